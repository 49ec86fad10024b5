//! Cancelling one batch of due orders, exactly once in effect.
//!
//! A batch may hold messages of several timers (`cancel_unpaid`,
//! `auto_receive`, …): each timer's are cancelled (flipped) together, by
//! that timer's store. Per timer:
//!
//! 1. [`OrderStore::cancel_due`](crate::store::OrderStore::cancel_due): one
//!    transaction flips every unpaid, overdue order to cancelled and records
//!    its outbox row;
//! 2. every order is settled by its state: paid and cancelled-elsewhere
//!    orders are acked, orders not yet due wait again, unknown orders are
//!    parked, contended ones are asked about again, and orders whose row
//!    another transaction holds (skipped by the cancel transaction, so
//!    that one held row delays only itself) wait a few seconds through the
//!    delay store, without spending an attempt;
//! 3. orders cancelled now or earlier with outbox work pending are returned
//!    to the batcher, which hands them to [`super::finish`]: stock release,
//!    event, outbox marks, ack.
//!
//! A statement that fails for one order's values (an `also` statement
//! hitting a unique constraint for that order alone, a trigger refusing its
//! row) is about that order, not the batch: the store runs such orders on
//! their own ([`OrderState::Failed`]), only that order is parked
//! (`permanent_failure`) and its row set aside for the sweeper (tried again
//! hourly, then daily, and at once when the row changes, so that it is
//! parked once), and the others are cancelled on time. A batch of one
//! order fails the same way. A failure of the environment (a privilege, a
//! missing table, the connection) is nobody's row: every order is retried
//! with backoff for as long as it lasts, readiness says so
//! ([`note_statements`]), and nothing is parked or set aside.
//!
//! A crash between any two steps redelivers the message, and the redelivery
//! finds the order cancelled with its outbox row still pending and finishes
//! the work: the inventory server's idempotency key makes the second
//! release a no-op. Paid orders never match the UPDATE.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::failure::Failure;
use super::finish::Pending;
use super::job::{Job, ack_each};
use super::park::{Parking, park};
use super::retry::later;
use super::worker::Worker;
use crate::message::{OrderId, ParkReason};
use crate::observe::metrics::{Metrics, Outcome, Stage, Statements};
use crate::settings::{TimerName, UnknownOrderPolicy};
use crate::store::{IdRejected, OrderFailure, OrderState, Store, StoreError};

/// How often a batch re-asks about orders another transaction was changing
/// at the same moment, before treating it as a transient failure.
const CONTENDED_ROUNDS: u32 = 5;

/// The shortest and longest wait of an order whose row another transaction
/// holds ([`OrderState::Locked`]) before it is asked about again.
const LOCKED_WAIT: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(4));

/// How long an order whose row another transaction holds waits before it is
/// asked about again: a quarter of how long it has been overdue, between
/// [`LOCKED_WAIT`]'s bounds. A row held for a moment (a payment callback)
/// is asked about again after a second; one held for minutes every few
/// seconds, so that the order is cancelled within seconds of the lock
/// going away, and the messages of many held rows do not churn the broker.
/// No state is needed for the wait to grow: how long the order has been
/// overdue grows by itself.
fn locked_wait(expires_at: DateTime<Utc>, db_now: DateTime<Utc>) -> Duration {
    let overdue = (db_now - expires_at).to_std().unwrap_or_default();
    (overdue / 4).clamp(LOCKED_WAIT.0, LOCKED_WAIT.1)
}

/// Jobs grouped by order (duplicates of one order travel together and are
/// settled together).
type ByOrder = HashMap<OrderId, Vec<Job>>;

/// Cancels one batch: per timer, the cancel transaction, then every order
/// settled by its state. Returns, per timer, the cancelled orders whose
/// outbox work is left: the batcher hands them to [`super::finish`] once it
/// has given back its slot, so the next batch's cancellation does not wait
/// for this batch's inventory calls.
#[tracing::instrument(skip_all, fields(messages = jobs.len()))]
pub(crate) async fn cancel_batch(worker: &Worker, jobs: Vec<Job>) -> Vec<(Store, Vec<Pending>)> {
    let mut to_finish = Vec::new();
    for (store, jobs) in by_timer(worker, jobs).await {
        let pending = cancel_timer_batch(worker, &store, jobs).await;
        to_finish.push((store, pending));
    }
    to_finish
}

/// The jobs of each timer with its store, in the order of the config. A
/// job for a timer the config does not have (the consumer parks those
/// before they get here) is parked.
async fn by_timer(worker: &Worker, jobs: Vec<Job>) -> Vec<(Store, Vec<Job>)> {
    let mut groups: HashMap<TimerName, Vec<Job>> = HashMap::new();
    for job in jobs {
        groups.entry(job.timer().clone()).or_default().push(job);
    }
    let mut by_store = Vec::with_capacity(groups.len());
    for store in worker.ctx.stores.iter() {
        if let Some(jobs) = groups.remove(&store.timer().name) {
            by_store.push((store.clone(), jobs));
        }
    }
    for job in groups.into_values().flatten() {
        job.park_unknown_timer(&worker.ctx).await;
    }
    by_store
}

/// Cancels (flips) the orders of `jobs`, all of `store`'s timer; returns
/// what is left for the outbox.
async fn cancel_timer_batch(worker: &Worker, store: &Store, jobs: Vec<Job>) -> Vec<Pending> {
    let (mut waiting, mut impossible) = group_by_order(store, jobs);
    if !impossible.is_empty() && store.reread_shape().await {
        // The shop changed the table (a widened id column): ask about
        // these ids in its new shape before calling them unknown.
        if let Err(e) = store.prepare().await {
            tracing::warn!(error = %e, timer = %store.timer().name, "checking the mapping against the changed table failed");
        }
        let jobs: Vec<Job> = impossible
            .into_values()
            .flat_map(|(_, jobs)| jobs)
            .collect();
        let (more, still) = group_by_order(store, jobs);
        for (id, jobs) in more {
            waiting.entry(id).or_default().extend(jobs);
        }
        impossible = still;
    }
    for (id, (why, jobs)) in impossible {
        unknown_order(worker, store, &id, Some(&why), jobs).await;
    }
    let mut to_finish = Vec::new();
    cancel_group(worker, store, waiting, &mut to_finish).await;
    to_finish
}

/// Runs the cancel transaction for `waiting` and settles every order,
/// asking again about contended ones up to [`CONTENDED_ROUNDS`] times. A
/// failure of the whole statement (the connection) is retried later,
/// order by order.
async fn cancel_group(
    worker: &Worker,
    store: &Store,
    mut waiting: ByOrder,
    to_finish: &mut Vec<Pending>,
) {
    for round in 0..CONTENDED_ROUNDS {
        if waiting.is_empty() {
            return;
        }
        if round > 0 {
            tokio::time::sleep(Duration::from_millis(10 * u64::from(round))).await;
        }
        match cancel_statement(worker, store, &waiting).await {
            Ok(states) => waiting = settle(worker, store, states, waiting, to_finish).await,
            Err(failure) => {
                for (_, jobs) in waiting.drain() {
                    worker.retry_later(jobs, failure.clone());
                }
            }
        }
    }
    for (_, jobs) in waiting {
        worker.retry_later(jobs, Failure::KeptChanging);
    }
}

/// Groups jobs by the canonical form of their order id (`00123` and `123`
/// are one order in an integer id column), apart from ids no row can have
/// (`abc` for an integer column), which are unknown orders, with the reason.
fn group_by_order(store: &Store, jobs: Vec<Job>) -> (ByOrder, Impossible) {
    let mut by_order = ByOrder::new();
    let mut impossible = Impossible::new();
    for job in jobs {
        match store.canonical(job.order_id()) {
            Ok(id) => by_order.entry(id).or_default().push(job),
            Err(why) => impossible
                .entry(job.order_id().clone())
                .or_insert_with(|| (why, Vec::new()))
                .1
                .push(job),
        }
    }
    (by_order, impossible)
}

/// Jobs whose order id no row can have, by id, with the reason.
type Impossible = HashMap<OrderId, (IdRejected, Vec<Job>)>;

/// Step 1: the cancel transaction for every order in `waiting`.
async fn cancel_statement(
    worker: &Worker,
    store: &Store,
    waiting: &ByOrder,
) -> Result<Vec<(OrderId, OrderState)>, Failure> {
    let ctx = &worker.ctx;
    let ids: Vec<OrderId> = waiting.keys().cloned().collect();
    let started = std::time::Instant::now();
    let result = store.cancel_due(&ids, ctx.settings.outbox_lease).await;
    ctx.metrics.stage(Stage::Db, started.elapsed());
    note_statements(&ctx.metrics, store, result.as_deref());
    Ok(result?)
}

/// Tells readiness (and `order_timeout_timer_failing`) whether the cancel
/// transaction of `store`'s timer runs: it fails for a reason of the
/// environment while the statement, or an order's own transaction, fails
/// with an error that is not about a row ([`Failure::is_environment`]: a
/// privilege revoked, a table missing, the connection), and runs again
/// once a statement answers with no such failure.
pub(crate) fn note_statements(
    metrics: &Metrics,
    store: &Store,
    result: Result<&[(OrderId, OrderState)], &StoreError>,
) {
    let failing = match result {
        Err(e) => !e.is_row_fault(),
        Ok(states) => states
            .iter()
            .any(|(_, state)| matches!(state, OrderState::Failed(f) if !f.0.is_row_fault())),
    };
    metrics.set_timer_failing(store.timer().name.as_str(), Statements::Cancel, failing);
}

/// Step 2: settles every order of `waiting` by its state. Cancelled orders
/// are added to `to_finish`; contended ones are returned, to ask again.
async fn settle(
    worker: &Worker,
    store: &Store,
    states: Vec<(OrderId, OrderState)>,
    mut waiting: ByOrder,
    to_finish: &mut Vec<Pending>,
) -> ByOrder {
    let ctx = &worker.ctx;
    let mut contended = ByOrder::new();
    // The deliveries of orders needing nothing more, acked together below.
    let mut acked = Vec::new();
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
            OrderState::Paid => {
                acked.extend(jobs.into_iter().map(|job| (job, Outcome::AlreadyPaid)));
            }
            OrderState::LeftAlone => {
                tracing::debug!(order_id = %id, "not unpaid, failing the guard, or no deadline: left alone");
                acked.extend(jobs.into_iter().map(|job| (job, Outcome::LeftAlone)));
            }
            OrderState::CancelledElsewhere => {
                acked.extend(jobs.into_iter().map(|job| (job, Outcome::AlreadyCancelled)));
            }
            OrderState::NotYetDue { expires_at, db_now } => {
                // The row's deadline is later than the message's (extended, or
                // a bare order id): wait for the row's deadline. One message
                // is enough; the others are duplicates.
                tracing::debug!(order_id = %id, %expires_at, "not due yet; re-scheduling for the row's deadline");
                worker
                    .wait_again(jobs, expires_at, db_now, Outcome::Duplicate)
                    .await;
            }
            OrderState::LeasedElsewhere { until, db_now } => {
                // Another worker is finishing this order's release right now.
                // It normally takes milliseconds: look again in a second, and
                // keep looking until the lease runs out (the worker crashed)
                // and this delivery can take over.
                tracing::debug!(order_id = %id, %until, "release in progress elsewhere; checking again shortly");
                let at = leased_look_again_at(until, db_now);
                worker
                    .wait_again(jobs, at, db_now, Outcome::AlreadyCancelled)
                    .await;
            }
            OrderState::Locked { expires_at, db_now } => {
                // Not a failure: the shop holds the row (a payment in
                // flight). Never acked as done, never parked for it.
                let wait = locked_wait(expires_at, db_now);
                tracing::debug!(order_id = %id, ?wait, "the order's row is held by another transaction; skipped, asking again shortly");
                let at = later(db_now, wait);
                worker
                    .wait_again_as(jobs, at, db_now, Outcome::Locked, Outcome::Duplicate)
                    .await;
            }
            OrderState::Unknown => unknown_order(worker, store, &id, None, jobs).await,
            OrderState::Failed(failure) => failed_order(worker, store, &id, failure, jobs).await,
        }
    }
    ack_each(&ctx.metrics, acked).await;
    // An order the statement did not report on: a transient failure, never
    // a message left unacknowledged.
    for (id, jobs) in waiting {
        worker.retry_later(jobs, Failure::NoState(id));
    }
    contended
}

/// When to look again at an order whose release another worker holds the
/// lease of: 100 ms after the lease ends, and at most a second from now.
fn leased_look_again_at(until: DateTime<Utc>, db_now: DateTime<Utc>) -> DateTime<Utc> {
    later(until, Duration::from_millis(100)).min(later(db_now, Duration::from_secs(1)))
}

/// An order whose cancel transaction failed on its own: a failure of the
/// environment is retried (never parked); one about the row's own values
/// is parked (by the retry policy) and the row set aside, so that the
/// sweeper does not fail on it (and park it) again at every sweep.
async fn failed_order(
    worker: &Worker,
    store: &Store,
    id: &OrderId,
    failure: OrderFailure,
    jobs: Vec<Job>,
) {
    let failure = Failure::Store(failure.0);
    if failure.is_permanent() {
        set_aside(store, id, &failure).await;
    }
    worker.retry_later(jobs, failure);
}

/// Sets the row of `id` aside after its flip failed for its own values;
/// the mark's attempts (1: the first failure of the row as it is), or
/// `None` when the row is gone or the mark could not be written (logged:
/// the sweeper then tries the row, and parks it, again).
pub(crate) async fn set_aside(store: &Store, id: &OrderId, failure: &Failure) -> Option<u32> {
    let reason = failure.to_string();
    let timer = &store.timer().name;
    match store.set_aside(id, &reason).await {
        Ok(Some(1)) => {
            tracing::warn!(order_id = %id, %timer, error = %reason, "the order's flip fails for its own values: its row is set aside (the sweeper tries it again in an hour, at once when the row changes; `order-timeout set-aside retry` or replaying the parked message tries it now)");
            Some(1)
        }
        Ok(Some(attempts)) => {
            tracing::warn!(order_id = %id, %timer, attempts, error = %reason, "the order's flip still fails for its own values: its row stays set aside (tried again hourly, then daily)");
            Some(attempts)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(order_id = %id, error = %e, "cannot set the row aside; the sweeper will try it again");
            None
        }
    }
}

/// An order id with no row (`why`: no row can have it): parked, or
/// dropped if the operator said so.
async fn unknown_order(
    worker: &Worker,
    store: &Store,
    id: &OrderId,
    why: Option<&IdRejected>,
    jobs: Vec<Job>,
) {
    let ctx = &worker.ctx;
    for job in jobs {
        match ctx.settings.unknown_order {
            UnknownOrderPolicy::Park => {
                let table = &store.timer().table;
                let error = match why {
                    Some(why) => format!(
                        "unknown order: no row in {table} can have id {:?}: {why}",
                        id.as_str()
                    ),
                    None => format!("unknown order: no row in {table} with id {:?}", id.as_str()),
                };
                let attempts = job.attempts.failed(Utc::now(), error.clone());
                let why = Parking {
                    kind: ParkReason::UnknownOrder,
                    error,
                    order_id: Some(id.clone()),
                    attempts,
                    timer: Some(store.timer().name.clone()),
                };
                park(ctx, job.delivery, why).await;
            }
            UnknownOrderPolicy::Drop => {
                tracing::warn!(order_id = %id, "unknown order; dropped by configuration");
                job.ack(&ctx.metrics, Outcome::Dropped).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_order_waits_a_second_then_longer_up_to_a_few_seconds() {
        let due = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let after = |ms: i64| due + chrono::Duration::milliseconds(ms);
        assert_eq!(locked_wait(due, after(5)), Duration::from_secs(1));
        // Clock skew: the deadline later than the database's clock.
        assert_eq!(locked_wait(due, after(-500)), Duration::from_secs(1));
        assert_eq!(locked_wait(due, after(8_000)), Duration::from_secs(2));
        assert_eq!(locked_wait(due, after(12_000)), Duration::from_secs(3));
        assert_eq!(locked_wait(due, after(600_000)), Duration::from_secs(4));
    }
}
