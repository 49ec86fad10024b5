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
use crate::ops::pending::{DUE_WINDOWS, LATER};
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
    /// Publish nothing: say how many rows each timer would schedule and
    /// when they fall due (overdue, within 1 minute … 7 days, later).
    /// Needs only DATABASE_URL.
    #[arg(long)]
    pub dry_run: bool,
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
    if args.dry_run {
        for store in stores.iter() {
            print!("{}", dry_run(store, args.batch).await?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let conn = connect(&settings, "order-timeout-backfill").await?;
    let publisher = Publisher::new(&conn).await?;
    topology::declare(&conn, &Layout::of(&settings)).await?;
    for store in stores.iter() {
        backfill_timer(store, &publisher, &args).await?;
    }
    publisher.close().await;
    crate::broker::close_quietly(&conn).await;
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

/// What `backfill` would schedule for `store`'s timer: the rows in its
/// `from` status passing the guard, by when they fall due (on this host's
/// clock), read page by page as the real run reads them; nothing is
/// published.
#[tracing::instrument(skip_all, fields(timer = %store.timer().name))]
async fn dry_run(store: &Store, batch: u32) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    let timer = store.timer();
    let now = chrono::Utc::now();
    // Overdue, then each window of `pending`, then later.
    let mut counts = vec![0u64; DUE_WINDOWS.len() + 2];
    let (mut first, mut last) = (None, None);
    let mut after: Option<String> = None;
    loop {
        let page = store.waiting_page(after.as_deref(), batch.max(1)).await?;
        for (_, deadline) in &page.rows {
            first = first.min(Some(*deadline)).or(Some(*deadline));
            last = last.max(Some(*deadline));
            let secs = (*deadline - now).num_seconds();
            let slot = match u64::try_from(secs) {
                Err(_) | Ok(0) => 0,
                Ok(secs) => {
                    1 + DUE_WINDOWS
                        .iter()
                        .take_while(|(_, bound)| secs > *bound)
                        .count()
                }
            };
            counts[slot] += 1;
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let total: u64 = counts.iter().sum();
    let mut out = format!(
        "timer {}: would schedule {total} rows of {} in status {} (dry run: nothing published)\n",
        timer.name,
        store.prepare().await?.table,
        timer.from
    );
    let labels = std::iter::once("overdue (flipped at once)".to_owned())
        .chain(
            DUE_WINDOWS
                .iter()
                .map(|(name, _)| format!("due within {name}")),
        )
        .chain(std::iter::once(format!("due {LATER}")));
    for (label, n) in labels.zip(&counts) {
        let _ = writeln!(out, "  {label:<26} {n:>10}");
    }
    if let (Some(first), Some(last)) = (first, last) {
        let _ = writeln!(
            out,
            "  deadlines from {} to {} (UTC)",
            first.format("%Y-%m-%d %H:%M:%S"),
            last.format("%Y-%m-%d %H:%M:%S")
        );
    }
    Ok(out)
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
