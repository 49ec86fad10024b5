//! The `order-timeout-tools` command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use order_timeout::settings::Settings;
use order_timeout::shutdown;

use crate::inventory::ReferenceInventory;
use crate::shop;

/// Default listen address of the reference inventory server (the
/// service's default `INVENTORY_URL` points here).
pub const DEFAULT_INVENTORY_ADDR: &str = "127.0.0.1:50051";

/// What production never runs: the demo, the bench, the reference
/// inventory server and shop schema.
#[derive(Debug, Parser)]
#[command(name = "order-timeout-tools", version, about, long_about = None)]
pub struct Cli {
    /// Optional TOML config file of the service (see README).
    #[arg(long, global = true, env = "ORDER_TIMEOUT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the product working end to end on the local servers.
    Demo(crate::demo::DemoArgs),
    /// Load-generate on the real path and measure lateness, throughput,
    /// CPU per order; compare with the seed design, the single-queue design
    /// and the broker's one-hop ceiling (see docs/BENCHMARKS.md).
    Bench(Box<crate::bench::BenchArgs>),
    /// Measure a timer's `watch`: the cost of its scan on a big table
    /// (`--part query`: 1,000,000 rows, windows of 0, ~1,000 and ~60,000
    /// rows, with the plan) and the lateness of its flips at 1,000 rows/s
    /// coming due with nobody publishing (`--part lateness`), on
    /// PostgreSQL or MariaDB (see docs/benchmarks-log.md).
    BenchWatch(Box<crate::bench::watch::WatchArgs>),
    /// Cut a peer of the service off silently (a network namespace whose
    /// link goes down: no reset, every packet dropped) while orders come
    /// due, heal it, and print what it did to them: lateness before,
    /// during and after the cut, readiness, resumption. `--peer broker`
    /// partitions the connected node of a 3-node cluster (`--rabbitmq4`:
    /// RabbitMQ 4.x nodes). Needs root; docs/benchmarks-log.md "Silent
    /// peers".
    Partition(crate::partition::PartitionArgs),
    /// Kill -9 a private RabbitMQ node under load (600 orders due over
    /// 3-30 s, 8 s down) once per `--levers` run, the broker's dead-letter
    /// retry and the service's catch-up sweeps set as given, and print
    /// what it did to the orders: lost, early, the outage, reconnect, the
    /// lateness of the orders due in it and after it (~2 min a run;
    /// docs/benchmarks-log.md "Broker crashes").
    CrashLevers(crate::measure::crash_levers::CrashLeversArgs),
    /// How late the sweeper, with its default settings, cancels orders
    /// whose timeout was never published while a poison row or 600
    /// re-opened rows sit at the head of its timer: 20 due inside the
    /// catch-up window, 20 after it, per database and head, side by side
    /// (~7 min; docs/guarantees.md).
    SweepLateness(crate::measure::sweep_lateness::SweepLatenessArgs),
    /// Run the reference gRPC inventory service (stock in `inventory.stock`
    /// of DATABASE_URL's database).
    InventoryServer {
        /// Listen address.
        #[arg(long, env = "INVENTORY_ADDR", default_value = DEFAULT_INVENTORY_ADDR)]
        addr: SocketAddr,
    },
    /// Create the reference shop schema (orders, order_items, inventory.*
    /// on PostgreSQL; orders and order_items on MySQL/MariaDB) in
    /// DATABASE_URL's database, after the service's own migrations.
    ReferenceSchema,
    /// The seed design's plain consumer, for `bench --baseline seed` (the
    /// bench starts it as a child process): cancels the order of each
    /// message on `bench.seed.cancel` in DATABASE_URL's `orders` with one
    /// conditional UPDATE.
    #[command(hide = true)]
    SeedConsumer,
}

impl Command {
    /// The log filter when `RUST_LOG` is unset: the demo and the bench talk
    /// through their progress bars and summaries.
    pub fn default_log_filter(&self) -> &'static str {
        match self {
            Command::Demo(_)
            | Command::Bench(_)
            | Command::BenchWatch(_)
            | Command::Partition(_)
            | Command::CrashLevers(_)
            | Command::SweepLateness(_) => "warn",
            _ => "info",
        }
    }
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(cli.config.as_deref())?;
    match cli.command {
        Command::Demo(args) => crate::demo::run(settings, args).await,
        Command::Bench(args) => crate::bench::run(settings, cli.config, *args).await,
        Command::BenchWatch(args) => crate::bench::watch::run(settings, cli.config, *args).await,
        Command::Partition(args) => crate::partition::command(args).await,
        Command::CrashLevers(args) => crate::measure::crash_levers::command(args).await,
        Command::SweepLateness(args) => crate::measure::sweep_lateness::command(args).await,
        Command::InventoryServer { addr } => {
            let pool = shop::prepare_database(&settings.database_url, 10).await?;
            ReferenceInventory::new(pool)
                .serve_addr(addr, shutdown::wait_for_signal())
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::SeedConsumer => {
            crate::bench::seed::consume(
                &settings.amqp_url,
                &settings.database_url,
                shutdown::wait_for_signal(),
            )
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::ReferenceSchema => {
            // The orders and items tables in DATABASE_URL's own dialect (a
            // MySQL URL given to PostgreSQL's driver failed with a protocol
            // error that named neither).
            let url = &settings.database_url;
            match order_timeout::testing::store::Dialect::of(url)? {
                order_timeout::testing::store::Dialect::Postgres => {
                    shop::prepare_database(url, 1).await?;
                }
                order_timeout::testing::store::Dialect::MySql => {
                    shop::prepare_mysql_database(url, 1).await?;
                }
            }
            println!(
                "service migrations and reference shop schema applied to {}",
                settings.database_url
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
