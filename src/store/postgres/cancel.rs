//! **The cancel transaction** on PostgreSQL: one statement (CTEs with
//! `UPDATE … RETURNING` over `unnest($1::text[])`), so a batch costs one
//! round trip and one commit; with `also` statements, that statement and
//! the statements for each order it flipped in one transaction.

use std::time::Duration;

use sqlx::{AssertSqlSafe, Connection};

use super::binding::{AlsoParam, BoundId};
use super::{PgStore, Postgres, text};
use crate::settings::{Release, Timer, TimerKey};
use crate::store::outbox::{self, Value};
use crate::store::shape::{self, OrdersColumns};
use crate::store::sql::{ALSO_LOCK_WAIT, Prepared, commit_or_roll_back};
use crate::store::state::StateRow;
use crate::store::{Dialect, StoreError};

/// **The cancel transaction**: the cancel statement for canonical `ids`
/// in id order, in a transaction with the `also` statements when there are
/// any.
pub(super) async fn cancel(
    store: &PgStore,
    prepared: &Prepared<Postgres>,
    ids: &[&str],
    lease: Duration,
) -> Result<Vec<StateRow>, StoreError> {
    let o = &store.timer;
    let query = sqlx::query_as::<_, StateRow>(AssertSqlSafe(prepared.sql.cancel.clone()))
        .bind(ids)
        .bind(text(&o.to))
        .bind(text(&o.from))
        .bind(o.paid.as_ref().map(text))
        .bind(lease)
        .bind(o.release == Release::None)
        .bind(o.name.as_str());
    if o.also.is_empty() {
        let mut conn = store.pool.acquire().await?;
        return match query.fetch_all(&mut *conn).await {
            Ok(rows) => Ok(rows),
            Err(e) => {
                // PostgreSQL reports the error before it has ended the
                // statement's transaction: wait for the session to be
                // ready again, so that the rows the statement locked
                // are free before the caller runs the batch again order
                // by order (else they are skipped there as locked).
                let _ = conn.ping().await;
                Err(e.into())
            }
        };
    }
    let mut tx = store.pool.begin().await?;
    let result = cancel_with_also(&mut tx, store, prepared, query).await;
    commit_or_roll_back(tx, result).await
}

/// The cancel statement `query` and the timer's `also` statements for each
/// order it flipped, on `tx`; the caller commits, or rolls back at once
/// when they fail.
pub(super) async fn cancel_with_also(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    store: &PgStore,
    prepared: &Prepared<Postgres>,
    query: sqlx::query::QueryAs<'_, sqlx::Postgres, StateRow, sqlx::postgres::PgArguments>,
) -> Result<Vec<StateRow>, StoreError> {
    let rows = query.fetch_all(&mut **tx).await?;
    for row in rows.iter().filter(|r| r.just_cancelled) {
        also(tx, store, prepared, &row.id).await?;
    }
    Ok(rows)
}

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
        super::run(lock)?.execute(&mut *conn).await?;
    }
    Ok(())
}

/// The cancel statement: the CTEs that change rows, then the report.
pub(super) fn cancel_statement(p: &Parts, timer: &Timer) -> String {
    format!(
        "{changes}{report}",
        changes = cancel_changes(p, timer),
        report = cancel_report(p)
    )
}

/// `mine`: the rows asked about that are unpaid, overdue and passing the
/// guard, locked `FOR UPDATE SKIP LOCKED`: a row another transaction holds
/// (the shop's payment callback, say) is skipped and reported
/// [`StateRow::locked`], so one held row delays only itself, not the
/// batch; `cancelled`: the conditional UPDATE of those rows (their ids as
/// an array, not a join: the planner nested-looped over the CTE, +40% per
/// statement), each timed when it was updated; `outbox`: an outbox row
/// leased to this caller per order it flipped; `leased`: expired leases of
/// earlier cancellations with work pending, taken over.
pub(super) fn cancel_changes(p: &Parts, timer: &Timer) -> String {
    let Parts {
        table,
        id,
        status,
        due,
        expires,
        guard,
        ..
    } = p;
    let set: String = timer
        .set
        .iter()
        .map(|(column, value)| format!(", {} = {value}", shape::quote(Dialect::Postgres, column)))
        .collect();
    let (matches, cancelled, unpaid) = (p.matches(), p.code(2), p.code(3));
    format!(
        r#"
        WITH mine AS (
            SELECT o.{id} AS key, o.{id}::text AS id
              FROM {table} AS o
             WHERE {matches} AND o.{status} = {unpaid}
               AND {due} AND {guard}
               AND NOT EXISTS (SELECT 1 FROM order_timeout_cancel_outbox AS x
                                WHERE x.timer = $7 AND x.order_id = o.{id}::text)
               FOR UPDATE OF o SKIP LOCKED
        ), cancelled AS (
            UPDATE {table} AS o
               SET {status} = {cancelled}{set}
             WHERE {matches} AND o.{id} = ANY(ARRAY(SELECT key FROM mine))
               AND o.{status} = {unpaid}
               AND {due} AND {guard}
            RETURNING o.{id}::text AS id, {expires} AS expires_at,
                      clock_timestamp() AS cancelled_at
        ), outbox AS (
            INSERT INTO order_timeout_cancel_outbox
                   (timer, order_id, created_at, claimed_until, stock_released_at)
            SELECT $7, id, cancelled_at, cancelled_at + $5, CASE WHEN $6 THEN cancelled_at END
              FROM cancelled
            ON CONFLICT (timer, order_id) DO NOTHING
        ), leased AS (
            UPDATE order_timeout_cancel_outbox
               SET claimed_until = now() + $5
             WHERE timer = $7 AND order_id = ANY($1)
               AND (stock_released_at IS NULL OR event_published_at IS NULL)
               AND (claimed_until IS NULL OR claimed_until <= now())
            RETURNING order_id
        )"#
    )
}

/// `ord`: the rows asked about as they were before the UPDATE (the last
/// committed versions, also of rows another transaction holds); then one
/// [`StateRow`] per id asked about, `locked` when the row is due and unpaid
/// but not flipped and not in `mine` (looked up only for such rows).
pub(super) fn cancel_report(p: &Parts) -> String {
    let Parts {
        table,
        id,
        status,
        due,
        expires,
        guard,
        ..
    } = p;
    let (matches, cancelled, unpaid, paid) = (p.matches(), p.code(2), p.code(3), p.code(4));
    format!(
        r#", ord AS (
            SELECT o.{id}::text AS id,
                   o.{status} = {cancelled} AS is_cancelled,
                   coalesce(o.{status} = {paid}, false) AS is_paid,
                   o.{status} = {unpaid} AS is_unpaid,
                   {expires} AS expires_at,
                   coalesce({guard}, false) AS guard_ok,
                   coalesce({due}, false) AS due
              FROM {table} AS o
             WHERE {matches}
        )
        SELECT req.id,
               ord.id IS NOT NULL AS found,
               (c.id IS NOT NULL OR coalesce(ord.is_cancelled, false)) AS is_cancelled,
               coalesce(ord.is_paid, false) AS is_paid,
               coalesce(ord.is_unpaid, false) AS is_unpaid,
               coalesce(ord.guard_ok, false) AS guard_ok,
               coalesce(c.expires_at, ord.expires_at) AS expires_at,
               coalesce(ob.created_at, c.cancelled_at) AS cancelled_at,
               c.id IS NOT NULL AS just_cancelled,
               CASE WHEN c.id IS NULL
                         AND coalesce(ord.is_unpaid AND ord.guard_ok AND ord.due, false)
                    THEN NOT (req.id = ANY(ARRAY(SELECT id FROM mine)))
                    ELSE false END AS locked,
               (c.id IS NOT NULL OR l.order_id IS NOT NULL) AS leased,
               ob.claimed_until,
               (c.id IS NOT NULL OR ob.order_id IS NOT NULL) AS has_outbox,
               CASE WHEN c.id IS NOT NULL THEN $6
                    ELSE coalesce(ob.stock_released_at IS NOT NULL, false) END AS stock_released,
               coalesce(ob.event_published_at IS NOT NULL, false) AS event_published,
               now() AS db_now
          FROM unnest($1::text[]) AS req(id)
          LEFT JOIN ord ON ord.id = req.id
          LEFT JOIN cancelled c ON c.id = req.id
          LEFT JOIN order_timeout_cancel_outbox ob ON ob.timer = $7 AND ob.order_id = req.id
          LEFT JOIN leased l ON l.order_id = req.id
        "#
    )
}

/// The pieces of the mapping every statement is rendered from.
pub(super) struct Parts {
    pub(super) table: String,
    pub(super) id: String,
    pub(super) status: String,
    /// The deadline as the service reads it: a `timestamptz`, NULL when it
    /// is no usable time ([`shape::usable_deadline_sql`]).
    pub(super) expires: String,
    /// The row is due: its deadline is a usable time, and passed.
    pub(super) due: String,
    pub(super) guard: String,
    /// The id column's type without length or precision.
    pub(super) id_base: String,
    pub(super) status_type: String,
}

impl Parts {
    pub(super) fn of(timer: &Timer, orders: &OrdersColumns) -> Self {
        let o = timer;
        let q = |s: &str| shape::quote(Dialect::Postgres, s);
        let deadline = shape::deadline_sql(Dialect::Postgres, o);
        let usable = shape::usable_deadline_sql(&deadline);
        Self {
            table: q(&o.table),
            id: q(&o.id),
            status: q(&o.status),
            expires: format!("CASE WHEN {usable} THEN ({deadline})::timestamptz END"),
            due: format!("({deadline} <= now() AND {usable})"),
            guard: shape::guard_sql(o),
            id_base: orders.id_base.clone(),
            status_type: orders.status_type.clone(),
        }
    }

    /// The status code bound as `$n`, in the status column's type.
    pub(super) fn code(&self, n: u8) -> String {
        format!("CAST(${n}::text AS {})", self.status_type)
    }

    /// The rows of `o` whose id is one of the ids bound as `$1`: compared
    /// in the id column's type (its index), and read back as exactly one of
    /// them (`00123` is not `123`, `ABC` is not `abc` in a `citext`
    /// column).
    pub(super) fn matches(&self) -> String {
        let Self { id, id_base, .. } = self;
        format!(
            "o.{id} = ANY(CAST($1::text[] AS {id_base}[])) \
             AND (o.{id}::text COLLATE \"C\") = ANY($1::text[])"
        )
    }
}
