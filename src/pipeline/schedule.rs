//! Ending a job by making it wait: sent back through the delay store
//! toward its deadline ([`Job::wait_until`]), or, under the cascade's
//! one-second resolution, held unacked on an in-process timer and then
//! handed to the batcher ([`hold`]); a failed attempt waits the same way,
//! with the backoff **the retry policy** gives ([`super::retry`]), or is
//! parked once it says so ([`Job::fail`]).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;

use super::context::{Context, Delayed, Worker};
use super::failure::Failure;
use super::job::{Job, ack_all};
use super::park::{Parking, park};
use super::retry::{RetryDecision, later};
use crate::broker::cascade::HOLD_WINDOW_SECS;
use crate::broker::headers::Attempts;
use crate::message::ParkReason;
use crate::observe::metrics::{Metrics, Outcome};

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

impl Worker {
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
        self.wait_again_as(jobs, at, db_now, Outcome::Rescheduled, duplicates)
            .await;
    }

    /// [`Worker::wait_again`], the message sent back counted as `outcome`
    /// ([`Outcome::Rescheduled`], or [`Outcome::Locked`]: a wait of a
    /// second or more, always through the delay store, keeping the
    /// message's attempt count).
    pub(crate) async fn wait_again_as(
        &self,
        jobs: Vec<Job>,
        at: DateTime<Utc>,
        db_now: DateTime<Utc>,
        outcome: Outcome,
        duplicates: Outcome,
    ) {
        let mut jobs = jobs.into_iter();
        let first = jobs.next();
        ack_all(&self.ctx.metrics, jobs.collect(), duplicates).await;
        let Some(job) = first else { return };
        let Some(due) = self.due.upgrade() else {
            return job.requeue(&self.ctx.metrics).await;
        };
        let ctx = self.ctx.clone();
        let span = job.span.clone();
        self.tracker.spawn(tracing::Instrument::instrument(
            async move {
                let attempts = job.attempts.clone();
                job.wait_until(&ctx, at, db_now, attempts, outcome, &due)
                    .await;
            },
            span,
        ));
    }

    /// A failure for an order: the first message is retried with backoff
    /// or parked (in its own task: a hold must not block the caller);
    /// duplicates are acked as `duplicate`, since one retry is enough.
    pub(crate) fn retry_later(&self, jobs: Vec<Job>, failure: Failure) {
        let mut jobs = jobs.into_iter();
        let Some(first) = jobs.next() else { return };
        let ctx = self.ctx.clone();
        let due = self.due.clone();
        let span = first.span.clone();
        self.tracker.spawn(tracing::Instrument::instrument(
            async move {
                match due.upgrade() {
                    Some(due) => first.fail(&ctx, failure, &due).await,
                    None => first.requeue(&ctx.metrics).await,
                }
                ack_all(&ctx.metrics, jobs.collect(), Outcome::Duplicate).await;
            },
            span,
        ));
    }
}

impl Job {
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
        let why = Parking {
            kind: reason,
            error,
            order_id: Some(self.order_id().clone()),
            attempts,
            timer: Some(self.timer().clone()),
        };
        park(ctx, self.delivery, why).await;
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
