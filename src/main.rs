//! `order-timeout`: see `order-timeout --help` and the README.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    order_timeout::telemetry::init();
    let cli = order_timeout::cli::Cli::parse();
    match order_timeout::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "fatal");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
