//! A message on its way through the service ([`Job`]), what every step
//! shares ([`Context`], [`Worker`]), and the ways a job ends: acked,
//! returned to the queue, held until due, sent back through the delay
//! store, retried with backoff, or parked.
//!
//! Every ending acks only after its work is confirmed (broker confirm or
//! database commit); a crash anywhere redelivers the message.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use super::retry::{RetryDecision, RetryPolicy};
use crate::broker::cascade::HOLD_WINDOW_SECS;
use crate::broker::headers::{Attempts, deadline_header};
use crate::broker::publisher::{ParkInfo, Publisher};
use crate::broker::topology::DUE_QUEUE;
use crate::inventory::InventoryClient;
use crate::message::{Deadline, OrderId, ParkReason, TimeoutRequest};
use crate::observe::metrics::{GaugeGuard, Metrics, Outcome, Stage};
use crate::settings::Settings;
use crate::store::Store;

/// Remaining time below which a message is held in-process instead of going
/// through the cascade (whose resolution is one second, and which may leave
/// up to this much to hold so as to take fewer hops:
/// [`crate::broker::cascade::cascade_delay_secs`]).
pub(crate) const HOLD_BELOW: Duration = Duration::from_secs(HOLD_WINDOW_SECS);

/// Remaining time below which a *retry* is held in-process. Retries go
/// through the delay store whenever its one-second resolution allows: the
/// failing delivery is acked (counted as `retried`) and the re-published
/// copy carries the attempt count, so a crash cannot reset the count and a
/// session that is ending (lost connection, shutdown) is not kept alive by
/// in-process retry loops.
pub(crate) const RETRY_HOLD_BELOW: Duration = Duration::from_secs(1);

/// Everything the message-handling tasks of one broker session share.
pub(crate) struct Context {
    /// Settings of this instance.
    pub(crate) settings: Settings,
    /// Confirm-mode publisher (re-schedules, parking, events).
    pub(crate) publisher: Publisher,
    /// The database.
    pub(crate) store: Store,
    /// The inventory service.
    pub(crate) inventory: InventoryClient,
    /// Retry policy.
    pub(crate) retry: RetryPolicy,
    /// Metrics of this instance.
    pub(crate) metrics: Arc<Metrics>,
}

/// What a step that settles jobs needs besides the jobs: the shared
/// context, the way back into the batcher for jobs that must wait again,
/// and the tracker that keeps the session open until spawned work ends.
#[derive(Clone)]
pub(crate) struct Worker {
    /// The session's shared context.
    pub(crate) ctx: Arc<Context>,
    /// The batcher's inbox. Weak, so that held work does not keep the
    /// batcher alive once the consumer has stopped: when it is gone, a job
    /// that must wait again is returned to the broker instead.
    pub(crate) due: mpsc::WeakSender<Job>,
    /// Tasks of this session.
    pub(crate) tracker: TaskTracker,
}

impl Worker {
    /// A transient failure for an order: the first message is retried with
    /// backoff (in its own task: a hold must not block the caller),
    /// duplicates are acked since one retry is enough.
    pub(crate) fn retry_later(&self, jobs: Vec<Job>, error: String) {
        let mut jobs = jobs.into_iter();
        let Some(first) = jobs.next() else { return };
        let ctx = self.ctx.clone();
        let due = self.due.clone();
        let span = first.span.clone();
        self.tracker.spawn(tracing::Instrument::instrument(
            async move {
                match due.upgrade() {
                    Some(due) => first.fail(&ctx, error, &due).await,
                    None => first.requeue().await,
                }
                ack_all(&ctx, jobs.collect(), Outcome::AlreadyCancelled).await;
            },
            span,
        ));
    }

    /// Sends one of an order's messages back toward `at` (on the database's
    /// clock, `db_now`) in its own task; duplicates are acked with
    /// `duplicates` as their outcome, one message is enough.
    pub(crate) async fn wait_again(
        &self,
        jobs: Vec<Job>,
        at: DateTime<Utc>,
        db_now: DateTime<Utc>,
        duplicates: Outcome,
    ) {
        let mut jobs = jobs.into_iter();
        let first = jobs.next();
        ack_all(&self.ctx, jobs.collect(), duplicates).await;
        let Some(job) = first else { return };
        let Some(due) = self.due.upgrade() else {
            return job.requeue().await;
        };
        let ctx = self.ctx.clone();
        let span = job.span.clone();
        self.tracker.spawn(tracing::Instrument::instrument(
            async move {
                let attempts = job.attempts.clone();
                job.wait_until(&ctx, at, db_now, attempts, Outcome::Rescheduled, &due)
                    .await;
            },
            span,
        ));
    }
}

/// Acks every job with `outcome`.
pub(crate) async fn ack_all(ctx: &Context, jobs: Vec<Job>, outcome: Outcome) {
    for job in jobs {
        job.ack(ctx, outcome).await;
    }
}

/// A parsed delivery on its way through the service.
pub(crate) struct Job {
    /// The delivery, to ack or nack when done.
    pub(crate) delivery: Delivery,
    /// The parsed body.
    pub(crate) request: TimeoutRequest,
    /// The failure history from the headers.
    pub(crate) attempts: Attempts,
    /// Counts the delivery in `order_timeout_in_flight_messages` until the
    /// job is dropped (acked, requeued, parked): held for its `Drop`.
    #[allow(dead_code)]
    pub(crate) in_flight: GaugeGuard,
    /// The message's span (`message{order_id}`): every log line about this
    /// delivery, wherever it is handled, carries its order id.
    pub(crate) span: tracing::Span,
}

impl Job {
    /// The order id.
    pub(crate) fn order_id(&self) -> &OrderId {
        &self.request.order_id
    }

    /// When the message wants to be processed: the re-schedule header if we
    /// set one, else the body's deadline; `None` for a bare order id.
    pub(crate) fn deadline(&self) -> Option<DateTime<Utc>> {
        deadline_header(self.delivery.properties.headers().as_ref()).or(
            match self.request.deadline {
                Deadline::At(at) => Some(at),
                Deadline::FromOrderRow => None,
            },
        )
    }

    /// Acks the delivery, recording `outcome`. A failed ack (lost channel)
    /// only means the broker will redeliver, which is safe.
    pub(crate) async fn ack(self, ctx: &Context, outcome: Outcome) {
        ctx.metrics.record(outcome);
        if let Err(e) = self.delivery.ack(BasicAckOptions::default()).await {
            tracing::warn!(order_id = %self.request.order_id, error = %e, "ack failed; the message will be redelivered");
        }
    }

    /// Returns the delivery to the queue (when even re-scheduling failed).
    pub(crate) async fn requeue(self) {
        let _ = self
            .delivery
            .nack(BasicNackOptions {
                requeue: true,
                ..Default::default()
            })
            .await;
    }

    /// Sends the message toward `deadline` (measured against `now`): through
    /// the cascade if it is a second or more away, else held in-process and
    /// then handed to `due`.
    pub(crate) async fn wait_until(
        self,
        ctx: &Context,
        deadline: DateTime<Utc>,
        now: DateTime<Utc>,
        attempts: Attempts,
        outcome: Outcome,
        due: &mpsc::Sender<Job>,
    ) {
        let remaining = (deadline - now).to_std().unwrap_or_default();
        let hold_below = if outcome == Outcome::Retried {
            RETRY_HOLD_BELOW
        } else {
            HOLD_BELOW
        };
        if remaining < hold_below {
            // Count it when it is finally processed, not now; a held retry
            // (only with a sub-second backoff) keeps its new attempt count.
            let mut job = self;
            job.attempts = attempts;
            hold(job, remaining, due, &ctx.metrics).await;
            return;
        }
        let started = std::time::Instant::now();
        let published = ctx
            .publisher
            .delay(
                &self.delivery.data,
                self.order_id(),
                deadline,
                now,
                &attempts,
                ctx.settings.cascade_shards,
            )
            .await;
        ctx.metrics.stage(Stage::Publish, started.elapsed());
        match published {
            Ok(hops) => {
                tracing::debug!(order_id = %self.order_id(), %deadline, hops, "scheduled in the delay cascade");
                self.ack(ctx, outcome).await;
            }
            Err(e) => {
                tracing::warn!(order_id = %self.order_id(), error = %e, "re-schedule failed; returning the message to the queue");
                self.requeue().await;
            }
        }
    }

    /// A transient failure: re-schedule with backoff, or park once the
    /// attempts are used up (**the retry policy** decides:
    /// [`RetryPolicy::decide`]).
    pub(crate) async fn fail(self, ctx: &Context, error: String, due: &mpsc::Sender<Job>) {
        let now = Utc::now();
        let attempts = self.attempts.failed(now, error.clone());
        match ctx.retry.decide(&attempts) {
            RetryDecision::RetryIn(delay) => {
                tracing::warn!(order_id = %self.order_id(), attempt = attempts.count, retry_in = ?delay, %error, "transient failure; will retry");
                let at = now + chrono::Duration::from_std(delay).unwrap_or_default();
                self.wait_until(ctx, at, now, attempts, Outcome::Retried, due)
                    .await;
            }
            RetryDecision::Park => {
                tracing::error!(order_id = %self.order_id(), attempts = attempts.count, %error, "giving up; parking");
                let order_id = Some(self.order_id().clone());
                park(
                    ctx,
                    self.delivery,
                    error,
                    ParkReason::RetriesExhausted,
                    order_id,
                    attempts,
                )
                .await;
            }
        }
    }
}

/// Holds a job for `remaining`, then hands it to the batcher.
async fn hold(job: Job, remaining: Duration, due: &mpsc::Sender<Job>, metrics: &Arc<Metrics>) {
    let held = metrics.held();
    // +1 ms: timers fire at millisecond resolution; never a hair early.
    tokio::time::sleep(remaining + Duration::from_millis(1)).await;
    drop(held);
    if let Err(mpsc::error::SendError(job)) = due.send(job).await {
        // The batcher is gone (shutting down): let the broker redeliver.
        job.requeue().await;
    }
}

/// Parks a delivery with its reason, then acks it. If parking itself fails
/// the delivery is returned to the queue rather than lost.
pub(crate) async fn park(
    ctx: &Context,
    delivery: Delivery,
    error: String,
    kind: ParkReason,
    order_id: Option<OrderId>,
    attempts: Attempts,
) {
    let info = ParkInfo {
        error,
        kind,
        order_id,
        attempts,
        source_queue: DUE_QUEUE.into(),
        source_exchange: delivery.exchange.to_string(),
        source_routing_key: delivery.routing_key.to_string(),
    };
    let started = std::time::Instant::now();
    let parked = ctx
        .publisher
        .park(&delivery.data, &delivery.properties, &info)
        .await;
    ctx.metrics.stage(Stage::Publish, started.elapsed());
    match parked {
        Ok(()) => {
            tracing::warn!(kind = %info.kind, error = %info.error, order_id = ?info.order_id, "parked a message");
            ctx.metrics.record(Outcome::Parked);
            ctx.metrics.parked(info.kind);
            if let Err(e) = delivery.ack(BasicAckOptions::default()).await {
                tracing::warn!(error = %e, "ack after parking failed; it may be parked twice");
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot park a message; returning it to the queue");
            let _ = delivery
                .nack(BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                })
                .await;
        }
    }
}
