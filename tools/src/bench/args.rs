//! The arguments of `bench` ([`BenchArgs`]), what they choose between
//! ([`Baseline`], [`Entry`], [`StockPath`]), and the checks of their
//! combinations.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::workload::{Chosen, LaneChoice, Named, TimeoutDist};
use super::{BenchError, paths, workload};
use crate::shop::OrdersDatabase;

/// What to compare the product with in the same run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Baseline {
    /// One delay queue with per-message `expiration`, dead-lettering into
    /// the service: the same workload, after the product's.
    SingleQueue,
    /// Publish → fixed-TTL queue → dead-letter → consume, no database,
    /// saturated: what one hop can carry on this machine (measured first).
    BrokerCeiling,
    /// Publish → 2 s TTL queue → dead-letter → consume, paced at `--rate`
    /// for `--duration`, no database: the broker's CPU per message on the
    /// service's lane path (quorum queues, at-least-once dead-lettering),
    /// with and without the event, and on the seed design's classic path
    /// (measured first, one path at a time).
    BrokerPaths,
    /// The seed design: one classic queue with per-message `expiration`
    /// into a plain consumer doing one conditional UPDATE per order (no
    /// stock release, no event): the same workload, after the product's,
    /// with the services stopped.
    Seed,
}

/// `bench --entry`: the routing key the generator publishes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Entry {
    /// Into the lane of the order's window (`schedule.<W>s`) when there is
    /// one, else `schedule`.
    Lane,
    /// Always `schedule`: the consumer reads every order before its wait.
    Schedule,
}

/// Arguments of `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Orders created per second.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Where the orders live: `postgres`, or `mysql` (a database on
    /// MYSQL_URL's server; the reference inventory stays on PostgreSQL).
    #[arg(long, value_enum, default_value_t = OrdersDatabase::Postgres)]
    pub database: OrdersDatabase,
    /// How cancelled orders' stock goes back: `grpc` (ReleaseStock to the
    /// reference inventory, from the outbox) or `also` (an `[orders].also`
    /// statement in the cancel transaction, on a stock table in the orders'
    /// MySQL database; with `--database mysql`).
    #[arg(long, value_enum, default_value_t = StockPath::Grpc)]
    pub stock: StockPath,
    /// How long to create orders.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// The workload: `shop` (every order the same payment window,
    /// `--timeout`: what real shops have) or `mix` (timeouts 0.5, 1, 5 and
    /// 10 s in equal shares).
    #[arg(long, value_enum, default_value_t = Named::Shop)]
    pub workload: Named,
    /// The shared payment window of `--workload shop` [default: 31s, as many
    /// cascade hops as 30 min; 8s is one hop on one level].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// Instead of a named workload, any payment windows: fixed (`3h`),
    /// uniform range (`1s..10s`), or a weighted list
    /// (`500ms:1,1s:1,5s:1,10s:1`).
    #[arg(long, value_parser = workload::parse_timeouts, conflicts_with_all = ["workload", "timeout"])]
    pub timeouts: Option<TimeoutDist>,
    /// Lanes the services run with: `auto` (with `--workload shop`, its
    /// window, as a shop configures it; none otherwise), `none`, or a list
    /// such as `30m,2h`.
    #[arg(long, default_value = "auto", value_parser = clap::value_parser!(LaneChoice))]
    pub lanes: LaneChoice,
    /// How the generator publishes an order's timeout: `lane` (routing key
    /// `schedule.<W>s`, straight into the lane of the order's window when
    /// the services run one, as the README tells a shop with one payment
    /// window to do; `schedule` for other orders) or `schedule` (every order
    /// through the due queue and the consumer first).
    #[arg(long, value_enum, default_value_t = Entry::Lane)]
    pub entry: Entry,
    /// Share of orders paid before their deadline (they must stay untouched).
    #[arg(long, default_value_t = 0.3)]
    pub paid_ratio: f64,
    /// Service instances (processes) competing on the due queue.
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    /// Comparisons to run in the same run: `single-queue`, `seed`,
    /// `broker-ceiling`, `broker-paths` (repeat the flag or separate with
    /// commas).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub baseline: Vec<Baseline>,
    /// How long the broker ceiling publishes.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub ceiling_duration: Duration,
    /// Instead of the rate run: create this many orders (with a long
    /// `--timeout`, e.g. 3h) as fast as possible and measure broker memory
    /// and disk and the service's memory while they are pending.
    #[arg(long)]
    pub pending: Option<u64>,
    /// Distinct SKUs order items draw from.
    #[arg(long, default_value_t = 1000)]
    pub skus: usize,
    /// Longest wait for orders to settle after the last deadline.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub settle_timeout: Duration,
    /// Confirm-mode channels the generator publishes on.
    #[arg(long, default_value_t = 4)]
    pub publish_channels: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Draw lateness over time and its distribution into this PNG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Run the workload this many times in a row (the same vhost, database
    /// and services; the broker ceiling once, first), one line per run and
    /// a verdict at the end: were all runs within `--p99-target`? With
    /// `--baseline broker-paths`, also the rounds of the paths (all paths in
    /// turn, round after round, before the workload).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// With `--repeat`: start every run after the first on empty tables
    /// (orders, items, the service's outbox, the reference inventory's
    /// reservations and releases) and freshly written stock, so each run
    /// measures the same state instead of a database grown by the earlier
    /// runs' orders. Without it, where the PostgreSQL server has
    /// autovacuum off, the bench vacuums the tables between runs.
    #[arg(long)]
    pub fresh_tables: bool,
    /// The verdict's lateness target: p99 at most this.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    pub p99_target: Duration,
    /// During the product's phase, this many HTTP clients hammer every
    /// endpoint of the services (console pages, a wrong login, `/metrics`,
    /// `/healthz`, `/readyz`, a foreign host name), one request per
    /// connection, as fast as answered: the lateness then says what
    /// anonymous HTTP traffic costs cancelling (compare with a run
    /// without). With `ADMIN_TOKEN` in the bench's environment (the
    /// services inherit it) the wrong logins meet the login limits.
    #[arg(long, default_value_t = 0)]
    pub flood: usize,
    /// With `--flood`: the flood is on and off in turns of this long each
    /// (quiet first) instead of the whole phase, and the report gives the
    /// lateness of the orders due in quiet and in flooded turns apart: one
    /// run, so the machine's own load weighs on both alike.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub flood_every: Option<Duration>,
    /// Keep the bench's vhost and database (and child logs) afterwards.
    #[arg(long)]
    pub keep: bool,
    /// The workload the arguments name (set by `prepare`).
    #[arg(skip)]
    pub(super) chosen: Chosen,
}

impl BenchArgs {
    /// Checks the arguments and settles the workload.
    pub(super) fn prepare(&mut self) -> Result<(), BenchError> {
        self.chosen = workload::choose(self.workload, self.timeout, self.timeouts.as_ref())
            .map_err(|e| BenchError::Args(e.to_string()))?;
        self.check_values()?;
        self.check_combinations()
    }

    fn check_values(&self) -> Result<(), BenchError> {
        let bad = |m: &str| Err(BenchError::Args(m.into()));
        if !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= 1_000_000.0) {
            return bad("--rate must be in (0, 1000000]");
        }
        if self.duration.is_zero() && self.pending.is_none() {
            return bad("--duration must be positive");
        }
        if !(0.0..=1.0).contains(&self.paid_ratio) {
            return bad("--paid-ratio is a share in 0..=1");
        }
        if !(1..=32).contains(&self.consumers) {
            return bad("--consumers must be 1..=32");
        }
        if self.skus == 0 {
            return bad("--skus must be positive");
        }
        if self.baseline.contains(&Baseline::BrokerCeiling)
            && self.ceiling_duration < Duration::from_secs(3)
        {
            return bad("--ceiling-duration must be at least 3s (the TTL is 1 s)");
        }
        if self.baseline.contains(&Baseline::BrokerPaths) && self.duration < paths::MIN_DURATION {
            return Err(BenchError::Args(format!(
                "--duration must be at least {:?} for broker-paths (the TTL, the hold, a warm-up and 3 s of readings)",
                paths::MIN_DURATION
            )));
        }
        if !(1..=64).contains(&self.publish_channels) {
            return bad("--publish-channels must be 1..=64");
        }
        if self.pending == Some(0) {
            return bad("--pending must be positive");
        }
        if !(1..=20).contains(&self.repeat) {
            return bad("--repeat must be 1..=20");
        }
        if self.flood > 10_000 {
            return bad("--flood must be at most 10000 clients");
        }
        if let Some(every) = self.flood_every
            && (self.flood == 0 || every < Duration::from_secs(2))
        {
            return bad("--flood-every needs --flood and turns of at least 2s");
        }
        if self.p99_target.is_zero() {
            return bad("--p99-target must be positive");
        }
        Ok(())
    }

    fn check_combinations(&self) -> Result<(), BenchError> {
        let bad = |m: &str| Err(BenchError::Args(m.into()));
        let phases = self.baseline.contains(&Baseline::SingleQueue)
            || self.baseline.contains(&Baseline::Seed)
            || self.repeat > 1;
        if self.pending.is_some() && phases {
            return bad(
                "--pending measures the product once; drop --baseline single-queue/seed and --repeat",
            );
        }
        // The `also` check counts the stock given back in the whole
        // database against one phase's cancellations.
        if self.stock.by_also() && (self.database != OrdersDatabase::Mysql || phases) {
            return bad(
                "--stock also/also-keys needs --database mysql, no --baseline single-queue/seed and no --repeat",
            );
        }
        Ok(())
    }
}

/// How the bench's cancelled orders give their stock back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StockPath {
    /// `ReleaseStock` over gRPC to the reference inventory.
    Grpc,
    /// An `also` statement in the cancel transaction (`release = "none"`).
    Also,
    /// The same `also` statement, its rows' keys (the order's SKUs) locked
    /// in one order first (`also_keys`).
    AlsoKeys,
}

impl StockPath {
    /// The stock goes back by an `also` statement.
    pub fn by_also(self) -> bool {
        matches!(self, Self::Also | Self::AlsoKeys)
    }
}
