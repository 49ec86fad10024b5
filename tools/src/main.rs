//! `order-timeout-tools`: demo, bench, reference inventory server and shop
//! schema. See `order-timeout-tools --help`.

use std::process::ExitCode;

use clap::Parser;
use order_timeout_tools::cli::{self, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    order_timeout::testing::init_process(cli.command.default_log_filter());
    order_timeout::cli::exit_code(cli::run(cli).await)
}
