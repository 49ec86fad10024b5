//! `order-timeout backfill`: on adoption day (or when a timer is added),
//! schedule every row a timer is waiting for that is already in the shop's
//! table — for the default timer, every unpaid order — so that rows from
//! before the switch are flipped on time rather than by the sweeper's
//! grace, and the cron job the timer replaces can be switched off.
//!
//! Each row gets the message its publisher would have sent (`{"order_id",
//! "cancel_at"}` with the row's deadline, and the timer's name for any
//! timer but the default one), confirmed, through the entry exchange and so
//! the same delay store. Safe to run twice: the cancel path absorbs
//! duplicate messages.

use std::process::ExitCode;

use clap::Args;
use futures_util::{StreamExt, TryStreamExt, stream};
use indicatif::{ProgressBar, ProgressStyle};

use super::connect;
use super::schedule::timer_names;
use crate::broker::publisher::Publisher;
use crate::broker::topology::{self, Layout};
use crate::message::{Deadline, TimeoutRequest};
use crate::settings::{Settings, Timer, TimerName};
use crate::store::{self, Store};

/// Arguments of `backfill`.
#[derive(Debug, Args)]
pub struct BackfillArgs {
    /// Rows read per query.
    #[arg(long, default_value_t = 500)]
    pub batch: u32,
    /// Confirmed publishes in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Only this timer (`cancel_unpaid` or a `[[timers]]` name); may be
    /// given several times. Default: every timer of the config.
    #[arg(long = "timer", value_name = "NAME")]
    pub timers: Vec<String>,
}

/// Schedules every waiting row of each chosen timer, page by page in id
/// order.
pub(super) async fn run(settings: Settings, args: BackfillArgs) -> anyhow::Result<ExitCode> {
    let timers = chosen(&settings.timers()?, &args.timers)?;
    let pool = store::PoolSettings::of(&settings).with_max_connections(2);
    let stores = store::connect_timers(&settings.database_url, pool, &timers)?;
    for store in stores.iter() {
        store.prepare().await?;
    }
    let conn = connect(&settings, "order-timeout-backfill").await?;
    let publisher = Publisher::new(&conn).await?;
    topology::declare(&conn, &Layout::of(&settings)).await?;
    for store in stores.iter() {
        backfill_timer(store, &publisher, &args).await?;
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(ExitCode::SUCCESS)
}

/// The timers `names` asks for, in config order (all of them when it is
/// empty); a name the config does not have is an error that lists them.
pub(super) fn chosen(timers: &[Timer], names: &[String]) -> anyhow::Result<Vec<Timer>> {
    if names.is_empty() {
        return Ok(timers.to_vec());
    }
    let mut wanted = Vec::with_capacity(names.len());
    for name in names {
        let name = TimerName::parse(name).map_err(|e| anyhow::anyhow!("--timer: {e}"))?;
        if !timers.iter().any(|t| t.name == name) {
            anyhow::bail!(
                "--timer {name}: the config has no such timer (it has {})",
                timer_names(timers)
            );
        }
        wanted.push(name);
    }
    Ok(timers
        .iter()
        .filter(|t| wanted.contains(&t.name))
        .cloned()
        .collect())
}

/// Schedules every row of `store`'s timer still in its `from` status.
#[tracing::instrument(skip_all, fields(timer = %store.timer().name))]
async fn backfill_timer(
    store: &Store,
    publisher: &Publisher,
    args: &BackfillArgs,
) -> anyhow::Result<()> {
    let report = store.prepare().await?;
    let timer = store.timer();
    let bar = ProgressBar::new(u64::try_from(report.waiting.0).unwrap_or(0)).with_style(
        ProgressStyle::with_template(&format!(
            "{{bar:40}} {{pos}}/{{len}} rows of {} scheduled ({{per_sec}}, eta {{eta}})",
            timer.name
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut after: Option<String> = None;
    let mut scheduled = 0u64;
    loop {
        // Pages go on from the last row read, also when a page's rows were
        // all left out (ids that are no order ids).
        let page = store
            .waiting_page(after.as_deref(), args.batch.max(1))
            .await?;
        let n = page.rows.len() as u64;
        stream::iter(page.rows)
            .map(|(order_id, deadline)| async move {
                let request = TimeoutRequest {
                    order_id,
                    deadline: Deadline::At(deadline),
                    timer: timer.name.clone(),
                };
                publisher.schedule(&request).await
            })
            .buffer_unordered(args.concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        scheduled += n;
        bar.inc(n);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    bar.finish_and_clear();
    if timer.is_default() {
        println!(
            "scheduled {scheduled} unpaid orders of {} ({} overdue when checked: cancelled at once)",
            report.table, report.waiting.1
        );
    } else {
        println!(
            "timer {}: scheduled {scheduled} rows of {} in status {} ({} overdue when checked: flipped to {} at once)",
            timer.name, report.table, timer.from, report.waiting.1, timer.to
        );
    }
    Ok(())
}
