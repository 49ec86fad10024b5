//! `order-timeout-tools`: demo, bench, reference inventory server and shop
//! schema. See `order-timeout-tools --help`.

use std::process::ExitCode;

use clap::Parser;
use order_timeout_tools::cli::{self, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    order_timeout::tls::install_crypto_provider();
    let cli = Cli::parse();
    order_timeout::observe::telemetry::init(cli.command.default_log_filter());
    order_timeout::cli::exit_code(cli::run(cli).await)
}
