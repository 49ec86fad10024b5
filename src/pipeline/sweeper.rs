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
//! It is also **the catch-up after a (re)connect**: for `catch_up_window`
//! after each broker session starts it sweeps every `catch_up_interval`
//! with a short grace, because a broker restart can hold timeout messages
//! in the cascade for minutes (RabbitMQ's dead-letter worker starts before
//! the next level's queue is back and retries only after
//! `dead_letter_worker_publisher_confirm_timeout`). Measured in
//! docs/BENCHMARKS.md, "Broker crashes".

use std::collections::HashSet;

use super::context::Worker;
use super::finish::{self, Pending};
use crate::message::OrderId;
use crate::shutdown::Shutdown;
use crate::store::{OrderState, Store, StoreError};

/// Most batches one sweep takes before yielding to the next interval.
const MAX_BATCHES: usize = 100;

/// Finished outbox rows one retention statement deletes: small enough that
/// it holds its locks for milliseconds.
pub(crate) const RETENTION_BATCH: u32 = 1_000;

/// Retention statements per sweep at most; a backlog (the first sweeps
/// after an upgrade) is worked off over the following sweeps.
const RETENTION_BATCHES: usize = 5;

/// Sweeps until `stop` fires: every `catch_up_interval` during the
/// session's first `catch_up_window` (the catch-up after a (re)connect),
/// then every `interval`.
pub(crate) async fn run(worker: Worker, stop: Shutdown) {
    let settings = worker.ctx.settings.sweeper.clone();
    if !settings.enabled {
        return;
    }
    let session_start = tokio::time::Instant::now();
    loop {
        let catching_up = session_start.elapsed() < settings.catch_up_window;
        let (pause, grace) = if catching_up {
            (settings.catch_up_interval, settings.catch_up_grace)
        } else {
            (settings.interval, settings.grace)
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.wait() => return,
        }
        for store in worker.ctx.stores.iter() {
            sweep_timer(&worker, store, grace, catching_up, pause).await;
        }
    }
}

/// One sweep of one timer (see [`sweep_once`]), logged, then its
/// retention ([`delete_expired`]).
async fn sweep_timer(
    worker: &Worker,
    store: &Store,
    grace: std::time::Duration,
    catching_up: bool,
    pause: std::time::Duration,
) {
    let timer = &store.timer().name;
    match sweep_once(worker, store, grace).await {
        Ok(0) => tracing::debug!(catching_up, %timer, "sweep: nothing overdue"),
        Ok(n) if catching_up => tracing::warn!(
            orders = n,
            %timer,
            "catch-up sweep: settled orders whose timeout messages are late (held up in the broker around a reconnect)"
        ),
        Ok(n) => tracing::warn!(
            orders = n,
            %timer,
            "sweep: settled orders no timeout message did (dual-write gap or lost work)"
        ),
        Err(e) => {
            tracing::warn!(error = %e, %timer, "sweep failed; next one in {pause:?}")
        }
    }
    if let Err(e) = delete_expired(worker, store).await {
        tracing::warn!(error = %e, %timer, "deleting finished outbox rows failed; next try in {pause:?}");
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

/// One sweep of `store`'s timer over orders overdue by more than `grace`
/// and cancellations whose stock release is stale; returns how many orders
/// it cancelled or finished.
#[tracing::instrument(skip(worker, store), fields(timer = %store.timer().name))]
pub(crate) async fn sweep_once(
    worker: &Worker,
    store: &Store,
    grace: std::time::Duration,
) -> Result<u64, StoreError> {
    let ctx = &worker.ctx;
    let s = &ctx.settings.sweeper;
    let mut settled = 0u64;
    let mut seen: HashSet<OrderId> = HashSet::new();
    for round in 0..MAX_BATCHES {
        let mut ids = store.overdue(grace, s.batch).await?;
        if round == 0 {
            ids.extend(store.stale_outbox(s.grace, s.batch).await?);
        }
        // An order that did not settle in this sweep (contended, inventory
        // down) waits for the next one rather than spinning here.
        ids.retain(|id| seen.insert(id.clone()));
        if ids.is_empty() {
            break;
        }
        let full = ids.len() >= s.batch as usize;
        let states = store.cancel_due(&ids, ctx.settings.outbox_lease).await?;
        let to_finish: Vec<Pending> = states
            .into_iter()
            .filter_map(|(id, state)| match state {
                OrderState::Cancelled(cancellation) if cancellation.leased => Some(Pending {
                    id,
                    cancellation,
                    jobs: Vec::new(),
                }),
                _ => None,
            })
            .collect();
        settled += to_finish.len() as u64;
        ctx.metrics
            .swept(store.timer().name.as_str(), to_finish.len() as u64);
        finish::finish(worker, store, to_finish).await;
        if !full {
            break;
        }
    }
    Ok(settled)
}
