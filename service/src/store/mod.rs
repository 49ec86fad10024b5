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
//! The dialect boundary is the operation, not SQL text: each dialect writes
//! its own statements; what a row *means* ([`OrderState`]) is decided once,
//! in `state.rs`, for all of them. `migrate` creates only the service's own
//! tables (prefixed `order_timeout_`), never the shop's.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::message::OrderId;
use crate::settings::{ItemsMapping, OrdersMapping, Release, SecretUrl, Settings};

mod mysql;
mod postgres;
mod shape;
mod state;
mod tls;

pub use tls::{mysql_options, pg_options};

pub use mysql::MySqlStore;
pub use postgres::PgStore;
pub use shape::{IdKind, SchemaReport};

/// The store as the service holds it: one per instance, shared by every
/// task.
pub type Store = Arc<dyn OrderStore>;

/// The database operations the service needs, one method per operation.
/// Every method is one transaction (or one statement) and safe to repeat:
/// messages arrive at least once. Order ids passed in are canonical
/// ([`OrderStore::canonical`]).
#[async_trait::async_trait]
pub trait OrderStore: Send + Sync + std::fmt::Debug {
    /// Reads the shop's schema, checks the configured mapping against it
    /// (table, columns, status codes, deadline, guard, `set`, `also`,
    /// items) and renders the statements. Done once; every other operation
    /// does it first if nobody has. A mapping error names its config key
    /// ([`StoreError::Schema`]).
    async fn prepare(&self) -> Result<SchemaReport, StoreError>;

    /// The order id as the shop's id column spells it (`00123` is `123` in
    /// an integer column, uuids in lower case), or `None` when no row can
    /// have it (`abc` for an integer column). Text ids are kept as they are.
    /// Valid after [`OrderStore::prepare`]; before, every id is text.
    fn canonical(&self, id: &OrderId) -> Option<OrderId>;

    /// **The cancel transaction**, for a batch of distinct canonical order
    /// ids: cancel every order that is unpaid, overdue and passes the
    /// guard (with the `set` columns and the `also` statements), record its
    /// outbox row leased to the caller for `lease`, take the lease of
    /// earlier cancellations whose work is pending and whose lease ran out,
    /// and report every order's state. Commits atomically.
    async fn cancel_due(
        &self,
        ids: &[OrderId],
        lease: Duration,
    ) -> Result<Vec<(OrderId, OrderState)>, StoreError>;

    /// The items of each order (by order id), for the stock release.
    async fn items(&self, ids: &[&OrderId]) -> Result<HashMap<String, Vec<OrderItem>>, StoreError>;

    /// Unpaid orders (passing the guard) overdue by more than `grace`,
    /// oldest first, at most `limit`: what the sweeper cancels.
    async fn overdue(&self, grace: Duration, limit: u32) -> Result<Vec<OrderId>, StoreError>;

    /// Unpaid orders (passing the guard) in id order after `from`
    /// (exclusive), at most `limit`, with their deadlines: what `backfill`
    /// schedules.
    async fn unpaid_page(
        &self,
        from: Option<&OrderId>,
        limit: u32,
    ) -> Result<Vec<(OrderId, DateTime<Utc>)>, StoreError>;

    /// Cancelled orders whose release or event is still pending after
    /// `grace`, with no live lease: work a crashed or parked delivery left.
    async fn stale_outbox(&self, grace: Duration, limit: u32) -> Result<Vec<OrderId>, StoreError>;

    /// Gives outbox leases back early (after a failure), so the retry does
    /// not wait for them to run out.
    async fn release_leases(&self, ids: &[&str]) -> Result<(), StoreError>;

    /// Marks outbox work done: stock released for `released`, event
    /// published for `published`. Idempotent.
    async fn mark_done(&self, released: &[&str], published: &[&str]) -> Result<(), StoreError>;

    /// One round trip to the database, for readiness.
    async fn ping(&self) -> Result<(), StoreError>;
}

/// The shop's schema as the store needs it: `[orders]`, `[items]` and
/// whether stock is released over gRPC (else the items are never read).
#[derive(Clone, Debug, Default)]
pub struct ShopSchema {
    /// `[orders]`.
    pub orders: OrdersMapping,
    /// `[items]`.
    pub items: ItemsMapping,
    /// `[inventory].release`.
    pub release: Release,
}

impl ShopSchema {
    /// The schema the settings describe.
    pub fn of(settings: &Settings) -> Self {
        Self {
            orders: settings.orders.clone(),
            items: settings.items.clone(),
            release: settings.inventory.release,
        }
    }
}

/// Connects to the database `url` names, with a pool of at most
/// `max_connections`, lazily: the first query opens the first connection,
/// so start-up does not fail on a database that is still booting.
pub fn connect_lazy(
    url: &SecretUrl,
    max_connections: u32,
    schema: &ShopSchema,
) -> Result<Store, StoreError> {
    Ok(match Dialect::of(url)? {
        Dialect::Postgres => Arc::new(PgStore::connect_lazy(url, max_connections, schema)?),
        Dialect::MySql => Arc::new(MySqlStore::connect_lazy(url, max_connections, schema)?),
    })
}

/// Creates the database if it does not exist, then applies the service's
/// own migrations (the `order_timeout_*` tables; never the shop's).
pub async fn migrate(url: &SecretUrl) -> Result<(), StoreError> {
    match Dialect::of(url)? {
        Dialect::Postgres => PgStore::migrate(url).await,
        Dialect::MySql => MySqlStore::migrate(url).await,
    }
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

/// Errors talking to the database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL does not parse.
    #[error("invalid DATABASE_URL {url}: {error}")]
    Url {
        /// The URL (its password redacted when shown).
        url: SecretUrl,
        /// The driver's complaint.
        error: sqlx::Error,
    },
    /// A TLS file the URL names (`sslrootcert`, `ssl-ca`, `sslcert`,
    /// `sslkey`, …) cannot be used.
    #[error("{0}")]
    Tls(crate::tls::TlsFileError),
    /// The URL names a CA or client certificate but no TLS mode, which
    /// would mean "prefer": TLS without verifying the server against it.
    #[error(
        "DATABASE_URL {url}: {param} needs a TLS mode: add sslmode=verify-full (PostgreSQL) or ssl-mode=VERIFY_IDENTITY (MySQL), or verify-ca/VERIFY_CA"
    )]
    TlsWithoutMode {
        /// The URL (its password redacted when shown).
        url: SecretUrl,
        /// The parameter that names a file.
        param: String,
    },
    /// The URL names a database this service does not speak.
    #[error("unsupported DATABASE_URL {url}: expected postgres:// or mysql://")]
    Scheme {
        /// The URL (its password redacted when shown).
        url: SecretUrl,
    },
    /// A query or connection failed; transient as far as we can tell.
    #[error("database: {0}")]
    Sql(sqlx::Error),
    /// Applying migrations failed.
    #[error("migrations: {0}")]
    Migrate(sqlx::migrate::MigrateError),
    /// The configured mapping does not fit the shop's schema: a
    /// configuration error, not transient.
    #[error("config {key}: {problem}")]
    Schema {
        /// The config key, e.g. `[orders].deadline`.
        key: &'static str,
        /// What does not fit.
        problem: String,
    },
}

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
impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Self::Migrate(e)
    }
}

/// Where an order stands after [`OrderStore::cancel_due`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrderState {
    /// No row with that id.
    Unknown,
    /// Paid: leave it alone.
    Paid,
    /// Neither unpaid nor paid nor cancelled, or it fails the guard
    /// (soft-deleted, say), or its deadline is NULL: left alone, like a
    /// paid order.
    LeftAlone,
    /// Still unpaid and its deadline has not passed (it may have been
    /// extended): wait until `expires_at`.
    NotYetDue {
        /// The row's deadline.
        expires_at: DateTime<Utc>,
        /// The database's clock when it answered.
        db_now: DateTime<Utc>,
    },
    /// Unpaid and overdue, yet this statement did not cancel it: another
    /// transaction holds or just changed the row. Ask again shortly.
    Contended,
    /// Cancelled, by this statement or an earlier one.
    Cancelled(Cancellation),
    /// Cancelled by someone other than this service (no outbox row): nothing
    /// for us to release.
    CancelledElsewhere,
    /// Cancelled, with outbox work pending that another worker has leased
    /// until `until`: check again then (if that worker crashed, the lease
    /// will have run out and this delivery takes over).
    LeasedElsewhere {
        /// When the other worker's lease runs out.
        until: DateTime<Utc>,
        /// The database's clock when it answered.
        db_now: DateTime<Utc>,
    },
}

/// A cancellation this service made, and what is still to do for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cancellation {
    /// True when the statement just now cancelled it.
    pub just_now: bool,
    /// True when this caller holds the outbox lease (and so must finish the
    /// pending work, or give the lease back with [`OrderStore::release_leases`]).
    pub leased: bool,
    /// The deadline it was cancelled for.
    pub expires_at: DateTime<Utc>,
    /// When it was cancelled.
    pub cancelled_at: DateTime<Utc>,
    /// The stock release is still to be done.
    pub release_pending: bool,
    /// The `order.cancelled` event is still to be published.
    pub event_pending: bool,
}

/// One line of an order.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct OrderItem {
    /// Stock keeping unit.
    pub sku: String,
    /// Units reserved.
    pub quantity: i64,
}
