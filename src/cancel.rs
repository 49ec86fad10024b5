//! Cancelling due orders, exactly once in effect, in batches.
//!
//! Due messages from the consumer are gathered into batches (whatever is
//! waiting, up to `batch_max`; more pile up while all `batch_concurrency`
//! cancel statements are running, so load makes batches bigger, not
//! slower). Per batch:
//!
//! 1. [`Store::cancel_due`]: one statement flips every UNPAID, overdue
//!    order to CANCELLED and records its outbox row;
//! 2. for every order cancelled now or earlier with outbox work pending:
//!    `ReleaseStock` (idempotent by order id) and the `order.cancelled`
//!    event, concurrently across orders;
//! 3. the outbox rows are marked done;
//! 4. the deliveries are acked, last.
//!
//! A crash between any two steps redelivers the message, and the redelivery
//! finds the order CANCELLED with its outbox row still pending and finishes
//! the work: the inventory server's idempotency key makes the second
//! release a no-op. Paid orders never match the UPDATE.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use backon::Retryable;
use chrono::Utc;
use futures_util::{StreamExt, stream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::task::TaskTracker;

use crate::config::UnknownOrderPolicy;
use crate::consumer::{Context, Job, park};
use crate::message::OrderId;
use crate::metrics::{Outcome, Stage};
use crate::publisher::CancelledEvent;
use crate::store::{Cancellation, OrderState};

/// How long the batcher waits for more due messages before it sends a batch
/// that is not full: a few milliseconds of lateness for far fewer, larger
/// cancel statements under load.
const BATCH_LINGER: Duration = Duration::from_millis(3);

/// How often a batch re-asks about orders another transaction was changing
/// at the same moment, before treating it as a transient failure.
const CONTENDED_ROUNDS: u32 = 5;

/// The batcher: runs until every sender of `due` is gone (the consumer has
/// stopped and no held message is still waiting).
pub async fn run(
    ctx: Arc<Context>,
    mut due: mpsc::Receiver<Job>,
    resend: mpsc::WeakSender<Job>,
    tracker: TaskTracker,
) {
    let slots = Arc::new(Semaphore::new(ctx.settings.batch_concurrency.max(1)));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = due.recv().await else {
            return;
        };
        let mut batch = vec![first];
        // Linger a moment for more: held messages fall due one timer at a
        // time, and without this most batches were 1–2 orders (measured with
        // `bench` at 1,000 orders/s: 1.6 orders per cancel statement, the
        // database the busiest process).
        let linger_until = tokio::time::Instant::now() + BATCH_LINGER;
        while batch.len() < ctx.settings.batch_max {
            match due.try_recv() {
                Ok(job) => batch.push(job),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    match tokio::time::timeout_at(linger_until, due.recv()).await {
                        Ok(Some(job)) => batch.push(job),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
        let ctx = ctx.clone();
        let resend = resend.clone();
        let tracker2 = tracker.clone();
        tracker.spawn(async move {
            process_batch(&ctx, batch, slot, &resend, &tracker2).await;
        });
    }
}

/// Jobs of one batch grouped by order (duplicates of one order travel
/// together and are settled together).
type ByOrder = HashMap<OrderId, Vec<Job>>;

#[tracing::instrument(skip_all, fields(messages = jobs.len()))]
async fn process_batch(
    ctx: &Arc<Context>,
    jobs: Vec<Job>,
    slot: OwnedSemaphorePermit,
    resend: &mpsc::WeakSender<Job>,
    tracker: &TaskTracker,
) {
    let mut by_order: ByOrder = HashMap::new();
    for job in jobs {
        by_order
            .entry(job.order_id().clone())
            .or_default()
            .push(job);
    }

    let mut ids: Vec<OrderId> = by_order.keys().cloned().collect();
    let mut to_finish = Vec::new();
    for round in 0..=CONTENDED_ROUNDS {
        if ids.is_empty() {
            break;
        }
        if round == CONTENDED_ROUNDS {
            for id in ids.drain(..) {
                let jobs = by_order.remove(&id).unwrap_or_default();
                settle_failed(
                    ctx,
                    jobs,
                    "order row kept changing under us".into(),
                    resend,
                    tracker,
                );
            }
            break;
        }
        if round > 0 {
            tokio::time::sleep(Duration::from_millis(10 * u64::from(round))).await;
        }
        let started = std::time::Instant::now();
        let result = ctx
            .store
            .cancel_due(&ids, &ctx.settings.cancel_reason, ctx.settings.outbox_lease)
            .await;
        ctx.metrics.stage(Stage::Db, started.elapsed());
        let states = match result {
            Ok(states) => states,
            Err(e) => {
                let error = e.to_string();
                for (_, jobs) in by_order.drain() {
                    settle_failed(ctx, jobs, error.clone(), resend, tracker);
                }
                return;
            }
        };
        ids.clear();
        for (id, state) in states {
            let Some(jobs) = by_order.remove(&id) else {
                continue;
            };
            match state {
                OrderState::Contended => {
                    ids.push(id.clone());
                    by_order.insert(id, jobs);
                }
                OrderState::Cancelled(c) => to_finish.push((id, c, jobs)),
                other => settle(ctx, id, other, jobs, resend, tracker).await,
            }
        }
    }
    // The slot bounds concurrent cancel statements only: the next batch's
    // cancellation must not wait for this batch's inventory calls.
    drop(slot);
    finish(ctx, to_finish, resend, tracker).await;
}

/// Settles orders that need no outbox work.
async fn settle(
    ctx: &Arc<Context>,
    id: OrderId,
    state: OrderState,
    jobs: Vec<Job>,
    resend: &mpsc::WeakSender<Job>,
    tracker: &TaskTracker,
) {
    match state {
        OrderState::Paid => ack_all(ctx, jobs, Outcome::AlreadyPaid).await,
        OrderState::CancelledElsewhere => ack_all(ctx, jobs, Outcome::AlreadyCancelled).await,
        OrderState::NotYetDue { expires_at, db_now } => {
            // The row's deadline is later than the message's (extended, or a
            // bare order id): wait for the row's deadline.
            tracing::debug!(order_id = %id, %expires_at, "not due yet; re-scheduling for the row's deadline");
            wait_again(
                ctx,
                jobs,
                expires_at,
                db_now,
                Outcome::Rescheduled,
                resend,
                tracker,
            )
            .await;
        }
        OrderState::LeasedElsewhere { until, db_now } => {
            // Another worker is finishing this order's release right now.
            // It normally takes milliseconds: look again in a second, and
            // keep looking until the lease runs out (the worker crashed) and
            // this delivery can take over.
            tracing::debug!(order_id = %id, %until, "release in progress elsewhere; checking again shortly");
            let at = (until + chrono::Duration::milliseconds(100))
                .min(db_now + chrono::Duration::seconds(1));
            wait_again(
                ctx,
                jobs,
                at,
                db_now,
                Outcome::AlreadyCancelled,
                resend,
                tracker,
            )
            .await;
        }
        OrderState::Unknown => {
            for job in jobs {
                match ctx.settings.unknown_order {
                    UnknownOrderPolicy::Park => {
                        let error =
                            format!("unknown order: no row in orders with id {:?}", id.as_str());
                        let attempts = job.attempts.failed(Utc::now(), error.clone());
                        park(
                            ctx,
                            job.delivery,
                            error,
                            "unknown_order",
                            Some(id.clone()),
                            attempts,
                        )
                        .await;
                    }
                    UnknownOrderPolicy::Drop => {
                        tracing::warn!(order_id = %id, "unknown order; dropped by configuration");
                        job.ack(ctx, Outcome::Dropped).await;
                    }
                }
            }
        }
        OrderState::Contended | OrderState::Cancelled(_) => {
            unreachable!("handled by process_batch")
        }
    }
}

/// Sends one of an order's messages back toward `at` (on the database's
/// clock, `db_now`); duplicates are acked with `duplicates` as their
/// outcome, one message is enough.
async fn wait_again(
    ctx: &Arc<Context>,
    jobs: Vec<Job>,
    at: chrono::DateTime<Utc>,
    db_now: chrono::DateTime<Utc>,
    duplicates: Outcome,
    resend: &mpsc::WeakSender<Job>,
    tracker: &TaskTracker,
) {
    let mut jobs = jobs.into_iter();
    let first = jobs.next();
    ack_all(ctx, jobs.collect(), duplicates).await;
    if let Some(job) = first {
        let Some(due) = resend.upgrade() else {
            return job.requeue().await;
        };
        let ctx = ctx.clone();
        let span = job.span.clone();
        tracker.spawn(tracing::Instrument::instrument(
            async move {
                let attempts = job.attempts.clone();
                job.wait_until(&ctx, at, db_now, attempts, Outcome::Rescheduled, &due)
                    .await;
            },
            span,
        ));
    }
}

async fn ack_all(ctx: &Context, jobs: Vec<Job>, outcome: Outcome) {
    for job in jobs {
        job.ack(ctx, outcome).await;
    }
}

/// A transient failure for an order: the first message is retried with
/// backoff (its own task: a hold must not block the batch), duplicates are
/// acked since one retry is enough.
fn settle_failed(
    ctx: &Arc<Context>,
    jobs: Vec<Job>,
    error: String,
    resend: &mpsc::WeakSender<Job>,
    tracker: &TaskTracker,
) {
    let ctx = ctx.clone();
    let resend = resend.clone();
    let mut jobs = jobs.into_iter();
    let Some(first) = jobs.next() else { return };
    let span = first.span.clone();
    tracker.spawn(tracing::Instrument::instrument(
        async move {
            match resend.upgrade() {
                Some(due) => first.fail(&ctx, error, &due).await,
                None => first.requeue().await,
            }
            ack_all(&ctx, jobs.collect(), Outcome::AlreadyCancelled).await;
        },
        span,
    ));
}

/// Steps 2–4 for cancelled orders: release stock, publish the event, mark
/// the outbox, ack.
#[tracing::instrument(skip_all, fields(orders = orders.len()))]
pub(crate) async fn finish(
    ctx: &Arc<Context>,
    orders: Vec<(OrderId, Cancellation, Vec<Job>)>,
    resend: &mpsc::WeakSender<Job>,
    tracker: &TaskTracker,
) {
    if orders.is_empty() {
        return;
    }
    let need_items: Vec<&OrderId> = orders
        .iter()
        .filter(|(_, c, _)| c.release_pending)
        .map(|(id, _, _)| id)
        .collect();
    let items = if need_items.is_empty() {
        HashMap::new()
    } else {
        match ctx.store.items(&need_items).await {
            Ok(items) => items,
            Err(e) => {
                let error = e.to_string();
                for (_, _, jobs) in orders {
                    settle_failed(ctx, jobs, error.clone(), resend, tracker);
                }
                return;
            }
        }
    };

    let items = &items;
    let done: Vec<Finished> = stream::iter(orders)
        .map(|(id, c, jobs)| {
            // The message's span, or (the sweeper has no message) a new one.
            let span = jobs.first().map(|j| j.span.clone()).unwrap_or_else(
                || tracing::info_span!("order", order_id = %id),
            );
            tracing::Instrument::instrument(async move {
            let mut errors = Vec::new();
            let mut released = false;
            if c.release_pending {
                let order_items = items.get(id.as_str()).map(Vec::as_slice).unwrap_or(&[]);
                let call = || async {
                    let started = std::time::Instant::now();
                    let result = ctx.inventory.release(id.as_str(), order_items).await;
                    ctx.metrics.stage(Stage::Inventory, started.elapsed());
                    result
                };
                match call.retry(ctx.retry.quick_backoff()).await {
                    Ok(first_time) => {
                        released = true;
                        if !first_time {
                            tracing::info!(order_id = %id, "stock was already released (a retried release)");
                        }
                    }
                    Err(e) => {
                        ctx.metrics.release_failed();
                        errors.push(e.to_string());
                    }
                }
            }
            let mut published = false;
            if c.event_pending {
                let event = CancelledEvent {
                    order_id: id.as_str().to_owned(),
                    expires_at: c.expires_at,
                    cancelled_at: c.cancelled_at,
                    lateness_ms: (c.cancelled_at - c.expires_at).num_milliseconds(),
                };
                let started = std::time::Instant::now();
                let sent = ctx.publisher.cancelled(&event).await;
                ctx.metrics.stage(Stage::Publish, started.elapsed());
                match sent {
                    Ok(()) => published = true,
                    Err(e) => errors.push(e.to_string()),
                }
            }
            Finished {
                id,
                cancellation: c,
                jobs,
                released,
                published,
                errors,
            }
        }, span)
        })
        .buffer_unordered(ctx.settings.inventory_concurrency.max(1))
        .collect()
        .await;

    let released: Vec<&str> = done
        .iter()
        .filter(|f| f.released)
        .map(|f| f.id.as_str())
        .collect();
    let published: Vec<&str> = done
        .iter()
        .filter(|f| f.published)
        .map(|f| f.id.as_str())
        .collect();
    let marked = ctx.store.mark_done(&released, &published).await;
    if let Err(e) = &marked {
        tracing::warn!(error = %e, "cannot mark outbox rows done; the work will be redone (idempotently)");
    }
    // Give back the leases of orders whose work failed, so their retries
    // can take them at once.
    let failed: Vec<&str> = done
        .iter()
        .filter(|f| f.cancellation.leased && (marked.is_err() || !f.errors.is_empty()))
        .map(|f| f.id.as_str())
        .collect();
    if let Err(e) = ctx.store.release_leases(&failed).await {
        tracing::warn!(error = %e, "cannot give back outbox leases; they will run out");
    }
    for f in &done {
        if f.cancellation.just_now {
            ctx.metrics
                .lateness(f.cancellation.cancelled_at - f.cancellation.expires_at);
        }
    }
    for f in done {
        let error = match &marked {
            Err(e) => Some(e.to_string()),
            Ok(()) if !f.errors.is_empty() => Some(f.errors.join("; ")),
            Ok(()) => None,
        };
        match error {
            Some(error) => settle_failed(ctx, f.jobs, error, resend, tracker),
            None => {
                let mut jobs = f.jobs.into_iter();
                if let Some(first) = jobs.next() {
                    if f.cancellation.just_now {
                        tracing::debug!(
                            order_id = %f.id,
                            lateness_ms = (f.cancellation.cancelled_at - f.cancellation.expires_at).num_milliseconds(),
                            "cancelled unpaid order"
                        );
                        first.ack(ctx, Outcome::Cancelled).await;
                    } else {
                        first.ack(ctx, Outcome::AlreadyCancelled).await;
                    }
                }
                ack_all(ctx, jobs.collect(), Outcome::AlreadyCancelled).await;
            }
        }
    }
}

struct Finished {
    id: OrderId,
    cancellation: Cancellation,
    jobs: Vec<Job>,
    released: bool,
    published: bool,
    errors: Vec<String>,
}
