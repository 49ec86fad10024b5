//! `order-timeout-tools bench`: a load generator and measurer on the real path
//! (insert the order row → publish the timeout → the service cancels →
//! the inventory releases), reporting from database timestamps.
//!
//! A run creates its own RabbitMQ vhost and PostgreSQL database, starts the
//! reference inventory server and `--consumers` service instances as child
//! processes of this binary (so their CPU and memory are measured apart
//! from the generator's), and then, in order:
//!
//! 1. with `--baseline broker-ceiling`: the one-hop broker ceiling
//!    ([`baseline::broker_ceiling`]);
//! 2. the product: `--rate` orders/s for `--duration`, timeouts drawn from
//!    `--timeouts`, `--paid-ratio` of them paid before their deadline; wait
//!    for every order to settle; measure;
//! 3. with `--baseline single-queue`: the same workload through one delay
//!    queue with per-message `expiration` ([`baseline`]);
//!
//! or, with `--pending N`, only fills N orders with long timeouts and
//! measures broker memory and disk and the service's memory.
//! Results: a summary on stdout, JSON (`--out`), a PNG (`--plot`).

pub mod baseline;
pub mod env;
pub mod load;
pub mod plot;
pub mod report;
pub mod sys;
pub mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

use self::env::BenchEnv;
use self::load::{Route, Workload};
use self::report::{BenchReport, PendingReport, PhaseReport};
use self::sys::{Group, Sampler, Who};
use self::workload::TimeoutDist;
use crate::shop::{OrdersDatabase, ShopDb};
use order_timeout::settings::Settings;

/// Errors of the bench (setup, broker, database, plotting, output).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad arguments.
    #[error("invalid arguments: {0}")]
    Args(String),
    /// Creating the bench's world failed.
    #[error("setup: {0}")]
    Setup(String),
    /// The broker.
    #[error("broker: {0}")]
    Amqp(#[from] lapin::Error),
    /// The database.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// The service's store.
    #[error("{0}")]
    Store(#[from] order_timeout::store::StoreError),
    /// The topology.
    #[error("{0}")]
    Topology(#[from] order_timeout::broker::topology::TopologyError),
    /// The scratch vhost or database.
    #[error("{0}")]
    Scratch(#[from] crate::scratch::ScratchError),
    /// Drawing the PNG.
    #[error("plot: {0}")]
    Plot(String),
    /// Writing results.
    #[error("writing {path}: {error}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
}

/// What to compare the product with in the same run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Baseline {
    /// One delay queue with per-message `expiration`, dead-lettering into
    /// the service: the same workload, after the product's.
    SingleQueue,
    /// Publish → fixed-TTL queue → dead-letter → consume, no database,
    /// saturated: what one hop can carry on this machine (measured first).
    BrokerCeiling,
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
    /// Payment windows: fixed (`5s`), uniform range (`1s..10s`), or a
    /// weighted list (`500ms:1,1s:1,5s:1,10s:1`).
    #[arg(long, default_value = "500ms:1,1s:1,5s:1,10s:1", value_parser = workload::parse_timeouts)]
    pub timeouts: TimeoutDist,
    /// Share of orders paid before their deadline (they must stay untouched).
    #[arg(long, default_value_t = 0.3)]
    pub paid_ratio: f64,
    /// Service instances (processes) competing on the due queue.
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    /// Comparisons to run in the same run: `single-queue`, `broker-ceiling`
    /// (repeat the flag or separate with commas).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub baseline: Vec<Baseline>,
    /// How long the broker ceiling publishes.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub ceiling_duration: Duration,
    /// Instead of the rate run: create this many orders (with long
    /// `--timeouts`, e.g. 3h) as fast as possible and measure broker memory
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
    /// Keep the bench's vhost and database (and child logs) afterwards.
    #[arg(long)]
    pub keep: bool,
}

impl BenchArgs {
    fn check(&self) -> Result<(), BenchError> {
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
        if !(1..=64).contains(&self.publish_channels) {
            return bad("--publish-channels must be 1..=64");
        }
        if self.pending == Some(0) {
            return bad("--pending must be positive");
        }
        if self.pending.is_some() && self.baseline.contains(&Baseline::SingleQueue) {
            return bad("--pending measures the product only; drop --baseline single-queue");
        }
        if self.stock == StockPath::Also
            && (self.database != OrdersDatabase::Mysql
                || self.baseline.contains(&Baseline::SingleQueue))
        {
            return bad("--stock also needs --database mysql and no --baseline single-queue");
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
}

/// Stock per SKU at the start of a run.
pub const INITIAL_STOCK: i64 = 1_000_000_000;

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unreadable".into())
}

fn machine_info() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert(
        "cores".into(),
        std::thread::available_parallelism()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "?".into()),
    );
    if let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo")
        && let Some(l) = meminfo.lines().find(|l| l.starts_with("MemTotal:"))
    {
        m.insert("memory".into(), l["MemTotal:".len()..].trim().to_owned());
    }
    if let Some(v) = env::rabbitmqctl_opt(&["version"]) {
        m.insert("rabbitmq".into(), v.trim().to_owned());
    }
    m
}

/// The broker's data directory (`rabbitmqctl status`), if it says.
fn broker_status() -> (Option<f64>, Option<String>) {
    let Some(text) = env::rabbitmqctl_opt(&["status", "--formatter", "json"]) else {
        return (None, None);
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return (None, None);
    };
    let mem = v["memory"]["total"]["rss"]
        .as_f64()
        .or_else(|| v["memory"]["total"]["erlang"].as_f64())
        .map(|b| b / 1048576.0);
    let dir = v["data_directory"].as_str().map(str::to_owned);
    (mem, dir)
}

/// Runs `bench`; the exit code says whether every check passed.
pub async fn run(
    settings: Settings,
    config_file: Option<PathBuf>,
    args: BenchArgs,
) -> anyhow::Result<ExitCode> {
    args.check()?;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut report = BenchReport {
        command,
        started_at: order_timeout::message::format_instant(chrono::Utc::now()),
        machine: machine_info(),
        ..Default::default()
    };
    let db_conns = 16;
    eprintln!("== creating the bench's vhost and database");
    let mut env = BenchEnv::create(
        &settings,
        config_file.as_deref(),
        args.keep,
        db_conns,
        args.database,
        args.stock,
    )
    .await?;
    let result = run_in(&mut env, &args, &mut report).await;
    eprintln!("== cleaning up");
    env.cleanup().await;
    let ok = result?;

    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| BenchError::Setup(format!("serializing results: {e}")))?;
    if let Some(path) = &args.out {
        std::fs::write(path, &json).map_err(|error| BenchError::Write {
            path: path.display().to_string(),
            error,
        })?;
        eprintln!("== results written to {}", path.display());
    }
    print_summary(&report);
    Ok(if ok {
        println!("bench: all checks passed");
        ExitCode::SUCCESS
    } else {
        println!("bench: CHECKS FAILED (see above)");
        ExitCode::FAILURE
    })
}

fn settings_info(s: &Settings, args: &BenchArgs) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert(
        "queue_type".into(),
        format!("{:?}", s.queue_type).to_lowercase(),
    );
    m.insert("cascade_shards".into(), s.cascade_shards.get().to_string());
    m.insert("prefetch".into(), s.prefetch.to_string());
    m.insert("batch_max".into(), s.batch_max.to_string());
    m.insert("batch_concurrency".into(), s.batch_concurrency.to_string());
    m.insert(
        "db_max_connections".into(),
        s.db_max_connections.to_string(),
    );
    m.insert(
        "inventory_concurrency".into(),
        s.inventory_concurrency.to_string(),
    );
    m.insert("consumers".into(), args.consumers.to_string());
    m.insert("timeouts".into(), args.timeouts.to_string());
    m.insert("paid_ratio".into(), args.paid_ratio.to_string());
    m
}

async fn run_in(
    env: &mut BenchEnv,
    args: &BenchArgs,
    report: &mut BenchReport,
) -> Result<bool, BenchError> {
    report.settings = settings_info(&env.settings, args);
    let declare_started = std::time::Instant::now();
    order_timeout::broker::declare_topology(&env.settings)
        .await
        .map_err(|e| BenchError::Setup(format!("declaring the topology: {e:#}")))?;
    let declare_seconds = declare_started.elapsed().as_secs_f64();
    eprintln!(
        "== topology declared in {declare_seconds:.2} s; starting {} service instance(s) (logs in {})",
        args.consumers,
        env.log_dir.display()
    );
    env.start_services(args.consumers).await?;
    let mut groups = vec![
        Group {
            name: "bench".into(),
            who: Who::Pids(vec![std::process::id()]),
        },
        Group {
            name: "service".into(),
            who: Who::Pids(env.service_pids()),
        },
        Group {
            name: "broker".into(),
            who: Who::Comm("beam.smp"),
        },
        Group {
            name: "postgres".into(),
            who: Who::Comm("postgres"),
        },
    ];
    if args.database == OrdersDatabase::Mysql {
        groups.push(Group {
            name: "mariadb".into(),
            who: Who::Comm("mariadbd"),
        });
    }
    if let Some(pid) = env.inventory.as_ref().and_then(|c| c.pid()) {
        groups.push(Group {
            name: "inventory".into(),
            who: Who::Pids(vec![pid]),
        });
    }
    let sampler = Arc::new(Mutex::new(Sampler::new(groups)));
    let stop_sampling = order_timeout::shutdown::Shutdown::new();
    let sampling = tokio::spawn({
        let (sampler, stop) = (sampler.clone(), stop_sampling.clone());
        async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.wait() => return,
                }
                if let Ok(mut s) = sampler.lock() {
                    s.sample();
                }
            }
        }
    });
    let reset = |s: &Arc<Mutex<Sampler>>| {
        if let Ok(mut s) = s.lock() {
            s.reset();
        }
    };
    let usage = |s: &Arc<Mutex<Sampler>>| {
        s.lock()
            .map(|mut s| {
                s.sample();
                s.usage()
            })
            .unwrap_or_default()
    };

    let mut ok = true;
    if args.baseline.contains(&Baseline::BrokerCeiling) {
        eprintln!(
            "== broker ceiling: publish → {} ms TTL queue → dead-letter → consume, {:?} saturated",
            baseline::CEILING_TTL_MS,
            args.ceiling_duration
        );
        reset(&sampler);
        let la0 = loadavg();
        let mut c = baseline::broker_ceiling(
            &env.settings.amqp_url,
            env.settings.queue_type,
            args.ceiling_duration,
        )
        .await?;
        c.resources = usage(&sampler);
        c.loadavg = (la0, loadavg());
        eprintln!(
            "   published {} ({:.0}/s), consumed {} at {:.0}/s ({:.0}/s while publishing)",
            c.published,
            c.publish_rate,
            c.consumed,
            c.consume_rate,
            c.sustained_rate.unwrap_or(0.0)
        );
        report.broker_ceiling = Some(c);
    }

    if let Some(n) = args.pending {
        reset(&sampler);
        let mut p = pending(env, args, n).await?;
        p.declare_seconds = declare_seconds;
        if let Ok(mut s) = sampler.lock() {
            s.sample();
            p.resources = s.usage();
            p.service_memory = s.series("service");
            p.broker_memory = s.series("broker");
        }
        ok &= p.failures.is_empty();
        report.pending = Some(p);
    } else {
        let skus: Vec<String> = (0..args.skus)
            .map(|i| format!("bench-sku-{i:05}"))
            .collect();
        let stock: Vec<(String, i64)> = skus.iter().map(|s| (s.clone(), INITIAL_STOCK)).collect();
        match &env.db.orders {
            ShopDb::MySql(pool) if args.stock == StockPath::Also => {
                for (sku, n) in &stock {
                    sqlx::query("INSERT INTO shop_stock (sku, available) VALUES (?, ?)")
                        .bind(sku)
                        .bind(n)
                        .execute(pool)
                        .await?;
                }
            }
            _ => crate::shop::set_stock(&env.db.inventory, &stock).await?,
        }
        let w = Workload {
            rate: args.rate,
            duration: args.duration,
            timeouts: args.timeouts.clone(),
            paid_ratio: args.paid_ratio,
            skus,
            publish_channels: args.publish_channels,
            settle_timeout: args.settle_timeout,
        };
        let conn =
            order_timeout::broker::connect_amqp(&env.settings.amqp_url, "order-timeout-bench-shop")
                .await?;
        let channels = load::confirm_channels(&conn, w.publish_channels).await?;
        let mut plots: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        let mut routes = vec![Route::Cascade];
        if args.baseline.contains(&Baseline::SingleQueue) {
            baseline::declare_single_queue(&conn, env.settings.queue_type).await?;
            routes.push(Route::SingleQueue);
        }
        for route in routes {
            eprintln!(
                "== {}: {} orders/s for {:?}, timeouts {}, {:.0}% paid",
                route.design(),
                w.rate,
                w.duration,
                w.timeouts,
                w.paid_ratio * 100.0
            );
            reset(&sampler);
            let la0 = loadavg();
            let m0 = env.scrape().await;
            let prefix = format!("{}-", route.design());
            let g = load::generate(&env.db, &channels, route, &w, &prefix).await?;
            let s = load::settle(&env.db, g, &w).await?;
            let resources = usage(&sampler);
            let (mut phase, points) = load::measure(&env.db, &s, route, &w).await?;
            phase.resources = resources;
            phase.loadavg = (la0, loadavg());
            phase.service_metrics = env
                .scrape()
                .await
                .into_iter()
                .map(|(k, v)| {
                    let d = v - m0.get(&k).copied().unwrap_or(0.0);
                    (k, d)
                })
                .filter(|(_, d)| *d != 0.0)
                .collect();
            ok &= phase.failures.is_empty();
            print_phase(&phase);
            plots.push((route.design().to_owned(), points));
            match route {
                Route::Cascade => report.cascade = Some(phase),
                Route::SingleQueue => report.single_queue = Some(phase),
            }
        }
        let _ = conn.close(200, "done".into()).await;
        if let Some(path) = &args.plot {
            let series: Vec<plot::Series<'_>> = plots
                .iter()
                .map(|(name, points)| plot::Series { name, points })
                .collect();
            let title = format!(
                "order-timeout-tools bench: {} orders/s for {:?}, timeouts {}, {} x{} ({} consumer(s))",
                args.rate,
                args.duration,
                args.timeouts,
                report.settings["queue_type"],
                report.settings["cascade_shards"],
                args.consumers
            );
            plot::draw(path, &title, &series)?;
            eprintln!("== plot written to {}", path.display());
        }
    }
    stop_sampling.trigger();
    let _ = sampling.await;
    Ok(ok)
}

/// `--pending N`: fill and measure.
async fn pending(
    env: &mut BenchEnv,
    args: &BenchArgs,
    n: u64,
) -> Result<PendingReport, BenchError> {
    let mut p = PendingReport {
        orders: n,
        timeouts: args.timeouts.to_string(),
        loadavg: (loadavg(), String::new()),
        ..Default::default()
    };
    let (mem0, data_dir) = broker_status();
    let disk0 = data_dir.as_deref().and_then(sys::disk_usage);
    let db = env.db.clone();
    let conn =
        order_timeout::broker::connect_amqp(&env.settings.amqp_url, "order-timeout-bench-fill")
            .await?;
    let channels = load::confirm_channels(&conn, args.publish_channels).await?;
    eprintln!("== filling {n} orders, timeouts {}", args.timeouts);
    let bar = ProgressBar::new(n).with_style(
        ProgressStyle::with_template(
            "{spinner} filling [{elapsed_precise}] {bar:30} {pos}/{len} published ({per_sec}) {msg}",
        )
        .map_err(|e| BenchError::Setup(e.to_string()))?,
    );
    let started = std::time::Instant::now();
    let errors = load::fill(&db, &channels, &args.timeouts, n, &bar).await?;
    p.publish_seconds = started.elapsed().as_secs_f64();
    bar.finish();
    if errors > 0 {
        p.failures
            .push(format!("{errors} orders failed to be created/published"));
    }
    // Wait until the service has moved every message into the cascade.
    let vhost = env.name.clone();
    let wait_bar = ProgressBar::new(n).with_style(
        ProgressStyle::with_template(
            "{spinner} into the cascade [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
        )
        .map_err(|e| BenchError::Setup(e.to_string()))?,
    );
    let give_up = std::time::Instant::now() + Duration::from_secs(600.max(n / 300));
    let depth_channel = conn.create_channel().await?;
    let layout = order_timeout::broker::topology::Layout::of(&env.settings);
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let q = queue_counts(&depth_channel, &layout).await?;
        let due = q
            .get(order_timeout::broker::topology::DUE_QUEUE)
            .copied()
            .unwrap_or(0);
        let in_cascade: u64 = q
            .iter()
            .filter(|(k, _)| k.starts_with("order-timeout.delay."))
            .map(|(_, v)| v)
            .sum();
        wait_bar.set_position(in_cascade);
        wait_bar.set_message(format!("due queue {due}"));
        if due == 0 && in_cascade >= n - errors {
            break;
        }
        if std::time::Instant::now() > give_up {
            p.failures.push(format!(
                "gave up waiting: {in_cascade} of {n} in the cascade, {due} in the due queue"
            ));
            break;
        }
    }
    p.fill_seconds = started.elapsed().as_secs_f64();
    wait_bar.finish();
    eprintln!(
        "== filled in {:.1} s; watching memory for 15 s",
        p.fill_seconds
    );
    tokio::time::sleep(Duration::from_secs(15)).await;
    p.queue_messages = queue_counts(&depth_channel, &layout)
        .await?
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .collect();
    p.queue_memory_mib = list_queues(&vhost).map(|(_, mem)| mem);
    let (mem1, _) = broker_status();
    p.broker_memory_mib = (mem0, mem1);
    let disk1 = data_dir.as_deref().and_then(sys::disk_usage);
    p.broker_disk_mib = (
        disk0.map(|b| b as f64 / 1048576.0),
        disk1.map(|b| b as f64 / 1048576.0),
    );
    p.loadavg.1 = loadavg();
    let _ = conn.close(200, "done".into()).await;
    Ok(p)
}

/// Ready messages in the service's queues (passive declares: cheap,
/// unlike a `rabbitmqctl` call, which costs the broker's host a second of
/// CPU).
async fn queue_counts(
    channel: &lapin::Channel,
    layout: &order_timeout::broker::topology::Layout,
) -> Result<BTreeMap<String, u64>, BenchError> {
    let mut out = BTreeMap::new();
    for spec in order_timeout::broker::topology::queue_specs(layout) {
        let q = channel
            .queue_declare(
                spec.name.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await?;
        out.insert(spec.name, u64::from(q.message_count()));
    }
    Ok(out)
}

/// Messages per queue and the queues' total memory (MiB) in `vhost`.
fn list_queues(vhost: &str) -> Option<(BTreeMap<String, u64>, f64)> {
    let text = env::rabbitmqctl_opt(&[
        "list_queues",
        "-p",
        vhost,
        "name",
        "messages",
        "memory",
        "--formatter",
        "json",
    ])?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let mut out = BTreeMap::new();
    let mut mem = 0.0;
    for q in v.as_array()? {
        let name = q["name"].as_str()?.to_owned();
        out.insert(name, q["messages"].as_u64().unwrap_or(0));
        mem += q["memory"].as_f64().unwrap_or(0.0);
    }
    Some((out, mem / 1048576.0))
}

fn fmt_usage(u: &BTreeMap<String, sys::Usage>) -> String {
    u.iter()
        .map(|(k, v)| match (v.cpu_cores, v.mem_peak_mib) {
            (Some(c), Some(m)) => format!("{k} {:.0}% CPU {m:.0} MiB", c * 100.0),
            (None, Some(m)) => format!("{k} ? CPU {m:.0} MiB"),
            _ => format!("{k} unreadable"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_phase(p: &PhaseReport) {
    let l = &p.lateness;
    println!(
        "{}: {} orders at {:.0}/s (target {}), {} cancelled, {} paid; lateness p50 {:.1} / p90 {:.1} / p99 {:.1} / p99.9 {:.1} / max {:.1} ms; {} early, {} not cancelled; peak {} cancellations/s",
        p.design,
        p.orders,
        p.achieved_rate,
        p.target_rate,
        p.cancelled,
        p.paid,
        l.p50_ms,
        l.p90_ms,
        l.p99_ms,
        l.p999_ms,
        l.max_ms,
        l.early,
        p.not_cancelled,
        p.peak_cancel_rate
    );
    if p.late_payments > 0 {
        println!(
            "   {} payments came after the deadline (the generator fell behind) and were refused; those orders were cancelled",
            p.late_payments
        );
    }
    println!("   resources: {}", fmt_usage(&p.resources));
    let stages: Vec<String> = p
        .service_metrics
        .iter()
        .filter_map(|(k, sum)| {
            let stage = k
                .strip_prefix("order_timeout_stage_duration_seconds_sum{stage=\"")?
                .strip_suffix("\"}")?;
            let count = p.service_metrics.get(&k.replace("_sum{", "_count{"))?;
            Some(format!(
                "{stage} {count:.0} calls, mean {:.1} ms",
                sum / count.max(1.0) * 1000.0
            ))
        })
        .collect();
    if !stages.is_empty() {
        println!("   service stages: {}", stages.join("; "));
    }
    println!("   loadavg: {} -> {}", p.loadavg.0, p.loadavg.1);
    for f in &p.failures {
        println!("   FAIL: {f}");
    }
}

fn print_summary(r: &BenchReport) {
    println!("== summary");
    if let Some(c) = &r.broker_ceiling {
        println!(
            "broker ceiling ({}, one hop, {} ms TTL): {:.0} msg/s sustained while publishing, {:.0} msg/s first to last delivery ({:.0}/s published); resources: {}",
            c.queue_type,
            c.ttl_ms,
            c.sustained_rate.unwrap_or(0.0),
            c.consume_rate,
            c.publish_rate,
            fmt_usage(&c.resources)
        );
    }
    for p in [&r.cascade, &r.single_queue].into_iter().flatten() {
        print_phase(p);
        if let Some(ceiling) = r.broker_ceiling.as_ref().and_then(|c| c.sustained_rate)
            && ceiling > 0.0
        {
            println!(
                "   = {:.0}% of the one-hop broker ceiling",
                p.achieved_rate / ceiling * 100.0
            );
        }
    }
    if let Some(p) = &r.pending {
        println!(
            "pending: {} orders ({}); declare {:.2} s, publish {:.1} s, all in the cascade after {:.1} s",
            p.orders, p.timeouts, p.declare_seconds, p.publish_seconds, p.fill_seconds
        );
        println!(
            "   broker: queue memory {:?} MiB, broker memory {:?} -> {:?} MiB, data dir {:?} -> {:?} MiB",
            p.queue_memory_mib.map(|m| m.round()),
            p.broker_memory_mib.0.map(|m| m.round()),
            p.broker_memory_mib.1.map(|m| m.round()),
            p.broker_disk_mib.0.map(|m| m.round()),
            p.broker_disk_mib.1.map(|m| m.round())
        );
        let svc: Vec<String> = p
            .service_memory
            .iter()
            .step_by((p.service_memory.len() / 10).max(1))
            .map(|s| format!("{:.0}s:{:.0}", s.t_s, s.mib))
            .collect();
        println!("   service memory over time (s:MiB): {}", svc.join(" "));
        println!("   resources: {}", fmt_usage(&p.resources));
        println!("   queues: {:?}", p.queue_messages);
        for f in &p.failures {
            println!("   FAIL: {f}");
        }
    }
}
