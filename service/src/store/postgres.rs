//! PostgreSQL: the cancel transaction as one statement (CTEs with
//! `UPDATE … RETURNING` over `unnest($1::text[])`), so a batch costs one
//! round trip and one commit.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor};

use super::state::StateRow;
use super::{OrderItem, OrderState, OrderStore, StoreError};
use crate::message::OrderId;
use crate::settings::SecretUrl;

/// The service's own migrations for PostgreSQL (`migrations/postgres/`),
/// recorded in their own table, `order_timeout_migrations`, so they never
/// mix with the shop's own sqlx migrations in a shared database.
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("./migrations/postgres");
    migrator.dangerous_set_table_name("order_timeout_migrations");
    migrator
}

/// The store on PostgreSQL: a connection pool plus the service's queries.
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
}

fn connect_options(url: &SecretUrl) -> Result<PgConnectOptions, StoreError> {
    url.expose()
        .parse::<PgConnectOptions>()
        .map(|o| {
            o.log_statements(tracing::log::LevelFilter::Trace)
                // Plan every execution with its real parameters. With cached
                // generic plans, a connection that prepared the cancel
                // statement while `orders`/the outbox were nearly empty
                // kept seq-scanning them as they grew (measured with `bench`
                // on a fresh database: one seq scan of each table per batch,
                // cancellations capped near 700/s). Planning costs well under
                // a millisecond per statement.
                .options([("plan_cache_mode", "force_custom_plan")])
        })
        .map_err(|error| StoreError::Url {
            url: url.clone(),
            error,
        })
}

impl PgStore {
    /// Connects a pool of at most `max_connections` (lazily: the first query
    /// opens the first connection, so start-up does not fail on a database
    /// that is still booting).
    pub fn connect_lazy(url: &SecretUrl, max_connections: u32) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_lazy_with(connect_options(url)?);
        Ok(Self { pool })
    }

    /// Wraps an existing pool.
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Creates the database if it does not exist, then applies the embedded
    /// migrations.
    #[tracing::instrument(skip_all, fields(url = %url))]
    pub async fn migrate(url: &SecretUrl) -> Result<(), StoreError> {
        let options = connect_options(url)?;
        let name = options.get_database().unwrap_or("postgres").to_owned();
        let admin = options.clone().database("postgres");
        let mut conn = sqlx::PgConnection::connect_with(&admin).await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await?;
        if !exists {
            let create = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
            match conn.execute(sqlx::AssertSqlSafe(create)).await {
                Ok(_) => tracing::info!(database = %name, "created database"),
                // Another process created it between our check and now.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
                Err(e) => return Err(e.into()),
            }
        }
        drop(conn);
        let mut conn = sqlx::PgConnection::connect_with(&options).await?;
        migrator().run(&mut conn).await?;
        Ok(())
    }

    /// The order ids a sweeper query (`$1` = grace, `$2` = limit) returns.
    /// An id that is not a valid order id (the shop's table may hold
    /// anything) is skipped with a warning: no message could name it either.
    async fn ids_older_than(
        &self,
        sql: &'static str,
        grace: Duration,
        limit: u32,
    ) -> Result<Vec<OrderId>, StoreError> {
        let ids: Vec<String> = sqlx::query_scalar(sql)
            .bind(grace)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(ids
            .iter()
            .filter_map(|id| match OrderId::parse(id) {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::warn!(order_id = ?id, error = %e, "skipping a row whose id is not a valid order id");
                    None
                }
            })
            .collect())
    }
}

#[async_trait::async_trait]
impl OrderStore for PgStore {
    /// One statement (so one transaction): CTEs update the orders, insert
    /// the outbox rows and take expired leases; the final SELECT reports
    /// every id asked about (`unnest`), joined with what the CTEs did.
    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn cancel_due(
        &self,
        ids: &[OrderId],
        reason: &str,
        lease: Duration,
    ) -> Result<Vec<(OrderId, OrderState)>, StoreError> {
        let ids_text: Vec<&str> = ids.iter().map(OrderId::as_str).collect();
        let rows: Vec<StateRow> = sqlx::query_as(
            r#"
            WITH cancelled AS (
                UPDATE orders
                   SET status = 'CANCELLED', cancelled_at = now(), cancel_reason = $2
                 WHERE id = ANY($1) AND status = 'UNPAID' AND expires_at <= now()
                RETURNING id, expires_at, cancelled_at
            ), outbox AS (
                INSERT INTO order_timeout_cancel_outbox (order_id, created_at, claimed_until)
                SELECT id, cancelled_at, now() + $3 FROM cancelled
                ON CONFLICT (order_id) DO NOTHING
            ), leased AS (
                UPDATE order_timeout_cancel_outbox
                   SET claimed_until = now() + $3
                 WHERE order_id = ANY($1)
                   AND (stock_released_at IS NULL OR event_published_at IS NULL)
                   AND (claimed_until IS NULL OR claimed_until <= now())
                RETURNING order_id
            )
            SELECT req.id,
                   CASE WHEN c.id IS NOT NULL THEN 'CANCELLED' ELSE o.status END AS status,
                   coalesce(c.expires_at, o.expires_at) AS expires_at,
                   coalesce(c.cancelled_at, o.cancelled_at) AS cancelled_at,
                   c.id IS NOT NULL AS just_cancelled,
                   (c.id IS NOT NULL OR l.order_id IS NOT NULL) AS leased,
                   ob.claimed_until,
                   (c.id IS NOT NULL OR ob.order_id IS NOT NULL) AS has_outbox,
                   coalesce(ob.stock_released_at IS NOT NULL, false) AS stock_released,
                   coalesce(ob.event_published_at IS NOT NULL, false) AS event_published,
                   now() AS db_now
              FROM unnest($1::text[]) AS req(id)
              LEFT JOIN orders o ON o.id = req.id
              LEFT JOIN cancelled c ON c.id = req.id
              LEFT JOIN order_timeout_cancel_outbox ob ON ob.order_id = req.id
              LEFT JOIN leased l ON l.order_id = req.id
            "#,
        )
        .bind(&ids_text)
        .bind(reason)
        .bind(lease)
        .fetch_all(&self.pool)
        .await?;

        let asked: HashMap<&str, &OrderId> = ids.iter().map(|id| (id.as_str(), id)).collect();
        Ok(rows
            .iter()
            .filter_map(|r| Some(((*asked.get(r.id.as_str())?).clone(), r.state())))
            .collect())
    }

    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn items(&self, ids: &[&OrderId]) -> Result<HashMap<String, Vec<OrderItem>>, StoreError> {
        let ids_text: Vec<&str> = ids.iter().map(|id| id.as_str()).collect();
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT order_id, sku, quantity FROM order_items WHERE order_id = ANY($1) ORDER BY order_id, sku",
        )
        .bind(&ids_text)
        .fetch_all(&self.pool)
        .await?;
        let mut map: HashMap<String, Vec<OrderItem>> = HashMap::new();
        for (order_id, sku, quantity) in rows {
            map.entry(order_id)
                .or_default()
                .push(OrderItem { sku, quantity });
        }
        Ok(map)
    }

    /// An index range scan on the shop's `(status, expires_at)` index.
    #[tracing::instrument(skip(self))]
    async fn overdue(&self, grace: Duration, limit: u32) -> Result<Vec<OrderId>, StoreError> {
        self.ids_older_than(
            r#"
            SELECT id FROM orders
             WHERE status = 'UNPAID' AND expires_at < now() - $1
             ORDER BY expires_at
             LIMIT $2
            "#,
            grace,
            limit,
        )
        .await
    }

    #[tracing::instrument(skip(self))]
    async fn stale_outbox(&self, grace: Duration, limit: u32) -> Result<Vec<OrderId>, StoreError> {
        self.ids_older_than(
            r#"
            SELECT order_id FROM order_timeout_cancel_outbox
             WHERE (stock_released_at IS NULL OR event_published_at IS NULL)
               AND created_at < now() - $1
               AND (claimed_until IS NULL OR claimed_until <= now())
             ORDER BY created_at
             LIMIT $2
            "#,
            grace,
            limit,
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn release_leases(&self, ids: &[&str]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "UPDATE order_timeout_cancel_outbox SET claimed_until = NULL WHERE order_id = ANY($1)",
        )
        .bind(ids)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(released = released.len(), published = published.len()))]
    async fn mark_done(&self, released: &[&str], published: &[&str]) -> Result<(), StoreError> {
        if released.is_empty() && published.is_empty() {
            return Ok(());
        }
        sqlx::query(
            r#"
            UPDATE order_timeout_cancel_outbox
               SET stock_released_at  = CASE WHEN order_id = ANY($1)
                                             THEN coalesce(stock_released_at, now())
                                             ELSE stock_released_at END,
                   event_published_at = CASE WHEN order_id = ANY($2)
                                             THEN coalesce(event_published_at, now())
                                             ELSE event_published_at END
             WHERE order_id = ANY($1) OR order_id = ANY($2)
            "#,
        )
        .bind(released)
        .bind(published)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}
