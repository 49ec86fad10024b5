//! **The cancel transaction**, written once over the dialects' words: the
//! order rows asked about locked and read (`FOR UPDATE SKIP LOCKED` where
//! the server has it: a row the shop holds is skipped, read without a lock
//! and reported held, so it delays only itself), their outbox rows locked,
//! a conditional `UPDATE` of the eligible ones, those rows read again (the
//! UPDATE may flip fewer: see [`flip`]), each flipped order's `also`
//! statements ([`SqlDialect::also`]) and an outbox row leased to this
//! caller, expired leases taken over, then one commit. The facts read are
//! turned into order states by one mapping ([`Findings::state_row`],
//! `state.rs`).
//!
//! Ids compare exactly: the collations shops use may be case-insensitive
//! and pad with spaces (`'abc ' = 'ABC'`), so `id IN (…)` may find a row
//! spelled differently from the id asked about. Every row is read back by
//! its id's text, and only the rows whose id is exactly one asked about
//! are acted on; the outbox keys ids as bytes.
//!
//! Templates are written as in `shop.rs` (the shop's tables) and
//! `outbox.rs` (the service's own), and found and prepared on both
//! dialects by the same tests.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::StoreError;
use super::ids::IdValue;
use super::outbox::{NewOutboxRow, Value, micros, render, render_mapped};
use super::sql::{Prepared, SqlDialect, SqlStore, commit_or_roll_back};
use super::state::StateRow;
use crate::settings::Release;

/// The facts of the order rows `{ids}`, then how they are locked.
macro_rules! order_facts {
    ($lock:literal) => {
        concat!(
            "SELECT {row_id_text} AS id, {status} = {to} AS is_cancelled, \
                    {status} = {paid} AS is_paid, {status} = {from} AS is_unpaid, \
                    {expires} AS expires_us, COALESCE({guard}, FALSE) AS guard_ok, {due} AS due \
               FROM {table} AS o WHERE {row_id} {ids}",
            $lock
        )
    };
}

/// The order rows asked about, locked; rows another transaction holds
/// skipped.
pub(super) const LOCK_ROWS: &str = order_facts!(" FOR UPDATE SKIP LOCKED");

/// [`LOCK_ROWS`] on a server without `SKIP LOCKED` (MySQL before 8.0.1,
/// MariaDB before 10.6): every row asked about waited for, bounded by
/// `db_lock_timeout`.
pub(super) const LOCK_ROWS_WAITING: &str = order_facts!(" FOR UPDATE");

/// The rows `SKIP LOCKED` left out, as last committed, without a lock.
pub(super) const READ_ROWS: &str = order_facts!("");

/// The conditional flip: only rows still unpaid, overdue and passing the
/// guard, evaluated anew.
pub(super) const FLIP: &str = "\
UPDATE {table} AS o SET {status_column} = {to}{set} \
 WHERE {row_id} {ids} AND {status} = {from} AND {due} AND {guard}";

/// The timer's outbox rows of `{ids}`, locked.
const LOCK_OUTBOX: &str = "\
SELECT {order_id} AS order_id, created_at, claimed_until, \
       stock_released_at IS NOT NULL AS released, event_published_at IS NOT NULL AS published, \
       (claimed_until IS NULL OR claimed_until <= {now}) AS free \
  FROM order_timeout_cancel_outbox WHERE timer = {timer} AND order_id {ids} FOR UPDATE";

/// The database's clock now (not the transaction's start), in UTC.
const CLOCK: &str = "SELECT {clock}";

/// An outbox row per order flipped, leased to this caller.
const NEW_OUTBOX_ROWS: &str = "\
INSERT INTO order_timeout_cancel_outbox \
       (timer, order_id, created_at, claimed_until, stock_released_at) \
{rows} {keep_existing:order_id}";

/// Expired leases of earlier cancellations with work pending, taken over.
const TAKE_OVER: &str = "\
UPDATE order_timeout_cancel_outbox SET claimed_until = {now} + {lease} \
 WHERE timer = {timer} AND order_id {ids}";

/// Every template by name (see `shop::TEMPLATES`).
pub(super) const TEMPLATES: [(&str, &str); 8] = templates![
    LOCK_ROWS,
    LOCK_ROWS_WAITING,
    READ_ROWS,
    FLIP,
    LOCK_OUTBOX,
    CLOCK,
    NEW_OUTBOX_ROWS,
    TAKE_OVER
];

/// A transaction on the dialect's database.
type Tx<D> = sqlx::Transaction<'static, <D as SqlDialect>::Db>;

/// One order row as the cancel transaction read it.
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

    /// Its deadline, as an instant.
    fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.expires_us.and_then(DateTime::from_timestamp_micros)
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
        let expires_at = self.orders.get(id).and_then(LockedOrder::expires_at);
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
            expires_at: order.and_then(LockedOrder::expires_at),
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

/// **The cancel transaction** for canonical `ids` in id order: one row per
/// id (see the module docs).
pub(super) async fn cancel<D: SqlDialect>(
    store: &SqlStore<D>,
    prepared: &Prepared<D>,
    ids: &[&str],
    lease: Duration,
) -> Result<Vec<StateRow>, StoreError> {
    let mut tx = store.pool.begin().await?;
    let result = cancel_in(&mut tx, store, prepared, ids, lease).await;
    commit_or_roll_back(tx, result).await
}

/// The cancel transaction's statements on `tx`; the caller commits, or
/// rolls back at once when they fail.
async fn cancel_in<D: SqlDialect>(
    tx: &mut Tx<D>,
    store: &SqlStore<D>,
    prepared: &Prepared<D>,
    ids: &[&str],
    lease: Duration,
) -> Result<Vec<StateRow>, StoreError> {
    let skips = D::skips_locked(&prepared.sql);
    let mut orders = read_orders(tx, store, prepared, ids, lock::<D>(prepared)).await?;
    // The rows `SKIP LOCKED` left out, as last committed: which of them
    // exist, and which another transaction holds while they are due.
    let skipped: Vec<&str> = (ids.iter().copied())
        .filter(|id| skips && !orders.contains_key(*id))
        .collect();
    let mut held = HashMap::new();
    if !skipped.is_empty() {
        held = read_orders(tx, store, prepared, &skipped, READ_ROWS).await?;
    }
    let outbox = lock_outbox(tx, store, ids).await?;
    relock_cancelled_meanwhile(tx, store, prepared, &mut held, &outbox, &mut orders).await?;
    // After the locks: a cancel that waited for a row the shop held is
    // timed when it happened, not when it began waiting.
    let clock: Vec<(DateTime<Utc>,)> = D::fetch(&mut **tx, render::<D>(CLOCK, &[])).await?;
    let db_now = clock.first().map_or_else(Utc::now, |(t,)| *t);
    let eligible: Vec<&str> = (ids.iter().copied())
        .filter(|id| orders.get(*id).is_some_and(LockedOrder::cancellable))
        .filter(|id| !outbox.contains_key(*id))
        .collect();
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
    findings.taken = take_over(tx, store, ids, &findings.outbox, lease).await?;
    let none = store.timer.release == Release::None;
    Ok(ids.iter().map(|id| findings.state_row(id, none)).collect())
}

/// How the order rows are locked on this server: [`LOCK_ROWS`], or
/// [`LOCK_ROWS_WAITING`] where it cannot skip locked rows.
fn lock<D: SqlDialect>(prepared: &Prepared<D>) -> &'static str {
    match D::skips_locked(&prepared.sql) {
        true => LOCK_ROWS,
        false => LOCK_ROWS_WAITING,
    }
}

/// A skipped row with an outbox row was, most likely, being cancelled by
/// another worker: locking the outbox waited for that transaction's
/// commit, and the row's facts read before (its last committed version,
/// unpaid) are stale. Those rows are locked and read again, now at their
/// latest version (a locking read sees it; the snapshot does not), and
/// replace what was read; one still held stays held.
async fn relock_cancelled_meanwhile<D: SqlDialect>(
    tx: &mut Tx<D>,
    store: &SqlStore<D>,
    prepared: &Prepared<D>,
    held: &mut HashMap<String, LockedOrder>,
    outbox: &HashMap<String, LockedOutbox>,
    orders: &mut HashMap<String, LockedOrder>,
) -> Result<(), StoreError> {
    let again: Vec<String> = (held.keys())
        .filter(|id| outbox.contains_key(*id))
        .cloned()
        .collect();
    if again.is_empty() {
        return Ok(());
    }
    let again: Vec<&str> = again.iter().map(String::as_str).collect();
    for (id, row) in read_orders(tx, store, prepared, &again, lock::<D>(prepared)).await? {
        held.remove(&id);
        orders.insert(id, row);
    }
    Ok(())
}

/// Reads the facts of the order rows `ids` with `template` ([`LOCK_ROWS`],
/// [`LOCK_ROWS_WAITING`] or [`READ_ROWS`]), by id.
async fn read_orders<D: SqlDialect>(
    tx: &mut Tx<D>,
    store: &SqlStore<D>,
    prepared: &Prepared<D>,
    ids: &[&str],
    template: &str,
) -> Result<HashMap<String, LockedOrder>, StoreError> {
    let o = &store.timer;
    let row_ids = id_values(prepared, ids)?;
    let values = [
        ("to", Value::Status(&o.to)),
        ("paid", Value::MaybeStatus(o.paid.as_ref())),
        ("from", Value::Status(&o.from)),
        ("ids", Value::RowIds(&row_ids)),
    ];
    let statement = render_mapped::<D>(template, &prepared.mapped, &values);
    let rows: Vec<LockedOrder> = D::fetch(&mut **tx, statement).await?;
    // Exactly the rows asked about: a case-insensitive or space-padding
    // collation also finds `abc` for `ABC` or `abc `.
    Ok(rows
        .into_iter()
        .filter(|r| ids.contains(&r.id.as_str()))
        .map(|r| (r.id.clone(), r))
        .collect())
}

/// `ids` as values of the id column's type.
fn id_values<D: SqlDialect>(
    prepared: &Prepared<D>,
    ids: &[&str],
) -> Result<Vec<IdValue>, StoreError> {
    ids.iter().map(|id| prepared.id_value(id)).collect()
}

/// Locks the timer's outbox rows of `ids` and reads them, by order id.
async fn lock_outbox<D: SqlDialect>(
    tx: &mut Tx<D>,
    store: &SqlStore<D>,
    ids: &[&str],
) -> Result<HashMap<String, LockedOutbox>, StoreError> {
    let values = [
        ("timer", Value::Text(store.timer.name.as_str())),
        ("ids", Value::Ids(ids)),
    ];
    let rows: Vec<LockedOutbox> = D::fetch(&mut **tx, render::<D>(LOCK_OUTBOX, &values)).await?;
    Ok(rows.into_iter().map(|r| (r.order_id.clone(), r)).collect())
}

/// Runs the conditional UPDATE over the eligible (locked) orders, then
/// reads them again: the UPDATE evaluates the deadline and the guard anew,
/// and what their sub-selects read (a cancel switch, a settings row) other
/// sessions may have changed since the locking read, so it may flip fewer
/// rows than were eligible. This transaction holds the rows' locks and they
/// were unpaid, so a row that reads cancelled now was flipped by it. The
/// facts read again replace the locked ones; returns the ids flipped.
async fn flip<D: SqlDialect>(
    tx: &mut Tx<D>,
    store: &SqlStore<D>,
    prepared: &Prepared<D>,
    eligible: &[&str],
    orders: &mut HashMap<String, LockedOrder>,
) -> Result<Vec<String>, StoreError> {
    let o = &store.timer;
    let row_ids = id_values(prepared, eligible)?;
    let values = [
        ("to", Value::Status(&o.to)),
        ("ids", Value::RowIds(&row_ids)),
        ("from", Value::Status(&o.from)),
    ];
    D::execute(
        &mut **tx,
        render_mapped::<D>(FLIP, &prepared.mapped, &values),
    )
    .await?;
    let after = read_orders(tx, store, prepared, eligible, lock::<D>(prepared)).await?;
    let flipped = (eligible.iter())
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
async fn record_effects<D: SqlDialect>(
    tx: &mut Tx<D>,
    store: &SqlStore<D>,
    prepared: &Prepared<D>,
    flipped: &[(String, DateTime<Utc>)],
    lease: Duration,
) -> Result<(), StoreError> {
    let o = &store.timer;
    if !o.also.is_empty() {
        for (id, _) in flipped {
            D::also(&mut **tx, store, prepared, id).await?;
        }
    }
    let none = o.release == Release::None;
    // The time reported now, so what is reported and what is read back
    // later is one instant.
    let rows: Vec<NewOutboxRow<'_>> = (flipped.iter())
        .map(|(id, at)| NewOutboxRow {
            order_id: id,
            created_at: *at,
            claimed_until: lease_end(*at, lease),
            stock_released_at: none.then_some(*at),
        })
        .collect();
    let values = [("rows", Value::NewOutboxRows(o.name.as_str(), &rows))];
    D::execute(&mut **tx, render::<D>(NEW_OUTBOX_ROWS, &values)).await?;
    Ok(())
}

/// The end of a lease of `lease` taken at `at`, within the range of
/// MySQL's `DATETIME`.
fn lease_end(at: DateTime<Utc>, lease: Duration) -> DateTime<Utc> {
    let latest = DateTime::from_timestamp(253_402_300_799, 0).unwrap_or(at); // 9999-12-31
    chrono::TimeDelta::from_std(lease)
        .ok()
        .and_then(|lease| at.checked_add_signed(lease))
        .map_or(latest, |end| end.min(latest))
}

/// Takes over the expired leases of earlier cancellations with work
/// pending; returns their ids.
async fn take_over<D: SqlDialect>(
    tx: &mut Tx<D>,
    store: &SqlStore<D>,
    ids: &[&str],
    outbox: &HashMap<String, LockedOutbox>,
    lease: Duration,
) -> Result<Vec<String>, StoreError> {
    let taken: Vec<&str> = (ids.iter().copied())
        .filter(|id| outbox.get(*id).is_some_and(LockedOutbox::to_take_over))
        .collect();
    if !taken.is_empty() {
        let values = [
            ("lease", Value::Micros(micros(lease))),
            ("timer", Value::Text(store.timer.name.as_str())),
            ("ids", Value::Ids(&taken)),
        ];
        D::execute(&mut **tx, render::<D>(TAKE_OVER, &values)).await?;
    }
    Ok(taken.into_iter().map(str::to_owned).collect())
}
