//! `migrate` and `migrate --contract`, written once for both dialects:
//! the service's own migrations, then what a release keeps for the
//! previous one ([`super::releases`]), kept, dropped or read as data.

use sqlx::Connection as _;

use super::StoreError;
use super::outbox::{self, Value};
use super::releases::{Expansion, Migrated};
use super::sql::{Conn, SqlDialect, SqlStore};
use crate::settings::SecretUrl;

impl<D: SqlDialect> SqlStore<D> {
    /// Creates the database if it does not exist, then applies the
    /// service's own migrations. On a database the previous release ran
    /// on, it keeps what that release needs where no migration does
    /// ([`Expansion::keep`]); on one that had none of the service's
    /// tables, it contracts at once ([`super::releases`]).
    #[tracing::instrument(skip_all, fields(url = %url))]
    pub(crate) async fn migrate(url: &SecretUrl) -> Result<Migrated, StoreError> {
        D::create_database(url).await?;
        let mut conn = connect::<D>(url).await?;
        let fresh = holds::<D>(&mut conn, D::FRESH, &[]).await?;
        let mut keep = Vec::new();
        for (first, statement) in D::EXPANSIONS.iter().filter_map(|e| e.keep) {
            let before = "SELECT COALESCE(MAX(version), 0) < {first} FROM order_timeout_migrations";
            if !fresh && holds::<D>(&mut conn, before, &[("first", Value::Int(first))]).await? {
                keep.push(statement);
            }
        }
        D::run_migrations(&mut conn).await?;
        for statement in keep {
            D::execute(&mut conn, outbox::render::<D>(statement, &[])).await?;
        }
        if fresh {
            contract_on::<D>(&mut conn).await?;
        }
        let kept = expansions_on::<D>(&mut conn).await?;
        Ok(Migrated { fresh, kept })
    }

    /// Drops what the migrations keep for the previous release, and
    /// returns what was there.
    #[tracing::instrument(skip_all, fields(url = %url))]
    pub(crate) async fn contract(url: &SecretUrl) -> Result<Vec<Expansion>, StoreError> {
        contract_on::<D>(&mut connect::<D>(url).await?).await
    }

    /// What the migrations keep for the previous release, still in place.
    pub(super) async fn expansions(&self) -> Result<Vec<Expansion>, StoreError> {
        expansions_on::<D>(&mut *self.pool.acquire().await?).await
    }
}

/// A connection of its own to `url` (to migrate and contract).
async fn connect<D: SqlDialect>(url: &SecretUrl) -> Result<Conn<D>, StoreError> {
    Ok(Conn::<D>::connect_with(&D::connect_options(url, Some("UTC"))?).await?)
}

/// Whether the one boolean `query` returns is true.
async fn holds<D: SqlDialect>(
    conn: &mut Conn<D>,
    query: &str,
    values: &[(&str, Value<'_>)],
) -> Result<bool, StoreError> {
    let rows: Vec<(bool,)> = D::fetch(conn, outbox::render::<D>(query, values)).await?;
    Ok(rows.first().is_some_and(|(yes,)| *yes))
}

/// The dialect's [`SqlDialect::EXPANSIONS`] in place.
async fn expansions_on<D: SqlDialect>(conn: &mut Conn<D>) -> Result<Vec<Expansion>, StoreError> {
    let mut present = Vec::new();
    for e in D::EXPANSIONS {
        if holds::<D>(conn, e.present, &[]).await? {
            present.push(*e);
        }
    }
    Ok(present)
}

/// Drops the [`SqlDialect::EXPANSIONS`] in place; returns them.
async fn contract_on<D: SqlDialect>(conn: &mut Conn<D>) -> Result<Vec<Expansion>, StoreError> {
    let present = expansions_on::<D>(conn).await?;
    for e in &present {
        D::execute(conn, outbox::render::<D>(e.drop, &[])).await?;
        tracing::info!(dropped = e.object, kept_for = e.kept_for, "contracted");
    }
    Ok(present)
}
