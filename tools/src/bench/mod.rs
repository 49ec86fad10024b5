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
//!    ([`baseline::broker_ceiling`]); with `--baseline broker-paths`, the
//!    broker's CPU per message on each way a timeout can cross it, paced
//!    at `--rate` ([`paths`]);
//! 2. the product: `--rate` orders/s for `--duration`, the `--workload`'s
//!    timeouts (`shop`: every order the same `--timeout`, default 31 s;
//!    `mix`: 0.5/1/5/10 s), `--paid-ratio` of them paid before their
//!    deadline; wait for every order to settle; measure;
//! 3. with `--baseline single-queue`: the same workload through one delay
//!    queue with per-message `expiration` into the service ([`baseline`]);
//! 4. with `--baseline seed`: the same workload through the seed design
//!    ([`seed`]), the services stopped meanwhile;
//!    with `--flood N`, N HTTP clients hammer every endpoint of the
//!    services meanwhile ([`flood`]);
//! 5. `--repeat N`: steps 2–4 N times in a row, one line per run and a
//!    verdict (every run's p99 within `--p99-target`?);
//!
//! or, with `--pending N`, only fills N orders with long timeouts and
//! measures broker memory and disk and the service's memory.
//! Each phase reports CPU time per order for every process its design runs
//! on (broker, PostgreSQL, MariaDB, the service or the seed consumer, the
//! reference inventory, the bench itself), their total, and the design's
//! own process apart. Results: a summary on stdout, JSON (`--out`), a PNG
//! (`--plot`).

pub mod amqp;
mod args;
mod autovacuum;
pub mod baseline;
mod checkpoints;
pub mod env;
pub mod flood;
pub mod load;
pub mod outcome;
pub mod paths;
mod pending;
pub mod plot;
pub mod report;
pub mod seed;
mod summary;
pub mod sys;
pub mod watch;
pub mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use lapin::Channel;

pub use self::args::{Baseline, BenchArgs, Entry, StockPath};
use self::env::BenchEnv;
use self::load::{Route, Workload};
use self::report::{BenchReport, CeilingReport, PhaseReport, RunReport};
use self::sys::{Group, Sampling, Who};
use self::workload::Chosen;
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
    Store(#[from] order_timeout::testing::store::StoreError),
    /// The topology.
    #[error("{0}")]
    Topology(#[from] order_timeout::testing::broker::TopologyError),
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
    if let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo")
        && let Some(l) = cpuinfo.lines().find(|l| l.starts_with("model name"))
        && let Some((_, model)) = l.split_once(':')
    {
        m.insert("cpu".into(), model.trim().to_owned());
    }
    m.insert("loadavg_at_start".into(), loadavg());
    if let Some(v) = env::rabbitmqctl_opt(&["version"]) {
        m.insert("rabbitmq".into(), v.trim().to_owned());
    }
    m
}

/// Runs `bench`; the exit code says whether every check passed.
pub async fn run(
    settings: Settings,
    config_file: Option<PathBuf>,
    mut args: BenchArgs,
) -> anyhow::Result<ExitCode> {
    args.prepare()?;
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
        &args.lanes.lanes(&args.chosen),
    )
    .await?;
    let result = run_in(&mut env, &args, &mut report).await;
    let missed = !matches!(result, Ok(true)) || report.verdicts.iter().any(|v| !v.stable);
    let log_dir = env.log_dir.clone();
    eprintln!("== cleaning up");
    env.cleanup(missed).await;
    let ok = result?;

    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| BenchError::Setup(format!("serializing results: {e}")))?;
    if missed {
        // Beside the logs: lateness second by second, to find the moment.
        let path = log_dir.join("report.json");
        match std::fs::write(&path, &json) {
            Ok(()) => eprintln!(
                "== the results, second by second, are in {}",
                path.display()
            ),
            Err(e) => eprintln!("warning: writing {}: {e}", path.display()),
        }
    }
    if let Some(path) = &args.out {
        std::fs::write(path, &json).map_err(|error| BenchError::Write {
            path: path.display().to_string(),
            error,
        })?;
        eprintln!("== results written to {}", path.display());
    }
    summary::print_summary(&report);
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
    let lanes: Vec<String> = s.lanes.iter().map(ToString::to_string).collect();
    m.insert("lanes".into(), lanes.join(","));
    m.insert("lane_shards".into(), s.lane_shards.get().to_string());
    if args.repeat > 1 {
        let tables = if args.fresh_tables {
            "fresh for every run"
        } else {
            "shared by every run"
        };
        m.insert("tables".into(), tables.into());
    }
    m.insert(
        "entry".into(),
        match args.entry {
            Entry::Lane if !s.lanes.is_empty() => "lane entry (schedule.<W>s)",
            _ => "schedule",
        }
        .into(),
    );
    m.insert("prefetch".into(), s.prefetch.to_string());
    m.insert("batch_max".into(), s.batch_max.to_string());
    m.insert(
        "batch_linger".into(),
        humantime::format_duration(s.batch_linger).to_string(),
    );
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
    m.insert("workload".into(), args.chosen.to_string());
    m.insert("timeouts".into(), args.chosen.timeouts.to_string());
    m.insert("paid_ratio".into(), args.paid_ratio.to_string());
    m
}

async fn run_in(
    env: &mut BenchEnv,
    args: &BenchArgs,
    report: &mut BenchReport,
) -> Result<bool, BenchError> {
    report.settings = settings_info(&env.settings, args);
    let declare_seconds = start_world(env, args).await?;
    let sampling = Sampling::start(process_groups(env, args.database));
    let mut ok = true;
    if args.baseline.contains(&Baseline::BrokerCeiling) {
        report.broker_ceiling = Some(measure_ceiling(env, args, &sampling).await?);
    }
    if args.baseline.contains(&Baseline::BrokerPaths) {
        eprintln!(
            "== broker paths: publish → {:?} TTL queue → dead-letter → consume, {}/s for {:?} each, no database",
            paths::PATH_TTL,
            args.rate,
            args.duration
        );
        report.broker_paths = paths::measure(
            &env.settings.amqp_url,
            args.rate,
            args.duration,
            args.repeat,
            &sampling,
        )
        .await?;
    }
    if let Some(n) = args.pending {
        let p = pending::measure(env, args, n, declare_seconds, &sampling).await?;
        ok &= p.failures.is_empty();
        report.pending = Some(p);
    } else {
        ok &= run_workload(env, args, &sampling, report).await?;
    }
    sampling.stop().await;
    Ok(ok)
}

/// Declares the topology and starts the service instances; returns how
/// long declaring took.
async fn start_world(env: &mut BenchEnv, args: &BenchArgs) -> Result<f64, BenchError> {
    let declare_started = std::time::Instant::now();
    order_timeout::testing::broker::declare_topology(&env.settings)
        .await
        .map_err(|e| BenchError::Setup(format!("declaring the topology: {e:#}")))?;
    let declare_seconds = declare_started.elapsed().as_secs_f64();
    eprintln!(
        "== topology declared in {declare_seconds:.2} s; starting {} service instance(s) (logs in {})",
        args.consumers,
        env.log_dir.display()
    );
    env.start_services(args.consumers).await?;
    if args.baseline.contains(&Baseline::Seed) {
        eprintln!("== starting the seed consumer");
        env.start_seed().await?;
    }
    Ok(declare_seconds)
}

/// The AMQP port of the broker (of its first node), for telling the
/// broker's process from private test nodes beside it.
fn amqp_port(url: &order_timeout::settings::SecretUrl) -> u16 {
    let first = url.expose().split(',').next().unwrap_or_default();
    let default = if first.starts_with("amqps:") {
        5671
    } else {
        5672
    };
    url::Url::parse(first)
        .ok()
        .and_then(|u| u.port())
        .unwrap_or(default)
}

/// The processes whose CPU and memory a run reports (`bench`, and
/// `bench-watch`, which has no seed process).
pub(crate) fn process_groups(env: &BenchEnv, database: OrdersDatabase) -> Vec<Group> {
    let group = |name: &str, who| Group {
        name: name.into(),
        who,
    };
    let broker = match sys::pid_listening_on(amqp_port(&env.settings.amqp_url), "beam.smp") {
        Some(pid) => Who::Pids(vec![pid]),
        None => Who::Comm("beam.smp"),
    };
    let mut groups = vec![
        group("bench", Who::Pids(vec![std::process::id()])),
        group("service", Who::Pids(env.service_pids())),
        group("broker", broker),
        group("postgres", Who::Postgres(vec![env.name.clone()])),
    ];
    if database == OrdersDatabase::Mysql {
        groups.push(group("mariadb", Who::Comm("mariadbd")));
    }
    let mut clients = vec![
        ("bench", vec![std::process::id()]),
        ("service", env.service_pids()),
    ];
    if let Some(pid) = env.inventory.as_ref().and_then(|c| c.pid()) {
        groups.push(group("inventory", Who::Pids(vec![pid])));
        clients.push(("inventory", vec![pid]));
    }
    if let Some(pid) = env.seed.as_ref().and_then(|c| c.pid()) {
        groups.push(group("seed", Who::Pids(vec![pid])));
        clients.push(("seed", vec![pid]));
    }
    for (name, pids) in clients {
        groups.push(group(&pg_client_group(name), pg_clients(env, pids)));
    }
    groups
}

/// The group of PostgreSQL's work on the statements of the process group
/// `name` (`postgres:service`, …).
pub(crate) fn pg_client_group(name: &str) -> String {
    format!("postgres:{name}")
}

/// PostgreSQL's backends of the bench's database serving `clients`.
fn pg_clients(env: &BenchEnv, clients: Vec<u32>) -> Who {
    Who::PostgresClients {
        databases: vec![env.name.clone()],
        clients,
    }
}

/// `--baseline broker-ceiling`: the one-hop ceiling, measured first.
async fn measure_ceiling(
    env: &BenchEnv,
    args: &BenchArgs,
    sampling: &Sampling,
) -> Result<CeilingReport, BenchError> {
    eprintln!(
        "== broker ceiling: publish → {} ms TTL queue → dead-letter → consume, {:?} saturated",
        baseline::CEILING_TTL_MS,
        args.ceiling_duration
    );
    sampling.reset();
    let la0 = loadavg();
    let mut c = baseline::broker_ceiling(
        &env.settings.amqp_url,
        env.settings.queue_type,
        args.ceiling_duration,
    )
    .await?;
    c.resources = sampling.usage();
    c.loadavg = (la0, loadavg());
    eprintln!(
        "   published {} ({:.0}/s), consumed {} at {:.0}/s ({:.0}/s while publishing)",
        c.published,
        c.publish_rate,
        c.consumed,
        c.consume_rate,
        c.sustained_rate.unwrap_or(0.0)
    );
    Ok(c)
}

/// Stocks `--skus` SKUs (in the reference inventory, or in the orders'
/// `shop_stock` with `--stock also`) and returns their names.
async fn stock_skus(env: &BenchEnv, args: &BenchArgs) -> Result<Vec<String>, BenchError> {
    let skus: Vec<String> = (0..args.skus)
        .map(|i| format!("bench-sku-{i:05}"))
        .collect();
    let stock: Vec<(String, i64)> = skus.iter().map(|s| (s.clone(), INITIAL_STOCK)).collect();
    match &env.db.orders {
        ShopDb::MySql(pool) if args.stock.by_also() => {
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
    Ok(skus)
}

/// `--fresh-tables`: empties what the earlier runs wrote (every order of
/// theirs is settled and measured by now) and writes the stock again.
/// (`--stock also` takes no `--repeat`, so the stock is the reference
/// inventory's.)
async fn fresh_tables(env: &BenchEnv, args: &BenchArgs) -> Result<(), BenchError> {
    eprintln!("== emptying the shop's tables and the outbox, writing the stock again");
    match &env.db.orders {
        ShopDb::Postgres(pool) => {
            sqlx::query("TRUNCATE orders, order_items, order_timeout_cancel_outbox")
                .execute(pool)
                .await?;
        }
        ShopDb::MySql(pool) => {
            // TRUNCATE refuses a table a foreign key points at.
            for table in ["order_items", "orders", "order_timeout_cancel_outbox"] {
                sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table}")))
                    .execute(pool)
                    .await?;
            }
        }
    }
    sqlx::query("TRUNCATE inventory.reservations, inventory.releases, inventory.stock")
        .execute(&env.db.inventory)
        .await?;
    stock_skus(env, args).await?;
    Ok(())
}

/// The rate run: `--repeat` runs of the product's phase and then the
/// baselines' phases, each printed as it ends; the verdicts; the plot (of
/// the last run). Returns whether every check passed.
async fn run_workload(
    env: &mut BenchEnv,
    args: &BenchArgs,
    sampling: &Sampling,
    report: &mut BenchReport,
) -> Result<bool, BenchError> {
    let w = Workload {
        rate: args.rate,
        duration: args.duration,
        timeouts: args.chosen.timeouts.clone(),
        paid_ratio: args.paid_ratio,
        skus: stock_skus(env, args).await?,
        publish_channels: args.publish_channels,
        settle_timeout: args.settle_timeout,
        entry_lanes: match args.entry {
            Entry::Lane => env.settings.lanes.clone(),
            Entry::Schedule => Vec::new(),
        },
        http_flood: args.flood,
        flood_every: args.flood_every,
    };
    let conn = order_timeout::testing::broker::connect_amqp(
        &env.settings.amqp_url,
        "order-timeout-bench-shop",
    )
    .await?;
    let channels = amqp::confirm_channels(&conn, w.publish_channels).await?;
    let mut routes = vec![Route::Service];
    if args.baseline.contains(&Baseline::SingleQueue) {
        baseline::declare_single_queue(&conn, env.settings.queue_type).await?;
        routes.push(Route::SingleQueue);
    }
    if args.baseline.contains(&Baseline::Seed) {
        routes.push(Route::Seed);
    }
    let mut ok = true;
    let mut plots = Vec::new();
    for run in 1..=args.repeat {
        let (r, points) = run_once(env, args, &channels, &routes, &w, sampling, run).await?;
        ok &= r.phases.iter().all(|p| p.failures.is_empty());
        if args.repeat > 1 {
            summary::print_run(&r);
        }
        report.runs.push(r);
        plots = points;
    }
    report.verdicts = report::verdicts(&report.runs, args.p99_target.as_secs_f64() * 1000.0);
    let _ = conn.close(200, "done".into()).await;
    if let Some(path) = &args.plot {
        draw_plot(path, args, report, &plots)?;
    }
    Ok(ok)
}

/// Each design's phase, in turn: one run. Also returns each design's
/// points for the plot.
async fn run_once(
    env: &mut BenchEnv,
    args: &BenchArgs,
    channels: &[Channel],
    routes: &[Route],
    w: &Workload,
    sampling: &Sampling,
    run: usize,
) -> Result<(RunReport, Vec<(String, Vec<(f64, f64)>)>), BenchError> {
    if args.repeat > 1 {
        eprintln!("== run {run} of {}", args.repeat);
    }
    if run > 1 && args.fresh_tables {
        fresh_tables(env, args).await?;
    } else if run > 1 {
        autovacuum::vacuum_between_runs(&env.db).await?;
    }
    let mut r = RunReport {
        run,
        started_at: order_timeout::message::format_instant(chrono::Utc::now()),
        phases: Vec::new(),
    };
    let mut plots = Vec::new();
    for &route in routes {
        services_for(env, args, route, sampling).await?;
        let prefix = match args.repeat {
            1 => format!("{}-", route.design()),
            _ => format!("{}-r{run}-", route.design()),
        };
        let (phase, points) =
            run_phase(env, channels, route, w, sampling, &prefix, &args.chosen).await?;
        summary::print_phase(&phase);
        plots.push((route.design().to_owned(), points));
        r.phases.push(phase);
    }
    Ok((r, plots))
}

/// The seed's phase runs with the services stopped (their sweeper would
/// otherwise cancel the seed's late orders, and their idle CPU is not the
/// seed's); the others with them running, restarted if a seed phase
/// stopped them.
async fn services_for(
    env: &mut BenchEnv,
    args: &BenchArgs,
    route: Route,
    sampling: &Sampling,
) -> Result<(), BenchError> {
    match route {
        Route::Seed if !env.services.is_empty() => {
            eprintln!("== stopping the service for the seed's phase");
            env.stop_services().await;
        }
        Route::Service | Route::SingleQueue if env.services.is_empty() => {
            eprintln!("== restarting {} service instance(s)", args.consumers);
            env.start_services(args.consumers).await?;
            let pids = env.service_pids();
            let pg = pg_clients(env, pids.clone());
            sampling.with(|s| {
                s.set_who("service", Who::Pids(pids));
                s.set_who(&pg_client_group("service"), pg);
            });
        }
        _ => {}
    }
    Ok(())
}

/// The phase's CPU time and context switches per order of the design's
/// processes, and PostgreSQL's CPU per order by whose statements it ran.
fn per_order(phase: &mut PhaseReport, resources: &BTreeMap<String, sys::Usage>, route: Route) {
    let processes = route.processes();
    let (per, total) = report::cpu_per_order(resources, phase.orders, processes);
    phase.cpu_ms_per_order = per;
    phase.cpu_ms_per_order_total = total;
    phase.switches_per_order = report::switches_per_order(resources, phase.orders, processes);
    let groups: Vec<String> = processes.iter().map(|name| pg_client_group(name)).collect();
    let group_names: Vec<&str> = groups.iter().map(String::as_str).collect();
    let (by_group, _) = report::cpu_per_order(resources, phase.orders, &group_names);
    phase.postgres_ms_per_order_by_client = processes
        .iter()
        .zip(&groups)
        .filter_map(|(name, group)| Some(((*name).to_owned(), *by_group.get(group)?)))
        .collect();
}

/// Creates the phase's orders and waits for them to settle, with the
/// services' HTTP side flooded meanwhile when `--flood` asks for it (the
/// product's phase only).
async fn generate_and_settle(
    env: &BenchEnv,
    channels: &[Channel],
    route: Route,
    w: &Workload,
    prefix: &str,
) -> Result<(outcome::Settled, Flooded), BenchError> {
    let clients = if route == Route::Service {
        w.http_flood
    } else {
        0
    };
    let flooding = (clients > 0).then(|| match w.flood_every {
        Some(every) => {
            eprintln!(
                "== flooding the services' HTTP side with {clients} clients, {every:?} on and {every:?} off"
            );
            Flooding::Turns(flood::Alternating::start(&env.metrics_ports, clients, every))
        }
        None => {
            eprintln!("== flooding the services' HTTP side with {clients} clients");
            Flooding::Whole(flood::Flood::start(&env.metrics_ports, clients))
        }
    });
    let g = load::generate(&env.db, channels, route, w, prefix).await?;
    let settled = outcome::settle(&env.db, g, w).await;
    let flooded = match flooding {
        Some(Flooding::Whole(f)) => (Some(f.stop().await), None),
        Some(Flooding::Turns(f)) => {
            let (report, windows) = f.stop().await;
            (Some(report), Some(windows))
        }
        None => (None, None),
    };
    Ok((settled?, flooded))
}

/// A flood for the whole phase, or in turns.
enum Flooding {
    Whole(flood::Flood),
    Turns(flood::Alternating),
}

/// What the flood's clients got, and when it was on (in turns only).
type Flooded = (Option<flood::FloodReport>, Option<flood::Windows>);

/// One design's phase: generate, settle, measure, with the CPU, load and
/// service counters over it.
async fn run_phase(
    env: &BenchEnv,
    channels: &[Channel],
    route: Route,
    w: &Workload,
    sampling: &Sampling,
    prefix: &str,
    chosen: &Chosen,
) -> Result<(PhaseReport, Vec<(f64, f64)>), BenchError> {
    eprintln!(
        "== {}: {} orders/s for {:?}, {chosen}, {:.0}% paid",
        route.design(),
        w.rate,
        w.duration,
        w.paid_ratio * 100.0
    );
    let analyzer = autovacuum::Analyzer::start(&env.db).await?;
    let checkpoints = checkpoints::Checkpoints::start(&env.db.inventory).await;
    sampling.reset();
    let la0 = loadavg();
    let m0 = env.scrape().await;
    let (s, (flooded, turns)) = generate_and_settle(env, channels, route, w, prefix).await?;
    let resources = sampling.usage();
    let mut happened = Vec::new();
    if let Some(analyzer) = analyzer {
        let analyzed = analyzer.stop().await;
        eprintln!(
            "== PostgreSQL's autovacuum is off on this server: the bench ran ANALYZE {} times during the phase (autovacuum's rule, looked at every 10 s)",
            analyzed.len()
        );
        happened.extend(analyzed);
    }
    if let Some(checkpoints) = checkpoints {
        happened.extend(checkpoints.stop().await);
    }
    happened.sort_by_key(|h| h.0);
    let (mut phase, points) = outcome::measure(&env.db, &s, route, w).await?;
    phase.db_events = happened
        .into_iter()
        .map(|h| report::DbEvent::on_phase_clock(s.started, h))
        .collect();
    phase.workload = chosen.to_string();
    phase.flood = flooded;
    phase.flood_split = turns.map(|windows| report::flood_split(&points, s.started, &windows));
    per_order(&mut phase, &resources, route);
    phase.own_process = route.own_process().into();
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
    phase.swept = phase
        .service_metrics
        .get("order_timeout_sweeper_orders_total")
        .map_or(0, |n| n.round() as u64);
    Ok((phase, points))
}

fn draw_plot(
    path: &Path,
    args: &BenchArgs,
    report: &BenchReport,
    plots: &[(String, Vec<(f64, f64)>)],
) -> Result<(), BenchError> {
    let series: Vec<plot::Series<'_>> = plots
        .iter()
        .map(|(name, points)| plot::Series { name, points })
        .collect();
    let run = match args.repeat {
        1 => String::new(),
        n => format!(", run {n} of {n}"),
    };
    let title = format!(
        "order-timeout-tools bench: {} orders/s for {:?}, {}, {} x{} ({} consumer(s){run})",
        args.rate,
        args.duration,
        args.chosen,
        report.settings["queue_type"],
        report.settings["cascade_shards"],
        args.consumers
    );
    plot::draw(path, &title, &series)?;
    eprintln!("== plot written to {}", path.display());
    Ok(())
}
