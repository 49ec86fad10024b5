//! `order-timeout schema check`: the `[orders]`, `[items]` and
//! `[inventory]` mapping checked against the shop's database, as `serve`
//! does at start-up, without consuming anything.

use std::process::ExitCode;

use clap::Subcommand;

use crate::settings::Settings;
use crate::store::{self, ShopSchema};

/// `order-timeout schema …`.
#[derive(Debug, Subcommand)]
pub enum SchemaCommand {
    /// Check that the table and columns exist, that the status codes fit
    /// the status column, that the deadline and guard evaluate, and that
    /// the `set` and `also` statements and the items query prepare. Exit 0
    /// when they do; otherwise the error names the config key.
    Check,
}

/// Runs `schema check`.
pub(super) async fn run(settings: Settings, command: SchemaCommand) -> anyhow::Result<ExitCode> {
    let SchemaCommand::Check = command;
    store::check_batch_sizes(&settings)?;
    let pool = store::PoolSettings::of(&settings).with_max_connections(1);
    let store = store::connect_lazy_with(&settings.database_url, pool, &ShopSchema::of(&settings))?;
    let report = store.prepare().await?;
    println!("{report}");
    println!("OK: the mapping fits {}", settings.database_url);
    Ok(ExitCode::SUCCESS)
}
