//! Finishing cancelled orders from the outbox, in named steps:
//!
//! 1. [`load_items`]: the items of every order whose stock release is
//!    pending;
//! 2. [`do_outbox_work`]: per order, concurrently across orders,
//!    [`release_stock`] (`ReleaseStock`, idempotent by order id) and
//!    [`publish_cancelled`] (the `order.cancelled` event);
//! 3. [`record_done`]: the outbox rows marked, the leases of failed orders
//!    given back;
//! 4. [`settle`]: the deliveries acked, last, or retried.
//!
//! Used by the cancel path for every batch and by the sweeper, which
//! finishes work that no delivery will come back for.

use std::collections::HashMap;

use backon::Retryable;
use futures_util::{StreamExt, stream};

use super::job::{Context, Job, Worker, ack_all};
use crate::broker::publisher::CancelledEvent;
use crate::message::OrderId;
use crate::observe::metrics::{Outcome, Stage};
use crate::store::{Cancellation, OrderItem};

/// A cancelled order with outbox work to do, and the deliveries (none, for
/// the sweeper) waiting for it.
pub(crate) struct Pending {
    /// The order.
    pub(crate) id: OrderId,
    /// What the cancel transaction reported.
    pub(crate) cancellation: Cancellation,
    /// Its deliveries, acked once the work is done.
    pub(crate) jobs: Vec<Job>,
}

/// A [`Pending`] order after its outbox work was tried.
struct Finished {
    order: Pending,
    released: bool,
    published: bool,
    errors: Vec<String>,
}

/// Items per order id.
type Items = HashMap<String, Vec<OrderItem>>;

/// Releases stock, publishes the events, marks the outbox and settles the
/// deliveries of `orders`.
#[tracing::instrument(skip_all, fields(orders = orders.len()))]
pub(crate) async fn finish(worker: &Worker, orders: Vec<Pending>) {
    if orders.is_empty() {
        return;
    }
    let items = match load_items(&worker.ctx, &orders).await {
        Ok(items) => items,
        Err(error) => {
            for order in orders {
                worker.retry_later(order.jobs, error.clone());
            }
            return;
        }
    };
    let done = do_outbox_work(&worker.ctx, orders, &items).await;
    let marked = record_done(&worker.ctx, &done).await;
    settle(worker, done, marked).await;
}

/// Step 1: the items of the orders whose release is pending.
async fn load_items(ctx: &Context, orders: &[Pending]) -> Result<Items, String> {
    let need: Vec<&OrderId> = orders
        .iter()
        .filter(|o| o.cancellation.release_pending)
        .map(|o| &o.id)
        .collect();
    if need.is_empty() {
        return Ok(Items::new());
    }
    ctx.store.items(&need).await.map_err(|e| e.to_string())
}

/// Step 2: every order's pending release and event, up to
/// `inventory_concurrency` orders at a time.
async fn do_outbox_work(ctx: &Context, orders: Vec<Pending>, items: &Items) -> Vec<Finished> {
    stream::iter(orders)
        .map(|order| {
            // The message's span, or (the sweeper has no message) a new one.
            let span = order
                .jobs
                .first()
                .map(|j| j.span.clone())
                .unwrap_or_else(|| tracing::info_span!("order", order_id = %order.id));
            let order_items = items
                .get(order.id.as_str())
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            tracing::Instrument::instrument(outbox_work(ctx, order, order_items), span)
        })
        .buffer_unordered(ctx.settings.inventory_concurrency.max(1))
        .collect()
        .await
}

/// One order's pending release and event.
async fn outbox_work(ctx: &Context, order: Pending, items: &[OrderItem]) -> Finished {
    let mut errors = Vec::new();
    let mut released = false;
    if order.cancellation.release_pending {
        match release_stock(ctx, &order.id, items).await {
            Ok(()) => released = true,
            Err(e) => errors.push(e),
        }
    }
    let mut published = false;
    if order.cancellation.event_pending {
        match publish_cancelled(ctx, &order.id, &order.cancellation).await {
            Ok(()) => published = true,
            Err(e) => errors.push(e),
        }
    }
    Finished {
        order,
        released,
        published,
        errors,
    }
}

/// `ReleaseStock` with the short in-process backoff of the retry policy.
async fn release_stock(ctx: &Context, id: &OrderId, items: &[OrderItem]) -> Result<(), String> {
    let call = || async {
        let started = std::time::Instant::now();
        let result = ctx.inventory.release(id.as_str(), items).await;
        ctx.metrics.stage(Stage::Inventory, started.elapsed());
        result
    };
    match call.retry(ctx.retry.quick_backoff()).await {
        Ok(first_time) => {
            if !first_time {
                tracing::info!(order_id = %id, "stock was already released (a retried release)");
            }
            Ok(())
        }
        Err(e) => {
            ctx.metrics.release_failed();
            Err(e.to_string())
        }
    }
}

/// The `order.cancelled` event, confirmed by the broker.
async fn publish_cancelled(ctx: &Context, id: &OrderId, c: &Cancellation) -> Result<(), String> {
    let event = CancelledEvent {
        order_id: id.as_str().to_owned(),
        expires_at: c.expires_at,
        cancelled_at: c.cancelled_at,
        lateness_ms: (c.cancelled_at - c.expires_at).num_milliseconds(),
    };
    let started = std::time::Instant::now();
    let sent = ctx.publisher.cancelled(&event).await;
    ctx.metrics.stage(Stage::Publish, started.elapsed());
    sent.map_err(|e| e.to_string())
}

/// Step 3: marks what was done in the outbox and gives back the leases of
/// orders whose work failed, so their retries can take them at once. The
/// error, if marking failed, is every order's error: its work will be redone
/// (idempotently).
async fn record_done(ctx: &Context, done: &[Finished]) -> Result<(), String> {
    let released: Vec<&str> = done
        .iter()
        .filter(|f| f.released)
        .map(|f| f.order.id.as_str())
        .collect();
    let published: Vec<&str> = done
        .iter()
        .filter(|f| f.published)
        .map(|f| f.order.id.as_str())
        .collect();
    let marked = ctx
        .store
        .mark_done(&released, &published)
        .await
        .map_err(|e| e.to_string());
    if let Err(e) = &marked {
        tracing::warn!(error = %e, "cannot mark outbox rows done; the work will be redone (idempotently)");
    }
    let failed: Vec<&str> = done
        .iter()
        .filter(|f| f.order.cancellation.leased && (marked.is_err() || !f.errors.is_empty()))
        .map(|f| f.order.id.as_str())
        .collect();
    if let Err(e) = ctx.store.release_leases(&failed).await {
        tracing::warn!(error = %e, "cannot give back outbox leases; they will run out");
    }
    marked
}

/// Step 4: records the lateness of orders cancelled just now, then acks the
/// deliveries of finished orders (the first as `cancelled` if this batch
/// cancelled it) and retries those of orders whose work failed.
async fn settle(worker: &Worker, done: Vec<Finished>, marked: Result<(), String>) {
    let ctx = &worker.ctx;
    for f in &done {
        let c = &f.order.cancellation;
        if c.just_now {
            ctx.metrics.lateness(c.cancelled_at - c.expires_at);
        }
    }
    for f in done {
        let error = match &marked {
            Err(e) => Some(e.clone()),
            Ok(()) if !f.errors.is_empty() => Some(f.errors.join("; ")),
            Ok(()) => None,
        };
        let Pending {
            id,
            cancellation: c,
            jobs,
        } = f.order;
        if let Some(error) = error {
            worker.retry_later(jobs, error);
            continue;
        }
        let mut jobs = jobs.into_iter();
        if let Some(first) = jobs.next() {
            if c.just_now {
                tracing::debug!(
                    order_id = %id,
                    lateness_ms = (c.cancelled_at - c.expires_at).num_milliseconds(),
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
