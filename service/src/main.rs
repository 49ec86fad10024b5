//! `order-timeout`, the production binary: see `order-timeout --help` and
//! the README.

use std::process::ExitCode;

use clap::Parser;
use order_timeout::cli::{self, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    order_timeout::tls::install_crypto_provider();
    let cli = Cli::parse();
    order_timeout::observe::telemetry::init(cli.command.default_log_filter());
    order_timeout::cli::exit_code(cli::run(cli).await)
}
