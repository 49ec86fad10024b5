//! `order-timeout`: see `order-timeout --help` and the README.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = order_timeout::cli::Cli::parse();
    // The demo talks through its progress bar and summary; keep logs to
    // warnings there unless RUST_LOG asks for more.
    let default_filter = match cli.command {
        order_timeout::cli::Command::Demo(_) | order_timeout::cli::Command::Bench(_) => "warn",
        // Operator commands print their results; the expected channel
        // errors of `topology check` (404/406) are results, not log noise.
        order_timeout::cli::Command::Parked(_) => "warn",
        order_timeout::cli::Command::Topology(_) => "warn,lapin=off",
        _ => "info",
    };
    order_timeout::telemetry::init(default_filter);
    match order_timeout::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "fatal");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
