//! [`StoreError`]: what went wrong talking to the database. What the
//! pipeline asks of one (a deadlock victim, a lock wait that ran out, a
//! failure waiting cannot fix) is answered in `store/mod.rs`, which knows
//! the dialects' error numbers.

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
