//! A message on its way through the service ([`Job`]): its delivery, its
//! parsed body and failure history, and the mechanics of its endings, which
//! [`Worker::end`](super::worker::Worker::end) carries out: acked
//! ([`ack_each`]: a batch's jobs in as few frames as is safe), returned to
//! the queue ([`Job::requeue`]), sent back through the delay store toward
//! its deadline or, under the cascade's one-second resolution, held
//! in-process and handed to the batcher ([`Job::wait_until`], [`hold`]), a
//! failed attempt retried with the backoff **the retry policy** gives
//! ([`super::retry`]) or parked once it says so ([`Job::fail`]).
//!
//! Every ending acks only after its work is confirmed (broker confirm or
//! database commit); a crash anywhere redelivers the message.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::types::DeliveryTag;
use tokio::sync::mpsc;

use super::context::{Context, Delayed};
use super::failure::Failure;
use super::park::{ParkWhy, park, requeue};
use super::retry::{RetryDecision, later};
use crate::broker::acks::Acks;
use crate::broker::cascade::HOLD_WINDOW_SECS;
use crate::broker::headers::{Attempts, deadline_header};
use crate::message::{Deadline, OrderId, ParkReason, TimeoutRequest};
use crate::observe::metrics::{GaugeGuard, Metrics, Outcome};
use crate::settings::TimerName;

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

/// A parsed delivery on its way through the service.
pub(crate) struct Job {
    /// The delivery, to ack or nack when done.
    pub(crate) delivery: Delivery,
    /// Where the delivery is settled: its channel's open deliveries.
    pub(crate) acks: Arc<Acks>,
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

    /// The timer the message is for.
    pub(crate) fn timer(&self) -> &TimerName {
        &self.request.timer
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

    /// Why a job whose message names a timer the config does not have is
    /// parked: with the timers the config has.
    pub(crate) fn unknown_timer(&self, ctx: &Context) -> ParkWhy {
        ParkWhy::UnknownTimer {
            order_id: self.order_id().clone(),
            timer: self.timer().clone(),
            known: ctx.stores.names().iter().map(|n| n.to_string()).collect(),
        }
    }

    /// Acks the delivery, recording `outcome`. A failed ack (lost channel)
    /// only means the broker will redeliver, which is safe.
    pub(crate) async fn ack(self, metrics: &Metrics, outcome: Outcome) {
        ack_each(metrics, vec![(self, outcome)]).await;
    }

    /// Returns the delivery to the queue unfinished (the session is ending,
    /// or a publish kept failing), counted in `order_timeout_requeued_total`.
    pub(crate) async fn requeue(self, metrics: &Metrics) {
        requeue(&self.acks, &self.delivery, metrics).await;
    }

    /// Sends the message toward `deadline` (measured against `now`): through
    /// the cascade if it is a second or more away, else held in-process and
    /// then handed to `due`. A re-schedule the broker keeps refusing is
    /// retried with backoff ([`Context::publish_patiently`]), each try
    /// routed by the time left then; it is held once that falls within the
    /// hold window, or else the delivery is returned to the queue.
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
        // A retry or a lock wait is acked (and counted) once it is in the
        // delay store, whose resolution allows it from one second on.
        let hold_below = if matches!(outcome, Outcome::Retried | Outcome::Locked) {
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
        let delayed = ctx
            .delay_patiently(
                &self.delivery.data,
                self.order_id(),
                deadline,
                now,
                &attempts,
                hold_below,
            )
            .await;
        match delayed {
            Ok(Delayed::Published { hops }) => {
                tracing::debug!(order_id = %self.order_id(), %deadline, hops, "scheduled in the delay store");
                self.ack(&ctx.metrics, outcome).await;
            }
            Ok(Delayed::TooClose(remaining)) => {
                // The broker refused the re-schedule until the deadline came
                // within the hold window: held like any message due so soon.
                tracing::info!(order_id = %self.order_id(), ?remaining, "re-schedule refused until the deadline came close; holding the message in-process");
                let mut job = self;
                job.attempts = attempts;
                hold(job, remaining, due, &ctx.metrics).await;
            }
            Err(e) => {
                tracing::warn!(order_id = %self.order_id(), error = %e, "re-schedule failed; returning the message to the queue");
                self.requeue(&ctx.metrics).await;
            }
        }
    }

    /// A failed attempt: re-schedule with backoff, or park once the
    /// attempts are used up or waiting cannot fix it (**the retry policy**
    /// decides: [`RetryPolicy::decide_after`]).
    pub(crate) async fn fail(self, ctx: &Context, failure: Failure, due: &mpsc::Sender<Job>) {
        let now = Utc::now();
        let error = failure.to_string();
        let attempts = self.attempts.failed(now, error.clone());
        let reason = match ctx.retry.decide_after(&attempts, &failure) {
            RetryDecision::RetryIn(delay) => {
                tracing::warn!(order_id = %self.order_id(), attempt = attempts.count, retry_in = ?delay, %error, "transient failure; will retry");
                let at = later(now, delay);
                self.wait_until(ctx, at, now, attempts, Outcome::Retried, due)
                    .await;
                return;
            }
            RetryDecision::Park => {
                tracing::error!(order_id = %self.order_id(), attempts = attempts.count, %error, "giving up; parking");
                ParkReason::RetriesExhausted
            }
            RetryDecision::ParkAtOnce if failure.is_release_refused() => {
                tracing::error!(order_id = %self.order_id(), attempts = attempts.count, %error, "the inventory refused the stock release for good; parking (replaying the message tries the release again)");
                ParkReason::ReleaseFailed
            }
            RetryDecision::ParkAtOnce => {
                tracing::error!(order_id = %self.order_id(), attempts = attempts.count, %error, "a failure waiting cannot fix; parking");
                ParkReason::PermanentFailure
            }
        };
        let why = ParkWhy::GaveUp {
            kind: reason,
            error,
            order_id: self.order_id().clone(),
            timer: self.timer().clone(),
            attempts,
        };
        park(ctx, self.delivery, &self.attempts, why).await;
    }
}

/// Acks every job with its outcome, in as few frames as is safe
/// ([`Acks::ack`]): a batch's jobs settle together. A failed ack (lost
/// channel) only means the broker will redeliver, which is safe.
pub(crate) async fn ack_each(metrics: &Metrics, jobs: Vec<(Job, Outcome)>) {
    // Jobs of one session share a channel; grouped by it all the same.
    let mut by_channel: Vec<(Arc<Acks>, Vec<DeliveryTag>)> = Vec::new();
    for (job, outcome) in jobs {
        metrics.record(job.request.timer.as_str(), outcome);
        let tag = job.delivery.delivery_tag;
        match by_channel
            .iter_mut()
            .find(|(a, _)| Arc::ptr_eq(a, &job.acks))
        {
            Some((_, tags)) => tags.push(tag),
            None => by_channel.push((job.acks.clone(), vec![tag])),
        }
    }
    for (acks, tags) in by_channel {
        if let Err(e) = acks.ack(&tags).await {
            tracing::warn!(deliveries = tags.len(), error = %e, "ack failed; the messages will be redelivered");
        }
    }
}

/// Holds a job for `remaining`, then hands it to the batcher.
pub(crate) async fn hold(
    job: Job,
    remaining: Duration,
    due: &mpsc::Sender<Job>,
    metrics: &Arc<Metrics>,
) {
    let held = metrics.held();
    // +1 ms: timers fire at millisecond resolution; never a hair early.
    tokio::time::sleep(remaining + Duration::from_millis(1)).await;
    drop(held);
    if let Err(mpsc::error::SendError(job)) = due.send(job).await {
        // The batcher is gone (shutting down): let the broker redeliver.
        job.requeue(metrics).await;
    }
}
