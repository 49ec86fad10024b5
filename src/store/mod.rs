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
//! The flow around the statements is written once (`sql.rs`: the schema
//! check, canonical ids, the cancel transaction's id order and deadlock
//! retries, items, ping, migrate), over a dialect trait whose two modules
//! hold only what differs: `postgres/` and `mysql/` render their own
//! statements on the shop's tables and run their own cancel transaction
//! (`cancel.rs` in each). The statements on the service's own tables (the
//! outbox, the watch marks) are written once, in `outbox.rs`, over a small
//! vocabulary each dialect supplies. What a row *means*
//! ([`OrderState`]) is decided once, in `state.rs`, for all of them.
//! `migrate` creates only the service's own tables (prefixed
//! `order_timeout_`), never the shop's.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::message::OrderId;
use crate::settings::{ConfigError, SecretUrl, Settings, Timer, TimerName};

mod bounded;
mod catalog;
mod check;
mod error;
mod ids;
mod mysql;
#[macro_use]
mod outbox;
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

#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) use error::StoreError;
pub(crate) use ids::IdRejected;
pub use parked::ParkedFilter;
#[cfg_attr(feature = "testing", visibility::make(pub))]
#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) use parked::{NewParked, ParkedRow};
pub(crate) use releases::{Expansion, Migrated};
pub(crate) use shape::{IdKind, SchemaReport};
#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) use tls::{mysql_options, pg_options};

#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) use values::{
    Cancellation, HistoryCursor, HistoryRow, NextAttempt, OrderFacts, OrderFailure, OrderItem,
    OrderState, OutboxFacts, OutboxFailure, Page, RowCursor, RowFacts, SetAsideRow, WatchMark,
};

use mysql::MySqlStore;
use postgres::PgStore;

/// The store of one timer as the service holds it: shared by every task.
#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) type Store = Arc<dyn OrderStore>;

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

/// The default timer's mapping as the sections of the config file give
/// it: `[orders]`, `[items]` and whether stock is released over gRPC
/// (else the items are never read). A shorthand for
/// [`Timer::cancel_unpaid`], for code that knows only the default timer.
#[cfg(feature = "testing")]
#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) struct ShopSchema {
    /// `[orders]`.
    pub orders: crate::settings::OrdersMapping,
    /// `[items]`.
    pub items: crate::settings::ItemsMapping,
    /// `[inventory].release`.
    pub release: crate::settings::Release,
}

#[cfg(feature = "testing")]
impl ShopSchema {
    /// The default timer this describes.
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn timer(&self) -> Timer {
        Timer::cancel_unpaid(&self.orders, &self.items, self.release)
    }
}

/// The stores of every timer of an instance, the default one
/// (`cancel_unpaid`) first: one per timer, sharing a connection pool per
/// session time zone. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Stores {
    stores: Arc<[Store]>,
}

impl Stores {
    /// Stores of the timers `stores` (the default one first).
    pub(crate) fn new(stores: Vec<Store>) -> Self {
        Self {
            stores: stores.into(),
        }
    }

    /// The store of the timer named `name`, if the settings have one.
    pub(crate) fn get(&self, name: &TimerName) -> Option<&Store> {
        self.stores.iter().find(|s| &s.timer().name == name)
    }

    /// The default timer's store (`cancel_unpaid`), also the one the
    /// readiness probe pings.
    pub(crate) fn default_timer(&self) -> &Store {
        &self.stores[0]
    }

    /// Every timer's store, the default one first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Store> {
        self.stores.iter()
    }

    /// The timers' names, in order.
    pub(crate) fn names(&self) -> Vec<TimerName> {
        self.iter().map(|s| s.timer().name.clone()).collect()
    }
}

/// The connection pool's size and how long one of its statements may wait,
/// so that a row the shop holds, or a slow guard or deadline expression,
/// fails the statement with a transient error instead of hanging the
/// pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) struct PoolSettings {
    /// Most connections open at once.
    pub max_connections: u32,
    /// Longest wait for one lock (PostgreSQL `lock_timeout`, InnoDB
    /// `innodb_lock_wait_timeout`, in whole seconds rounded up).
    pub lock_timeout: Duration,
    /// Longest run of one statement (PostgreSQL `statement_timeout`,
    /// MariaDB `max_statement_time`, MySQL `max_execution_time`, which
    /// bounds only `SELECT`s).
    pub statement_timeout: Duration,
    /// Longest one store operation may take on the client's side, answered
    /// or not (`[liveness].database_timeout`, [`bounded`]).
    pub client_timeout: Duration,
}

impl PoolSettings {
    /// A pool of at most `max_connections` with the default timeouts.
    #[cfg(feature = "testing")]
    #[cfg_attr(feature = "testing", visibility::make(pub))]
    pub(crate) fn new(max_connections: u32) -> Self {
        let defaults = Settings::default();
        Self {
            max_connections,
            lock_timeout: defaults.db_lock_timeout,
            statement_timeout: defaults.db_statement_timeout,
            client_timeout: defaults.liveness.database_timeout,
        }
    }

    /// The pool `settings` describe (`db_max_connections`,
    /// `db_lock_timeout`, `db_statement_timeout`).
    pub(crate) fn of(settings: &Settings) -> Self {
        Self {
            max_connections: settings.db_max_connections,
            lock_timeout: settings.db_lock_timeout,
            statement_timeout: settings.db_statement_timeout,
            client_timeout: settings.liveness.database_timeout,
        }
    }

    /// The same with at most `max_connections` (the CLI's commands need
    /// one or two).
    pub(crate) fn with_max_connections(self, max_connections: u32) -> Self {
        Self {
            max_connections,
            ..self
        }
    }
}

/// Connects the default timer's store to the database `url` names, with a
/// pool of at most `max_connections` and the default timeouts, lazily: the
/// first query opens the first connection, so start-up does not fail on a
/// database that is still booting.
#[cfg(feature = "testing")]
#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) fn connect_lazy(
    url: &SecretUrl,
    max_connections: u32,
    schema: &ShopSchema,
) -> Result<Store, StoreError> {
    connect_lazy_with(url, PoolSettings::new(max_connections), schema)
}

/// [`connect_lazy`] with the pool's size and timeouts given.
#[cfg(feature = "testing")]
#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) fn connect_lazy_with(
    url: &SecretUrl,
    pool: PoolSettings,
    schema: &ShopSchema,
) -> Result<Store, StoreError> {
    connect_timer(url, pool, &schema.timer())
}

/// The store of one timer, on a pool of its own (lazily, as
/// [`connect_lazy`]).
#[cfg(feature = "testing")]
#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) fn connect_timer(
    url: &SecretUrl,
    pool: PoolSettings,
    timer: &Timer,
) -> Result<Store, StoreError> {
    let store: Store = match Dialect::of(url)? {
        Dialect::Postgres => Arc::new(PgStore::connect_lazy(url, pool, timer)?),
        Dialect::MySql => Arc::new(MySqlStore::connect_lazy(url, pool, timer)?),
    };
    Ok(Arc::new(bounded::Bounded::new(store, pool.client_timeout)))
}

/// The stores of every timer of `settings` ([`Settings::timers`]), lazily:
/// one pool of `pool`'s size per session time zone the timers use (one,
/// unless a timer sets a `time_zone` of its own), shared by the timers of
/// that zone.
pub(crate) fn connect_timers(
    url: &SecretUrl,
    pool: PoolSettings,
    timers: &[Timer],
) -> Result<Stores, StoreError> {
    fn build<D: sql::SqlDialect>(
        url: &SecretUrl,
        pool: PoolSettings,
        timers: &[Timer],
    ) -> Result<Vec<Store>, StoreError>
    where
        sql::SqlStore<D>: OrderStore,
    {
        type Pools<D> = (
            sqlx::Pool<<D as sql::SqlDialect>::Db>,
            sqlx::Pool<<D as sql::SqlDialect>::Db>,
        );
        let mut pools: HashMap<&str, Pools<D>> = HashMap::new();
        let mut stores: Vec<Store> = Vec::with_capacity(timers.len());
        for timer in timers {
            let zone = timer.time_zone.as_str();
            let (on, own) = match pools.get(zone) {
                Some(p) => p.clone(),
                None => {
                    let p = sql::SqlStore::<D>::pools(url, pool, zone)?;
                    pools.insert(zone, p.clone());
                    p
                }
            };
            let store: Store = Arc::new(sql::SqlStore::<D>::on_pool(on, own, timer));
            stores.push(Arc::new(bounded::Bounded::new(store, pool.client_timeout)));
        }
        Ok(stores)
    }
    if timers.is_empty() {
        return Err(StoreError::Schema {
            key: "[orders]",
            problem: "no timers to run".into(),
        });
    }
    Ok(Stores::new(match Dialect::of(url)? {
        Dialect::Postgres => build::<postgres::Postgres>(url, pool, timers)?,
        Dialect::MySql => build::<mysql::MySql>(url, pool, timers)?,
    }))
}

/// Creates the database if it does not exist, then applies the service's
/// own migrations (the `order_timeout_*` tables; never the shop's). What
/// they keep for the previous release stays until [`contract`], unless the
/// database had none of the service's tables.
#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) async fn migrate(url: &SecretUrl) -> Result<Migrated, StoreError> {
    match Dialect::of(url)? {
        Dialect::Postgres => PgStore::migrate(url).await,
        Dialect::MySql => MySqlStore::migrate(url).await,
    }
}

/// Drops what the migrations keep for the previous release (`migrate
/// --contract`, once no replica of it runs); returns what was there.
pub(crate) async fn contract(url: &SecretUrl) -> Result<Vec<Expansion>, StoreError> {
    match Dialect::of(url)? {
        Dialect::Postgres => PgStore::contract(url).await,
        Dialect::MySql => MySqlStore::contract(url).await,
    }
}

/// How many order ids one cancel transaction of `dialect` can carry, so
/// that the settings can refuse a batch size over it: MySQL's statements
/// have at most 65,535 placeholders and the cancel transaction's outbox
/// insert binds four per order (16,383 ids); PostgreSQL binds the ids as
/// one array, with no such limit (`usize::MAX`).
#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) fn max_batch_ids(dialect: Dialect) -> usize {
    use sql::SqlDialect;
    match dialect {
        Dialect::Postgres => postgres::Postgres::MAX_BATCH_IDS,
        Dialect::MySql => mysql::MySql::MAX_BATCH_IDS,
    }
}

/// Refuses, naming the key, a batch size that one cancel transaction of
/// `DATABASE_URL`'s dialect cannot carry ([`max_batch_ids`]): the store
/// would split such a batch into several transactions, so the setting would
/// not mean what it says. A URL of no known dialect is left to
/// [`connect_lazy`], which names it.
pub(crate) fn check_batch_sizes(settings: &Settings) -> Result<(), ConfigError> {
    let Ok(dialect) = Dialect::of(&settings.database_url) else {
        return Ok(());
    };
    let max = max_batch_ids(dialect);
    let sizes: [(&'static str, usize); 2] = [
        ("batch_max", settings.batch_max),
        (
            "[sweeper].batch",
            usize::try_from(settings.sweeper.batch).unwrap_or(usize::MAX),
        ),
    ];
    for (key, value) in sizes {
        if value > max {
            return Err(ConfigError::Invalid {
                key,
                problem: format!(
                    "{value} orders per cancel transaction is over what one statement can carry \
                     on {dialect:?} ({max}: 65,535 placeholders, 4 per order)"
                ),
            });
        }
    }
    Ok(())
}

/// The SQL dialects the service speaks, picked by `DATABASE_URL`'s scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` (MySQL 5.7/8, MariaDB 10.x).
    MySql,
}

impl Dialect {
    /// The dialect of `url`.
    pub fn of(url: &SecretUrl) -> Result<Self, StoreError> {
        let scheme = url.expose().split_once("://").map(|(s, _)| s);
        match scheme {
            Some("postgres" | "postgresql") => Ok(Self::Postgres),
            Some("mysql" | "mariadb") => Ok(Self::MySql),
            _ => Err(StoreError::Scheme { url: url.clone() }),
        }
    }
}

/// Failures of a row set aside after each of which the sweeper tries it
/// again an hour later; after more, a day later.
pub(crate) const SET_ASIDE_HOURLY_TRIES: u32 = 24;

/// How often a cancel transaction that the database chose as a deadlock
/// victim is run again at once, before the failure goes to the retry
/// policy (which would cost the batch a second or more).
pub(crate) const DEADLOCK_RETRIES: u32 = 5;

/// Runs `attempt` again, a few milliseconds later, while it fails because
/// the database broke a deadlock by aborting it (SQLSTATE 40001 or 40P01;
/// MySQL 1213): "try restarting transaction" is the documented answer, and
/// `also` statements touching the same stock rows from concurrent batches
/// make such deadlocks part of normal operation (measured with `bench
/// --stock also` on MariaDB: p99 lateness 23 s without this).
pub(crate) async fn retry_deadlocks<T, F, Fut>(mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut tries = 1;
    loop {
        match attempt().await {
            Err(e) if e.is_deadlock() && tries < DEADLOCK_RETRIES => {
                tracing::debug!(error = %e, tries, "deadlock victim; running the transaction again");
                tokio::time::sleep(Duration::from_millis(3 * u64::from(tries))).await;
                tries += 1;
            }
            result => return result,
        }
    }
}

impl StoreError {
    /// The database aborted the transaction to break a deadlock (or a
    /// serialization conflict): running it again is the answer.
    pub fn is_deadlock(&self) -> bool {
        match self {
            Self::Sql(sqlx::Error::Database(e)) => {
                matches!(e.code().as_deref(), Some("40001" | "40P01"))
            }
            _ => false,
        }
    }

    /// The statement waited for a row lock another transaction held for
    /// longer than `db_lock_timeout` (PostgreSQL 55P03, MySQL 1205, and
    /// 3572 for `NOWAIT`): not a failure of the order, which is asked
    /// about again shortly.
    pub fn is_lock_timeout(&self) -> bool {
        match self {
            Self::Sql(sqlx::Error::Database(e)) => {
                if let Some(class) = mysql::error_class(e.as_ref()) {
                    return class == mysql::ErrorClass::LockTimeout;
                }
                e.code().as_deref() == Some("55P03")
            }
            _ => false,
        }
    }

    /// Whether waiting cannot fix this error, so that retrying the same
    /// work later would fail the same way (the pipeline parks such work at
    /// once instead of spending its retries).
    ///
    /// Permanent: configuration and schema errors, and SQL errors about the
    /// statement or the data — SQLSTATE classes 42 (syntax, undefined table
    /// or column, privilege), 22 (data exception: out of range, invalid
    /// text, division by zero), 23 (integrity), 21 (cardinality), 0A (not
    /// supported), 3D/3F (no such database/schema), 44, 27, 54, 2F/38/39
    /// and P0/45 (routines, triggers and `SIGNAL`s raising errors), and the
    /// MySQL numbers filed under the generic `HY000` that mean the same
    /// (1366 incorrect value, 1292 truncated value, 1364 no default, 3819
    /// check constraint, 1093/1442 statements MySQL refuses); and values the
    /// driver cannot encode or decode.
    ///
    /// Transient: connection, pool, I/O and TLS errors; timeouts (PostgreSQL
    /// 57014, MySQL 1969/3024/1317), deadlocks and serialization failures
    /// (class 40, MySQL 1213), lock waits (55P03, MySQL 1205/3572), server
    /// shutdown and restarts (classes 08, 57, 58, MySQL 1053/1927), read-only
    /// servers during a failover (25006, MySQL 1290/1836), resource limits
    /// (class 53, MySQL 1040/1203/1226), and anything not recognised.
    /// Login errors (class 28, MySQL 1044/1045) count as transient too: they
    /// are about the connection, not the work, and a rotated credential
    /// fixes them without anyone replaying the messages they would park.
    pub fn is_permanent(&self) -> bool {
        /// SQLSTATE classes of errors about the statement or the data.
        const PERMANENT_CLASSES: [&str; 15] = [
            "42", "22", "23", "21", "0A", "3D", "3F", "44", "27", "54", "2F", "38", "39", "P0",
            "45",
        ];
        fn database(e: &dyn sqlx::error::DatabaseError) -> bool {
            match mysql::error_class(e) {
                Some(mysql::ErrorClass::Row | mysql::ErrorClass::Statement) => return true,
                Some(mysql::ErrorClass::Transient | mysql::ErrorClass::LockTimeout) => {
                    return false;
                }
                None => {}
            }
            let code = e.code();
            let class = code.as_deref().and_then(|c| c.get(..2)).unwrap_or("");
            PERMANENT_CLASSES.contains(&class)
        }
        fn sql(e: &sqlx::Error) -> bool {
            match e {
                sqlx::Error::Database(e) => database(e.as_ref()),
                sqlx::Error::Configuration(_)
                | sqlx::Error::InvalidArgument(_)
                | sqlx::Error::TypeNotFound { .. }
                | sqlx::Error::ColumnIndexOutOfBounds { .. }
                | sqlx::Error::ColumnNotFound(_)
                | sqlx::Error::ColumnDecode { .. }
                | sqlx::Error::Encode(_)
                | sqlx::Error::Decode(_)
                | sqlx::Error::InvalidSavePointStatement => true,
                sqlx::Error::Migrate(e) => migrate(e),
                _ => false,
            }
        }
        fn migrate(e: &sqlx::migrate::MigrateError) -> bool {
            match e {
                sqlx::migrate::MigrateError::Execute(e)
                | sqlx::migrate::MigrateError::ExecuteMigration(e, _) => sql(e),
                _ => true,
            }
        }
        match self {
            Self::Sql(e) => sql(e),
            Self::Migrate(e) => migrate(e),
            Self::Widespread { error, .. } => error.is_permanent(),
            Self::Unanswered { .. } => false,
            Self::Url { .. }
            | Self::Tls(_)
            | Self::TlsWithoutMode { .. }
            | Self::Scheme { .. }
            | Self::Schema { .. } => true,
        }
    }

    /// Whether the error is about the row's own values, so that another
    /// order would not fail the same way: only then is an order parked
    /// and its row set aside. SQLSTATE classes 22 (a value out of range,
    /// invalid text, division by zero), 23 (a constraint: unique, not
    /// null, foreign key, CHECK), 21 (a subquery of more than one row),
    /// 27 and 44 (triggered data change, `WITH CHECK OPTION`), P0 (a
    /// trigger's `RAISE`), 45 (MySQL's `SIGNAL`), 2F/38/39 (a routine
    /// failing), the MySQL numbers of the same under `HY000`, and a value
    /// the driver cannot decode.
    ///
    /// Everything else is **the world's**: a missing privilege, table,
    /// column or function, a syntax error, a statement the server refuses
    /// whatever the row, a lost connection, a timeout, the mapping (a
    /// [`StoreError::Schema`]). Such a failure would hit any order: it is
    /// retried with backoff for as long as it lasts, and readiness and an
    /// alert say so, but it never parks or sets aside an order, so that
    /// fixing the environment (a `GRANT`, the table back) is all it takes.
    pub fn is_row_fault(&self) -> bool {
        /// SQLSTATE classes of errors about the row's values.
        const ROW_CLASSES: [&str; 10] =
            ["22", "23", "21", "27", "44", "P0", "45", "2F", "38", "39"];
        match self {
            Self::Sql(sqlx::Error::Database(e)) => match mysql::error_class(e.as_ref()) {
                Some(class) => class == mysql::ErrorClass::Row,
                None => {
                    let code = e.code();
                    let class = code.as_deref().and_then(|c| c.get(..2)).unwrap_or("");
                    ROW_CLASSES.contains(&class)
                }
            },
            Self::Sql(sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)) => true,
            _ => false,
        }
    }

    /// Whether waiting cannot fix it and no row is to blame: an error about
    /// the statement or the schema (a table or column missing, a type that
    /// changed, a syntax error), after which the store looks whether the
    /// tables' shape changed.
    pub(crate) fn is_about_the_statement(&self) -> bool {
        self.is_permanent() && !self.is_row_fault()
    }

    /// The SQLSTATE (or MySQL error number) of a database error, to tell
    /// whether several orders failed the same way.
    pub(crate) fn code(&self) -> Option<String> {
        match self {
            Self::Sql(sqlx::Error::Database(e)) => {
                match e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                    Some(my) => Some(my.number().to_string()),
                    None => e.code().map(|c| c.into_owned()),
                }
            }
            Self::Widespread { error, .. } => error.code(),
            _ => None,
        }
    }

    /// A configuration error (retrying cannot help).
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            Self::Schema { .. }
                | Self::Url { .. }
                | Self::Scheme { .. }
                | Self::Tls(_)
                | Self::TlsWithoutMode { .. }
        )
    }
}

// Hand-written (not `#[from]`) so the inner error is shown once, in the
// message, and not again as a `source` in `{:#}` chains.
/// The sweep's outbox scan as the sweeper runs it on `dialect`, with its
/// values written in: for a test that asks the database for its plan.
#[cfg(feature = "testing")]
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
#[cfg(feature = "testing")]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_sizes_over_the_dialects_limit_are_refused_with_the_key() {
        let mut settings = Settings {
            database_url: SecretUrl::new("mysql://root@127.0.0.1/shop"),
            ..Settings::default()
        };
        settings.batch_max = max_batch_ids(Dialect::MySql);
        assert!(
            check_batch_sizes(&settings).is_ok(),
            "the limit itself fits"
        );
        settings.batch_max += 1;
        let err = check_batch_sizes(&settings).unwrap_err().to_string();
        assert!(err.starts_with("config batch_max: 16384 orders"), "{err}");
        settings.batch_max = 200;
        settings.sweeper.batch = 20_000;
        let err = check_batch_sizes(&settings).unwrap_err().to_string();
        assert!(err.starts_with("config [sweeper].batch: 20000"), "{err}");
        // PostgreSQL binds one array: no such limit.
        settings.database_url = SecretUrl::new("postgres://postgres@127.0.0.1/shop");
        settings.batch_max = 1_000_000;
        assert!(check_batch_sizes(&settings).is_ok());
    }
}
