//! The store's flow, written once for every SQL dialect: [`SqlStore`]
//! implements [`OrderStore`] over a [`SqlDialect`], and a dialect module
//! (`postgres/`, `mysql/`) holds only what differs: its connection
//! options, reading a table's columns, how it binds values and runs the
//! timer's `also` statements, its error numbers, and the words of the
//! vocabulary every statement is written in once (`shop.rs` on the shop's
//! tables, `outbox.rs` on the service's own, `cancel.rs` the cancel
//! transaction).
//!
//! Shared here: canonical ids (an id no row can have is never sent), the
//! id order and deadlock retries of the cancel transaction and the mapping
//! of its rows to order states, the items by order, the pools' common
//! settings and ping. `migrate` and `migrate --contract` are in
//! `migrate.rs`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::{StreamExt, stream};
use sqlx::{Connection, Pool};

use super::catalog::Columns;
use super::ids::{IdColumn, IdRejected, IdValue};
use super::outbox::{self, Mapped, OwnRow, OwnTables, Statement, Vocabulary};
use super::parked::{self, NewParked, ParkedFilter, ParkedRow};
use super::releases::Expansion;
use super::shape::{self, OrdersColumns, SchemaReport};
use super::zones::ZoneFacts;
use super::{
    Dialect, HistoryCursor, HistoryRow, NextAttempt, OrderFacts, OrderFailure, OrderItem,
    OrderState, OrderStore, OutboxFailure, Page, PoolSettings, RowCursor, SetAsideRow, StoreError,
    WatchMark,
};
use crate::message::OrderId;
use crate::settings::{SecretUrl, StatusValue, Timer};

/// What one SQL dialect does its own way. Its methods are the dialect's
/// statements; everything around them is [`SqlStore`]'s.
pub(crate) trait SqlDialect:
    Vocabulary + fmt::Debug + Send + Sync + Sized + 'static
{
    /// The columns of the outbox table this version's statements use on
    /// this dialect alone, beside the shared ones (`shape::OUTBOX_COLUMNS`).
    const OUTBOX_COLUMNS: &'static [&'static str] = &[];
    /// The sqlx database.
    type Db: sqlx::Database;
    /// The statements rendered from the mapping.
    type Statements: fmt::Debug + Send + Sync;

    /// A pool on `url` of `pool`'s size, connecting lazily, whose sessions
    /// read zone-less times in `time_zone` (`None`: the server's default
    /// for new sessions, left as it is) and wait for locks and statements
    /// at most `pool`'s timeouts.
    fn pool(
        url: &SecretUrl,
        pool: PoolSettings,
        time_zone: Option<&str>,
    ) -> Result<Pool<Self::Db>, StoreError>;

    /// How to connect to `url`, with sessions that read zone-less times in
    /// `time_zone` (`None`: the server's default).
    fn connect_options(
        url: &SecretUrl,
        time_zone: Option<&str>,
    ) -> Result<<Conn<Self> as sqlx::Connection>::Options, StoreError>;

    /// Creates the database `url` names if it does not exist.
    fn create_database(url: &SecretUrl) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A query of one boolean: whether the database has none of the
    /// service's tables yet.
    const FRESH: &'static str;

    /// Applies the service's own migrations (`migrations/<dialect>/`),
    /// recorded in their own table, `order_timeout_migrations`, so they
    /// never mix with the shop's own sqlx migrations in a shared database.
    /// (Not `Send`: sqlx's migrator cannot prove it for a borrowed
    /// connection.)
    fn run_migrations(conn: &mut Conn<Self>) -> impl Future<Output = Result<(), StoreError>>;

    /// What the migrations keep for the previous release
    /// ([`super::releases`]).
    const EXPANSIONS: &'static [Expansion];

    /// The time zones as [`super::zones`] needs them: the zone of a
    /// session of the store's pool and its offsets, the zone a session of
    /// the server's own defaults starts in, and the zones other sessions
    /// of the database start in.
    fn zone_facts(
        store: &SqlStore<Self>,
    ) -> impl Future<Output = Result<ZoneFacts, StoreError>> + Send;

    /// Whether the server knows the configured `time_zone` (none
    /// configured: nothing to know), asked on a connection of its own
    /// before the pool's first: a pool whose sessions cannot set their zone
    /// only times out, which would hide the reason.
    fn check_zone(store: &SqlStore<Self>) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A table's columns; empty when there is no such table.
    fn columns(
        store: &SqlStore<Self>,
        table: &str,
    ) -> impl Future<Output = Result<Columns, StoreError>> + Send;

    /// The dialect's own statements (the cancel transaction's) for the
    /// mapping and the orders table's columns, with what binding them
    /// takes.
    fn statements(
        store: &SqlStore<Self>,
        orders: &OrdersColumns,
    ) -> impl Future<Output = Result<Self::Statements, StoreError>> + Send;

    /// Prepares `statement` on a connection of the pool (nothing is run):
    /// its parameters and columns as the server describes them.
    fn prepare(
        store: &SqlStore<Self>,
        statement: String,
    ) -> impl Future<Output = Result<<Self::Db as sqlx::Database>::Statement, sqlx::Error>> + Send;

    /// How the order id is bound to every parameter of one `also`
    /// statement.
    type AlsoParams: fmt::Debug + Send + Sync;

    /// How the order id is bound to each parameter of the prepared `also`
    /// statement, or why it cannot be (a parameter of a type no id is).
    fn also_parameters(
        statement: &<Self::Db as sqlx::Database>::Statement,
    ) -> Result<Self::AlsoParams, String>;

    /// Whether the status codes `a` and `b` compare equal in the timer's
    /// status column (its type and collation: letter case and trailing
    /// spaces may not count).
    fn same_code(
        store: &SqlStore<Self>,
        orders: &OrdersColumns,
        a: &StatusValue,
        b: &StatusValue,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Which of `tables` nothing vacuums: on PostgreSQL all of them when
    /// the server runs with `autovacuum = off`, else those whose own
    /// `autovacuum_enabled` is off; none on MySQL (InnoDB purges old row
    /// versions itself). Every cancellation leaves a dead row version in
    /// the orders table and the outbox: unvacuumed, they slow every
    /// statement on those tables down over hours.
    fn unvacuumed(
        _store: &SqlStore<Self>,
        _tables: &[&str],
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Whether the server skips rows another transaction holds (`FOR
    /// UPDATE SKIP LOCKED`: MySQL from 8.0.1, MariaDB from 10.6,
    /// PostgreSQL).
    fn skips_locked(_sql: &Self::Statements) -> bool {
        true
    }

    /// The timer's `also` statements for the order `id`, which the cancel
    /// transaction on `conn` has just flipped ([`super::cancel`]): the
    /// slots of the keys its `also_keys` query returns locked first, in
    /// ascending order ([`super::outbox::ALSO_LOCKS`]), and each statement
    /// waiting at most [`ALSO_LOCK_WAIT`] for a row the shop holds.
    fn also(
        conn: &mut Conn<Self>,
        store: &SqlStore<Self>,
        prepared: &Prepared<Self>,
        id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Runs a rendered statement ([`super::outbox`], [`super::shop`],
    /// [`super::cancel`]) on `conn` (of a pool, or a transaction's); the
    /// rows it changed.
    fn execute(
        conn: &mut Conn<Self>,
        statement: Statement<'_>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Runs a rendered query on `conn`; its rows (see
    /// [`SqlDialect::execute`]).
    fn fetch<T: OwnRow>(
        conn: &mut Conn<Self>,
        statement: Statement<'_>,
    ) -> impl Future<Output = Result<Vec<T>, StoreError>> + Send;
}

/// A dialect's connection.
pub(crate) type Conn<D> = <<D as SqlDialect>::Db as sqlx::Database>::Connection;

/// What every pool of `pool`'s size does, whatever its dialect: waits at
/// most 5 s for a free connection, and closes a released connection whose
/// operation was abandoned unanswered (`store/bounded.rs`) rather than
/// reusing it.
pub(crate) fn pool_options<D: SqlDialect>(pool: PoolSettings) -> sqlx::pool::PoolOptions<D::Db> {
    sqlx::pool::PoolOptions::new()
        .max_connections(pool.max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .after_release(|conn, _| Box::pin(super::bounded::release_check(conn)))
}

/// The type name of a prepared statement's first column, as the server
/// describes it; empty when it returns none.
pub(crate) fn first_column_type(statement: &impl sqlx::Statement) -> String {
    let first = sqlx::Statement::columns(statement).first();
    first.map_or_else(String::new, |column| {
        sqlx::TypeInfo::name(sqlx::Column::type_info(column)).to_owned()
    })
}

/// How many parameters a prepared statement takes.
pub(crate) fn parameter_count(statement: &impl sqlx::Statement) -> usize {
    sqlx::Statement::parameters(statement).map_or(0, |p| p.either(|t| t.len(), |n| n))
}

/// A rendered statement the check prepares: the config key a failure
/// names, the statement, and how many parameters the service binds to it
/// (a placeholder written into a guard, a deadline or a `set` value would
/// shift every value after it).
#[derive(Debug)]
pub(crate) struct Check {
    /// The config key a failure names.
    pub(crate) key: &'static str,
    /// The statement.
    pub(crate) sql: String,
    /// Its parameters, as the service binds them.
    pub(crate) binds: usize,
}

/// A waiting row's id and deadline (NULL: none), as a page of
/// [`SqlDialect::waiting_page`] reads it.
pub(crate) type PageRow = (String, Option<DateTime<Utc>>);

/// One line of an order as the items query reads it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ItemRow {
    /// The order id, as the items table spells it.
    pub(crate) order_id: String,
    /// Stock keeping unit.
    pub(crate) sku: String,
    /// Units reserved.
    pub(crate) quantity: i64,
}

/// The store of one timer on one SQL dialect: a connection pool (shared
/// with the other timers of the same session time zone), the timer's
/// mapping, and what the schema check found (once).
#[derive(Debug)]
pub(crate) struct SqlStore<D: SqlDialect> {
    /// The database, for the one session of the server's own defaults the
    /// check opens to read its time zones (`store::zones`).
    pub(super) url: SecretUrl,
    /// The shop's tables: the cancel transaction, the scans, the items.
    pub(super) pool: Pool<D::Db>,
    /// The service's own tables (outbox marks, leases, the watch, the rows
    /// set aside) and readiness' ping, on connections of their own
    /// ([`OWN_CONNECTIONS`]): work that must not wait behind orders whose
    /// rows the shop holds.
    pub(super) own: Pool<D::Db>,
    pub(super) timer: Timer,
    /// The statements and the tables' shape of the last check; `None`
    /// before the first, or once the shape changed ([`SqlStore::reread_shape`]).
    prepared: std::sync::RwLock<Option<Arc<Prepared<D>>>>,
    /// Held while a check runs, so that one runs at a time.
    checking: tokio::sync::Mutex<()>,
    /// When the tables' shape was last compared with the check's.
    shape_read_at: std::sync::Mutex<Option<Instant>>,
    /// The last order id of the set-aside marks the last prune looked at
    /// (empty: start from the first).
    pub(super) prune_after: std::sync::Mutex<String>,
}

/// A timer's pools: the shop's tables', the service's own.
pub(crate) type Pools<D> = (Pool<<D as SqlDialect>::Db>, Pool<<D as SqlDialect>::Db>);

/// Connections kept for the service's own tables and readiness, beside
/// `db_max_connections` for the shop's: however many orders wait for rows
/// the shop holds, `mark_done`, the leases and readiness get one.
pub(crate) const OWN_CONNECTIONS: u32 = 2;

/// How long an `also` statement waits for a row the shop holds (a stock
/// row a checkout has locked) before its order is asked about again a
/// second or more later ([`super::OrderState::Locked`]), instead of holding
/// a connection for `db_lock_timeout` while the other orders of its batch
/// wait. PostgreSQL takes it as it is (`SET LOCAL lock_timeout`); MariaDB
/// counts whole seconds (`SET STATEMENT innodb_lock_wait_timeout = 1`).
pub(crate) const ALSO_LOCK_WAIT: Duration = Duration::from_millis(200);

/// The least time between two looks at whether the tables' shape changed
/// (one `information_schema` query per table): ids that do not fit the
/// id column, or a statement failing with a shape error, ask for one.
const SHAPE_LOOK_EVERY: Duration = Duration::from_secs(1);

/// The statements rendered from the mapping, and what the check found.
#[derive(Debug)]
pub(crate) struct Prepared<D: SqlDialect> {
    /// The dialect's statements.
    pub(crate) sql: D::Statements,
    /// The mapping's words, for the templates on the shop's tables.
    pub(crate) mapped: Mapped,
    /// The table's id column.
    pub(crate) id: IdColumn,
    /// The config key that names it (`[orders].id`, `[[timers]].id`).
    pub(crate) id_key: &'static str,
    /// The items table's order id column, when the items are read.
    pub(crate) items_id: Option<IdColumn>,
    /// How each `also` statement's parameters are bound the order id.
    pub(crate) also_params: Vec<D::AlsoParams>,
    /// How the `also_keys` query's parameters are bound the order id, when
    /// the timer has one.
    pub(crate) also_keys: Option<D::AlsoParams>,
    /// What `schema check` prints.
    pub(crate) report: SchemaReport,
    /// The columns (name and type) of the orders table and of the items
    /// table (when read) as the check saw them: what tells a changed shape.
    pub(crate) shape: Vec<(String, String)>,
}

impl<D: SqlDialect> SqlStore<D> {
    /// A store on `url` with a pool of `pool`'s size and timeouts,
    /// lazily: the first query opens the first connection, so start-up
    /// does not fail on a database that is still booting.
    pub(crate) fn connect_lazy(
        url: &SecretUrl,
        pool: PoolSettings,
        timer: &Timer,
    ) -> Result<Self, StoreError> {
        let (pool, own) = Self::pools(url, pool, timer.time_zone.as_deref())?;
        Ok(Self::on_pool(url, pool, own, timer))
    }

    /// The store of `timer` on existing pools (whose sessions read
    /// zone-less times in the timer's time zone): `pool` for the shop's
    /// tables, `own` for the service's.
    pub(crate) fn on_pool(
        url: &SecretUrl,
        pool: Pool<D::Db>,
        own: Pool<D::Db>,
        timer: &Timer,
    ) -> Self {
        Self {
            url: url.clone(),
            pool,
            own,
            timer: timer.clone(),
            prepared: std::sync::RwLock::new(None),
            checking: tokio::sync::Mutex::new(()),
            shape_read_at: std::sync::Mutex::new(None),
            prune_after: std::sync::Mutex::new(String::new()),
        }
    }

    /// The pools on `url` for the timers of `time_zone`: the shop's
    /// tables' of `pool`'s size, and the service's own tables' of
    /// [`OWN_CONNECTIONS`].
    pub(crate) fn pools(
        url: &SecretUrl,
        pool: PoolSettings,
        time_zone: Option<&str>,
    ) -> Result<Pools<D>, StoreError> {
        let own = PoolSettings {
            max_connections: OWN_CONNECTIONS,
            ..pool
        };
        Ok((
            D::pool(url, pool, time_zone)?,
            D::pool(url, own, time_zone)?,
        ))
    }

    /// Prepares `statement` (nothing is run): how many parameters it takes.
    pub(super) async fn parameters(&self, statement: &str) -> Result<usize, sqlx::Error> {
        let prepared = D::prepare(self, statement.to_owned()).await?;
        Ok(parameter_count(&prepared))
    }

    /// The type name of the one column `query` returns, as the server
    /// describes it when preparing it (nothing is run).
    pub(super) async fn result_type(&self, query: String) -> Result<String, sqlx::Error> {
        Ok(first_column_type(&D::prepare(self, query).await?))
    }

    /// The statements and shape of the last check, checking first if
    /// there is none.
    pub(super) async fn prepared(&self) -> Result<Arc<Prepared<D>>, StoreError> {
        if let Some(prepared) = self.current() {
            return Ok(prepared);
        }
        let _one = self.checking.lock().await;
        if let Some(prepared) = self.current() {
            return Ok(prepared);
        }
        // A mapping error of another timer than the default one says
        // which: its keys (`[[timers]].deadline`) do not.
        let prepared = Arc::new(self.check().await.map_err(|e| match e {
            StoreError::Schema { key, problem } => StoreError::Schema {
                key,
                problem: self.timer.problem(problem),
            },
            // MySQL 1298; PostgreSQL 22023 for its `TimeZone` at connect.
            other
                if other.code().as_deref() == Some("1298")
                    || (other.code().as_deref() == Some("22023")
                        && other.to_string().to_lowercase().contains("zone")) =>
            {
                StoreError::Schema {
                    key: self.timer.key(crate::settings::TimerKey::TimeZone),
                    problem: self.timer.problem(format!(
                        "the server does not know the time zone {:?} ({other}): write it as an \
                     offset such as \"+08:00\", or load the server's time zone tables \
                     (mariadb-tzinfo-to-sql /usr/share/zoneinfo | mariadb mysql)",
                        self.timer.time_zone.as_deref().unwrap_or_default()
                    )),
                }
            }
            other => other,
        })?);
        *self.prepared.write().unwrap_or_else(|e| e.into_inner()) = Some(prepared.clone());
        *self.shape_read_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        Ok(prepared)
    }

    fn current(&self) -> Option<Arc<Prepared<D>>> {
        self.prepared
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Looks whether the tables' shape changed since the last check (a
    /// column widened from `varchar(16)` to `varchar(32)` or `int` to
    /// `bigint`, a column renamed or dropped, the items table's order id
    /// widened) while the service runs, and if it did, forgets the check,
    /// so that the next statement checks again and renders its statements
    /// for the new shape. At most every [`SHAPE_LOOK_EVERY`]; `true` when
    /// the shape changed.
    pub(crate) async fn reread_shape(&self) -> bool {
        let Some(prepared) = self.current() else {
            return false;
        };
        {
            let mut read_at = self.shape_read_at.lock().unwrap_or_else(|e| e.into_inner());
            if read_at.is_some_and(|at| at.elapsed() < SHAPE_LOOK_EVERY) {
                return false;
            }
            *read_at = Some(Instant::now());
        }
        let shape = match self.shape().await {
            Ok(shape) => shape,
            Err(e) => {
                tracing::debug!(error = %e, timer = %self.timer.name, "cannot read the tables' shape");
                return false;
            }
        };
        if shape == prepared.shape {
            return false;
        }
        tracing::warn!(timer = %self.timer.name, table = %self.timer.table, "the tables' shape changed since the last check: checking the mapping again");
        let mut current = self.prepared.write().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|p| Arc::ptr_eq(p, &prepared)) {
            *current = None;
        }
        true
    }

    /// The tables' shape as it is now ([`tables_shape`]).
    async fn shape(&self) -> Result<Vec<(String, String)>, StoreError> {
        let orders = D::columns(self, &self.timer.table).await?;
        let items = match self.timer.release {
            crate::settings::Release::Grpc => {
                Some(D::columns(self, &self.timer.items.table).await?)
            }
            crate::settings::Release::None => None,
        };
        Ok(tables_shape(&self.timer, &orders, items.as_ref()))
    }

    /// `result`, after looking whether the tables' shape changed when it is
    /// an error about the statement (a column or table missing, a type
    /// mismatch), so that the next try runs statements for the new shape.
    async fn after<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &result
            && e.is_about_the_statement()
        {
            self.reread_shape().await;
        }
        result
    }
}

/// What [`Prepared::shape`] holds: the columns (name and type) of
/// `timer`'s orders table and, when read, of its items table, as sorted
/// `(table.column, type)` pairs.
pub(super) fn tables_shape(
    timer: &Timer,
    orders: &Columns,
    items: Option<&Columns>,
) -> Vec<(String, String)> {
    let tables = std::iter::once((timer.table.as_str(), orders))
        .chain(items.map(|columns| (timer.items.table.as_str(), columns)));
    let mut shape: Vec<(String, String)> = tables
        .flat_map(|(table, columns)| {
            columns
                .values()
                .map(move |c| (format!("{table}.{}", c.name), c.shown.clone()))
        })
        .collect();
    shape.sort();
    shape
}

/// Commits `tx` when `result` is a success, else rolls it back at once (not
/// when the connection is next used, as dropping it would): the rows it
/// locked are free before the caller runs the batch again order by order.
pub(crate) async fn commit_or_roll_back<DB: sqlx::Database, T>(
    tx: sqlx::Transaction<'static, DB>,
    result: Result<T, StoreError>,
) -> Result<T, StoreError> {
    match result {
        Ok(value) => {
            tx.commit().await?;
            Ok(value)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

impl<D: SqlDialect> SqlStore<D> {
    /// The cancel transaction for `ids` in batches (more ids than one
    /// transaction can carry go in several, one after the other: the
    /// settings refuse such a batch size, and a MySQL statement over its
    /// placeholder limit never answers). A batch that fails because of a
    /// row's values (a trigger, a CHECK constraint or a `set` value failing
    /// for one row: [`StoreError::is_row_fault`]), or that waited in vain
    /// for a row lock it could not skip (MySQL before 8.0.1 / MariaDB
    /// 10.6), is run again order by order ([`SqlStore::cancel_each`]), so
    /// that the failure stays with the orders it belongs to and the others
    /// are cancelled now. A batch of one order is no exception: its order
    /// fails as it would among many ([`OrderState::Failed`]). Any other
    /// failure (the connection, a privilege, a missing table) is the
    /// world's, and the batch's.
    async fn cancel_batch(
        &self,
        prepared: &Prepared<D>,
        ids: &[&str],
        lease: Duration,
    ) -> Result<HashMap<String, OrderState>, StoreError> {
        let mut states = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(D::MAX_BATCH_IDS) {
            let cancel = || super::cancel::cancel(self, prepared, chunk, lease);
            match super::retry_deadlocks(cancel).await {
                Ok(rows) => states.extend(rows.into_iter().map(|r| {
                    let state = r.state();
                    (r.id, state)
                })),
                Err(e) if e.is_row_fault() || e.is_lock_timeout() => {
                    tracing::warn!(orders = chunk.len(), timer = %self.timer.name, error = %e, "the cancel transaction failed for a batch; running it order by order to find the orders the failure belongs to");
                    states.extend(self.cancel_each(prepared, chunk, lease).await);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(states)
    }

    /// The cancel transaction for each of `ids` on its own, a few at a
    /// time. A timer with `also` statements always cancels this way: its
    /// statements update the shop's rows (stock, coupons), and an order
    /// whose statement waits for a row the shop holds, or fails for that
    /// order alone, then delays or fails only itself, never a batch (one
    /// transaction per batch, run one at a time to keep batches from
    /// deadlocking on hot stock rows, made one held row stall every
    /// batch). A lock waited for in vain is [`OrderState::Locked`] (asked
    /// about again shortly, costing no attempt); any other failure
    /// [`OrderState::Failed`].
    async fn cancel_each(
        &self,
        prepared: &Prepared<D>,
        ids: &[&str],
        lease: Duration,
    ) -> HashMap<String, OrderState> {
        // A share of the shop's pool per batch, so that the batches running
        // at once leave connections for each other; an order whose `also`
        // statement waits for a row the shop holds waits briefly
        // (`ALSO_LOCK_WAIT`), so the others of its batch soon have its
        // connection. The service's own tables have connections of their
        // own.
        let at_once = (self.pool.options().get_max_connections() / 4).max(1) as usize;
        let ids: Vec<String> = ids.iter().map(|id| (*id).to_owned()).collect();
        let states: HashMap<String, OrderState> = stream::iter(ids)
            .map(|id| self.cancel_one(prepared, id, lease))
            .buffer_unordered(at_once)
            .filter_map(std::future::ready)
            .collect()
            .await;
        widespread(states)
    }

    /// The cancel transaction for the order `id` alone (see
    /// [`SqlStore::cancel_each`]).
    async fn cancel_one(
        &self,
        prepared: &Prepared<D>,
        id: String,
        lease: Duration,
    ) -> Option<(String, OrderState)> {
        let one = [id.as_str()];
        let cancel = || super::cancel::cancel(self, prepared, &one, lease);
        let mut result = super::retry_deadlocks(cancel).await;
        if D::DIALECT == Dialect::Postgres
            && result.as_ref().is_err_and(StoreError::is_lock_timeout)
        {
            // Two orders' transactions each holding a row the other's
            // `also` statement needs (statements taking rows in different
            // orders) end in a lock wait timing out on PostgreSQL (200 ms)
            // before its deadlock check runs (1 s): the other has committed
            // a moment later, so one more try at once, not a second later.
            // (InnoDB finds the deadlock at once: `retry_deadlocks`.)
            let jitter = u64::from(Utc::now().timestamp_subsec_nanos() % 25);
            tokio::time::sleep(Duration::from_millis(5 + jitter)).await;
            result = super::retry_deadlocks(cancel).await;
        }
        let state = match result {
            Ok(rows) => rows.into_iter().find(|r| r.id == id)?.state(),
            Err(e) if e.is_lock_timeout() => {
                tracing::debug!(order_id = %id, error = %e, "the order's cancel transaction waited for a row lock in vain; asking again shortly");
                let now = Utc::now();
                OrderState::Locked {
                    expires_at: now,
                    db_now: now,
                }
            }
            Err(e) => OrderState::Failed(OrderFailure::new(e)),
        };
        Some((id, state))
    }
}

/// `states` as they are, unless every one of two or more orders failed
/// for a row's values with the same error code: a failure that meets every
/// order is not one row's fault (a `set` value too long for its column, a
/// trigger refusing every cancellation), so each becomes a
/// [`StoreError::Widespread`], which is retried and never sets a row aside.
fn widespread(mut states: HashMap<String, OrderState>) -> HashMap<String, OrderState> {
    let codes: Vec<Option<String>> = states
        .values()
        .map(|state| match state {
            OrderState::Failed(f) if f.0.is_row_fault() => f.0.code().or(Some(String::new())),
            _ => None,
        })
        .collect();
    let same = codes.len() > 1 && codes[0].is_some() && codes.iter().all(|code| *code == codes[0]);
    if !same {
        return states;
    }
    let orders = states.len();
    for state in states.values_mut() {
        if let OrderState::Failed(f) = state {
            *state = OrderState::Failed(OrderFailure(Arc::new(StoreError::Widespread {
                error: f.0.clone(),
                orders,
            })));
        }
    }
    states
}

impl<D: SqlDialect> Prepared<D> {
    /// `id` (canonical, as the cancel transaction was asked or the table
    /// answered) as a value of the id column's type.
    pub(crate) fn id_value(&self, id: &str) -> Result<IdValue, StoreError> {
        self.id.value(id).map_err(|rejected| StoreError::Schema {
            key: self.id_key,
            problem: format!("order id {id:?} does not fit the id column: {rejected}"),
        })
    }

    /// `id` (canonical for the items table) as a value of its order id
    /// column's type.
    pub(crate) fn items_id_value(&self, id: &str) -> Result<IdValue, StoreError> {
        let column = self.items_id.as_ref().unwrap_or(&self.id);
        column.value(id).map_err(|rejected| StoreError::Schema {
            key: "[items].order_id",
            problem: format!("order id {id:?} does not fit the column: {rejected}"),
        })
    }
}

/// What the statements of the service's own tables (`outbox.rs`) run on.
impl<D: SqlDialect> OwnTables for SqlStore<D> {
    type Words = D;

    fn timer_name(&self) -> &str {
        self.timer.name.as_str()
    }

    async fn execute(&self, statement: Statement<'_>) -> Result<u64, StoreError> {
        D::execute(&mut *self.own.acquire().await?, statement).await
    }

    async fn fetch<T: OwnRow>(&self, statement: Statement<'_>) -> Result<Vec<T>, StoreError> {
        D::fetch(&mut *self.own.acquire().await?, statement).await
    }
}

#[async_trait::async_trait]
impl<D: SqlDialect> OrderStore for SqlStore<D> {
    fn timer(&self) -> &Timer {
        &self.timer
    }

    async fn prepare(&self) -> Result<SchemaReport, StoreError> {
        Ok(self.prepared().await?.report.clone())
    }

    fn canonical(&self, id: &OrderId) -> Result<OrderId, IdRejected> {
        match self.current() {
            Some(prepared) => prepared.id.canonical(id),
            None => Ok(id.clone()),
        }
    }

    async fn reread_shape(&self) -> bool {
        SqlStore::reread_shape(self).await
    }

    async fn prepare_every_template(&self) -> Result<usize, StoreError> {
        SqlStore::prepare_every_template(self).await
    }

    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn cancel_due(
        &self,
        ids: &[OrderId],
        lease: Duration,
    ) -> Result<Vec<(OrderId, OrderState)>, StoreError> {
        let mut prepared = self.prepared().await?;
        // An id that is not its own canonical form names no row: unknown,
        // without asking (no statement could bind it in the column's type)
        // — once the column's type is known to be the one the check read
        // (the shop may have widened it meanwhile).
        let fits =
            |prepared: &Prepared<D>, id: &&OrderId| prepared.id.canonical(id).as_ref() == Ok(*id);
        if !ids.iter().all(|id| fits(&prepared, &id)) && self.reread_shape().await {
            prepared = self.prepared().await?;
        }
        let (asked, impossible): (Vec<&OrderId>, Vec<&OrderId>) =
            ids.iter().partition(|id| fits(&prepared, id));
        // In id order, so concurrent batches lock rows in the same order
        // (fewer deadlocks).
        let mut sorted: Vec<&str> = asked.iter().map(|id| id.as_str()).collect();
        sorted.sort_unstable();
        let states = if self.timer.also.is_empty() {
            let result = self.cancel_batch(&prepared, &sorted, lease).await;
            self.after(result).await?
        } else {
            let states = self.cancel_each(&prepared, &sorted, lease).await;
            if states
                .values()
                .any(|s| matches!(s, OrderState::Failed(f) if f.0.is_about_the_statement()))
            {
                self.reread_shape().await;
            }
            states
        };
        let reported = asked
            .into_iter()
            .filter_map(|id| Some((id.clone(), states.get(id.as_str())?.clone())));
        let unknown = impossible
            .into_iter()
            .map(|id| (id.clone(), OrderState::Unknown));
        Ok(reported.chain(unknown).collect())
    }

    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn items(&self, ids: &[&OrderId]) -> Result<HashMap<String, Vec<OrderItem>>, StoreError> {
        let mut prepared = self.prepared().await?;
        // An id the items table's column cannot hold has no items there —
        // once its type is known to be the one the check read (a widened
        // column would otherwise release an order with no items).
        let fit = |prepared: &Prepared<D>| match &prepared.items_id {
            Some(items_id) => ids.iter().all(|id| items_id.canonical(id).is_ok()),
            None => true,
        };
        if !fit(&prepared) && self.reread_shape().await {
            prepared = self.prepared().await?;
        }
        let Some(items_id) = &prepared.items_id else {
            return Ok(HashMap::new());
        };
        // Each order as the items table's column spells it; an order id it
        // cannot hold has no items there.
        let spelled: HashMap<String, &OrderId> = ids
            .iter()
            .filter_map(|id| Some((items_id.canonical(id).ok()?.as_str().to_owned(), *id)))
            .collect();
        let mut keys: Vec<&str> = spelled.keys().map(String::as_str).collect();
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        keys.sort_unstable();
        let mut rows = Vec::new();
        for chunk in keys.chunks(D::MAX_BATCH_IDS) {
            let result = self.item_rows(&prepared, chunk).await;
            rows.extend(self.after(result).await?);
        }
        let mut map: HashMap<String, Vec<OrderItem>> = HashMap::new();
        for row in rows {
            // Exactly the orders asked about (a case-insensitive column
            // may answer with another spelling).
            if let Some(id) = spelled.get(&row.order_id) {
                map.entry(id.as_str().to_owned())
                    .or_default()
                    .push(OrderItem {
                        sku: row.sku,
                        quantity: row.quantity,
                    });
            }
        }
        Ok(map)
    }

    /// An index range scan when the shop has an index on `(status,
    /// deadline column)` and the deadline is that column.
    #[tracing::instrument(skip(self))]
    async fn overdue(
        &self,
        grace: Duration,
        after: Option<&RowCursor>,
        limit: u32,
    ) -> Result<Page<RowCursor>, StoreError> {
        let prepared = self.prepared().await?;
        let after = after.map(|c| (c.deadline, c.id.as_deref()));
        let result = self.overdue_rows(&prepared, grace, after, limit).await;
        let rows = self.after(result).await?;
        Ok(shape::due_page(rows, limit))
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn explain(&self, id: &OrderId) -> Result<OrderFacts, StoreError> {
        let prepared = self.prepared().await?;
        let row = self.row_facts(&prepared, id.as_str()).await?;
        let db_now = self.db_now(&prepared).await?;
        Ok(OrderFacts {
            row,
            db_now,
            outbox: outbox::outbox_facts(self, id.as_str()).await?,
            set_aside: outbox::set_aside_of(self, id.as_str()).await?,
        })
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn history(
        &self,
        cursor: Option<&HistoryCursor>,
        limit: u32,
    ) -> Result<Vec<HistoryRow>, StoreError> {
        let mut rows = outbox::history(self, cursor, limit).await?;
        if rows.is_empty() {
            return Ok(rows);
        }
        let prepared = self.prepared().await?;
        for row in &mut rows {
            let facts = self.row_facts(&prepared, &row.order_id).await?;
            row.deadline = facts.and_then(|f| f.expires_at);
        }
        Ok(rows)
    }

    #[tracing::instrument(skip(self))]
    async fn waiting_page(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Page<String>, StoreError> {
        let prepared = self.prepared().await?;
        let rows = self.waiting_rows(&prepared, after, limit).await?;
        Ok(shape::page(rows, limit, |(id, _)| Some(id.clone())))
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn set_aside(&self, id: &OrderId, reason: &str) -> Result<Option<u32>, StoreError> {
        let prepared = self.prepared().await?;
        self.mark_set_aside(&prepared, id.as_str(), reason).await
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn set_aside_rows(&self, limit: u32) -> Result<Vec<SetAsideRow>, StoreError> {
        outbox::set_aside_rows(self, limit).await
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn forget_set_aside(&self, id: &OrderId) -> Result<(), StoreError> {
        outbox::forget_set_aside(self, id.as_str()).await
    }

    #[tracing::instrument(skip(self))]
    async fn record_replica(&self, instance: &str, version: &str) -> Result<(), StoreError> {
        outbox::record_replica(self, instance, version).await
    }

    #[tracing::instrument(skip(self))]
    async fn forget_replica(&self, instance: &str) -> Result<(), StoreError> {
        outbox::forget_replica(self, instance).await
    }

    #[tracing::instrument(skip(self))]
    async fn live_replicas(&self, within: Duration) -> Result<Vec<(String, String)>, StoreError> {
        outbox::live_replicas(self, within).await
    }

    #[tracing::instrument(skip_all)]
    async fn record_logout(&self, session: &str, until: DateTime<Utc>) -> Result<(), StoreError> {
        outbox::record_logout(self, session, until).await
    }

    async fn logouts(&self) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
        outbox::logouts(self).await
    }

    async fn keep_parked(&self, message: &NewParked<'_>) -> Result<bool, StoreError> {
        parked::keep(self, message).await
    }

    async fn parked_page(
        &self,
        filter: &ParkedFilter,
        after: i64,
        limit: u32,
        excerpt: Option<usize>,
    ) -> Result<Vec<ParkedRow>, StoreError> {
        parked::page(self, filter, after, limit, excerpt).await
    }

    async fn parked_ids(&self, filter: &ParkedFilter, upto: i64) -> Result<Vec<i64>, StoreError> {
        parked::ids(self, filter, upto).await
    }

    async fn parked_last_id(&self) -> Result<i64, StoreError> {
        parked::last_id(self).await
    }

    async fn parked_counts(&self) -> Result<Vec<(Option<String>, u64)>, StoreError> {
        parked::counts(self).await
    }

    async fn delete_parked(&self, ids: &[i64]) -> Result<u64, StoreError> {
        parked::delete(self, ids).await
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn set_aside_count(&self) -> Result<u64, StoreError> {
        outbox::set_aside_count(self).await
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn retry_set_aside(&self, ids: Option<&[&str]>) -> Result<u64, StoreError> {
        outbox::retry_set_aside(self, ids).await
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn prune_set_aside(&self) -> Result<u64, StoreError> {
        let prepared = self.prepared().await?;
        self.prune_marks(&prepared).await
    }

    #[tracing::instrument(skip(self))]
    async fn stale_outbox(&self, grace: Duration, limit: u32) -> Result<Vec<OrderId>, StoreError> {
        Ok(shape::order_ids(outbox::stale(self, grace, limit).await?))
    }

    #[tracing::instrument(skip_all, fields(orders = failures.len()))]
    async fn record_failures(
        &self,
        failures: &[OutboxFailure<'_>],
        plan: &(dyn for<'r, 'f> Fn(&'r OutboxFailure<'f>, u32) -> NextAttempt + Send + Sync),
    ) -> Result<Vec<(String, u32, NextAttempt)>, StoreError> {
        if failures.is_empty() {
            return Ok(Vec::new());
        }
        let errors: Vec<(&str, &str)> = failures.iter().map(|f| (f.id, f.error)).collect();
        let attempts: HashMap<String, u32> = outbox::count_failures(self, &errors)
            .await?
            .into_iter()
            .map(|(id, n)| (id, u32::try_from(n).unwrap_or(0)))
            .collect();
        let planned: Vec<(String, u32, NextAttempt)> = failures
            .iter()
            .filter_map(|f| {
                let n = *attempts.get(f.id)?;
                Some((f.id.to_owned(), n, plan(f, n)))
            })
            .collect();
        let plans: Vec<(&str, &NextAttempt)> =
            planned.iter().map(|(id, _, p)| (id.as_str(), p)).collect();
        if !plans.is_empty() {
            outbox::plan_attempts(self, &plans).await?;
        }
        Ok(planned)
    }

    #[tracing::instrument(skip(self))]
    async fn delete_finished(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError> {
        outbox::delete_finished(self, older_than, limit).await
    }

    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn release_leases(&self, ids: &[&str]) -> Result<(), StoreError> {
        outbox::release_leases(self, ids).await
    }

    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn renew_leases(&self, ids: &[&str], lease: Duration) -> Result<(), StoreError> {
        outbox::renew_leases(self, ids, lease).await
    }

    #[tracing::instrument(skip_all, fields(released = released.len(), published = published.len()))]
    async fn mark_done(&self, released: &[&str], published: &[&str]) -> Result<(), StoreError> {
        outbox::mark_done(self, released, published).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.own.acquire().await?.ping().await?;
        Ok(())
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn watch_lease(
        &self,
        holder: &str,
        lease: Duration,
    ) -> Result<Option<WatchMark>, StoreError> {
        outbox::watch_lease(self, holder, lease).await
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn due_between(
        &self,
        after: &RowCursor,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Page<RowCursor>, StoreError> {
        let prepared = self.prepared().await?;
        let after = (after.deadline, after.id.as_deref());
        let result = self.due_rows(&prepared, after, until, limit).await;
        let rows = self.after(result).await?;
        Ok(shape::due_page(rows, limit))
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn watch_advance(&self, holder: &str, until: DateTime<Utc>) -> Result<bool, StoreError> {
        outbox::watch_advance(self, holder, until).await
    }

    #[tracing::instrument(skip(self), fields(timer = %self.timer.name))]
    async fn watch_release(&self, holder: &str) -> Result<(), StoreError> {
        outbox::watch_release(self, holder).await
    }
}
