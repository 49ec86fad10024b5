//! `order-timeout schedule`: publish one timeout as the order service
//! would (for operators and scripts).

use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;

use super::connect;
use crate::broker::publisher::Publisher;
use crate::broker::topology::{self, Layout};
use crate::message::{Deadline, OrderId, TimeoutRequest, format_instant};
use crate::settings::{Settings, Timer, TimerName};

/// The names of `timers`, for messages: `cancel_unpaid, auto_receive`.
pub(super) fn timer_names(timers: &[Timer]) -> String {
    timers
        .iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Arguments of `schedule`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["cancel_at", "in_"])))]
pub struct ScheduleArgs {
    /// The order to cancel if still unpaid.
    #[arg(long)]
    pub order_id: String,
    /// Deadline, RFC 3339 (e.g. 2026-11-21T10:30:00Z or 2026-11-21T18:30:00+08:00).
    #[arg(long, value_parser = parse_rfc3339)]
    pub cancel_at: Option<DateTime<Utc>>,
    /// Deadline relative to now (e.g. 30m, 1h 30m, 1500ms).
    #[arg(long = "in", id = "in_", value_parser = humantime::parse_duration)]
    pub in_: Option<Duration>,
    /// The timer (a `[[timers]]` name of the config); default: the default
    /// one, cancel_unpaid.
    #[arg(long)]
    pub timer: Option<String>,
}

fn parse_rfc3339(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not RFC 3339: {e}"))
}

/// Publishes the timeout with a publisher confirm.
pub(super) async fn run(settings: Settings, args: ScheduleArgs) -> anyhow::Result<ExitCode> {
    let order_id = OrderId::parse(&args.order_id)?;
    let cancel_at = match (args.cancel_at, args.in_) {
        (Some(at), _) => at,
        (None, Some(d)) => chrono::Duration::from_std(d)
            .ok()
            .and_then(|d| Utc::now().checked_add_signed(d))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--in {}: too far in the future",
                    humantime::format_duration(d)
                )
            })?,
        (None, None) => anyhow::bail!("give --cancel-at or --in"),
    };
    let timer = match &args.timer {
        None => TimerName::default_timer(),
        Some(name) => {
            let name = TimerName::parse(name).map_err(|e| anyhow::anyhow!("--timer: {e}"))?;
            let timers = settings.timers()?;
            if !timers.iter().any(|t| t.name == name) {
                anyhow::bail!(
                    "--timer {name}: the config has no such timer (it has {})",
                    timer_names(&timers)
                );
            }
            name
        }
    };
    // The consumer would park a deadline outside the years it accepts.
    let request = TimeoutRequest::parse(
        &TimeoutRequest {
            order_id,
            deadline: Deadline::At(cancel_at),
            timer,
        }
        .to_json(),
        usize::MAX,
    )?;
    let conn = connect(&settings, "order-timeout-cli").await?;
    let publisher = Publisher::new(&conn).await?;
    topology::declare(&conn, &Layout::of(&settings)).await?;
    publisher.schedule(&request).await?;
    publisher.close().await;
    crate::broker::close_quietly(&conn).await;
    if request.timer.is_default() {
        println!(
            "scheduled order {} to be cancelled at {} if unpaid",
            request.order_id,
            format_instant(cancel_at)
        );
    } else {
        println!(
            "scheduled row {} for timer {} at {}",
            request.order_id,
            request.timer,
            format_instant(cancel_at)
        );
    }
    Ok(ExitCode::SUCCESS)
}
