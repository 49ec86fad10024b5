//! The consumer: takes messages from `order-timeout.due` and decides, for
//! each, without waiting on any other message:
//!
//! - unparseable → parked at once with the reason;
//! - deadline ≥ 2 s away (a fresh timeout, or one the order row pushed
//!   back) → sent into the delay cascade, then acked;
//! - deadline < 2 s away (the cascade works in whole seconds and hands
//!   messages back up to 2 s early to save hops) → held unacked on an
//!   in-process timer until the exact deadline, then due;
//! - due, or deadline only known to the order row → handed to the
//!   [`crate::cancel`] batcher.
//!
//! Every path acks only after its work is confirmed (broker confirm or
//! database commit); a crash anywhere redelivers the message.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::FieldTable;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use crate::config::Settings;
use crate::inventory::InventoryClient;
use crate::message::{Deadline, MessageError, OrderId, TimeoutRequest};
use crate::metrics::{GaugeGuard, Metrics, Outcome, Stage};
use crate::publisher::{ParkInfo, Publisher, deadline_header};
use crate::retry::{Attempts, RetryDecision, RetryPolicy};
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::topology::DUE_QUEUE;

/// Remaining time below which a message is held in-process instead of going
/// through the cascade (whose resolution is one second, and which may leave
/// up to this much to hold so as to take fewer hops:
/// [`crate::topology::cascade_delay_secs`]).
pub const HOLD_BELOW: Duration = Duration::from_secs(crate::topology::HOLD_WINDOW_SECS);

/// Remaining time below which a *retry* is held in-process. Retries go
/// through the delay store whenever its one-second resolution allows: the
/// failing delivery is acked (counted as `retried`) and the re-published
/// copy carries the attempt count, so a crash cannot reset the count and a
/// session that is ending (lost connection, shutdown) is not kept alive by
/// in-process retry loops.
pub const RETRY_HOLD_BELOW: Duration = Duration::from_secs(1);

/// Everything the message-handling tasks share.
pub struct Context {
    /// Settings of this instance.
    pub settings: Settings,
    /// Confirm-mode publisher (re-schedules, parking, events).
    pub publisher: Publisher,
    /// The database.
    pub store: Store,
    /// The inventory service.
    pub inventory: InventoryClient,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Metrics of this instance.
    pub metrics: Arc<Metrics>,
}

/// A parsed delivery on its way through the service.
pub struct Job {
    /// The delivery, to ack or nack when done.
    pub delivery: Delivery,
    /// The parsed body.
    pub request: TimeoutRequest,
    /// The failure history from the headers.
    pub attempts: Attempts,
    /// Counts the delivery in `order_timeout_in_flight_messages` until the
    /// job is dropped (acked, requeued, parked).
    pub in_flight: GaugeGuard,
    /// The message's span (`message{order_id}`): every log line about this
    /// delivery, wherever it is handled, carries its order id.
    pub span: tracing::Span,
}

impl Job {
    /// The order id.
    pub fn order_id(&self) -> &OrderId {
        &self.request.order_id
    }

    /// When the message wants to be processed: the re-schedule header if we
    /// set one, else the body's deadline; `None` for a bare order id.
    pub fn deadline(&self) -> Option<DateTime<Utc>> {
        deadline_header(self.delivery.properties.headers().as_ref()).or(
            match self.request.deadline {
                Deadline::At(at) => Some(at),
                Deadline::FromOrderRow => None,
            },
        )
    }

    /// Acks the delivery, recording `outcome`. A failed ack (lost channel)
    /// only means the broker will redeliver, which is safe.
    pub async fn ack(self, ctx: &Context, outcome: Outcome) {
        ctx.metrics.record(outcome);
        if let Err(e) = self.delivery.ack(BasicAckOptions::default()).await {
            tracing::warn!(order_id = %self.request.order_id, error = %e, "ack failed; the message will be redelivered");
        }
    }

    /// Returns the delivery to the queue (when even re-scheduling failed).
    pub async fn requeue(self) {
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
    pub async fn wait_until(
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
    /// attempts are used up.
    pub async fn fail(self, ctx: &Context, error: String, due: &mpsc::Sender<Job>) {
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
                    "retries_exhausted",
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
pub async fn park(
    ctx: &Context,
    delivery: Delivery,
    error: String,
    kind: &str,
    order_id: Option<OrderId>,
    attempts: Attempts,
) {
    let info = ParkInfo {
        error,
        kind: kind.to_owned(),
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
            ctx.metrics.parked(&info.kind);
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

/// Errors that end a consumer session (the supervisor reconnects).
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// The channel or connection failed.
    #[error("consumer channel: {0}")]
    Amqp(lapin::Error),
    /// The broker ended the consumer (queue deleted, channel closed).
    #[error("the broker ended the consumer")]
    Ended,
}

impl From<lapin::Error> for ConsumerError {
    fn from(e: lapin::Error) -> Self {
        Self::Amqp(e)
    }
}

/// Consumes until `shutdown` fires or the channel fails. On return, no new
/// deliveries are taken; jobs already dispatched are tracked by `tracker`
/// and finish (or are returned to the broker) on their own.
pub async fn run(
    ctx: Arc<Context>,
    channel: Channel,
    shutdown: Shutdown,
    tracker: TaskTracker,
) -> Result<(), ConsumerError> {
    channel
        .basic_qos(ctx.settings.prefetch, BasicQosOptions::default())
        .await?;
    let mut consumer = channel
        .basic_consume(
            DUE_QUEUE.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let tag = consumer.tag();
    tracing::info!(
        queue = DUE_QUEUE,
        prefetch = ctx.settings.prefetch,
        "consuming"
    );

    let (due_tx, due_rx) = mpsc::channel::<Job>(usize::from(ctx.settings.prefetch).max(1));
    // Tasks that live as long as this consumer (the sweeper).
    let session = shutdown.child();
    tracker.spawn(crate::sweeper::run(
        ctx.clone(),
        due_tx.downgrade(),
        tracker.clone(),
        session.clone(),
    ));
    tracker.spawn(crate::cancel::run(
        ctx.clone(),
        due_rx,
        due_tx.downgrade(),
        tracker.clone(),
    ));

    let result = loop {
        let next = tokio::select! {
            _ = shutdown.wait() => break Ok(()),
            next = consumer.next() => next,
        };
        match next {
            Some(Ok(delivery)) => dispatch(&ctx, delivery, &due_tx, &tracker).await,
            Some(Err(e)) => break Err(ConsumerError::Amqp(e)),
            None => break Err(ConsumerError::Ended),
        }
    };
    session.trigger();
    if result.is_ok() {
        // Stop deliveries; what the broker already sent us is returned when
        // the channel closes.
        if let Err(e) = channel
            .basic_cancel(tag, BasicCancelOptions::default())
            .await
        {
            tracing::warn!(error = %e, "basic.cancel failed");
        }
    }
    result
}

/// Routes one delivery to the path it needs (see the module docs).
async fn dispatch(
    ctx: &Arc<Context>,
    delivery: Delivery,
    due: &mpsc::Sender<Job>,
    tracker: &TaskTracker,
) {
    let in_flight = ctx.metrics.in_flight();
    let attempts = Attempts::from_headers(delivery.properties.headers().as_ref());
    let span = tracing::info_span!(
        "message",
        order_id = tracing::field::Empty,
        attempt = attempts.count + 1,
        redelivered = delivery.redelivered,
    );
    let request = match TimeoutRequest::parse(&delivery.data, ctx.settings.max_body_bytes) {
        Ok(request) => request,
        Err(e) => {
            let ctx = ctx.clone();
            tracker.spawn(tracing::Instrument::instrument(
                async move {
                    park_bad(&ctx, delivery, e, attempts).await;
                    drop(in_flight);
                },
                span,
            ));
            return;
        }
    };
    span.record("order_id", tracing::field::display(&request.order_id));
    let job = Job {
        delivery,
        request,
        attempts,
        in_flight,
        span,
    };
    let now = Utc::now();
    match job.deadline() {
        Some(deadline) if deadline > now => {
            let ctx = ctx.clone();
            let due = due.clone();
            let span = job.span.clone();
            tracker.spawn(tracing::Instrument::instrument(
                async move {
                    let attempts = job.attempts.clone();
                    job.wait_until(&ctx, deadline, now, attempts, Outcome::Rescheduled, &due)
                        .await;
                },
                span,
            ));
        }
        _ => {
            if let Err(mpsc::error::SendError(job)) = due.send(job).await {
                job.requeue().await;
            }
        }
    }
}

async fn park_bad(ctx: &Context, delivery: Delivery, error: MessageError, attempts: Attempts) {
    let attempts = attempts.failed(Utc::now(), error.to_string());
    park(
        ctx,
        delivery,
        error.to_string(),
        error.kind(),
        None,
        attempts,
    )
    .await;
}
