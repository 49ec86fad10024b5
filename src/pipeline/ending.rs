//! **The one place a job ends.** A step decides how an order's deliveries
//! end ([`Ending`], a value: the verdict's consequence for a delivery) and
//! hands it to [`Worker::end`]; everything that follows is here, top to
//! bottom:
//!
//! - acked with an outcome ([`ack_each`]: a batch's jobs in as few frames
//!   as is safe);
//! - returned to the queue ([`requeue`]);
//! - sent back toward its deadline through the delay store or, under the
//!   cascade's one-second resolution, held in-process and handed to the
//!   batcher ([`wait_until`], [`hold`]);
//! - a failed attempt retried with the backoff **the retry policy** gives,
//!   or parked once it says so ([`fail`]);
//! - parked for a reason ([`park`], the record built from a
//!   [`ParkWhy`]), or, for a row no delivery brought, a message parked
//!   for it ([`park_row`]; the sweeper's given-up releases:
//!   [`park_given_up`]);
//! - and the one way every publish that must not be lost is made
//!   ([`publish_patiently`], [`delay_patiently`]).
//!
//! An order's messages end together: one is enough for whatever must
//! happen next, the others are acked as duplicates. Every ending acks only
//! after its work is confirmed (broker confirm or database commit); a crash
//! anywhere redelivers the message.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::types::DeliveryTag;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use super::context::Context;
use super::failure::Failure;
use super::job::Job;
use super::park::{ParkWhy, Parking};
use super::retry::{RetryDecision, later};
use crate::broker::acks::Acks;
use crate::broker::cascade::HOLD_WINDOW_SECS;
use crate::broker::headers::Attempts;
use crate::broker::parked::{ParkInfo, order_id_from_body};
use crate::broker::publisher::PublishError;
use crate::broker::topology::DUE_QUEUE;
use crate::message::{Deadline, OrderId, ParkReason, TimeoutRequest};
use crate::observe::metrics::{Metrics, NO_TIMER, Outcome, Stage};
use crate::settings::TimerName;
use crate::shutdown::Shutdown;
use crate::store::{Cancellation, NextAttempt, OutboxFailure, Store};

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

/// How long a publish the broker refuses (a nack from a full queue with
/// `reject-publish`, a channel error) is retried in-process, with backoff,
/// before the delivery it belongs to goes back to the queue. Returned at
/// once, the delivery would come straight back and fail again: a hot loop
/// for as long as the broker refuses. Held, it keeps its prefetch slot, so
/// the consumer slows down with the broker instead.
pub(crate) const PUBLISH_PATIENCE: Duration = Duration::from_secs(8);

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
    /// Ends the broker session: what a batch that panicked does, so that
    /// its unacked deliveries are returned and delivered again.
    pub(crate) session: Shutdown,
}

/// How each order's deliveries end: what a step decides as it goes and
/// hands to [`Worker::end_all`] at its end.
pub(crate) type Endings = Vec<(Vec<Job>, Ending)>;

/// How an order's deliveries (its [`Job`]s: the first and its duplicates)
/// end: what [`Worker::end`] carries out.
pub(crate) enum Ending {
    /// Acked: the first counted as `first`, the others as `duplicates`.
    Ack {
        /// The first delivery's outcome.
        first: Outcome,
        /// The outcome of the others.
        duplicates: Outcome,
    },
    /// Returned to the queue unfinished (the batcher is gone).
    Requeue,
    /// The first sent back toward `at` (on the clock `now`) in its own
    /// task, counted as `outcome` ([`Outcome::Rescheduled`], or
    /// [`Outcome::Locked`]: through the delay store from a second on,
    /// keeping the message's attempt count); the others acked first as
    /// `duplicates`, one message is enough.
    WaitUntil {
        /// When it is due again.
        at: DateTime<Utc>,
        /// The clock `at` is measured against.
        now: DateTime<Utc>,
        /// How the message sent back is counted.
        outcome: Outcome,
        /// How the others are counted.
        duplicates: Outcome,
    },
    /// A failed attempt: the first retried with backoff or parked, as the
    /// retry policy says ([`fail`], in its own task: a hold must not
    /// block the caller); the others then acked as duplicates, since one
    /// retry is enough.
    Fail(Failure),
    /// Every delivery parked for this reason.
    Park(ParkWhy),
}

impl Worker {
    /// Ends `jobs` (an order's deliveries) as `ending` says: **the one
    /// place a job ends**. A job that must wait goes back into the batcher
    /// through `due` (gone: it is returned to the queue instead); waits and
    /// retries run in the session's tasks.
    pub(crate) async fn end(&self, jobs: Vec<Job>, ending: Ending) {
        let ctx = &self.ctx;
        let mut jobs = jobs.into_iter();
        let Some(first) = jobs.next() else { return };
        let rest: Vec<Job> = jobs.collect();
        match ending {
            Ending::Ack {
                first: o,
                duplicates,
            } => {
                let acked =
                    std::iter::once((first, o)).chain(rest.into_iter().map(|j| (j, duplicates)));
                ack_each(&ctx.metrics, acked.collect()).await;
            }
            Ending::Requeue => {
                for job in std::iter::once(first).chain(rest) {
                    requeue(job, &ctx.metrics).await;
                }
            }
            Ending::WaitUntil {
                at,
                now,
                outcome,
                duplicates,
            } => {
                ack_each(
                    &ctx.metrics,
                    rest.into_iter().map(|j| (j, duplicates)).collect(),
                )
                .await;
                let Some(due) = self.due.upgrade() else {
                    return requeue(first, &ctx.metrics).await;
                };
                let ctx = ctx.clone();
                let span = first.span.clone();
                let wait = async move {
                    let attempts = first.attempts.clone();
                    wait_until(first, &ctx, at, now, attempts, outcome, &due).await;
                };
                self.tracker
                    .spawn(tracing::Instrument::instrument(wait, span));
            }
            Ending::Fail(failure) => {
                let span = first.span.clone();
                let fail = fail_then_ack(self.ctx.clone(), self.due.clone(), first, failure, rest);
                self.tracker
                    .spawn(tracing::Instrument::instrument(fail, span));
            }
            Ending::Park(why) => {
                for job in std::iter::once(first).chain(rest) {
                    park(ctx, job.delivery, &job.attempts, why.clone()).await;
                }
            }
        }
    }

    /// Ends the deliveries of several orders ([`Worker::end`]), in order;
    /// the acks last, together, in as few frames as is safe
    /// ([`ack_each`]).
    pub(crate) async fn end_all(&self, endings: Endings) {
        let mut acked = Vec::new();
        for (jobs, ending) in endings {
            match ending {
                Ending::Ack { first, duplicates } => {
                    let outcomes = std::iter::once(first).chain(std::iter::repeat(duplicates));
                    acked.extend(jobs.into_iter().zip(outcomes));
                }
                ending => self.end(jobs, ending).await,
            }
        }
        ack_each(&self.ctx.metrics, acked).await;
    }
}

/// [`Ending::Fail`]'s task: the first job fails (retried or parked), or is
/// returned to the queue once the batcher is gone; then its duplicates are
/// acked.
async fn fail_then_ack(
    ctx: Arc<Context>,
    due: mpsc::WeakSender<Job>,
    first: Job,
    failure: Failure,
    rest: Vec<Job>,
) {
    match due.upgrade() {
        Some(due) => fail(first, &ctx, failure, &due).await,
        None => requeue(first, &ctx.metrics).await,
    }
    let duplicates = rest.into_iter().map(|j| (j, Outcome::Duplicate));
    ack_each(&ctx.metrics, duplicates.collect()).await;
}

/// Returns the delivery to the queue unfinished (the session is ending,
/// or a publish kept failing), counted in `order_timeout_requeued_total`.
pub(crate) async fn requeue(job: Job, metrics: &Metrics) {
    requeue_delivery(&job.acks, &job.delivery, metrics).await;
}

/// Sends the message toward `deadline` (measured against `now`): through
/// the cascade if it is a second or more away, else held in-process and
/// then handed to `due`. A re-schedule the broker keeps refusing is
/// retried with backoff ([`publish_patiently`]), each try
/// routed by the time left then; it is held once that falls within the
/// hold window, or else the delivery is returned to the queue.
async fn wait_until(
    mut job: Job,
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
        job.attempts = attempts;
        hold(job, remaining, due, &ctx.metrics).await;
        return;
    }
    let delayed = delay_patiently(
        ctx,
        &job.delivery.data,
        job.order_id(),
        deadline,
        now,
        &attempts,
        hold_below,
    )
    .await;
    match delayed {
        Ok(Delayed::Published { hops }) => {
            tracing::debug!(order_id = %job.order_id(), %deadline, hops, "scheduled in the delay store");
            ack_each(&ctx.metrics, vec![(job, outcome)]).await;
        }
        Ok(Delayed::TooClose(remaining)) => {
            // The broker refused the re-schedule until the deadline came
            // within the hold window: held like any message due so soon.
            tracing::info!(order_id = %job.order_id(), ?remaining, "re-schedule refused until the deadline came close; holding the message in-process");
            job.attempts = attempts;
            hold(job, remaining, due, &ctx.metrics).await;
        }
        Err(e) => {
            tracing::warn!(order_id = %job.order_id(), error = %e, "re-schedule failed; returning the message to the queue");
            requeue(job, &ctx.metrics).await;
        }
    }
}

/// A failed attempt: re-schedule with backoff, or park once the
/// attempts are used up or waiting cannot fix it (**the retry policy**
/// decides: [`RetryPolicy::decide_after`]).
async fn fail(job: Job, ctx: &Context, failure: Failure, due: &mpsc::Sender<Job>) {
    let now = Utc::now();
    let error = failure.to_string();
    let attempts = job.attempts.failed(now, error.clone());
    let reason = match ctx.retry.decide_after(&attempts, &failure) {
        RetryDecision::RetryIn(delay) => {
            tracing::warn!(order_id = %job.order_id(), attempt = attempts.count, retry_in = ?delay, %error, "transient failure; will retry");
            let at = later(now, delay);
            wait_until(job, ctx, at, now, attempts, Outcome::Retried, due).await;
            return;
        }
        RetryDecision::Park => {
            tracing::error!(order_id = %job.order_id(), attempts = attempts.count, %error, "giving up; parking");
            ParkReason::RetriesExhausted
        }
        RetryDecision::ParkAtOnce if failure.is_release_refused() => {
            tracing::error!(order_id = %job.order_id(), attempts = attempts.count, %error, "the inventory refused the stock release for good; parking (replaying the message tries the release again)");
            ParkReason::ReleaseFailed
        }
        RetryDecision::ParkAtOnce => {
            tracing::error!(order_id = %job.order_id(), attempts = attempts.count, %error, "a failure waiting cannot fix; parking");
            ParkReason::PermanentFailure
        }
    };
    let why = ParkWhy::GaveUp {
        kind: reason,
        error,
        order_id: job.order_id().clone(),
        timer: job.timer().clone(),
        attempts,
    };
    park(ctx, job.delivery, &job.attempts, why).await;
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
        requeue(job, metrics).await;
    }
}

/// Parks a delivery from the due queue for `why` (its failure history so
/// far: `history`), then acks it. A park the broker refuses is tried again
/// with backoff ([`publish_patiently`]); if it still fails, the
/// delivery is returned to the queue rather than lost.
pub(crate) async fn park(ctx: &Context, delivery: Delivery, history: &Attempts, why: ParkWhy) {
    let Parking {
        kind,
        error,
        order_id,
        attempts,
        timer,
    } = why.parking(history);
    let info = ParkInfo {
        error,
        kind,
        order_id,
        attempts,
        source_queue: DUE_QUEUE.into(),
        source_exchange: delivery.exchange.to_string(),
        source_routing_key: delivery.routing_key.to_string(),
    };
    let parked = publish_patiently(ctx, "park", || {
        ctx.publisher
            .park(&delivery.data, &delivery.properties, &info)
    })
    .await;
    match parked {
        Ok(()) => {
            // The order id as the listing shows it: the body's when the
            // message was refused before its id was taken (`ambiguous`).
            let order_id = info
                .order_id
                .as_ref()
                .map(|id| id.as_str().to_owned())
                .or_else(|| order_id_from_body(&delivery.data));
            tracing::warn!(kind = %info.kind, error = %info.error, order_id = order_id.as_deref().unwrap_or("-"), "parked a message");
            let timer = timer.as_ref().map_or(NO_TIMER, TimerName::as_str);
            ctx.metrics.record(timer, Outcome::Parked);
            ctx.metrics.parked(info.kind);
            if let Err(e) = ctx.acks.ack(&[delivery.delivery_tag]).await {
                tracing::warn!(error = %e, "ack after parking failed; it may be parked twice");
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot park a message; returning it to the queue");
            requeue_delivery(&ctx.acks, &delivery, &ctx.metrics).await;
        }
    }
}

/// Returns `delivery` to the queue (a nack with requeue), counted in
/// `order_timeout_requeued_total`: a job that could not go on
/// ([`requeue`]), or a park that failed. A failed nack (lost channel)
/// returns it all the same.
async fn requeue_delivery(acks: &Acks, delivery: &Delivery, metrics: &Metrics) {
    metrics.requeued();
    let _ = acks.requeue(delivery.delivery_tag).await;
}

/// `x-source-queue` of a message the sweeper parks (it consumed none).
const SWEEPER_SOURCE: &str = "sweeper";

/// Parks a message for a row no delivery brought (the sweeper found it):
/// the timeout message its publisher would have sent (`{"order_id",
/// "cancel_at"}` with the row's `deadline`, and the timer), with `kind` and
/// `error`, so that it is seen and, once the cause is fixed, replayed. A
/// park the broker refuses is tried again with backoff; the error is
/// returned if it still fails (the caller keeps the row in hand).
pub(crate) async fn park_row(
    ctx: &Context,
    timer: &TimerName,
    id: &OrderId,
    deadline: DateTime<Utc>,
    kind: ParkReason,
    error: &str,
) -> Result<(), PublishError> {
    let body = TimeoutRequest {
        order_id: id.clone(),
        deadline: Deadline::At(deadline),
        timer: timer.clone(),
    }
    .to_json();
    let properties = lapin::BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(id.as_str().into());
    let info = ParkInfo {
        error: error.to_owned(),
        kind,
        order_id: Some(id.clone()),
        attempts: Attempts::default().failed(Utc::now(), error),
        source_queue: SWEEPER_SOURCE.into(),
        source_exchange: String::new(),
        source_routing_key: String::new(),
    };
    publish_patiently(ctx, "park", || {
        ctx.publisher.park(&body, &properties, &info)
    })
    .await?;
    tracing::warn!(order_id = %id, %timer, kind = %info.kind, error = %info.error, "parked a row the sweeper found");
    ctx.metrics.parked(kind);
    Ok(())
}

/// Parks a timeout message for an order whose stock release the sweeper
/// gave up, with the reason `release_failed`, so that it is seen and, once
/// the cause is fixed, replayed: the replayed message finds the order
/// cancelled with its release pending and finishes it. If the broker
/// refuses the park, the row is put back in the sweeper's hands (retried
/// after a backoff, given up and parked again).
pub(crate) async fn park_given_up(
    ctx: &Context,
    store: &Store,
    id: &OrderId,
    c: &Cancellation,
    reason: &str,
) {
    let timer = &store.timer().name;
    let kind = ParkReason::ReleaseFailed;
    if let Err(e) = park_row(ctx, timer, id, c.expires_at, kind, reason).await {
        tracing::error!(order_id = %id, error = %e, "cannot park an order whose stock release was given up; the sweeper will try it again");
        let failure = [OutboxFailure {
            id: id.as_str(),
            error: reason,
            release: true,
            permanent: false,
        }];
        let retry_later =
            |_: &OutboxFailure<'_>, n: u32| NextAttempt::After(ctx.retry.outbox_delay(n));
        if let Err(e) = store.record_failures(&failure, &retry_later).await {
            tracing::error!(order_id = %id, error = %e, "cannot put the given-up row back either; replay or release it by hand");
        }
    }
}

/// A confirmed publish (`publish`: a re-schedule, a parked copy), timed,
/// and tried again with backoff while the broker refuses it, for at most
/// [`PUBLISH_PATIENCE`] and only while the publishing channel is open
/// (a lost connection ends the session, which returns the delivery).
/// Every failed try is counted in `order_timeout_publish_failures_total`.
pub(crate) async fn publish_patiently<T, F, Fut>(
    ctx: &Context,
    what: &'static str,
    publish: F,
) -> Result<T, PublishError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, PublishError>>,
{
    let mut publish = publish;
    let timed = || {
        let started = std::time::Instant::now();
        let attempt = publish();
        async move {
            let result = attempt.await;
            ctx.metrics.stage(Stage::Publish, started.elapsed());
            if result.is_err() {
                ctx.metrics.publish_failed();
            }
            result
        }
    };
    timed
        .retry(publish_backoff())
        .when(|_| ctx.publisher.channel().status().connected())
        .notify(|error, pause| {
            tracing::warn!(%error, ?pause, what, "the broker refused a publish; trying again");
        })
        .await
}

/// Publishes `body` into the delay store toward `deadline`, tried again
/// like [`publish_patiently`]. Each try routes by the time left
/// at that try (`now`, on the caller's clock, moved on by the time
/// spent since): a message the broker took after two seconds of
/// refusals would otherwise come back two seconds late, and the time
/// left picks another route, around a full queue. Once less than
/// `hold_below` is left, nothing is published and the caller gets the
/// time left to wait out another way ([`Delayed::TooClose`]).
pub(crate) async fn delay_patiently(
    ctx: &Context,
    body: &[u8],
    order_id: &OrderId,
    deadline: DateTime<Utc>,
    now: DateTime<Utc>,
    attempts: &Attempts,
    hold_below: Duration,
) -> Result<Delayed, PublishError> {
    let since = std::time::Instant::now();
    let (publisher, layout) = (&ctx.publisher, &ctx.layout);
    publish_patiently(ctx, "delay", move || async move {
        let now = now + since.elapsed();
        let left = (deadline - now).to_std().unwrap_or_default();
        if left < hold_below {
            return Ok(Delayed::TooClose(left));
        }
        let hops = publisher
            .delay(body, order_id, deadline, now, attempts, layout)
            .await?;
        Ok(Delayed::Published { hops })
    })
    .await
}

/// What [`delay_patiently`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delayed {
    /// The broker took it, on a route of `hops` delay queues.
    Published {
        /// Delay queues on its route.
        hops: u32,
    },
    /// Nothing was published: only this much is left, less than the hold
    /// threshold asked for.
    TooClose(Duration),
}

/// 100 ms doubling to 2 s, with jitter, [`PUBLISH_PATIENCE`] in all.
fn publish_backoff() -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .with_total_delay(Some(PUBLISH_PATIENCE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use backon::BackoffBuilder;

    #[test]
    fn a_refused_publish_backs_off_within_its_patience() {
        let pauses: Vec<Duration> = publish_backoff().build().collect();
        assert!(pauses.len() >= 5, "{pauses:?}");
        assert!(pauses[0] >= Duration::from_millis(100), "{pauses:?}");
        assert!(pauses.iter().all(|p| *p <= Duration::from_secs(4)));
        let total: Duration = pauses.iter().sum();
        assert!(total <= PUBLISH_PATIENCE, "{total:?}");
        assert!(total >= PUBLISH_PATIENCE / 2, "{total:?}");
    }
}
