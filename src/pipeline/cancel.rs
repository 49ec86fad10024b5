//! Cancelling one batch of due orders, exactly once in effect.
//!
//! A batch may hold messages of several timers (`cancel_unpaid`,
//! `auto_receive`, …): each timer's are cancelled (flipped) together, by
//! that timer's store. Per timer:
//!
//! 1. [`OrderStore::cancel_due`](crate::store::OrderStore::cancel_due): one
//!    transaction flips every unpaid, overdue order to cancelled and records
//!    its outbox row;
//! 2. every order is settled by its verdict ([`super::verdict`]) on its
//!    state: paid and cancelled-elsewhere orders are acked, orders not yet due wait again, unknown orders are
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

use super::context::Context;
use super::ending::{Ending, Endings, Worker};
use super::failure::Failure;
use super::finish::Pending;
use super::job::Job;
use super::park::ParkWhy;
use super::verdict::{Origin, Seen, Verdict, Wait, verdict};
use crate::message::OrderId;
use crate::observe::metrics::{Metrics, Outcome, Stage, Statements};
use crate::store::{IdRejected, OrderState, Store, StoreError};

/// How often a batch re-asks about orders another transaction was changing
/// at the same moment, before treating it as a transient failure.
const CONTENDED_ROUNDS: u32 = 5;

/// Jobs grouped by order (duplicates of one order travel together and are
/// settled together).
type ByOrder = HashMap<OrderId, Vec<Job>>;

/// Cancels one batch: per timer (in the order they first appear in the
/// batch), the cancel transaction, then every order settled by its
/// verdict; the endings of the deliveries are carried out last, together.
/// Returns, per timer, the cancelled orders whose outbox work is left: the
/// batcher hands them to [`super::finish`] once it has given back its
/// slot, so the next batch's cancellation does not wait for this batch's
/// inventory calls.
#[tracing::instrument(skip_all, fields(messages = jobs.len()))]
pub(crate) async fn cancel_batch(worker: &Worker, jobs: Vec<Job>) -> Vec<(Store, Vec<Pending>)> {
    let mut by_store: Vec<(Store, Vec<Job>)> = Vec::new();
    for job in jobs {
        let name = &job.store.timer().name;
        match by_store.iter().position(|(s, _)| &s.timer().name == name) {
            Some(i) => by_store[i].1.push(job),
            None => by_store.push((job.store.clone(), vec![job])),
        }
    }
    let mut endings = Endings::new();
    let mut to_finish = Vec::with_capacity(by_store.len());
    for (store, jobs) in by_store {
        let pending = cancel_timer(&worker.ctx, &store, jobs, &mut endings).await;
        to_finish.push((store, pending));
    }
    worker.end_all(endings).await;
    to_finish
}

/// Cancels (flips) the orders of `jobs`, all of `store`'s timer: the
/// cancel transaction, asked again about contended orders up to
/// [`CONTENDED_ROUNDS`] times; adds how each other order's deliveries end
/// to `endings` and returns what is left for the outbox. A failure of the
/// whole statement (the connection) is retried later, order by order.
async fn cancel_timer(
    ctx: &Context,
    store: &Store,
    jobs: Vec<Job>,
    endings: &mut Endings,
) -> Vec<Pending> {
    let (mut waiting, mut impossible) = group_by_order(store, jobs);
    if !impossible.is_empty() {
        impossible = read_shape_again(store, impossible, &mut waiting).await;
    }
    let mut to_finish = Vec::new();
    // Ids no row can have: unknown orders, with the reason.
    let unknown = verdict(
        Origin::Message,
        Seen::State(&OrderState::Unknown),
        ctx.settings.unknown_order,
    );
    for (id, (why, jobs)) in impossible {
        let ending = unknown_ending(&unknown, store, &id, Some(why), jobs.len());
        endings.push((jobs, ending));
    }
    for round in 0..CONTENDED_ROUNDS {
        if waiting.is_empty() {
            break;
        }
        if round > 0 {
            tokio::time::sleep(Duration::from_millis(10 * u64::from(round))).await;
        }
        let ids: Vec<OrderId> = waiting.keys().cloned().collect();
        let started = std::time::Instant::now();
        let result = store.cancel_due(&ids, ctx.settings.outbox_lease).await;
        ctx.metrics.stage(Stage::Db, started.elapsed());
        note_statements(&ctx.metrics, store, result.as_deref());
        waiting = match result {
            Ok(states) => settle(ctx, store, states, waiting, &mut to_finish, endings).await,
            Err(e) => {
                let failure = Failure::from(e);
                let failed = waiting
                    .drain()
                    .map(|(_, jobs)| (jobs, Ending::Fail(failure.clone())));
                endings.extend(failed);
                ByOrder::new()
            }
        };
    }
    let kept_changing = waiting
        .into_values()
        .map(|jobs| (jobs, Ending::Fail(Failure::KeptChanging)));
    endings.extend(kept_changing);
    to_finish
}

/// Reads the table's shape again when it changed (a widened id column),
/// so that ids no row could have in its old shape are asked about in its
/// new one: those that fit it join `waiting`; returns the others.
async fn read_shape_again(
    store: &Store,
    impossible: Impossible,
    waiting: &mut ByOrder,
) -> Impossible {
    if !store.reread_shape().await {
        return impossible;
    }
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
    still
}

/// Groups jobs by the canonical form of their order id (`00123` and `123`
/// are one order in an integer id column), apart from ids no row can have,
/// with the reason.
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

/// Settles every order of `waiting` by its verdict on its state: cancelled
/// orders are added to `to_finish`, how the others' deliveries end to
/// `endings`; contended ones are returned, to ask again. An order the
/// statement did not report on is a transient failure, never a message
/// left unacknowledged.
async fn settle(
    ctx: &Context,
    store: &Store,
    states: Vec<(OrderId, OrderState)>,
    mut waiting: ByOrder,
    to_finish: &mut Vec<Pending>,
    endings: &mut Endings,
) -> ByOrder {
    let mut contended = ByOrder::new();
    for (id, state) in states {
        let Some(jobs) = waiting.remove(&id) else {
            continue;
        };
        let ending = match verdict(
            Origin::Message,
            Seen::State(&state),
            ctx.settings.unknown_order,
        ) {
            Verdict::Finish(cancellation) => {
                to_finish.push(Pending {
                    id,
                    cancellation,
                    jobs,
                });
                continue;
            }
            Verdict::AskAgain => {
                contended.insert(id, jobs);
                continue;
            }
            Verdict::SetAside(failure) => {
                set_aside(store, &id, &failure).await;
                Ending::Fail(failure)
            }
            verdict => message_ending(&verdict, store, &id, jobs.len()),
        };
        endings.push((jobs, ending));
    }
    let no_state = waiting
        .into_iter()
        .map(|(id, jobs)| (jobs, Ending::Fail(Failure::NoState(id))));
    endings.extend(no_state);
    contended
}

/// How the `n` deliveries of order `id` end for `verdict` (one that leaves
/// nothing more for the cancel path to do), logged as it is decided.
fn message_ending(verdict: &Verdict, store: &Store, id: &OrderId, n: usize) -> Ending {
    match *verdict {
        Verdict::Ack { first, duplicates } => {
            if first == Outcome::LeftAlone {
                tracing::debug!(order_id = %id, "not unpaid, failing the guard, or no deadline: left alone");
            }
            Ending::Ack { first, duplicates }
        }
        Verdict::WaitUntil { at, db_now, why } => {
            match why {
                // The row's deadline is later than the message's (extended,
                // or a bare order id): wait for the row's deadline.
                Wait::NotYetDue { expires_at } => {
                    tracing::debug!(order_id = %id, %expires_at, "not due yet; re-scheduling for the row's deadline");
                }
                // Another worker is finishing this order's release right
                // now. It normally takes milliseconds: look again in a
                // second, and keep looking until the lease runs out (the
                // worker crashed) and this delivery can take over.
                Wait::LeasedElsewhere { until } => {
                    tracing::debug!(order_id = %id, %until, "release in progress elsewhere; checking again shortly");
                }
                // Not a failure: the shop holds the row (a payment in
                // flight). Never acked as done, never parked for it.
                Wait::Locked { wait } => {
                    tracing::debug!(order_id = %id, ?wait, "the order's row is held by another transaction; skipped, asking again shortly");
                }
            }
            Ending::WaitUntil {
                at,
                now: db_now,
                outcome: why.outcome(),
                duplicates: why.duplicates(),
            }
        }
        Verdict::ParkUnknown | Verdict::DropUnknown => unknown_ending(verdict, store, id, None, n),
        Verdict::Retry(ref failure) | Verdict::SetAside(ref failure) => {
            Ending::Fail(failure.clone())
        }
        // Settled by the caller (finish, ask again), or the sweeper's, never
        // given for a message (the verdict's table test says so): were one
        // to be, the delivery goes back to the queue rather than be lost.
        Verdict::Finish(_)
        | Verdict::AskAgain
        | Verdict::Skip
        | Verdict::LeftBehind
        | Verdict::GiveUp => Ending::Requeue,
    }
}

/// How the `n` deliveries of an order id with no row end (`rejected`: why
/// no row can have it): parked, or dropped if the operator said so.
fn unknown_ending(
    verdict: &Verdict,
    store: &Store,
    id: &OrderId,
    rejected: Option<IdRejected>,
    n: usize,
) -> Ending {
    if matches!(verdict, Verdict::DropUnknown) {
        for _ in 0..n {
            tracing::warn!(order_id = %id, "unknown order; dropped by configuration");
        }
        return Ending::Ack {
            first: Outcome::Dropped,
            duplicates: Outcome::Dropped,
        };
    }
    Ending::Park(ParkWhy::UnknownOrder {
        id: id.clone(),
        table: store.timer().table.to_string(),
        timer: store.timer().name.clone(),
        rejected,
    })
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
