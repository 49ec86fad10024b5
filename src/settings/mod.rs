//! Configuration: environment variables for the connection endpoints, an
//! optional TOML file for the tuning knobs, defaults that work against local
//! servers. The connection URLs are [`SecretUrl`]s, so no `Debug` or log
//! line of the settings can show a password.
//!
//! Precedence, lowest first: built-in defaults, the config file
//! (`--config FILE` or `ORDER_TIMEOUT_CONFIG`), environment variables.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

#[cfg(test)]
mod examples;
mod http;
mod lanes;
mod liveness;
#[cfg(test)]
mod reference;
mod schema;
mod secret;
mod timers;
mod validate;
pub use http::HttpSettings;
pub use lanes::{DEFAULT_LANE_SHARDS, Lane};
pub use liveness::LivenessSettings;
pub use schema::{
    DeadlineUnit, InventorySettings, ItemsMapping, OrdersMapping, Release, StatusValue,
    is_identifier,
};
pub use secret::{AdminToken, SecretUrl, is_secret_param, redact_url};
pub use timers::{
    CANCELLED_EVENT, DEFAULT_TIMER, MAX_WATCH, Timer, TimerKey, TimerMapping, TimerName,
};
pub use validate::MAX_DURATION;

/// Default broker URL: the local RabbitMQ's default vhost.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Default database URL: the local PostgreSQL, database `order_timeout`.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/order_timeout";
/// Default inventory endpoint: the reference server's default listen address.
pub const DEFAULT_INVENTORY_URL: &str = "http://127.0.0.1:50051";
/// Default listen address for metrics and health endpoints.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9464";

/// The batcher's default wait for more due orders ([`Settings::batch_linger`]):
/// 25 ms. Measured with `bench` at 1,000 orders/s on a shared 31 s window,
/// four alternating runs each against 10 ms (docs/benchmarks-log.md): the
/// service's statements cost PostgreSQL 0.10 instead of 0.13–0.14 ms of CPU
/// per order, the reference inventory's 0.03 instead of 0.04–0.05, all
/// processes 0.91–1.03 instead of 1.00–1.13 ms, for lateness p99 ~30
/// instead of ~15 ms. (10 ms had replaced 3 ms the same way: 0.69 instead
/// of 0.80 ms of PostgreSQL per order.)
pub const DEFAULT_BATCH_LINGER: Duration = Duration::from_millis(25);

/// The longest `batch_linger` accepted: every order may wait this long, so
/// more is a typo, not a trade-off.
pub const MAX_BATCH_LINGER: Duration = Duration::from_secs(1);

/// Errors reading the configuration; they stop the process at start-up.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// Why it could not be read.
        error: std::io::Error,
    },
    /// The config file is not valid TOML for [`Settings`].
    #[error("invalid config file {path}: {error}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, with the line.
        error: Box<toml::de::Error>,
    },
    /// Settings that contradict themselves ([`Settings::validate`]).
    #[error("config {key}: {problem}")]
    Invalid {
        /// The key, e.g. `prefetch` or `[orders].cancelled`.
        key: &'static str,
        /// What is wrong with its value.
        problem: String,
    },
    /// An environment variable holds a value that does not parse.
    #[error("invalid value for {name}: {reason}")]
    Env {
        /// The variable.
        name: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
}

/// Which RabbitMQ queue type backs the delay cascade and the work queues.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    /// Replicated Raft queues with at-least-once dead-lettering: nothing is
    /// lost between cascade levels, even across a broker restart. Default.
    Quorum,
    /// Classic queues: less broker work per hop, but dead-lettering is
    /// at-most-once (a broker crash can drop a message between levels).
    Classic,
}

/// How many parallel copies ("shards") of a delay queue to declare: of the
/// cascade (`cascade_shards`) and of each lane (`lane_shards`).
///
/// RabbitMQ moves a quorum queue's expired messages to its dead-letter
/// target through one worker per queue, with a small window of unconfirmed
/// messages (`dead_letter_worker_consumer_prefetch`, default 32, a setting
/// of the broker's `advanced.config` that managed brokers do not expose),
/// which limits how fast one queue drains under load (measured with `bench`,
/// every order on a 9 s timeout at 1,000 orders/s: p99 lateness 2,517 ms
/// with one shard, 487 ms with four). Each shard is a queue of its own, so
/// `n` shards give `n` workers. Orders are spread by a hash of their id.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(try_from = "u32")]
pub struct Shards(u32);

impl Shards {
    /// Most shards accepted: 28 cascade levels x 16 = 448 queues is already
    /// plenty.
    pub const MAX: u32 = 16;

    /// The number of shards (1..=[`Self::MAX`]).
    pub fn get(self) -> u32 {
        self.0
    }
}

impl TryFrom<u32> for Shards {
    type Error = String;

    fn try_from(n: u32) -> Result<Self, Self::Error> {
        if (1..=Self::MAX).contains(&n) {
            Ok(Self(n))
        } else {
            Err(format!(
                "shards must be between 1 and {}, not {n}",
                Self::MAX
            ))
        }
    }
}

impl Default for Shards {
    /// Four, for the cascade: measured with `bench` (docs/benchmarks-log.md).
    fn default() -> Self {
        Self(4)
    }
}

/// What to do with a timeout message whose order id has no row.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum UnknownOrderPolicy {
    /// Park it with reason "unknown order" (default): an operator looks.
    Park,
    /// Log it, count it and drop it.
    Drop,
}

/// Retry policy knobs; see the retry policy (`pipeline/retry.rs`) for how
/// they are used.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetrySettings {
    /// Attempts (deliveries that failed transiently) before a message is parked.
    pub max_attempts: u32,
    /// First re-schedule delay; doubles each attempt.
    #[serde(with = "humantime_serde")]
    pub base_delay: Duration,
    /// Ceiling of the re-schedule delay.
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    /// In-process retries of one inventory call before falling back to a
    /// re-schedule through the delay store.
    pub quick_retries: usize,
}

impl Default for RetrySettings {
    fn default() -> Self {
        // 1+2+4+…+64 s (capped) over 8 attempts: a few minutes of outage.
        Self {
            max_attempts: 8,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(120),
            quick_retries: 2,
        }
    }
}

/// The sweeper: the safety net for orders whose timeout message was never
/// published (`pipeline/sweeper.rs`).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SweeperSettings {
    /// Run it at all.
    pub enabled: bool,
    /// Time between sweeps.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Only orders overdue by more than this are swept: the normal path
    /// handles everything younger.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// Orders per statement; a sweep takes batches until one comes back
    /// short (at most 100 batches per sweep).
    pub batch: u32,
    /// For this long after every (re)connect to the broker, sweep every
    /// `catch_up_interval` for orders overdue by more than `catch_up_grace`
    /// (`0s` turns it off). After a broker restart, messages can sit in a
    /// cascade level until RabbitMQ retries dead-lettering them (180 s on
    /// 3.10–3.13 unless `dead_letter_worker_publisher_confirm_timeout` is
    /// lowered, see `deploy/rabbitmq/`); the orders they were for are
    /// cancelled by these sweeps instead, seconds late instead of minutes.
    #[serde(with = "humantime_serde")]
    pub catch_up_window: Duration,
    /// Time between catch-up sweeps.
    #[serde(with = "humantime_serde")]
    pub catch_up_interval: Duration,
    /// Catch-up sweeps take orders overdue by more than this; the normal
    /// path settles orders within milliseconds of their deadline.
    #[serde(with = "humantime_serde")]
    pub catch_up_grace: Duration,
    /// Finished outbox rows (stock released and event published) older
    /// than this are deleted, a few small batches per sweep, so the table
    /// does not grow without end. Pending and given-up rows are kept.
    #[serde(with = "humantime_serde")]
    pub outbox_retention: Duration,
}

impl Default for SweeperSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(30),
            grace: Duration::from_secs(60),
            batch: 500,
            catch_up_window: Duration::from_secs(300),
            catch_up_interval: Duration::from_secs(1),
            catch_up_grace: Duration::from_secs(1),
            outbox_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// Everything the service needs to run. Built by [`Settings::load`].
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// RabbitMQ URL (`AMQP_URL`). The vhost is the URL's path.
    pub amqp_url: SecretUrl,
    /// Database URL (`DATABASE_URL`): `postgres://` or `mysql://` picks the
    /// dialect.
    pub database_url: SecretUrl,
    /// gRPC inventory endpoint (`INVENTORY_URL`).
    pub inventory_url: SecretUrl,
    /// Metrics and health listen address (`HTTP_ADDR`).
    pub http_addr: SocketAddr,
    /// What the HTTP side accepts from whom, and how long it waits (`[http]`).
    pub http: HttpSettings,
    /// Queue type of the delay cascade and work queues.
    pub queue_type: QueueType,
    /// Parallel copies of the delay cascade (see [`Shards`]).
    pub cascade_shards: Shards,
    /// Payment windows most orders share (e.g. `["30m"]`), each a fixed-TTL
    /// queue of its own: an order that fits one waits there in one hop
    /// instead of crossing the cascade ([`Lane`]). Empty: every delay goes
    /// through the cascade.
    pub lanes: Vec<Lane>,
    /// Parallel copies of each lane (see [`Shards`]); a lane carries a
    /// shop's whole load, so it gets more than a cascade level.
    pub lane_shards: Shards,
    /// Unacknowledged deliveries the consumer may hold at once. Messages held
    /// for the last 0.5–2 seconds before their deadline count against it,
    /// so keep it above (orders/s due) x 2 s: the messages that find no
    /// slot wait in the due queue, late only if that wait outlasts the time
    /// they have left (docs/limits.md).
    pub prefetch: u16,
    /// Most orders cancelled in one database statement.
    pub batch_max: usize,
    /// How long the batcher waits for more due orders before it sends a
    /// batch that is not full: at most this much lateness per order, for
    /// fewer, larger cancel statements (a statement's planning and commit
    /// cost is per batch, not per order). `0s`: no wait.
    #[serde(with = "humantime_serde")]
    pub batch_linger: Duration,
    /// Batches processed concurrently.
    pub batch_concurrency: usize,
    /// Database connection pool size.
    pub db_max_connections: u32,
    /// Longest wait of one database statement for a row lock the cancel
    /// transaction cannot skip (a row an `also` statement updates that the
    /// shop holds, an outbox row another instance holds). Past it the
    /// statement fails, a transient failure retried with backoff, instead
    /// of hanging the batch.
    #[serde(with = "humantime_serde")]
    pub db_lock_timeout: Duration,
    /// Longest run of one database statement (a slow guard or deadline
    /// expression); past it, a transient failure as above.
    #[serde(with = "humantime_serde")]
    pub db_statement_timeout: Duration,
    /// Timeout of one inventory call.
    #[serde(with = "humantime_serde")]
    pub inventory_timeout: Duration,
    /// Concurrent inventory calls per batch.
    pub inventory_concurrency: usize,
    /// How long a worker owns a cancelled order's pending release before
    /// another delivery may take it over (after a crash). Longer than one
    /// release normally takes, inventory retries included.
    #[serde(with = "humantime_serde")]
    pub outbox_lease: Duration,
    /// Retry policy.
    pub retry: RetrySettings,
    /// The sweeper.
    pub sweeper: SweeperSettings,
    /// How soon a silent broker, database or inventory is noticed
    /// (`[liveness]`).
    pub liveness: LivenessSettings,
    /// What to do with messages for unknown orders.
    pub unknown_order: UnknownOrderPolicy,
    /// Bodies above this size are parked unread.
    pub max_body_bytes: usize,
    /// How long a graceful shutdown waits for in-flight work.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// The shop's orders table (`[orders]`).
    pub orders: OrdersMapping,
    /// The shop's order lines (`[items]`), for `ReleaseStock`.
    pub items: ItemsMapping,
    /// How stock goes back (`[inventory]`).
    pub inventory: InventorySettings,
    /// Timers beyond the default one (`[[timers]]`); see [`Settings::timers`].
    pub timers: Vec<TimerMapping>,
    /// The console's write token (`ADMIN_TOKEN`, environment only): unset,
    /// the console is read-only.
    #[serde(skip)]
    pub admin_token: Option<AdminToken>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            amqp_url: SecretUrl::new(DEFAULT_AMQP_URL),
            database_url: SecretUrl::new(DEFAULT_DATABASE_URL),
            inventory_url: SecretUrl::new(DEFAULT_INVENTORY_URL),
            http_addr: DEFAULT_HTTP_ADDR.parse().expect("valid default address"),
            http: HttpSettings::default(),
            queue_type: QueueType::Quorum,
            cascade_shards: Shards::default(),
            lanes: Vec::new(),
            lane_shards: DEFAULT_LANE_SHARDS,
            prefetch: 4000,
            batch_max: 200,
            batch_linger: DEFAULT_BATCH_LINGER,
            batch_concurrency: 4,
            db_max_connections: 10,
            db_lock_timeout: Duration::from_secs(5),
            db_statement_timeout: Duration::from_secs(30),
            inventory_timeout: Duration::from_secs(5),
            inventory_concurrency: 64,
            outbox_lease: Duration::from_secs(15),
            retry: RetrySettings::default(),
            sweeper: SweeperSettings::default(),
            liveness: LivenessSettings::default(),
            unknown_order: UnknownOrderPolicy::Park,
            max_body_bytes: 64 * 1024,
            shutdown_timeout: Duration::from_secs(20),
            orders: OrdersMapping::default(),
            items: ItemsMapping::default(),
            inventory: InventorySettings::default(),
            timers: Vec::new(),
            admin_token: None,
        }
    }
}

impl Settings {
    /// Defaults, then the config file if one is named (argument or
    /// `ORDER_TIMEOUT_CONFIG`), then the environment variables; refused if
    /// they contradict themselves ([`Settings::validate`]).
    pub fn load(config_file: Option<&Path>) -> Result<Self, ConfigError> {
        let from_env = std::env::var_os("ORDER_TIMEOUT_CONFIG");
        let path = config_file.or(from_env.as_deref().map(Path::new));
        let mut settings = match path {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        settings.apply_env(|name| std::env::var(name).ok())?;
        settings.validate()?;
        Ok(settings)
    }

    fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.display().to_string(),
            error,
        })?;
        toml::from_str(&text).map_err(|error| ConfigError::Parse {
            path: path.display().to_string(),
            error: Box::new(error),
        })
    }

    /// Overrides from environment variables, read through `get` so tests can
    /// feed their own.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(v) = get("AMQP_URL") {
            self.amqp_url = SecretUrl::new(v);
        }
        if let Some(v) = get("DATABASE_URL") {
            self.database_url = SecretUrl::new(v);
        }
        if let Some(v) = get("INVENTORY_URL") {
            self.inventory_url = SecretUrl::new(v);
        }
        if let Some(v) = get("HTTP_ADDR") {
            self.http_addr = v.parse().map_err(|e| ConfigError::Env {
                name: "HTTP_ADDR",
                reason: format!("{v:?}: {e}"),
            })?;
        }
        if let Some(v) = get("HTTP_HOSTS") {
            self.http.hosts = http::list(&v).map(str::to_owned).collect();
        }
        if let Some(v) = get("HTTP_TRUSTED_PROXIES") {
            self.http.trusted_proxies = http::list(&v)
                .map(|ip| {
                    ip.parse().map_err(|e| ConfigError::Env {
                        name: "HTTP_TRUSTED_PROXIES",
                        reason: format!("{ip:?}: {e}"),
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(v) = get("ADMIN_TOKEN").filter(|v| !v.is_empty()) {
            self.admin_token = Some(AdminToken::parse(&v).map_err(|reason| ConfigError::Env {
                name: "ADMIN_TOKEN",
                reason,
            })?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_file_and_defaults() {
        let mut s: Settings = toml::from_str(
            r#"
            prefetch = 10
            queue_type = "classic"
            inventory_timeout = "250ms"
            [retry]
            max_attempts = 3
            "#,
        )
        .unwrap();
        assert_eq!(s.prefetch, 10);
        assert_eq!(s.queue_type, QueueType::Classic);
        assert_eq!(s.inventory_timeout, Duration::from_millis(250));
        assert_eq!(s.retry.max_attempts, 3);
        assert_eq!(s.retry.base_delay, Duration::from_secs(1));
        assert_eq!(s.amqp_url.expose(), DEFAULT_AMQP_URL);
        s.apply_env(|n| (n == "AMQP_URL").then(|| "amqp://x/%2f".to_string()))
            .unwrap();
        assert_eq!(s.amqp_url.expose(), "amqp://x/%2f");
        assert_eq!(s.database_url.expose(), DEFAULT_DATABASE_URL);
    }

    #[test]
    fn the_example_file_lists_the_defaults() {
        let example: Settings =
            toml::from_str(include_str!("../../config/order-timeout.example.toml")).unwrap();
        assert_eq!(format!("{example:?}"), format!("{:?}", Settings::default()));
    }

    #[test]
    fn the_worked_examples_parse() {
        for (name, text) in [
            (
                "mall",
                include_str!("../../config/examples/mall-mysql.toml"),
            ),
            (
                "litemall",
                include_str!("../../config/examples/litemall-mysql.toml"),
            ),
            (
                "saleor",
                include_str!("../../config/examples/saleor-postgres.toml"),
            ),
            (
                "reference",
                include_str!("../../config/examples/reference.toml"),
            ),
        ] {
            let s: Settings = toml::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!s.orders.table.is_empty(), "{name}");
        }
        let reference: Settings =
            toml::from_str(include_str!("../../config/examples/reference.toml")).unwrap();
        assert_eq!(
            format!(
                "{:?}",
                (&reference.orders, &reference.items, &reference.inventory)
            ),
            format!(
                "{:?}",
                (
                    &Settings::default().orders,
                    &Settings::default().items,
                    &Settings::default().inventory
                )
            ),
            "reference.toml is the defaults"
        );
    }

    #[test]
    fn unknown_keys_and_bad_addresses_are_errors() {
        assert!(toml::from_str::<Settings>("prefech = 1").is_err());
        let err = toml::from_str::<Settings>("cascade_shards = 0").unwrap_err();
        assert!(err.to_string().contains("between 1 and 16"), "{err}");
        assert!(toml::from_str::<Settings>("cascade_shards = 17").is_err());
        let mut s = Settings::default();
        let err = s
            .apply_env(|n| (n == "HTTP_ADDR").then(|| "nope".to_string()))
            .unwrap_err();
        assert!(err.to_string().contains("HTTP_ADDR"), "{err}");
    }
}
