//! Cancelling one batch of due orders, exactly once in effect.
//!
//! Per batch:
//!
//! 1. [`OrderStore::cancel_due`](crate::store::OrderStore::cancel_due): one
//!    transaction flips every unpaid, overdue order to cancelled and records
//!    its outbox row;
//! 2. every order is settled by its state: paid and cancelled-elsewhere
//!    orders are acked, orders not yet due wait again, unknown orders are
//!    parked, contended ones are asked about again;
//! 3. orders cancelled now or earlier with outbox work pending go to
//!    [`super::finish`]: stock release, event, outbox marks, ack.
//!
//! A crash between any two steps redelivers the message, and the redelivery
//! finds the order cancelled with its outbox row still pending and finishes
//! the work: the inventory server's idempotency key makes the second
//! release a no-op. Paid orders never match the UPDATE.

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::OwnedSemaphorePermit;

use super::finish::{self, Pending};
use super::job::{Job, Worker, ack_all, park};
use crate::message::{OrderId, ParkReason};
use crate::observe::metrics::{Outcome, Stage};
use crate::settings::UnknownOrderPolicy;
use crate::store::OrderState;

/// How often a batch re-asks about orders another transaction was changing
/// at the same moment, before treating it as a transient failure.
const CONTENDED_ROUNDS: u32 = 5;

/// Jobs grouped by order (duplicates of one order travel together and are
/// settled together).
type ByOrder = HashMap<OrderId, Vec<Job>>;

/// Cancels one batch: the cancel transaction, then every order settled by
/// its state. `slot` bounds concurrent cancel statements and is given back
/// before the outbox work, so the next batch's cancellation does not wait
/// for this batch's inventory calls.
#[tracing::instrument(skip_all, fields(messages = jobs.len()))]
pub(crate) async fn cancel_batch(worker: &Worker, jobs: Vec<Job>, slot: OwnedSemaphorePermit) {
    let (mut waiting, impossible) = group_by_order(worker, jobs);
    for (id, jobs) in impossible {
        unknown_order(worker, &id, jobs).await;
    }
    let mut to_finish = Vec::new();
    for round in 0..CONTENDED_ROUNDS {
        if waiting.is_empty() {
            break;
        }
        if round > 0 {
            tokio::time::sleep(Duration::from_millis(10 * u64::from(round))).await;
        }
        match cancel_statement(worker, &waiting).await {
            Ok(states) => waiting = settle(worker, states, waiting, &mut to_finish).await,
            Err(error) => {
                for (_, jobs) in waiting.drain() {
                    worker.retry_later(jobs, error.clone());
                }
            }
        }
    }
    for (_, jobs) in waiting {
        worker.retry_later(jobs, "order row kept changing under us".into());
    }
    drop(slot);
    finish::finish(worker, to_finish).await;
}

/// Groups jobs by the canonical form of their order id (`00123` and `123`
/// are one order in an integer id column), apart from ids no row can have
/// (`abc` for an integer column), which are unknown orders.
fn group_by_order(worker: &Worker, jobs: Vec<Job>) -> (ByOrder, ByOrder) {
    let mut by_order = ByOrder::new();
    let mut impossible = ByOrder::new();
    for job in jobs {
        match worker.ctx.store.canonical(job.order_id()) {
            Some(id) => by_order.entry(id).or_default().push(job),
            None => impossible
                .entry(job.order_id().clone())
                .or_default()
                .push(job),
        }
    }
    (by_order, impossible)
}

/// Step 1: the cancel transaction for every order in `waiting`.
async fn cancel_statement(
    worker: &Worker,
    waiting: &ByOrder,
) -> Result<Vec<(OrderId, OrderState)>, String> {
    let ctx = &worker.ctx;
    let ids: Vec<OrderId> = waiting.keys().cloned().collect();
    let started = std::time::Instant::now();
    let result = ctx.store.cancel_due(&ids, ctx.settings.outbox_lease).await;
    ctx.metrics.stage(Stage::Db, started.elapsed());
    result.map_err(|e| e.to_string())
}

/// Step 2: settles every order of `waiting` by its state. Cancelled orders
/// are added to `to_finish`; contended ones are returned, to ask again.
async fn settle(
    worker: &Worker,
    states: Vec<(OrderId, OrderState)>,
    mut waiting: ByOrder,
    to_finish: &mut Vec<Pending>,
) -> ByOrder {
    let ctx = &worker.ctx;
    let mut contended = ByOrder::new();
    for (id, state) in states {
        let Some(jobs) = waiting.remove(&id) else {
            continue;
        };
        match state {
            OrderState::Contended => {
                contended.insert(id, jobs);
            }
            OrderState::Cancelled(cancellation) => to_finish.push(Pending {
                id,
                cancellation,
                jobs,
            }),
            OrderState::Paid => ack_all(ctx, jobs, Outcome::AlreadyPaid).await,
            OrderState::LeftAlone => {
                tracing::debug!(order_id = %id, "not unpaid, failing the guard, or no deadline: left alone");
                ack_all(ctx, jobs, Outcome::LeftAlone).await;
            }
            OrderState::CancelledElsewhere => ack_all(ctx, jobs, Outcome::AlreadyCancelled).await,
            OrderState::NotYetDue { expires_at, db_now } => {
                // The row's deadline is later than the message's (extended, or
                // a bare order id): wait for the row's deadline.
                tracing::debug!(order_id = %id, %expires_at, "not due yet; re-scheduling for the row's deadline");
                worker
                    .wait_again(jobs, expires_at, db_now, Outcome::Rescheduled)
                    .await;
            }
            OrderState::LeasedElsewhere { until, db_now } => {
                // Another worker is finishing this order's release right now.
                // It normally takes milliseconds: look again in a second, and
                // keep looking until the lease runs out (the worker crashed)
                // and this delivery can take over.
                tracing::debug!(order_id = %id, %until, "release in progress elsewhere; checking again shortly");
                let at = (until + chrono::Duration::milliseconds(100))
                    .min(db_now + chrono::Duration::seconds(1));
                worker
                    .wait_again(jobs, at, db_now, Outcome::AlreadyCancelled)
                    .await;
            }
            OrderState::Unknown => unknown_order(worker, &id, jobs).await,
        }
    }
    // An order the statement did not report on: a transient failure, never
    // a message left unacknowledged.
    for (id, jobs) in waiting {
        worker.retry_later(jobs, format!("the store reported no state for order {id}"));
    }
    contended
}

/// An order id with no row: parked, or dropped if the operator said so.
async fn unknown_order(worker: &Worker, id: &OrderId, jobs: Vec<Job>) {
    let ctx = &worker.ctx;
    for job in jobs {
        match ctx.settings.unknown_order {
            UnknownOrderPolicy::Park => {
                let error = format!(
                    "unknown order: no row in {} with id {:?}",
                    ctx.settings.orders.table,
                    id.as_str()
                );
                let attempts = job.attempts.failed(Utc::now(), error.clone());
                park(
                    ctx,
                    job.delivery,
                    error,
                    ParkReason::UnknownOrder,
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
