//! The command line: `migrate`, `serve`, `inventory-server`, `schedule`,
//! `demo`, `bench`, and the operator commands `parked` and `topology` (in
//! [`crate::cli_ops`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};

use crate::config::{self, Settings};
use crate::inventory::ReferenceInventory;
use crate::message::{Deadline, OrderId, TimeoutRequest, format_instant};
use crate::publisher::Publisher;
use crate::shutdown::Shutdown;
use crate::startup;
use crate::store::Store;

/// Cancels unpaid orders when their payment window runs out.
#[derive(Debug, Parser)]
#[command(name = "order-timeout", version, about, long_about = None)]
pub struct Cli {
    /// Optional TOML config file for tuning knobs (see README).
    #[arg(long, global = true, env = "ORDER_TIMEOUT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the database if missing and apply migrations (orders,
    /// order_items, the cancel outbox, the reference inventory schema).
    Migrate,
    /// Declare the broker topology, then consume and cancel until SIGTERM/SIGINT.
    Serve,
    /// Run the reference gRPC inventory service (stock in `inventory.stock`).
    InventoryServer {
        /// Listen address.
        #[arg(long, env = "INVENTORY_ADDR", default_value = config::DEFAULT_INVENTORY_ADDR)]
        addr: SocketAddr,
    },
    /// Publish one timeout (with publisher confirms), as the order service would.
    Schedule(ScheduleArgs),
    /// Show the product working end to end on the local servers.
    Demo(crate::demo::DemoArgs),
    /// Inspect, replay and purge parked (failed) messages.
    #[command(subcommand)]
    Parked(crate::cli_ops::ParkedCommand),
    /// Check the broker's queues and exchanges against what the service expects.
    #[command(subcommand)]
    Topology(crate::cli_ops::TopologyCommand),
    /// Load-generate on the real path and measure lateness, throughput,
    /// resources; compare with the single-queue design and the broker's
    /// one-hop ceiling (see docs/BENCHMARKS.md).
    Bench(crate::bench::BenchArgs),
}

/// Arguments of `schedule`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["cancel_at", "in_"])))]
pub struct ScheduleArgs {
    /// The order to cancel if still unpaid.
    #[arg(long)]
    pub order_id: String,
    /// Deadline, RFC 3339 (e.g. 2026-11-21T10:30:00Z or 2026-11-21T18:30:00+08:00).
    #[arg(long, value_parser = parse_rfc3339)]
    pub cancel_at: Option<DateTime<Utc>>,
    /// Deadline relative to now (e.g. 30m, 1h 30m, 1500ms).
    #[arg(long = "in", id = "in_", value_parser = humantime::parse_duration)]
    pub in_: Option<Duration>,
}

fn parse_rfc3339(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not RFC 3339: {e}"))
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(cli.config.as_deref())?;
    match cli.command {
        Command::Migrate => {
            Store::migrate(&settings.database_url).await?;
            println!(
                "migrations applied to {}",
                config::redact_url(&settings.database_url)
            );
        }
        Command::Serve => {
            let shutdown = Shutdown::new();
            shutdown.trigger_on_signals();
            startup::run(settings, shutdown).await?;
        }
        Command::InventoryServer { addr } => {
            let store = Store::connect_lazy(&settings.database_url, 10)?;
            ReferenceInventory::new(store.pool().clone())
                .serve_addr(addr, crate::shutdown::wait_for_signal())
                .await?;
        }
        Command::Schedule(args) => {
            let order_id = OrderId::parse(&args.order_id)?;
            let cancel_at = match (args.cancel_at, args.in_) {
                (Some(at), _) => at,
                (None, Some(d)) => Utc::now() + chrono::Duration::from_std(d)?,
                (None, None) => unreachable!("clap requires one"),
            };
            let request = TimeoutRequest {
                order_id,
                deadline: Deadline::At(cancel_at),
            };
            let conn = startup::connect_amqp(&settings.amqp_url, "order-timeout-cli")
                .await
                .with_context(|| {
                    format!("connecting to {}", config::redact_url(&settings.amqp_url))
                })?;
            let publisher = Publisher::new(&conn).await?;
            crate::topology::declare(publisher.channel(), &settings.layout()).await?;
            publisher.schedule(&request).await?;
            let _ = conn.close(200, "done".into()).await;
            println!(
                "scheduled order {} to be cancelled at {} if unpaid",
                request.order_id,
                format_instant(cancel_at)
            );
        }
        Command::Demo(args) => return crate::demo::run(settings, args).await,
        Command::Parked(command) => return crate::cli_ops::run_parked(settings, command).await,
        Command::Topology(command) => {
            return crate::cli_ops::run_topology(settings, command).await;
        }
        Command::Bench(args) => return crate::bench::run(settings, cli.config, args).await,
    }
    Ok(ExitCode::SUCCESS)
}
