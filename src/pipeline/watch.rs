//! Watches: timers nobody publishes for. A shop's shipping service does not
//! publish "received in 15 days" messages; a timer with `watch = "1m"` has
//! the service find, every minute, the rows that fall due within the next
//! minute and schedule them itself, through the same delay store as a
//! published message, so that they are flipped on time to the millisecond
//! with no change to any other service.
//!
//! Per tick of a watched timer ([`tick`]):
//!
//! 1. the lease of the timer's watch (`order_timeout_watch`) is taken or
//!    kept: one replica scans at a time, the others' ticks find it held and
//!    do nothing; a replica that dies loses it when it runs out
//!    ([`lease_for`]), and a graceful stop gives it back;
//! 2. the rows in the timer's `from` status due after the mark the last
//!    scan left (`scanned_until`) and no later than the database's clock
//!    plus the window are read in (deadline, id) pages ([`PAGE`]);
//! 3. each is scheduled for its deadline (confirmed): into the lane or
//!    cascade level it fits, or, due within the consumer's hold window,
//!    through the entry exchange;
//! 4. the mark moves to the end of the window.
//!
//! A crash or a lost lease between 2 and 4 leaves the mark where it was,
//! and the next holder schedules the range again: duplicates are harmless,
//! the row is the truth (a row already flipped is left alone). Rows that
//! enter the `from` status with a deadline inside a window already scanned,
//! and rows already overdue when the watch starts, are the sweeper's.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::{StreamExt, TryStreamExt, stream};

use super::context::Context;
use super::context::catch_panic;
use super::ending::{Delayed, HOLD_BELOW, Worker, delay_patiently, publish_patiently};
use super::failure::Failure;
use crate::broker::headers::Attempts;
use crate::message::{Deadline, OrderId, TimeoutRequest};
use crate::shutdown::Shutdown;
use crate::store::{RowCursor, Store};

/// Rows read per statement of a scan (and published before the next).
pub(crate) const PAGE: u32 = 1_000;

/// Confirmed publishes in flight while a page is scheduled.
const PUBLISHES_IN_FLIGHT: usize = 64;

/// How long a replica holds a timer's watch after each tick (or page): two
/// windows, and at least 10 s, so that a holder a little late for its
/// next tick keeps it, and one that died is replaced within about two
/// windows (its range is then scanned by the next holder).
pub(crate) fn lease_for(window: Duration) -> Duration {
    (window * 2).max(Duration::from_secs(10))
}

/// Runs the watch of every timer that has one until `stop` fires, then
/// gives their leases back.
pub(crate) async fn run(worker: Worker, stop: Shutdown) {
    let watched: Vec<(Store, Duration)> = worker
        .ctx
        .stores
        .iter()
        .filter_map(|store| Some((store.clone(), store.timer().watch?)))
        .collect();
    let watches = watched
        .into_iter()
        .map(|(store, window)| watch_timer(&worker, store, window, &stop));
    futures_util::future::join_all(watches).await;
}

/// One timer's watch: a tick every `window` until `stop` fires.
#[tracing::instrument(skip_all, fields(timer = %store.timer().name, ?window))]
async fn watch_timer(worker: &Worker, store: Store, window: Duration, stop: &Shutdown) {
    let mut ticks = tokio::time::interval(window);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.wait() => break,
        }
        let scan = tick(&worker.ctx, &store, window);
        let then = "the next tick scans again";
        let Some(result) = catch_panic(&worker.ctx.metrics, "watch", then, scan).await else {
            continue;
        };
        match result {
            Ok(Some(0)) => tracing::debug!("watch: nothing falls due within the window"),
            Ok(Some(rows)) => {
                tracing::info!(
                    rows,
                    "watch: scheduled the rows falling due within the window"
                );
            }
            Ok(None) => tracing::debug!("watch: another replica holds the lease"),
            Err(e) => tracing::warn!(error = %e, "watch failed; next tick in {window:?}"),
        }
    }
    if let Err(e) = store.watch_release(&worker.ctx.instance).await {
        tracing::debug!(error = %e, "cannot give the watch's lease back; it runs out");
    }
}

/// One tick (see the module docs): `Some(rows scheduled)` when this
/// replica holds the lease, `None` when another one does.
pub(crate) async fn tick(
    ctx: &Context,
    store: &Store,
    window: Duration,
) -> Result<Option<u64>, Failure> {
    let holder = ctx.instance.as_ref();
    let lease = lease_for(window);
    let Some(mark) = store.watch_lease(holder, lease).await? else {
        return Ok(None);
    };
    let window = chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
    let until = mark
        .db_now
        .checked_add_signed(window)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    // The database's clock, read with the lease, carried on by this
    // host's monotonic clock: what the publishes are timed by, so that a
    // host clock off from the database's does not move the deadlines.
    let clock = DbClock::new(mark.db_now);
    let mut cursor = RowCursor {
        deadline: mark.scanned_until,
        id: None,
    };
    let mut scheduled = 0u64;
    loop {
        let page = store.due_between(&cursor, until, PAGE).await?;
        let rows = page.rows.len() as u64;
        schedule_page(ctx, store, page.rows, &clock).await?;
        scheduled += rows;
        ctx.metrics.watched(store.timer().name.as_str(), rows);
        // The next page goes on from the last row read, also when some of
        // this page's rows were left out (ids that are no order ids).
        let Some(next) = page.next else { break };
        cursor = next;
        // A long scan keeps the lease; a lost one leaves the rest of the
        // range to the next holder (from the old mark: duplicates only).
        if store.watch_lease(holder, lease).await?.is_none() {
            return Ok(Some(scheduled));
        }
    }
    if !store.watch_advance(holder, until).await? {
        tracing::warn!(
            "watch: the lease ran out during the scan; the next holder schedules the range again"
        );
    }
    Ok(Some(scheduled))
}

/// The database's clock as read at one instant, carried on by this host's
/// monotonic clock.
struct DbClock {
    read: DateTime<Utc>,
    at: tokio::time::Instant,
}

impl DbClock {
    fn new(read: DateTime<Utc>) -> Self {
        Self {
            read,
            at: tokio::time::Instant::now(),
        }
    }

    /// The database's clock now.
    fn now(&self) -> DateTime<Utc> {
        let elapsed = chrono::Duration::from_std(self.at.elapsed()).unwrap_or_default();
        self.read
            .checked_add_signed(elapsed)
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }
}

/// Schedules each row of `page` for its deadline, confirmed: into the delay
/// store, or, due within the consumer's hold window, through the entry
/// exchange (the consumer holds it to the millisecond).
async fn schedule_page(
    ctx: &Context,
    store: &Store,
    page: Vec<(OrderId, DateTime<Utc>)>,
    clock: &DbClock,
) -> Result<(), Failure> {
    let timer = &store.timer().name;
    stream::iter(page)
        .map(|(order_id, deadline)| async move {
            let request = TimeoutRequest {
                order_id,
                deadline: Deadline::At(deadline),
                timer: timer.clone(),
            };
            let body = request.to_json();
            let attempts = Attempts::default();
            let delayed = delay_patiently(
                ctx,
                &body,
                &request.order_id,
                deadline,
                clock.now(),
                &attempts,
                HOLD_BELOW,
            )
            .await;
            // Due within the hold window (at once, or after refusals): the
            // entry exchange, and the consumer holds it.
            let published = match delayed {
                Ok(Delayed::TooClose(_)) => {
                    publish_patiently(ctx, "watch", || ctx.publisher.schedule(&request)).await
                }
                other => other.map(drop),
            };
            published.map_err(Failure::from)
        })
        .buffer_unordered(PUBLISHES_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn publishes_are_timed_by_the_databases_clock_carried_on_monotonically() {
        // A database whose clock is a day behind this host's.
        let read = Utc::now() - chrono::Duration::days(1);
        let clock = DbClock::new(read);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = clock.now();
        let elapsed = now - read;
        assert!(
            elapsed >= chrono::Duration::milliseconds(50) && elapsed < chrono::Duration::seconds(5),
            "{elapsed}"
        );
        assert!(
            now < Utc::now() - chrono::Duration::hours(23),
            "the host's clock leaked in"
        );
        let far = DbClock::new(DateTime::<Utc>::MAX_UTC);
        assert_eq!(
            far.now(),
            DateTime::<Utc>::MAX_UTC,
            "saturates, never panics"
        );
    }
}
