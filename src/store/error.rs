//! [`StoreError`]: what went wrong talking to the database, and what the
//! pipeline asks of one: a deadlock victim (run again at once:
//! [`retry_deadlocks`]), a lock wait that ran out, a failure waiting cannot
//! fix, the row's own fault or the world's. The answers read SQLSTATEs and,
//! where MySQL hides them behind `HY000`, its error numbers.

use std::time::Duration;

use super::mysql;
use crate::settings::SecretUrl;

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
    /// The database did not answer one operation within
    /// `[liveness].database_timeout` (a server cut off by the network, or
    /// one too slow): abandoned on the client's side, its connection
    /// closed. The environment's, like a lost connection: retried.
    #[error(
        "database: no answer to {operation} within {limit:?} (the connection is closed; [liveness].database_timeout)"
    )]
    Unanswered {
        /// The store operation, e.g. `cancel_due`.
        operation: &'static str,
        /// The limit it ran out.
        limit: std::time::Duration,
    },
    /// Applying migrations failed.
    #[error("migrations: {0}")]
    Migrate(sqlx::migrate::MigrateError),
    /// A failure about a row's values (see [`StoreError::is_row_fault`])
    /// that every order of a batch met the same way, each on its own: a
    /// `set` value too long for its column, a trigger refusing every
    /// cancellation. Not one row's fault, so the world's: retried, never
    /// parked or set aside.
    #[error(
        "{error} (every one of the {orders} orders of the batch failed the same way: not a fault of one row)"
    )]
    Widespread {
        /// The failure of one of them.
        error: std::sync::Arc<StoreError>,
        /// How many orders failed so.
        orders: usize,
    },
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
