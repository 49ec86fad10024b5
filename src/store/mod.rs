//! The database side of a cancellation: **the cancel transaction** and the
//! transactional outbox, behind one interface per operation
//! ([`OrderStore`]), with one implementation per SQL dialect.
//!
//! [`OrderStore::cancel_due`] is one transaction for a whole batch of
//! orders: it flips `UNPAID -> CANCELLED` only where the row's deadline has
//! passed, inserts an outbox row (`order_timeout_cancel_outbox`) for each
//! order it flipped, and reports the state of every order asked about. The
//! stock release and the event are then done from the outbox and marked
//! there, so a crash at any point leaves either nothing done or a pending
//! outbox row that the next delivery (or the sweeper) finishes.
//!
//! The flow around the statements is written once (`sql.rs`: canonical
//! ids, the cancel transaction's id order and deadlock retries, items,
//! ping; `check.rs`: the schema check), over a dialect trait whose two
//! modules hold only what differs: `postgres/` and `mysql/` connect, read
//! their catalogs, run their own cancel transaction (`cancel.rs` in each)
//! and supply the words of a small vocabulary. Every other statement is a
//! template written once over that vocabulary: on the shop's tables in
//! `shop.rs` (scans, one row's facts, items, the rows set aside), on the
//! service's own (the outbox, the watch marks) in `outbox.rs`. What a row
//! *means* ([`OrderState`]) is decided once, in `state.rs`. Connecting an
//! instance is `connect.rs`, the dialects `dialect.rs`, what an error means
//! `error.rs`.
//! `migrate` creates only the service's own tables (prefixed
//! `order_timeout_`), never the shop's.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::message::OrderId;
use crate::settings::Timer;

mod bounded;
mod catalog;
mod check;
mod connect;
mod dialect;
mod error;
mod ids;
mod migrate;
mod mysql;
#[macro_use]
mod outbox;
mod cancel;
#[cfg(test)]
mod outbox_words_tests;
mod parked;
mod postgres;
mod releases;
mod shape;
mod shop;
mod sql;
mod state;
mod tls;
mod values;
pub(crate) mod zones;

pub use connect::{PoolSettings, migrate};
pub use connect::{ShopSchema, connect_lazy, connect_timer};
pub(crate) use connect::{Stores, connect_timers, contract};
pub use dialect::Dialect;
pub(crate) use dialect::check_batch_sizes;
pub use dialect::max_batch_ids;
pub use error::StoreError;
pub(crate) use error::retry_deadlocks;
pub(crate) use ids::IdRejected;
pub use parked::ParkedFilter;
pub(crate) use parked::{NewParked, ParkedRow};
pub(crate) use releases::{Expansion, Migrated};
pub(crate) use shape::{IdKind, SchemaReport};
pub use tls::{mysql_options, pg_options};

pub use values::{
    Cancellation, HistoryCursor, NextAttempt, OrderItem, OrderState, OutboxFailure, Page, RowCursor,
};
pub(crate) use values::{
    HistoryRow, OrderFacts, OrderFailure, OutboxFacts, RowFacts, SetAsideRow, WatchMark,
};

/// The store of one timer as the service holds it: shared by every task.
pub type Store = Arc<dyn OrderStore>;

/// The database operations the service needs for one timer (a guarded
/// status flip of rows of one table, [`Timer`]), one method per operation.
/// Every method is one transaction (or one statement) and safe to repeat:
/// messages arrive at least once. Order ids passed in are canonical
/// ([`OrderStore::canonical`]).
///
/// The documentation speaks of the default timer, `cancel_unpaid`
/// ("unpaid", "cancelled"); for another timer read its `from` and `to`
/// statuses. The outbox rows of each timer are its own (the outbox is
/// keyed by timer and order id).
#[async_trait::async_trait]
pub trait OrderStore: Send + Sync + std::fmt::Debug {
    /// The timer this store flips rows for.
    fn timer(&self) -> &Timer;

    /// Reads the shop's schema, checks the configured mapping against it
    /// (table, columns, status codes, deadline, guard, `set`, `also`,
    /// items) and renders the statements. Done once; every other operation
    /// does it first if nobody has. A mapping error names its config key
    /// ([`StoreError::Schema`]).
    async fn prepare(&self) -> Result<SchemaReport, StoreError>;

    /// The order id as the shop's id column spells it (`00123` is `123` in
    /// an integer column, uuids in lower case), or why no row can have it
    /// (`abc` or `3000000000` for an `integer` column, 23 characters for a
    /// `varchar(8)` one, …): such an id matches nothing and is never sent
    /// to the database. Text ids are kept as they are. Valid after
    /// [`OrderStore::prepare`]; before, every id is text.
    fn canonical(&self, id: &OrderId) -> Result<OrderId, IdRejected>;

    /// Renders and prepares every statement template of the service for
    /// this timer (`outbox.rs`, `shop.rs`), each checked to take exactly
    /// the parameters the service binds; how many. For the test that
    /// prepares them all on both dialects.
    async fn prepare_every_template(&self) -> Result<usize, StoreError>;

    /// Looks whether the tables' shape changed since the last check (the
    /// shop widened the id column while the service runs); if so, the
    /// next statement checks the mapping again. `true` when it changed:
    /// an id [`OrderStore::canonical`] refused may fit now.
    async fn reread_shape(&self) -> bool;

    /// **The cancel transaction**, for a batch of distinct canonical order
    /// ids (any other id is reported [`OrderState::Unknown`] without being
    /// sent): cancel every order that is unpaid, overdue and passes the
    /// guard (with the `set` columns and the `also` statements) and whose
    /// row no other transaction holds (such an order is skipped, not
    /// waited for: [`OrderState::Locked`]), record its
    /// outbox row leased to the caller for `lease`, take the lease of
    /// earlier cancellations whose work is pending and whose lease ran out,
    /// and report every order's state. Commits atomically.
    async fn cancel_due(
        &self,
        ids: &[OrderId],
        lease: Duration,
    ) -> Result<Vec<(OrderId, OrderState)>, StoreError>;

    /// What this timer knows of order `id` (canonical), read without
    /// changing or locking anything: its row (status, guard, deadline), the
    /// database's clock, its outbox row and its set-aside mark. For
    /// `order-timeout explain` and the console's order page.
    async fn explain(&self, id: &OrderId) -> Result<OrderFacts, StoreError>;

    /// This timer's cancellations after `cursor` in the history's order
    /// (newest first), at most `limit`, from its outbox rows (one range of
    /// the history index), each with its order's deadline as the row says
    /// now (one read per row returned, without locks): for the console's
    /// history page.
    async fn history(
        &self,
        cursor: Option<&HistoryCursor>,
        limit: u32,
    ) -> Result<Vec<HistoryRow>, StoreError>;

    /// The items of each order (by order id), for the stock release.
    async fn items(&self, ids: &[&OrderId]) -> Result<HashMap<String, Vec<OrderItem>>, StoreError>;

    /// Unpaid orders (passing the guard) overdue by more than `grace`
    /// that this timer may still flip, with their deadlines, in (deadline,
    /// id) order after `after`, at most `limit` rows read: what the
    /// sweeper cancels, page by page. Left out: rows this timer flipped
    /// before (they have an outbox row: re-opened orders are never flipped
    /// twice) and rows set aside ([`OrderStore::set_aside`]) that have not
    /// changed since, so that neither fills every page and hides the rows
    /// behind them.
    async fn overdue(
        &self,
        grace: Duration,
        after: Option<&RowCursor>,
        limit: u32,
    ) -> Result<Page<RowCursor>, StoreError>;

    /// Rows in the `from` status (unpaid orders) passing the guard, in id
    /// order after the id `after` (exclusive; as the table spells it), at
    /// most `limit` rows read, with their deadlines: what `backfill`
    /// schedules.
    async fn waiting_page(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Page<String>, StoreError>;

    /// Sets the row of order `id` aside for the sweeper, with the `reason`
    /// its flip failed for its own values: later sweeps skip it while the
    /// row is unchanged (its digest is recorded) until the mark's
    /// `retry_at`, an hour after each of the first
    /// [`SET_ASIDE_HOURLY_TRIES`] failures and a day after later ones, so
    /// that a row that cannot flip is parked once, not at every sweep, and
    /// is still tried again when nothing changes it. A message for the
    /// order (a replay) still tries it at once. Returns the mark's
    /// attempts: 1 the first time (or the first time since the row
    /// changed); `None`: no such row.
    async fn set_aside(&self, id: &OrderId, reason: &str) -> Result<Option<u32>, StoreError>;

    /// The rows set aside (the oldest first, at most `limit`), with why,
    /// since when, how often they failed and when the sweeper tries them
    /// again: for `order-timeout set-aside list` and the console.
    async fn set_aside_rows(&self, limit: u32) -> Result<Vec<SetAsideRow>, StoreError>;

    /// Forgets the mark of the row `id` set aside (its park failed: the
    /// next sweep must find it as new).
    async fn forget_set_aside(&self, id: &OrderId) -> Result<(), StoreError>;

    /// Records this replica (`instance`, of release `version`) as
    /// serving now (`order_timeout_replicas`): what `migrate --contract`
    /// counts against the due queue's consumers.
    async fn record_replica(&self, instance: &str, version: &str) -> Result<(), StoreError>;

    /// Forgets this replica: it stopped.
    async fn forget_replica(&self, instance: &str) -> Result<(), StoreError>;

    /// The replicas that recorded themselves within `within`: `(instance,
    /// release)`.
    async fn live_replicas(&self, within: Duration) -> Result<Vec<(String, String)>, StoreError>;

    /// Records that the console session whose MAC is `session` logged
    /// out, until `until` (`order_timeout_logouts`, the same table for
    /// every timer), so that every replica refuses it.
    async fn record_logout(&self, session: &str, until: DateTime<Utc>) -> Result<(), StoreError>;

    /// The console sessions logged out that have not expired:
    /// `(MAC, expiry)`.
    async fn logouts(&self) -> Result<Vec<(String, DateTime<Utc>)>, StoreError>;

    /// Keeps a parked message in the parked store (`order_timeout_parked`,
    /// the same table for every timer): `true` if no message with its key
    /// was kept before.
    async fn keep_parked(&self, message: &NewParked<'_>) -> Result<bool, StoreError>;

    /// The parked messages `filter` names after the row id `after`, in the
    /// order they arrived, at most `limit`, each with the first `excerpt`
    /// bytes of its body (`None`: the whole body kept). Reading changes
    /// nothing.
    async fn parked_page(
        &self,
        filter: &ParkedFilter,
        after: i64,
        limit: u32,
        excerpt: Option<usize>,
    ) -> Result<Vec<ParkedRow>, StoreError>;

    /// The row ids of the parked messages `filter` names, none above
    /// `upto`, in the order they arrived: what a replay or a purge acts on.
    async fn parked_ids(&self, filter: &ParkedFilter, upto: i64) -> Result<Vec<i64>, StoreError>;

    /// The highest parked row id now (0: none): where an operation's
    /// selection ends, so that messages parked meanwhile are left alone.
    async fn parked_last_id(&self) -> Result<i64, StoreError>;

    /// How many parked messages are kept, by reason (`None`: none
    /// recorded).
    async fn parked_counts(&self) -> Result<Vec<(Option<String>, u64)>, StoreError>;

    /// Deletes the parked messages with these row ids (replayed, or
    /// purged); how many it deleted.
    async fn delete_parked(&self, ids: &[i64]) -> Result<u64, StoreError>;

    /// How many rows of the timer are set aside (the gauge).
    async fn set_aside_count(&self) -> Result<u64, StoreError>;

    /// Has the next sweep try the rows set aside of `ids` (canonical;
    /// `None`: every one of the timer's) again, instead of at their
    /// `retry_at`; returns how many marks it moved.
    async fn retry_set_aside(&self, ids: Option<&[&str]>) -> Result<u64, StoreError>;

    /// Forgets the rows set aside that have left the `from` status
    /// (flipped by a replayed message, paid, deleted); returns how many.
    async fn prune_set_aside(&self) -> Result<u64, StoreError>;

    /// Cancelled orders whose release or event is still pending after
    /// `grace`, with no live lease, not given up, and due: never failed, or
    /// past the next attempt a failure planned ([`OrderStore::record_failures`]),
    /// the longest due first — so rows that keep failing wait their backoff
    /// and newer work gets its turn. Work a crashed or parked delivery left.
    async fn stale_outbox(&self, grace: Duration, limit: u32) -> Result<Vec<OrderId>, StoreError>;

    /// Records a failed attempt at the outbox work of each of `failures`
    /// (`attempts` + 1, `last_error`), then asks `plan` what comes next for
    /// the row given its attempts so far, and records that: the next
    /// attempt after a delay, or giving up (the sweeper no longer takes the
    /// row). Returns each row's attempts and plan (rows that no longer
    /// exist are left out).
    async fn record_failures(
        &self,
        failures: &[OutboxFailure<'_>],
        plan: &(dyn for<'r, 'f> Fn(&'r OutboxFailure<'f>, u32) -> NextAttempt + Send + Sync),
    ) -> Result<Vec<(String, u32, NextAttempt)>, StoreError>;

    /// Deletes at most `limit` finished outbox rows (stock released and
    /// event published) created more than `older_than` ago, oldest first,
    /// in one short statement; returns how many. Pending and given-up rows
    /// are never deleted.
    async fn delete_finished(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError>;

    /// Gives outbox leases back early (after a failure), so the retry does
    /// not wait for them to run out.
    async fn release_leases(&self, ids: &[&str]) -> Result<(), StoreError>;

    /// Keeps the outbox leases of `ids` that are still held for another
    /// `lease` from now: their work is still in progress.
    async fn renew_leases(&self, ids: &[&str], lease: Duration) -> Result<(), StoreError>;

    /// Marks outbox work done: stock released for `released`, event
    /// published for `published`. Idempotent.
    async fn mark_done(&self, released: &[&str], published: &[&str]) -> Result<(), StoreError>;

    /// One round trip to the database, for readiness.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Takes, or keeps, the lease of this timer's watch
    /// (`order_timeout_watch`) for `holder`, for `lease`: `Some` with how
    /// far the scans have covered when `holder` holds it now, `None` when
    /// another replica does. The first call for a timer starts its scans at
    /// the database's clock (rows overdue before are the sweeper's).
    async fn watch_lease(
        &self,
        holder: &str,
        lease: Duration,
    ) -> Result<Option<WatchMark>, StoreError>;

    /// Rows in the `from` status passing the guard that fall due after
    /// `after` and not after `until`, in (deadline, id) order, at most
    /// `limit` rows read: what a watch schedules. `after` is a deadline,
    /// or a deadline and the last id read at it (the next page of rows
    /// that share a deadline).
    async fn due_between(
        &self,
        after: &RowCursor,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Page<RowCursor>, StoreError>;

    /// Records that every row due up to `until` was scheduled, if `holder`
    /// still holds the lease (`false`: it lost it; the next holder scans
    /// the range again). Never moves the mark back.
    async fn watch_advance(&self, holder: &str, until: DateTime<Utc>) -> Result<bool, StoreError>;

    /// Gives the lease back, if `holder` holds it (a graceful stop), so
    /// that another replica's next tick takes it over.
    async fn watch_release(&self, holder: &str) -> Result<(), StoreError>;
}

/// Failures of a row set aside after each of which the sweeper tries it
/// again an hour later; after more, a day later.
pub(crate) const SET_ASIDE_HOURLY_TRIES: u32 = 24;

/// The sweep's outbox scan as the sweeper runs it on `dialect`, with its
/// values written in: for a test that asks the database for its plan.
pub fn stale_statement_for_explain(
    dialect: Dialect,
    timer: &str,
    grace: Duration,
    limit: u32,
) -> String {
    match dialect {
        Dialect::Postgres => outbox::stale_written_in::<postgres::Postgres>(timer, grace, limit),
        Dialect::MySql => outbox::stale_written_in::<mysql::MySql>(timer, grace, limit),
    }
}

/// The history's statement for the page after `cursor` as the console
/// runs it on `dialect`, with its values written in: for a test that asks
/// the database for its plan.
pub fn history_statement_for_explain(
    dialect: Dialect,
    timer: &str,
    cursor: &HistoryCursor,
    limit: u32,
) -> String {
    match dialect {
        Dialect::Postgres => outbox::history_written_in::<postgres::Postgres>(timer, cursor, limit),
        Dialect::MySql => outbox::history_written_in::<mysql::MySql>(timer, cursor, limit),
    }
}
