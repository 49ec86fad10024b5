//! `order-timeout`, the production binary: see `order-timeout --help` and
//! the README.

use std::process::ExitCode;

use clap::Parser;
use order_timeout::cli::{self, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    cli::main(Cli::parse()).await
}
