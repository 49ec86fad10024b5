//! `order-timeout set-aside list|retry`: the rows whose flip failed for
//! their own values (a constraint, a CHECK, a trigger refusing the row, a
//! value out of range), parked once and set aside by the sweeper: each
//! with its reason, its age, how often it failed and when the sweeper tries
//! it again (hourly, then daily); and a way to have the next sweep try
//! them now, once the operator has fixed the rows or what refused them.

use std::process::ExitCode;

use chrono::Utc;
use clap::{Args, Subcommand};

use super::backfill::chosen;
use crate::message::OrderId;
use crate::settings::Settings;
use crate::store::{self, SetAsideRow};

/// `order-timeout set-aside …`.
#[derive(Debug, Subcommand)]
pub enum SetAsideCommand {
    /// List the rows set aside, the oldest first, per timer: order id,
    /// since when, how many failures, when the sweeper tries it again, and
    /// the database's error.
    List(SetAsideListArgs),
    /// Have the next sweep try rows set aside again now (instead of at
    /// their next hourly or daily try): the given order ids, or `--all`.
    Retry(SetAsideRetryArgs),
}

/// Arguments of `set-aside list`.
#[derive(Debug, Args)]
pub struct SetAsideListArgs {
    /// Only this timer; may be given several times. Default: every timer.
    #[arg(long = "timer", value_name = "NAME")]
    pub timers: Vec<String>,
    /// At most this many rows per timer.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `set-aside retry`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["order_ids", "all"])))]
pub struct SetAsideRetryArgs {
    /// Only this timer; may be given several times. Default: every timer.
    #[arg(long = "timer", value_name = "NAME")]
    pub timers: Vec<String>,
    /// Every row set aside (of the chosen timers).
    #[arg(long)]
    pub all: bool,
    /// These order ids.
    #[arg(value_name = "ORDER_ID")]
    pub order_ids: Vec<String>,
}

/// Runs `set-aside list` or `set-aside retry`.
pub(super) async fn run(settings: Settings, command: SetAsideCommand) -> anyhow::Result<ExitCode> {
    let names = match &command {
        SetAsideCommand::List(args) => &args.timers,
        SetAsideCommand::Retry(args) => &args.timers,
    };
    let timers = chosen(&settings.timers()?, names)?;
    let pool = store::PoolSettings::of(&settings).with_max_connections(1);
    let stores = store::connect_timers(&settings.database_url, pool, &timers)?;
    match command {
        SetAsideCommand::List(args) => {
            for store in stores.iter() {
                let timer = store.timer().name.to_string();
                let rows = store.set_aside_rows(args.limit).await?;
                if args.json {
                    for row in &rows {
                        let mut value = serde_json::to_value(row)?;
                        value["timer"] = serde_json::Value::String(timer.clone());
                        println!("{value}");
                    }
                } else {
                    print!("{}", table(&timer, &rows, Utc::now()));
                }
            }
        }
        SetAsideCommand::Retry(args) => {
            let ids: Vec<OrderId> = args
                .order_ids
                .iter()
                .map(|id| OrderId::parse(id).map_err(|e| anyhow::anyhow!("order id {id:?}: {e}")))
                .collect::<anyhow::Result<_>>()?;
            for store in stores.iter() {
                store.prepare().await?;
                let canonical: Vec<OrderId> = ids
                    .iter()
                    .filter_map(|id| store.canonical(id).ok())
                    .collect();
                let spelled: Vec<&str> = canonical.iter().map(OrderId::as_str).collect();
                let moved = if args.all {
                    store.retry_set_aside(None).await?
                } else {
                    store.retry_set_aside(Some(&spelled)).await?
                };
                println!(
                    "{}: {moved} row(s) set aside will be tried by the next sweep",
                    store.timer().name
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The rows of `timer` as a table, with ages as of `now`.
fn table(timer: &str, rows: &[SetAsideRow], now: chrono::DateTime<Utc>) -> String {
    use std::fmt::Write as _;
    let mut out = format!("timer {timer}: {} row(s) set aside\n", rows.len());
    if rows.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{:<24} {:>10} {:>8} {:>12}  reason",
        "order id", "age", "failures", "next try in"
    );
    for row in rows {
        let age = human((now - row.set_aside_at).num_seconds());
        let next = human((row.retry_at - now).num_seconds());
        let reason: String = row.reason.chars().take(160).collect();
        let _ = writeln!(
            out,
            "{:<24} {age:>10} {:>8} {next:>12}  {}",
            row.order_id,
            row.attempts,
            reason.replace(['\n', '\r'], " ")
        );
    }
    out
}

/// Whole seconds as the largest unit that fits (`0s` for the past).
fn human(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_each_row_with_its_age_failures_and_next_try() {
        let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let rows = [SetAsideRow {
            order_id: "P1".into(),
            reason: "database: trigger says\nno".into(),
            set_aside_at: now - chrono::Duration::seconds(7_260),
            attempts: 3,
            retry_at: now + chrono::Duration::seconds(1_500),
        }];
        let text = table("cancel_unpaid", &rows, now);
        assert!(
            text.starts_with("timer cancel_unpaid: 1 row(s) set aside\n"),
            "{text}"
        );
        let line = text.lines().last().unwrap();
        for part in ["P1", "2h1m", " 3 ", "25m0s", "trigger says no"] {
            assert!(line.contains(part), "{part} in {line}");
        }
        assert_eq!(table("t", &[], now), "timer t: 0 row(s) set aside\n");
        assert_eq!(human(-5), "0s");
        assert_eq!(human(90_000), "1d1h");
    }
}
