//! The timer's `also` statements on PostgreSQL, for an order the cancel
//! transaction (`store/cancel.rs`) has just flipped.

use sqlx::AssertSqlSafe;

use super::binding::{AlsoParam, BoundId};
use super::{PgStore, Postgres};
use crate::settings::{Timer, TimerKey};
use crate::store::StoreError;
use crate::store::outbox::{self, Value};
use crate::store::sql::{ALSO_LOCK_WAIT, Prepared, SqlDialect};

/// The timer's `also` statements for the order `id` just flipped on
/// `conn`, each waiting at most [`ALSO_LOCK_WAIT`] for a row the shop
/// holds: a held row delays only this order, and briefly.
pub(super) async fn also(
    conn: &mut sqlx::PgConnection,
    store: &PgStore,
    prepared: &Prepared<Postgres>,
    id: &str,
) -> Result<(), StoreError> {
    let o = &store.timer;
    let wait = format!("SET LOCAL lock_timeout = {}", ALSO_LOCK_WAIT.as_millis());
    sqlx::query(AssertSqlSafe(wait)).execute(&mut *conn).await?;
    if let Some(params) = &prepared.also_keys {
        lock_also_keys(conn, o, params, id).await?;
    }
    for (statement, params) in o.also.iter().zip(&prepared.also_params) {
        let mut also = sqlx::query(AssertSqlSafe(statement.clone()));
        for value in id_values(params, id, o.key(TimerKey::Also))? {
            also = also.bind(value);
        }
        also.execute(&mut *conn).await?;
    }
    Ok(())
}

/// The order `id` as the value of each of `params` (an `also` statement's
/// or the `also_keys` query's); an id a parameter's type cannot hold is a
/// mistake of the mapping, named by `key`.
fn id_values<'a>(
    params: &'a [AlsoParam],
    id: &str,
    key: &'static str,
) -> Result<Vec<BoundId<'a>>, StoreError> {
    params
        .iter()
        .map(|param| param.bind(id))
        .collect::<Result<_, _>>()
        .map_err(|problem| StoreError::Schema { key, problem })
}

/// Locks the slots of the keys the timer's `also_keys` query returns for
/// the order `id`, in ascending order ([`outbox::ALSO_LOCKS`]), so that
/// its `also` statements run only once no other order's writing the same
/// keys hold them.
async fn lock_also_keys(
    conn: &mut sqlx::PgConnection,
    timer: &Timer,
    params: &[AlsoParam],
    id: &str,
) -> Result<(), StoreError> {
    let query = timer.also_keys.trim().trim_end_matches(';');
    let query = format!("SELECT CAST(k AS text) FROM ({query}) AS also_keys(k)");
    let mut keys = sqlx::query_scalar::<_, Option<String>>(AssertSqlSafe(query));
    for value in id_values(params, id, timer.key(TimerKey::AlsoKeys))? {
        keys = keys.bind(value);
    }
    let keys: Vec<String> = keys
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .flatten()
        .collect();
    let slots = outbox::also_lock_slots(&keys);
    if !slots.is_empty() {
        let lock =
            outbox::render::<Postgres>(outbox::ALSO_LOCKS, &[("slots", Value::Nums(&slots))]);
        Postgres::execute(conn, lock).await?;
    }
    Ok(())
}
