//! `order-timeout explain ID [--timer NAME] [--json]`: everything the
//! service knows of one order and what happens to it next, printed from
//! [`crate::ops::explain`]. Reads only: the shop's row, the service's own
//! tables and the parked store; never the broker.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;

use super::backfill::chosen;
use crate::ops::explain;
use crate::settings::Settings;
use crate::store;

/// Arguments of `explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The order id, as the order service publishes it.
    pub id: String,
    /// Only this timer (`cancel_unpaid` or a `[[timers]]` name); may be
    /// given several times. Default: every timer of the config.
    #[arg(long = "timer", value_name = "NAME")]
    pub timers: Vec<String>,
    /// Print one JSON object instead.
    #[arg(long)]
    pub json: bool,
}

/// Runs `explain`.
pub(super) async fn run(settings: Settings, args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let all = settings.timers()?;
    let timers = chosen(&all, &args.timers)?;
    let pool = store::PoolSettings::of(&settings).with_max_connections(1);
    let stores = store::connect_timers(&settings.database_url, pool, &timers)?;
    let parked = store::connect_timers(&settings.database_url, pool, &all[..1])?;
    let stores: Vec<store::Store> = stores.iter().cloned().collect();
    let explanation =
        explain::explain(&stores, parked.default_timer(), &settings.sweeper, &args.id).await?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &explanation)?;
        writeln!(out)?;
    } else {
        writeln!(out, "order {}", explanation.order_id)?;
        for (label, text) in explanation.lines() {
            writeln!(out, "{label:<18} {text}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
