//! **The cancel transaction** on MySQL and MariaDB (see the dialect's
//! module docs): lock, flip, record the effects, take over expired leases,
//! all in one transaction ([`cancel_in`]).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;

use super::statements::{Arg, Sql, args, from_micros, id_arg, marks, micros};
use super::{MySql, MySqlStore, Tx};
use crate::settings::{Release, Timer, TimerKey};
use crate::store::StoreError;
use crate::store::ids::IdValue;
use crate::store::outbox::{self, Value};
use crate::store::sql::Prepared;
use crate::store::state::StateRow;

/// One order row as the cancel transaction locked it.
#[derive(Debug, sqlx::FromRow)]
struct LockedOrder {
    /// The id, as text.
    id: String,
    /// Its status is `cancelled`.
    is_cancelled: Option<bool>,
    /// Its status is `paid`.
    is_paid: Option<bool>,
    /// Its status is `unpaid`.
    is_unpaid: Option<bool>,
    /// Its deadline, in UTC microseconds since the epoch.
    expires_us: Option<i64>,
    /// It passes the guard.
    guard_ok: Option<bool>,
    /// Its deadline has passed.
    due: Option<bool>,
}

impl LockedOrder {
    /// Unpaid, passing the guard and overdue: what the UPDATE flips.
    fn cancellable(&self) -> bool {
        [self.is_unpaid, self.guard_ok, self.due]
            .iter()
            .all(|fact| fact.unwrap_or(false))
    }
}

/// One outbox row as the cancel transaction locked it.
#[derive(Debug, sqlx::FromRow)]
struct LockedOutbox {
    /// The order id.
    order_id: String,
    /// When the order was cancelled.
    created_at: DateTime<Utc>,
    /// The lease's end, if any.
    claimed_until: Option<DateTime<Utc>>,
    /// The stock release is done.
    released: bool,
    /// The event is published.
    published: bool,
    /// No live lease.
    free: bool,
}

impl LockedOutbox {
    /// Work pending and no live lease: this caller takes it over.
    fn to_take_over(&self) -> bool {
        self.free && !(self.released && self.published)
    }
}

/// What the cancel transaction found and did, per order asked about.
struct Findings {
    orders: HashMap<String, LockedOrder>,
    /// Rows another transaction holds, as last committed: skipped.
    held: HashMap<String, LockedOrder>,
    outbox: HashMap<String, LockedOutbox>,
    /// Flipped to cancelled by this transaction, and when.
    cancelled: HashMap<String, DateTime<Utc>>,
    /// Outbox leases taken over by this transaction.
    taken: Vec<String>,
    /// The transaction's clock.
    db_now: DateTime<Utc>,
}

impl Findings {
    /// When this transaction cancelled `id`: its clock after the locks,
    /// and never before the deadline it cancelled for (the clocks the
    /// deadline check and this one read are a statement apart).
    fn cancelled_at(&self, id: &str) -> DateTime<Utc> {
        let expires_at = self.orders.get(id).and_then(|r| from_micros(r.expires_us));
        expires_at.map_or(self.db_now, |deadline| deadline.max(self.db_now))
    }

    /// The facts about `id`, for the shared mapping to an order state.
    fn state_row(&self, id: &str, nothing_to_release: bool) -> StateRow {
        let held = self.held.get(id);
        let order = self.orders.get(id).or(held);
        let ob = self.outbox.get(id);
        let cancelled_at = self.cancelled.get(id).copied();
        let just = cancelled_at.is_some();
        let fact = |f: fn(&LockedOrder) -> Option<bool>| order.and_then(f).unwrap_or(false);
        StateRow {
            id: id.to_owned(),
            found: order.is_some(),
            is_cancelled: just || fact(|r| r.is_cancelled),
            is_paid: !just && fact(|r| r.is_paid),
            is_unpaid: fact(|r| r.is_unpaid),
            guard_ok: fact(|r| r.guard_ok),
            expires_at: order.and_then(|r| from_micros(r.expires_us)),
            cancelled_at: cancelled_at.or(ob.map(|r| r.created_at)),
            just_cancelled: just,
            locked: held.is_some_and(LockedOrder::cancellable),
            leased: just || self.taken.iter().any(|t| t == id),
            claimed_until: ob.and_then(|r| r.claimed_until),
            has_outbox: just || ob.is_some(),
            stock_released: if just {
                nothing_to_release
            } else {
                ob.is_some_and(|r| r.released)
            },
            event_published: ob.is_some_and(|r| r.published),
            db_now: self.db_now,
        }
    }
}

/// The cancel transaction's statements on `tx` (see the module docs); the
/// caller commits, or rolls back at once when they fail.
pub(super) async fn cancel_in(
    tx: &mut Tx,
    store: &MySqlStore,
    prepared: &Prepared<MySql>,
    ids: &[&str],
    lease: Duration,
) -> Result<Vec<StateRow>, StoreError> {
    let mut orders = lock_orders(tx, store, prepared, ids).await?;
    // The rows `SKIP LOCKED` left out, as last committed: which of them
    // exist, and which another transaction holds while they are due.
    let skipped: Vec<&str> = match prepared.sql.skip_locked {
        true => ids
            .iter()
            .copied()
            .filter(|id| !orders.contains_key(*id))
            .collect(),
        false => Vec::new(),
    };
    let mut held = match skipped.is_empty() {
        true => HashMap::new(),
        false => {
            let sql = &prepared.sql.read_orders;
            read_orders(tx, store, prepared, &skipped, sql).await?
        }
    };
    let outbox = lock_outbox(tx, &store.timer, ids).await?;
    relock_cancelled_meanwhile(tx, store, prepared, &mut held, &outbox, &mut orders).await?;
    // After the locks: a cancel that waited for a row the shop held is
    // timed when it happened, not when it began waiting.
    let db_now = utc_now(tx).await?;
    let eligible = eligible(ids, &orders, &outbox);
    let mut flipped = Vec::new();
    if !eligible.is_empty() {
        flipped = flip(tx, store, prepared, &eligible, &mut orders).await?;
    }
    let mut findings = Findings {
        orders,
        held,
        outbox,
        cancelled: HashMap::new(),
        taken: Vec::new(),
        db_now,
    };
    // In id order, as the rows were locked.
    let flipped: Vec<(String, DateTime<Utc>)> = (flipped.into_iter())
        .map(|id| {
            let at = findings.cancelled_at(&id);
            (id, at)
        })
        .collect();
    if !flipped.is_empty() {
        record_effects(tx, store, prepared, &flipped, lease).await?;
    }
    findings.cancelled = flipped.into_iter().collect();
    findings.taken = take_over(tx, &store.timer, ids, &findings.outbox, lease).await?;
    let none = store.timer.release == Release::None;
    Ok(ids.iter().map(|id| findings.state_row(id, none)).collect())
}

/// A skipped row with an outbox row was, most likely, being cancelled by
/// another worker: locking the outbox waited for that transaction's
/// commit, and the row's facts read before (its last committed version,
/// unpaid) are stale. Those rows are locked and read again, now at their
/// latest version (a locking read sees it; the snapshot does not), and
/// replace what was read; one still held stays held.
async fn relock_cancelled_meanwhile(
    tx: &mut Tx,
    store: &MySqlStore,
    prepared: &Prepared<MySql>,
    held: &mut HashMap<String, LockedOrder>,
    outbox: &HashMap<String, LockedOutbox>,
    orders: &mut HashMap<String, LockedOrder>,
) -> Result<(), StoreError> {
    let again: Vec<String> = held
        .keys()
        .filter(|id| outbox.contains_key(*id))
        .cloned()
        .collect();
    if again.is_empty() {
        return Ok(());
    }
    let again: Vec<&str> = again.iter().map(String::as_str).collect();
    for (id, row) in lock_orders(tx, store, prepared, &again).await? {
        held.remove(&id);
        orders.insert(id, row);
    }
    Ok(())
}

/// The database's UTC clock.
async fn utc_now(tx: &mut Tx) -> Result<DateTime<Utc>, StoreError> {
    Ok(sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
        .fetch_one(&mut **tx)
        .await?)
}

/// Locks the order rows `ids` and reads their facts, by id (skipping rows
/// another transaction holds, where the server can).
async fn lock_orders(
    tx: &mut Tx,
    store: &MySqlStore,
    prepared: &Prepared<MySql>,
    ids: &[&str],
) -> Result<HashMap<String, LockedOrder>, StoreError> {
    read_orders(tx, store, prepared, ids, &prepared.sql.lock_orders).await
}

/// Reads the facts of the order rows `ids` with `sql` (`lock_orders` or
/// `read_orders`), by id.
async fn read_orders(
    tx: &mut Tx,
    store: &MySqlStore,
    prepared: &Prepared<MySql>,
    ids: &[&str],
    sql: &str,
) -> Result<HashMap<String, LockedOrder>, StoreError> {
    let o = &store.timer;
    let statuses = [
        Arg::Status(&o.to),
        Arg::MaybeStatus(o.paid.as_ref()),
        Arg::Status(&o.from),
    ];
    let id_values = id_values(prepared, ids)?;
    let id_args = id_values
        .iter()
        .map(|v| id_arg(v, Some(&prepared.sql.decimal)));
    let values = args(statuses.into_iter().chain(id_args))?;
    let sql = sql.replace("{ids}", &marks(ids.len()));
    let rows: Vec<LockedOrder> = sqlx::query_as_with(AssertSqlSafe(sql), values)
        .fetch_all(&mut **tx)
        .await?;
    // Exactly the rows asked about: a case-insensitive or space-padding
    // collation also finds `abc` for `ABC` or `abc `.
    Ok(rows
        .into_iter()
        .filter(|r| ids.contains(&r.id.as_str()))
        .map(|r| (r.id.clone(), r))
        .collect())
}

/// `ids` as values of the id column's type.
fn id_values(prepared: &Prepared<MySql>, ids: &[&str]) -> Result<Vec<IdValue>, StoreError> {
    ids.iter().map(|id| prepared.id_value(id)).collect()
}

/// Locks the timer's outbox rows of `ids` and reads them, by order id.
async fn lock_outbox(
    tx: &mut Tx,
    timer: &Timer,
    ids: &[&str],
) -> Result<HashMap<String, LockedOutbox>, StoreError> {
    let sql = format!(
        "SELECT CAST(order_id AS CHAR) AS order_id, created_at, claimed_until, \
                stock_released_at IS NOT NULL AS released, \
                event_published_at IS NOT NULL AS published, \
                claimed_until IS NULL OR claimed_until <= UTC_TIMESTAMP(6) AS free \
           FROM order_timeout_cancel_outbox \
          WHERE timer = ? AND order_id IN ({}) FOR UPDATE",
        marks(ids.len())
    );
    let values =
        std::iter::once(Arg::Text(timer.name.as_str())).chain(ids.iter().map(|id| Arg::Text(id)));
    let rows: Vec<LockedOutbox> = sqlx::query_as_with(AssertSqlSafe(sql), args(values)?)
        .fetch_all(&mut **tx)
        .await?;
    Ok(rows.into_iter().map(|r| (r.order_id.clone(), r)).collect())
}

/// The orders the UPDATE is for: locked unpaid, overdue and passing the
/// guard, and never cancelled by this service before (no outbox row).
fn eligible<'a>(
    ids: &[&'a str],
    orders: &HashMap<String, LockedOrder>,
    outbox: &HashMap<String, LockedOutbox>,
) -> Vec<&'a str> {
    ids.iter()
        .copied()
        .filter(|id| orders.get(*id).is_some_and(LockedOrder::cancellable))
        .filter(|id| !outbox.contains_key(*id))
        .collect()
}

/// Runs the conditional UPDATE over the eligible (locked) orders, then
/// reads them again: the UPDATE evaluates the deadline and the guard anew,
/// and what their sub-selects read (a cancel switch, a settings row) other
/// sessions may have changed since the locking read, so it may flip fewer
/// rows than were eligible. This transaction holds the rows' locks and they
/// were unpaid, so a row that reads cancelled now was flipped by it. The
/// facts read again replace the locked ones; returns the ids flipped.
async fn flip(
    tx: &mut Tx,
    store: &MySqlStore,
    prepared: &Prepared<MySql>,
    eligible: &[&str],
    orders: &mut HashMap<String, LockedOrder>,
) -> Result<Vec<String>, StoreError> {
    let o = &store.timer;
    let sql = &prepared.sql;
    let id_values = id_values(prepared, eligible)?;
    let update = sql.update.replace("{ids}", &marks(eligible.len()));
    let values = std::iter::once(Arg::Status(&o.to))
        .chain(id_values.iter().map(|v| id_arg(v, Some(&sql.decimal))))
        .chain([Arg::Status(&o.from)]);
    run!(update, values, &mut **tx).await?;
    let after = lock_orders(tx, store, prepared, eligible).await?;
    let flipped = eligible
        .iter()
        .filter(|id| {
            after
                .get(**id)
                .is_some_and(|r| r.is_cancelled == Some(true))
        })
        .map(|id| (*id).to_owned())
        .collect();
    orders.extend(after);
    Ok(flipped)
}

/// For each order this transaction flipped, with the time it was
/// cancelled: its `also` statements, and its outbox row leased to this
/// caller.
async fn record_effects(
    tx: &mut Tx,
    store: &MySqlStore,
    prepared: &Prepared<MySql>,
    flipped: &[(String, DateTime<Utc>)],
    lease: Duration,
) -> Result<(), StoreError> {
    let o = &store.timer;
    let sql = &prepared.sql;
    for (id, _) in flipped {
        let id = prepared.id_value(id)?;
        if let Some(params) = prepared.also_keys {
            lock_also_keys(tx, o, sql, &id, params).await?;
        }
        // A row the shop holds delays only this order, and briefly
        // (`Sql::also`).
        for (statement, params) in sql.also.iter().zip(&prepared.also_params) {
            let values = std::iter::repeat_n(id_arg(&id, Some(&sql.decimal)), *params);
            run!(statement.clone(), values, &mut **tx).await?;
        }
    }
    // PLACEHOLDERS_PER_ID per row: the statement with the most per id.
    // The timer's name is written in: `[a-z0-9_]{1,64}` (TimerName).
    let insert = format!(
        "INSERT INTO order_timeout_cancel_outbox \
                (timer, order_id, created_at, claimed_until, stock_released_at) VALUES {} \
         ON DUPLICATE KEY UPDATE order_id = order_id",
        vec![format!("('{}', ?, ?, ?, ?)", o.name); flipped.len()].join(", ")
    );
    let none = o.release == Release::None;
    // The time reported now, so what is reported and what is read back
    // later is one instant.
    let values = flipped.iter().flat_map(|(id, at)| {
        [
            Arg::Text(id),
            Arg::Time(*at),
            Arg::Time(lease_end(*at, lease)),
            none.then_some(*at).map_or(Arg::Null, Arg::Time),
        ]
    });
    run!(insert, values, &mut **tx).await?;
    Ok(())
}

/// Locks the slots of the keys the timer's `also_keys` query (taking the
/// order id `params` times) returns for the order `id`, in ascending order
/// ([`outbox::ALSO_LOCKS`]), so that its `also` statements run only once
/// no other order's writing the same keys hold them.
async fn lock_also_keys(
    tx: &mut Tx,
    timer: &Timer,
    sql: &Sql,
    id: &IdValue,
    params: usize,
) -> Result<(), StoreError> {
    let values = std::iter::repeat_n(id_arg(id, Some(&sql.decimal)), params);
    let query = sqlx::query_with(AssertSqlSafe(timer.also_keys.clone()), args(values)?);
    let rows = query.fetch_all(&mut **tx).await?;
    let keys = rows
        .iter()
        .filter_map(|row| key_text(row).transpose())
        .collect::<Result<Vec<String>, String>>()
        .map_err(|problem| StoreError::Schema {
            key: timer.key(TimerKey::AlsoKeys),
            problem,
        })?;
    let slots = outbox::also_lock_slots(&keys);
    if !slots.is_empty() {
        let lock = outbox::render::<MySql>(outbox::ALSO_LOCKS, &[("slots", Value::Nums(&slots))]);
        let values = lock.values.iter().flat_map(|v| super::arg(v, None));
        run!(format!("{}{}", sql.also_wait, lock.sql), values, &mut **tx).await?;
    }
    Ok(())
}

/// The first column of a row of the `also_keys` query as text (NULL:
/// none), whatever text or integer type it has.
fn key_text(row: &sqlx::mysql::MySqlRow) -> Result<Option<String>, String> {
    use sqlx::Row;
    if let Ok(text) = row.try_get::<Option<String>, _>(0) {
        return Ok(text);
    }
    if let Ok(n) = row.try_get::<Option<i64>, _>(0) {
        return Ok(n.map(|n| n.to_string()));
    }
    match row.try_get::<Option<u64>, _>(0) {
        Ok(n) => Ok(n.map(|n| n.to_string())),
        Err(e) => Err(format!(
            "a key it returned is neither text nor an integer ({e}): return the keys as text \
             or integers (CAST(… AS CHAR))"
        )),
    }
}

/// The end of a lease of `lease` taken at `at`, within `DATETIME`'s range.
fn lease_end(at: DateTime<Utc>, lease: Duration) -> DateTime<Utc> {
    let latest = DateTime::from_timestamp(253_402_300_799, 0).unwrap_or(at); // 9999-12-31
    chrono::TimeDelta::from_std(lease)
        .ok()
        .and_then(|lease| at.checked_add_signed(lease))
        .map_or(latest, |end| end.min(latest))
}

/// Takes over the expired leases of earlier cancellations with work
/// pending; returns their ids.
async fn take_over(
    tx: &mut Tx,
    timer: &Timer,
    ids: &[&str],
    outbox: &HashMap<String, LockedOutbox>,
    lease: Duration,
) -> Result<Vec<String>, StoreError> {
    let taken: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| outbox.get(*id).is_some_and(LockedOutbox::to_take_over))
        .collect();
    if !taken.is_empty() {
        let take = format!(
            "UPDATE order_timeout_cancel_outbox \
                SET claimed_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
              WHERE timer = ? AND order_id IN ({})",
            marks(taken.len())
        );
        let values = [Arg::Int(micros(lease)), Arg::Text(timer.name.as_str())]
            .into_iter()
            .chain(taken.iter().map(|id| Arg::Text(id)));
        run!(take, values, &mut **tx).await?;
    }
    Ok(taken.into_iter().map(str::to_owned).collect())
}
