//! The sweeper: the safety net for the dual-write gap.
//!
//! The order service inserts the order row, then publishes the timeout; if
//! it dies in between, no message will ever come. Every `interval` the
//! sweeper cancels UNPAID orders overdue by more than `grace` (the normal
//! path settles everything younger), and finishes cancellations whose stock
//! release is still pending (a parked or lost delivery), through the same
//! cancel statement and outbox leases as the consumer — so several replicas
//! sweeping at once, or a sweep racing a late message, still release stock
//! once.
//!
//! Outbox rows whose work keeps failing wait longer and longer between the
//! sweeper's attempts (`finish.rs` plans them), and its scan takes the rows
//! that are due first, so they never starve newer ones; a release that can
//! never succeed is given up and parked (`release_failed`) instead of being
//! retried for ever. Finished rows older than `outbox_retention` are
//! deleted, [`RETENTION_BATCH`] at a time ([`delete_expired`]).
//!
//! Every timer is swept (its rows in `from` overdue by more than the
//! grace, its own outbox rows), one after the other, each by its store.
//!
//! **The safety net never stops**: a sweep reads the overdue rows page by
//! page in (deadline, id) order, each page after the last row read, so
//! rows it leaves alone never hide the rows behind them; rows the timer
//! flipped before (re-opened orders) and rows set aside are left out by
//! the query itself. A row whose flip fails for good (an `also` statement
//! hitting a constraint for that order alone) fails alone (the store runs
//! it on its own), is parked once (`permanent_failure`, with the reason)
//! and set aside: later sweeps skip it until the row changes. Each sweep's
//! outcome is counted per timer (`order_timeout_sweeps_total{timer,
//! result}`: `ok`, `left_behind` when overdue rows it found stay unsettled
//! for now, `failed` when it could not run), and alert rules fire when a
//! timer's sweeps keep failing or leaving rows behind.
//!
//! It is also **the catch-up after a (re)connect**: for `catch_up_window`
//! after each broker session starts it sweeps every `catch_up_interval`
//! with a short grace, because a broker restart can hold timeout messages
//! in the cascade for minutes (RabbitMQ's dead-letter worker starts before
//! the next level's queue is back and retries only after
//! `dead_letter_worker_publisher_confirm_timeout`). Measured in
//! docs/benchmarks-log.md, "Broker crashes".

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use super::cancel::{note_statements, set_aside};
use super::context::catch_panic;
use super::ending::{Worker, park_row};
use super::failure::Failure;
use super::finish::{self, Pending};
use super::verdict::{Origin, Seen, Verdict, verdict};
use crate::message::{OrderId, ParkReason};
use crate::observe::metrics::{Statements, SweepResult};
use crate::shutdown::Shutdown;
use crate::store::{RowCursor, Store, StoreError};

/// Most pages one sweep reads before yielding to the next interval.
const MAX_BATCHES: usize = 100;

/// Finished outbox rows one retention statement deletes: small enough that
/// it holds its locks for milliseconds.
pub(crate) const RETENTION_BATCH: u32 = 1_000;

/// Retention statements per sweep at most; a backlog (the first sweeps
/// after an upgrade) is worked off over the following sweeps.
const RETENTION_BATCHES: usize = 5;

/// Sweeps until `stop` fires: every `catch_up_interval` during the
/// session's first `catch_up_window` (the catch-up after a (re)connect),
/// then every `interval`; and every `catch_up_interval` after a sweep that
/// failed for a reason waiting fixes (a lost connection, a timeout), so
/// that the sweep, and readiness with it, follows the database's return
/// within seconds instead of an `interval` later.
pub(crate) async fn run(worker: Worker, stop: Shutdown) {
    let settings = worker.ctx.settings.sweeper.clone();
    if !settings.enabled {
        return;
    }
    let session_start = tokio::time::Instant::now();
    for store in worker.ctx.stores.iter() {
        // The series exists from the start: a sweeper that never completes
        // a sweep is an alert too.
        if worker
            .ctx
            .metrics
            .sweep_last_success_of(store.timer().name.as_str())
            == 0
        {
            worker
                .ctx
                .metrics
                .sweep_succeeded(store.timer().name.as_str());
        }
    }
    let mut retrying = false;
    loop {
        let catching_up = session_start.elapsed() < settings.catch_up_window;
        let (mut pause, grace) = if catching_up {
            (settings.catch_up_interval, settings.catch_up_grace)
        } else {
            (settings.interval, settings.grace)
        };
        if retrying {
            pause = pause.min(settings.catch_up_interval);
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.wait() => return,
        }
        retrying = false;
        for store in worker.ctx.stores.iter() {
            // A panic in a sweep (a value no one foresaw) ends that sweep,
            // not the safety net: it is logged and counted, and the next
            // interval sweeps again.
            let sweep = sweep_timer(&worker, store, grace, catching_up, pause);
            let then = format!(
                "timer {}'s next sweep runs in {pause:?}",
                store.timer().name
            );
            retrying |= catch_panic(&worker.ctx.metrics, "sweeper", &then, sweep)
                .await
                .unwrap_or(false);
        }
    }
}

/// What one sweep of one timer did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Orders it cancelled (flipped) or finished the outbox work of.
    pub(crate) settled: u64,
    /// Rows whose flip failed for good: parked and set aside.
    pub(crate) set_aside: u64,
    /// Overdue rows it found and could not settle now (held by another
    /// transaction, contended, a failure waiting can fix, a park the
    /// broker refused): the next sweep tries them again.
    pub(crate) left_behind: u64,
    /// It stopped after [`MAX_BATCHES`] pages with more to read.
    pub(crate) more: bool,
}

impl Swept {
    /// The sweep's `result` label.
    pub(crate) fn result(&self) -> SweepResult {
        if self.left_behind > 0 || self.more {
            SweepResult::LeftBehind
        } else {
            SweepResult::Ok
        }
    }
}

/// One sweep of one timer (see [`sweep_once`]), logged and counted, then
/// its retention ([`delete_expired`]) and the marks of rows set aside that
/// no longer need them. Whether it failed for a reason waiting fixes.
async fn sweep_timer(
    worker: &Worker,
    store: &Store,
    grace: std::time::Duration,
    catching_up: bool,
    pause: std::time::Duration,
) -> bool {
    let timer = &store.timer().name;
    let metrics = &worker.ctx.metrics;
    let transient = match sweep_once(worker, store, grace).await {
        Ok(swept) => {
            metrics.sweep(timer.as_str(), swept.result());
            metrics.sweep_succeeded(timer.as_str());
            metrics.set_timer_failing(timer.as_str(), Statements::Sweep, false);
            log_sweep(&swept, timer.as_str(), catching_up);
            false
        }
        Err(e) => {
            metrics.sweep(timer.as_str(), SweepResult::Failed);
            metrics.set_timer_failing(timer.as_str(), Statements::Sweep, !e.is_row_fault());
            let transient = !e.is_permanent();
            let next = if transient {
                pause.min(worker.ctx.settings.sweeper.catch_up_interval)
            } else {
                pause
            };
            tracing::warn!(error = %e, %timer, "sweep failed; next one in {next:?}");
            transient
        }
    };
    match store.set_aside_count().await {
        Ok(n) => metrics.set_set_aside_rows(timer.as_str(), n),
        Err(e) => tracing::debug!(error = %e, %timer, "cannot count the rows set aside"),
    }
    if let Err(e) = delete_expired(worker, store).await {
        tracing::warn!(error = %e, %timer, "deleting finished outbox rows failed; next try in {pause:?}");
    }
    match store.prune_set_aside().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(rows = n, %timer, "forgot rows set aside that left their status"),
        Err(e) => tracing::debug!(error = %e, %timer, "cannot prune the rows set aside"),
    }
    transient
}

fn log_sweep(swept: &Swept, timer: &str, catching_up: bool) {
    let n = swept.settled;
    match n {
        0 => tracing::debug!(catching_up, %timer, "sweep: nothing overdue settled"),
        _ if catching_up => tracing::warn!(
            orders = n,
            %timer,
            "catch-up sweep after a reconnect: settled overdue orders no message had done yet (late in the broker around the reconnect, or never published)"
        ),
        _ => tracing::warn!(
            orders = n,
            %timer,
            "sweep: settled orders no timeout message did (dual-write gap or lost work)"
        ),
    }
    if swept.set_aside > 0 {
        tracing::warn!(rows = swept.set_aside, %timer, "sweep: rows whose flip fails for good parked and set aside (skipped until they change)");
    }
    if swept.left_behind > 0 || swept.more {
        tracing::warn!(rows = swept.left_behind, more_pages = swept.more, %timer, "sweep: overdue rows left for the next sweep");
    }
}

/// Deletes finished outbox rows older than `outbox_retention`, in at most
/// [`RETENTION_BATCHES`] statements of [`RETENTION_BATCH`] rows; returns
/// how many. Rows whose work is pending or was given up are kept.
#[tracing::instrument(skip_all, fields(timer = %store.timer().name))]
pub(crate) async fn delete_expired(worker: &Worker, store: &Store) -> Result<u64, StoreError> {
    let ctx = &worker.ctx;
    let retention = ctx.settings.sweeper.outbox_retention;
    let mut deleted = 0;
    for _ in 0..RETENTION_BATCHES {
        let n = store.delete_finished(retention, RETENTION_BATCH).await?;
        ctx.metrics.outbox_deleted(n);
        deleted += n;
        if n < u64::from(RETENTION_BATCH) {
            break;
        }
    }
    if deleted > 0 {
        tracing::info!(
            rows = deleted,
            ?retention,
            "deleted finished outbox rows past their retention"
        );
    }
    Ok(deleted)
}

/// One sweep of `store`'s timer over orders overdue by more than `grace`,
/// page by page, and cancellations whose outbox work is stale (with the
/// first page); returns what it did. An error is a statement that failed
/// for the whole sweep (the connection); a failure of one order's flip is
/// that order's.
#[tracing::instrument(skip(worker, store), fields(timer = %store.timer().name))]
pub(crate) async fn sweep_once(
    worker: &Worker,
    store: &Store,
    grace: std::time::Duration,
) -> Result<Swept, StoreError> {
    let s = &worker.ctx.settings.sweeper;
    let mut swept = Swept::default();
    let mut seen: HashSet<OrderId> = HashSet::new();
    let mut cursor: Option<RowCursor> = None;
    for round in 0..MAX_BATCHES {
        let page = store.overdue(grace, cursor.as_ref(), s.batch).await?;
        let mut rows: Vec<(OrderId, Option<DateTime<Utc>>)> = page
            .rows
            .into_iter()
            .map(|(id, deadline)| (id, Some(deadline)))
            .collect();
        if round == 0 {
            let stale = store.stale_outbox(s.grace, s.batch).await?;
            rows.extend(stale.into_iter().map(|id| (id, None)));
        }
        // An order that did not settle in this sweep (contended, inventory
        // down) waits for the next one rather than spinning here.
        rows.retain(|(id, _)| seen.insert(id.clone()));
        if !rows.is_empty() {
            settle_page(worker, store, rows, &mut swept).await?;
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => return Ok(swept),
        }
    }
    swept.more = true;
    Ok(swept)
}

/// The cancel transaction for one page's rows, then each settled by its
/// verdict ([`super::verdict`]): cancellations leased to the sweep finished, rows whose flip
/// fails for good parked and set aside, the rest counted as left behind
/// when they stay unsettled.
async fn settle_page(
    worker: &Worker,
    store: &Store,
    rows: Vec<(OrderId, Option<DateTime<Utc>>)>,
    swept: &mut Swept,
) -> Result<(), StoreError> {
    let ctx = &worker.ctx;
    let ids: Vec<OrderId> = rows.iter().map(|(id, _)| id.clone()).collect();
    let result = store.cancel_due(&ids, ctx.settings.outbox_lease).await;
    note_statements(&ctx.metrics, store, result.as_deref());
    let states = result?;
    let mut to_finish = Vec::new();
    for (id, state) in states {
        let failure = match verdict(
            Origin::Sweep,
            Seen::State(&state),
            ctx.settings.unknown_order,
        ) {
            Verdict::Finish(cancellation) => {
                to_finish.push(Pending {
                    id,
                    cancellation,
                    jobs: Vec::new(),
                });
                continue;
            }
            Verdict::LeftBehind => {
                swept.left_behind += 1;
                continue;
            }
            Verdict::SetAside(failure) => {
                let deadline = rows.iter().find(|(r, _)| *r == id).and_then(|(_, d)| *d);
                if set_aside_and_park(worker, store, &id, deadline, &failure).await {
                    swept.set_aside += 1;
                    continue;
                }
                failure
            }
            Verdict::Retry(failure) => failure,
            // Nothing for the sweep to do (and never a message's verdict).
            _ => continue,
        };
        tracing::warn!(order_id = %id, error = %failure, "sweep: the order's flip failed; the next sweep tries it again");
        swept.left_behind += 1;
    }
    swept.settled += to_finish.len() as u64;
    ctx.metrics
        .swept(store.timer().name.as_str(), to_finish.len() as u64);
    finish::finish(worker, store, to_finish, Origin::Sweep).await;
    Ok(())
}

/// Sets aside a row whose flip fails for its own values, then parks it
/// (the timeout message its publisher would have sent, for its
/// `deadline`) with the reason `permanent_failure` the first time it fails
/// as it is: parked once, and visible. A row tried again after its
/// `retry_at` that still fails stays set aside, without a second parked
/// copy. `false` when nothing could be recorded (the mark, or the park the
/// broker refused: the next sweep tries again).
async fn set_aside_and_park(
    worker: &Worker,
    store: &Store,
    id: &OrderId,
    deadline: Option<DateTime<Utc>>,
    failure: &Failure,
) -> bool {
    let ctx = &worker.ctx;
    let reason = failure.to_string();
    let deadline = deadline.unwrap_or_else(Utc::now);
    let timer = &store.timer().name;
    match set_aside(store, id, failure).await {
        Some(1) => {}
        Some(_) => return true,
        None => return false,
    }
    if let Err(e) = park_row(
        ctx,
        timer,
        id,
        deadline,
        ParkReason::PermanentFailure,
        &reason,
    )
    .await
    {
        tracing::error!(order_id = %id, error = %e, "cannot park an order whose flip fails for its own values; the next sweep tries it again");
        // Not parked: the next sweep must find it, and park it, again.
        if let Err(e) = store.forget_set_aside(id).await {
            tracing::warn!(order_id = %id, error = %e, "cannot forget the row's mark; the sweeper tries it again in an hour");
        }
        return false;
    }
    true
}
