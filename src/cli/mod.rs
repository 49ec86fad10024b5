//! The command line of the production binary: one file per command behind
//! the [`Command`] enum.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use lapin::Connection;

use crate::broker::connect_amqp;
use crate::settings::Settings;

mod backfill;
mod explain;
mod migrate;
mod parked;
mod pending;
mod schedule;
mod schema;
mod serve;
mod set_aside;
mod topology;

pub use backfill::BackfillArgs;
pub use explain::ExplainArgs;
pub use migrate::MigrateArgs;
pub use parked::ParkedCommand;
pub use pending::PendingArgs;
pub use schedule::ScheduleArgs;
pub use schema::SchemaCommand;
pub use set_aside::{SetAsideCommand, SetAsideListArgs, SetAsideRetryArgs};
pub use topology::TopologyCommand;

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
    /// Create the database if missing and apply the service's own migrations
    /// (its `order_timeout_*` tables; the shop's tables are never touched).
    /// The previous release keeps working against the migrated database;
    /// `--contract` drops what was kept for it (docs/upgrading.md).
    Migrate(MigrateArgs),
    /// Declare the broker topology, then consume and cancel until SIGTERM/SIGINT.
    Serve,
    /// Publish one timeout (with publisher confirms), as the order service would.
    Schedule(ScheduleArgs),
    /// Inspect, replay and purge parked (failed) messages.
    #[command(subcommand)]
    Parked(ParkedCommand),
    /// Show what falls due when (the timeouts waiting within 1 minute, 10
    /// minutes, 1 hour, 1 day, 7 days, later: bounds, not exact times), the
    /// delay cascade by level, the due queue and the parked messages by
    /// reason (queue depths only; exit 1 when a queue is missing).
    Pending(PendingArgs),
    /// Check the broker's queues and exchanges against what the service expects.
    #[command(subcommand)]
    Topology(TopologyCommand),
    /// Check the `[orders]` mapping against the shop's database.
    #[command(subcommand)]
    Schema(SchemaCommand),
    /// The rows whose flip failed for their own values, parked once and
    /// set aside (tried again hourly, then daily): list them with their
    /// reasons and ages, or have the next sweep try them now.
    #[command(subcommand)]
    SetAside(SetAsideCommand),
    /// Schedule a timeout for every unpaid order already in the shop's table
    /// (adoption day); safe to run twice.
    Backfill(BackfillArgs),
    /// What happened to an order, and what happens next: its row as each
    /// timer sees it, what the service did (cancelled when, stock released,
    /// event published), whether it is set aside, the parked messages that
    /// name it. Reads only.
    Explain(ExplainArgs),
}

impl Command {
    /// The log filter when `RUST_LOG` is unset: operator commands print
    /// their results, so they log warnings only; the expected channel
    /// errors of `topology check` and `pending` (404/406: a missing queue,
    /// and one per queue of an earlier layout probed for leftovers) are
    /// results, not log noise.
    pub fn default_log_filter(&self) -> &'static str {
        match self {
            Command::Parked(_) => "warn",
            Command::Pending(_) | Command::Topology(_) => "warn,lapin=off",
            Command::Schema(_)
            | Command::Backfill(_)
            | Command::SetAside(_)
            | Command::Explain(_) => "warn",
            _ => "info",
        }
    }
}

/// The production binary's `main`: installs the TLS crypto provider, starts
/// the logs at the command's default level, runs the command and turns its
/// result into the process's exit code.
pub async fn main(cli: Cli) -> ExitCode {
    crate::tls::install_crypto_provider();
    crate::observe::telemetry::init(cli.command.default_log_filter());
    exit_code(run(cli).await)
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(cli.config.as_deref())?;
    match cli.command {
        Command::Migrate(args) => migrate::run(settings, args).await,
        Command::Serve => serve::run(settings).await,
        Command::Schedule(args) => schedule::run(settings, args).await,
        Command::Parked(command) => parked::run(settings, command).await,
        Command::Pending(args) => pending::run(settings, args).await,
        Command::Topology(command) => topology::run(settings, command).await,
        Command::Schema(command) => schema::run(settings, command).await,
        Command::Backfill(args) => backfill::run(settings, args).await,
        Command::SetAside(command) => set_aside::run(settings, command).await,
        Command::Explain(args) => explain::run(settings, args).await,
    }
}

/// The process exit code for a command's result: its own code, or, for an
/// error, the error (with its causes) logged and printed, and failure.
pub fn exit_code(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "fatal");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A broker connection for a command, with the (redacted) URL in the error.
async fn connect(settings: &Settings, name: &str) -> anyhow::Result<Connection> {
    connect_amqp(&settings.amqp_url, name)
        .await
        .with_context(|| format!("connecting to {}", settings.amqp_url))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use clap::Parser as _;

    use super::Cli;

    /// What a subscriber with `filter` writes for lapin's error on a
    /// channel the broker closed (a queue probed that is not there) and for
    /// a warning of the service's own.
    fn logged_with(filter: &str) -> String {
        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl Write for Captured {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(
                target: "lapin::channel",
                channel = 3,
                "Channel closed"
            );
            tracing::warn!(target: "order_timeout::ops", "a warning of its own");
        });
        String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn pending_and_topology_check_keep_lapins_channel_errors_off_stderr() {
        for args in [
            &["order-timeout", "pending"][..],
            &["order-timeout", "pending", "--json"],
            &["order-timeout", "topology", "check"],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            let logged = logged_with(cli.command.default_log_filter());
            assert!(!logged.contains("Channel closed"), "{args:?}: {logged}");
            assert!(
                logged.contains("a warning of its own"),
                "{args:?}: {logged}"
            );
        }
        // Elsewhere lapin's errors are logged.
        let cli = Cli::try_parse_from(["order-timeout", "serve"]).unwrap();
        let logged = logged_with(cli.command.default_log_filter());
        assert!(logged.contains("Channel closed"), "{logged}");
    }
}
