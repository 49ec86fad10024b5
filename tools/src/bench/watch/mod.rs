//! `order-timeout-tools bench-watch`: what a timer's `watch` costs and how
//! late its flips are, on PostgreSQL or MariaDB/MySQL (`--database`).
//!
//! A run creates its own vhost and database as `bench` does
//! ([`BenchEnv`]), a table shaped like the reference `orders`
//! (`watched_orders`: text id, text status, `expires_at`, and `flipped_at`,
//! which the timers' `set` writes from the database's clock), and a config
//! for the services with one watched `[[timers]]` table per window. Then:
//!
//! - **part (a), `query`**: fills the table with `--rows` rows (default
//!   1,000,000: most in statuses the watch does not read, 15 % in its
//!   from-status due over the next 14 days, and 60,000 due at 1,000/s for
//!   one minute a day ahead), creates the `(status, expires_at)` index the
//!   README tells a shop to create, and times the watch's scan — the
//!   store's own `due_between`, in pages as a tick reads them — for an
//!   empty window, a sparse one, ~1,000 rows and ~60,000 rows: median per
//!   scan, per statement and per row, and `EXPLAIN` of the page statement;
//! - **part (b), `lateness`**: starts one service instance (no publisher at
//!   all) and, for each `--windows` window in turn, inserts `--rate`
//!   rows/s for `--duration` into that timer's from-status, each due
//!   `--lead` (default 3 windows) after its insert; reports lateness
//!   (`flipped_at - expires_at`) p50/p99/max, early rows (must be 0), rows
//!   never flipped (lost), and CPU per row per process.
//!
//! Known limit, by design (`src/pipeline/watch.rs`): a row entering the
//! from-status with its deadline inside a window already scanned is left
//! to the sweeper (`[sweeper] grace`, 60 s late); the lead here (> 2
//! windows) keeps every row out of that case.

mod lateness;
mod query;
mod table;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::BenchError;
use super::env::BenchEnv;
use super::sys::Sampling;
use super::{StockPath, machine_info};
use crate::shop::OrdersDatabase;
use order_timeout::settings::{Settings, Timer};

/// The timer part (a) scans: [`table::FILL_FROM`] → [`table::TO`].
const QUERY_TIMER: &str = "auto_receive";

/// Which parts to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// The cost of the watch's scan on a big table.
    Query,
    /// Lateness of watched timers at `--rate` rows/s coming due.
    Lateness,
    /// Both: the query part first, then lateness on the filled table.
    All,
}

/// Arguments of `bench-watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Where the watched table lives: `postgres` (DATABASE_URL's server) or
    /// `mysql` (MYSQL_URL's server, MariaDB or MySQL).
    #[arg(long, value_enum, default_value_t = OrdersDatabase::Postgres)]
    pub database: OrdersDatabase,
    /// What to measure: `query` (part a), `lateness` (part b) or `all`.
    #[arg(long, value_enum, default_value_t = Part::All)]
    pub part: Part,
    /// Part (a): rows in the table (at least 100000; 60000 of them are
    /// the 1,000 rows/s minute).
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Part (a): timed scans per window (after one warm-up scan); the
    /// median is reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Part (b): the watch windows to measure, one timer and one phase
    /// each, in this order (each at least 1s).
    #[arg(long, value_delimiter = ',', default_values = ["10s", "1m"], value_parser = humantime::parse_duration)]
    pub windows: Vec<Duration>,
    /// Part (b): rows coming into the from-status per second.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Part (b): how long each phase inserts rows.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Part (b): how long before its deadline a row enters the
    /// from-status; more than 2 windows [default: 3 windows of the phase's
    /// timer].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub lead: Option<Duration>,
    /// Part (b): the longest wait for a phase's rows after the last
    /// deadline.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub settle_timeout: Duration,
    /// Write the results as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep the bench's vhost and database (and child logs) afterwards.
    #[arg(long)]
    pub keep: bool,
}

impl WatchArgs {
    fn check(&self) -> Result<(), BenchError> {
        let bad = |m: &str| Err(BenchError::Args(m.into()));
        if !(100_000..=100_000_000).contains(&self.rows) {
            return bad("--rows must be 100000..=100000000");
        }
        if !(1..=100).contains(&self.repeat) {
            return bad("--repeat must be 1..=100");
        }
        if self.windows.is_empty() || self.windows.len() > 8 {
            return bad("--windows takes 1 to 8 durations");
        }
        let longest = self.windows.iter().max().copied().unwrap_or_default();
        for (i, w) in self.windows.iter().enumerate() {
            if *w < Duration::from_secs(1) || *w > Duration::from_secs(3600) {
                return bad("each of --windows must be 1s..=1h (the service refuses under 1s)");
            }
            if self.windows[..i]
                .iter()
                .any(|o| timer_suffix(*o) == timer_suffix(*w))
            {
                return bad("--windows has the same window twice");
            }
        }
        if !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= 100_000.0) {
            return bad("--rate must be in (0, 100000]");
        }
        if self.duration.is_zero() || self.duration > Duration::from_secs(3600) {
            return bad("--duration must be in (0, 1h]");
        }
        if self.lead.is_some_and(|l| l <= longest * 2) {
            return bad("--lead must be longer than 2 of the longest of --windows");
        }
        if self.settle_timeout < Duration::from_secs(1) {
            return bad("--settle-timeout must be at least 1s");
        }
        Ok(())
    }

    fn query(&self) -> bool {
        matches!(self.part, Part::Query | Part::All)
    }

    fn lateness(&self) -> bool {
        matches!(self.part, Part::Lateness | Part::All)
    }
}

/// `10s` → `10s`, `1m 30s` → `1m30s`: a window as a timer name's suffix.
fn timer_suffix(window: Duration) -> String {
    humantime::format_duration(window)
        .to_string()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect::<String>()
        .to_ascii_lowercase()
}

/// The flip-time expression of the timers' `set`, from the database's
/// clock at the flip (not the transaction's start).
fn flip_clock(database: OrdersDatabase) -> &'static str {
    match database {
        OrdersDatabase::Postgres => "clock_timestamp()",
        OrdersDatabase::Mysql => "UTC_TIMESTAMP(6)",
    }
}

/// One `[[timers]]` table on the watched table.
fn timer_toml(name: &str, from: &str, window: Duration, database: OrdersDatabase) -> String {
    format!(
        "\n[[timers]]\nname = \"{name}\"\ntable = \"{table}\"\nid = \"id\"\nstatus = \"status\"\n\
         from = \"{from}\"\nto = \"{to}\"\ndeadline = \"expires_at\"\n\
         set = {{ flipped_at = \"{clock}\" }}\nevent = \"order.{name}\"\nwatch = \"{window}\"\n",
        table = table::TABLE,
        to = table::TO,
        clock = flip_clock(database),
        window = humantime::format_duration(window),
    )
}

/// The lateness phases: one timer per window.
fn phases(args: &WatchArgs) -> Vec<lateness::Phase> {
    args.windows
        .iter()
        .map(|&w| {
            let suffix = timer_suffix(w);
            lateness::Phase {
                timer: format!("receive_{suffix}"),
                window: w,
                from: format!("SHIPPED_{}", suffix.to_ascii_uppercase()),
                lead: args.lead.unwrap_or((w * 3).max(Duration::from_secs(5))),
                rate: args.rate,
                duration: args.duration,
                settle_timeout: args.settle_timeout,
                prefix: format!("w{suffix}-"),
            }
        })
        .collect()
}

/// Writes the services' config: the user's `--config` (if any) and the
/// bench's timers after it.
fn write_config(
    user: Option<&Path>,
    args: &WatchArgs,
    phases: &[lateness::Phase],
) -> Result<PathBuf, BenchError> {
    let mut text = match user {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| BenchError::Setup(format!("reading {}: {e}", file.display())))?,
        None => String::new(),
    };
    text.push_str(&timer_toml(
        QUERY_TIMER,
        table::FILL_FROM,
        Duration::from_secs(60),
        args.database,
    ));
    for p in phases {
        text.push_str(&timer_toml(&p.timer, &p.from, p.window, args.database));
    }
    let file = std::env::temp_dir().join(format!(
        "ot_bench_watch_{}_{}.toml",
        std::process::id(),
        chrono::Utc::now().format("%Y%m%d%H%M%S")
    ));
    std::fs::write(&file, text)
        .map_err(|e| BenchError::Setup(format!("writing {}: {e}", file.display())))?;
    Ok(file)
}

/// What a run reports (`--out`).
#[derive(Debug, Default, Serialize)]
pub struct WatchReport {
    /// The command line.
    pub command: String,
    /// When the run started (UTC).
    pub started_at: String,
    /// The machine.
    pub machine: std::collections::BTreeMap<String, String>,
    /// `postgres` or `mysql`.
    pub database: String,
    /// Part (a).
    pub query: Option<query::QueryReport>,
    /// Part (b), one per window.
    pub lateness: Vec<lateness::LatenessReport>,
}

/// Runs `bench-watch`; the exit code says whether every check passed.
pub async fn run(
    settings: Settings,
    config_file: Option<PathBuf>,
    args: WatchArgs,
) -> anyhow::Result<ExitCode> {
    args.check()?;
    let phases = phases(&args);
    let config = write_config(config_file.as_deref(), &args, &phases)?;
    let result = run_with_config(&settings, &config, &args, &phases).await;
    let _ = std::fs::remove_file(&config);
    let report = result?;
    let failures: Vec<&String> = report
        .query
        .iter()
        .flat_map(|q| &q.failures)
        .chain(report.lateness.iter().flat_map(|l| &l.failures))
        .collect();
    if let Some(path) = &args.out {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| BenchError::Setup(format!("serializing results: {e}")))?;
        std::fs::write(path, json).map_err(|error| BenchError::Write {
            path: path.display().to_string(),
            error,
        })?;
        eprintln!("== results written to {}", path.display());
    }
    println!(
        "note: a row entering the from-status with its deadline inside a window the watch already \
         scanned is left to the sweeper ([sweeper] grace, 60 s by default); the lead here keeps \
         every row out of that case"
    );
    Ok(if failures.is_empty() {
        println!("bench-watch: all checks passed");
        ExitCode::SUCCESS
    } else {
        for f in failures {
            println!("FAIL: {f}");
        }
        println!("bench-watch: CHECKS FAILED");
        ExitCode::FAILURE
    })
}

/// The timers of the services' config, to call the store of one of them.
fn timer_named(config: &Path, name: &str) -> Result<Timer, BenchError> {
    let s = Settings::load(Some(config))
        .map_err(|e| BenchError::Setup(format!("the bench's config {}: {e}", config.display())))?;
    s.timers()
        .map_err(|e| BenchError::Setup(e.to_string()))?
        .into_iter()
        .find(|t| t.name.as_str() == name)
        .ok_or_else(|| BenchError::Setup(format!("no timer {name} in {}", config.display())))
}

async fn run_with_config(
    settings: &Settings,
    config: &Path,
    args: &WatchArgs,
    phases: &[lateness::Phase],
) -> Result<WatchReport, BenchError> {
    let timer = timer_named(config, QUERY_TIMER)?;
    let mut report = WatchReport {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started_at: order_timeout::message::format_instant(chrono::Utc::now()),
        machine: machine_info(),
        database: format!("{:?}", args.database).to_lowercase(),
        ..Default::default()
    };
    eprintln!("== creating the bench's vhost and database");
    let mut env = BenchEnv::create(
        settings,
        Some(config),
        args.keep,
        8,
        args.database,
        StockPath::Grpc,
        &[],
    )
    .await?;
    let result = run_in(&mut env, &timer, args, phases, &mut report).await;
    eprintln!("== cleaning up");
    env.cleanup(result.is_err()).await;
    result.map(|()| report)
}

async fn run_in(
    env: &mut BenchEnv,
    timer: &Timer,
    args: &WatchArgs,
    phases: &[lateness::Phase],
    report: &mut WatchReport,
) -> Result<(), BenchError> {
    table::create(&env.db.orders).await?;
    if args.query() {
        report.query = Some(query::measure(env, timer, args.rows, args.repeat).await?);
    } else {
        table::create_index(&env.db.orders).await?;
    }
    if !args.lateness() {
        return Ok(());
    }
    order_timeout::testing::broker::declare_topology(&env.settings)
        .await
        .map_err(|e| BenchError::Setup(format!("declaring the topology: {e:#}")))?;
    eprintln!(
        "== starting one service instance (logs in {})",
        env.log_dir.display()
    );
    env.start_services(1).await?;
    let sampling = Sampling::start(super::process_groups(env, args.database));
    let mut result = Ok(());
    for p in phases {
        match lateness::run(env, p, &sampling).await {
            Ok(r) => {
                lateness::print(&r);
                report.lateness.push(r);
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    sampling.stop().await;
    result
}
