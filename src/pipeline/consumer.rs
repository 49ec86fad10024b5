//! The consumer: takes messages from `order-timeout.due` and decides, for
//! each, without waiting on any other message:
//!
//! - returned to the queue so often that the queue's delivery limit is near
//!   → parked at once (`delivery_limit`), before the broker would drop it;
//! - unparseable, or for a timer the config does not have → parked at
//!   once with the reason;
//! - deadline ≥ 2 s away (a fresh timeout, or one the order row pushed
//!   back) → sent into the delay cascade, then acked;
//! - deadline < 2 s away (the cascade works in whole seconds and hands
//!   messages back up to 2 s early to save hops) → held unacked on an
//!   in-process timer until the exact deadline, then due;
//! - due, or deadline only known to the order row → handed to the batcher
//!   ([`super::batcher`]), which cancels in batches.
//!
//! Every path acks only after its work is confirmed (broker confirm or
//! database commit); a crash anywhere redelivers the message.

use std::sync::Arc;

use chrono::Utc;
use futures_util::StreamExt;
use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use super::context::Context;
use super::job::Job;
use super::park::{Parking, near_delivery_limit, park, park_near_delivery_limit};
use crate::broker::headers::Attempts;
use crate::broker::topology::{DELIVERY_LIMIT, DUE_QUEUE};
use crate::message::{MessageError, TimeoutRequest};
use crate::observe::metrics::{GaugeGuard, Outcome};
use crate::shutdown::Shutdown;

/// Errors that end a consumer session (the supervisor reconnects).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConsumerError {
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

/// A consumer on `order-timeout.due`, started (prefetch set, `basic.consume`
/// accepted) but not yet taking deliveries.
pub(crate) struct Consumer {
    ctx: Arc<Context>,
    channel: Channel,
    deliveries: lapin::Consumer,
}

impl Consumer {
    /// Sets the prefetch window and starts consuming on `channel`.
    #[tracing::instrument(skip_all)]
    pub(crate) async fn start(ctx: Arc<Context>, channel: Channel) -> Result<Self, ConsumerError> {
        channel
            .basic_qos(ctx.settings.prefetch, BasicQosOptions::default())
            .await?;
        let deliveries = channel
            .basic_consume(
                DUE_QUEUE.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        tracing::info!(
            queue = DUE_QUEUE,
            prefetch = ctx.settings.prefetch,
            "consuming"
        );
        Ok(Self {
            ctx,
            channel,
            deliveries,
        })
    }

    /// Takes deliveries until `shutdown` fires or the channel fails, sending
    /// due jobs to `due`. On return, no new deliveries are taken; jobs
    /// already dispatched are tracked by `tracker` and finish (or are
    /// returned to the broker) on their own.
    pub(crate) async fn run(
        mut self,
        due: mpsc::Sender<Job>,
        shutdown: Shutdown,
        tracker: TaskTracker,
    ) -> Result<(), ConsumerError> {
        let tag = self.deliveries.tag();
        let result = loop {
            let next = tokio::select! {
                _ = shutdown.wait() => break Ok(()),
                next = self.deliveries.next() => next,
            };
            match next {
                Some(Ok(delivery)) => dispatch(&self.ctx, delivery, &due, &tracker).await,
                Some(Err(e)) => break Err(ConsumerError::Amqp(e)),
                None => break Err(ConsumerError::Ended),
            }
        };
        if result.is_ok() {
            // Stop deliveries; what the broker already sent us is returned
            // when the channel closes.
            if let Err(e) = self
                .channel
                .basic_cancel(tag, BasicCancelOptions::default())
                .await
            {
                tracing::warn!(error = %e, "basic.cancel failed");
            }
        }
        result
    }
}

/// Routes one delivery to the path it needs (see the module docs).
async fn dispatch(
    ctx: &Arc<Context>,
    delivery: Delivery,
    due: &mpsc::Sender<Job>,
    tracker: &TaskTracker,
) {
    // Open until settled: before anything can ack it.
    ctx.acks.taken(delivery.delivery_tag);
    let in_flight = ctx.metrics.in_flight();
    let headers = delivery.properties.headers().as_ref();
    let attempts = Attempts::of_delivery(delivery.exchange.as_str(), headers);
    let span = tracing::info_span!(
        "message",
        order_id = tracing::field::Empty,
        timer = tracing::field::Empty,
        attempt = attempts.count.saturating_add(1),
        redelivered = delivery.redelivered,
    );
    if let Some(count) = near_delivery_limit(headers, DELIVERY_LIMIT) {
        let ctx = ctx.clone();
        let park = async move { park_near_delivery_limit(&ctx, delivery, count).await };
        return spawn_parking(tracker, span, in_flight, park);
    }
    let request = match TimeoutRequest::parse(&delivery.data, ctx.settings.max_body_bytes) {
        Ok(request) => request,
        Err(e) => {
            let ctx = ctx.clone();
            let park = async move { park_bad(&ctx, delivery, e, attempts).await };
            return spawn_parking(tracker, span, in_flight, park);
        }
    };
    span.record("order_id", tracing::field::display(&request.order_id));
    if !request.timer.is_default() {
        span.record("timer", tracing::field::display(&request.timer));
    }
    let job = Job {
        delivery,
        acks: ctx.acks.clone(),
        request,
        attempts,
        in_flight,
        span,
    };
    route(ctx, job, due, tracker).await;
}

/// A parsed job's way on: parked when its timer is not configured, sent
/// toward its deadline when that is still ahead, else to the batcher.
async fn route(ctx: &Arc<Context>, job: Job, due: &mpsc::Sender<Job>, tracker: &TaskTracker) {
    if ctx.stores.get(job.timer()).is_none() {
        // Counted in flight by the job until it is parked.
        let ctx = ctx.clone();
        let span = job.span.clone();
        let park = async move { job.park_unknown_timer(&ctx).await };
        tracker.spawn(tracing::Instrument::instrument(park, span));
        return;
    }
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
                job.requeue(&ctx.metrics).await;
            }
        }
    }
}

/// Runs `park` in its own task (a park must not hold up the deliveries
/// behind it), in the message's `span`, counting the delivery in flight
/// until it is parked.
fn spawn_parking(
    tracker: &TaskTracker,
    span: tracing::Span,
    in_flight: GaugeGuard,
    park: impl Future<Output = ()> + Send + 'static,
) {
    tracker.spawn(tracing::Instrument::instrument(
        async move {
            park.await;
            drop(in_flight);
        },
        span,
    ));
}

/// Parks an unparseable delivery with the parser's reason.
async fn park_bad(ctx: &Context, delivery: Delivery, error: MessageError, attempts: Attempts) {
    let why = Parking {
        kind: error.kind(),
        error: error.to_string(),
        order_id: None,
        attempts: attempts.failed(Utc::now(), error.to_string()),
        timer: None,
    };
    park(ctx, delivery, why).await;
}
