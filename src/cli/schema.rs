//! `order-timeout schema check`: every timer's mapping (`[orders]`,
//! `[items]` and `[inventory]` for the default one, each `[[timers]]`)
//! checked against the shop's database, as `serve` does at start-up,
//! without consuming anything.

use std::process::ExitCode;

use clap::Subcommand;

use crate::settings::Settings;
use crate::store;

/// `order-timeout schema …`.
#[derive(Debug, Subcommand)]
pub enum SchemaCommand {
    /// Check, for every timer, that the table and columns exist, that the
    /// status codes fit the status column, that the deadline and guard
    /// evaluate, and that the `set` and `also` statements and the items
    /// query prepare. Exit 0 when they do; otherwise the error names the
    /// config key (and the timer).
    Check,
}

/// Runs `schema check`.
pub(super) async fn run(settings: Settings, command: SchemaCommand) -> anyhow::Result<ExitCode> {
    let SchemaCommand::Check = command;
    store::check_batch_sizes(&settings)?;
    let pool = store::PoolSettings::of(&settings).with_max_connections(1);
    let stores = store::connect_timers(&settings.database_url, pool, &settings.timers()?)?;
    for store in stores.iter() {
        let report = store.prepare().await?;
        println!("{report}\n");
    }
    println!("OK: the mapping fits {}", settings.database_url);
    Ok(ExitCode::SUCCESS)
}
