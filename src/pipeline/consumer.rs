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
use super::ending::{Ending, Worker, park, requeue};
use super::job::Job;
use super::park::{ParkWhy, near_delivery_limit};
use crate::broker::headers::Attempts;
use crate::broker::topology::{DELIVERY_LIMIT, DUE_QUEUE};
use crate::message::TimeoutRequest;
use crate::observe::metrics::Outcome;
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
        // The session's worker (the batcher's, the sweeper's): the same
        // context, batcher, tasks and session.
        let worker = Worker {
            ctx: self.ctx.clone(),
            due: due.downgrade(),
            tracker,
            session: shutdown.clone(),
        };
        let result = loop {
            let next = tokio::select! {
                _ = shutdown.wait() => break Ok(()),
                next = self.deliveries.next() => next,
            };
            match next {
                Some(Ok(delivery)) => dispatch(&worker, delivery, &due).await,
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
async fn dispatch(worker: &Worker, delivery: Delivery, due: &mpsc::Sender<Job>) {
    let ctx = &worker.ctx;
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
    let why = match near_delivery_limit(headers, DELIVERY_LIMIT) {
        Some(count) => ParkWhy::DeliveryLimit(count),
        None => match TimeoutRequest::parse(&delivery.data, ctx.settings.max_body_bytes) {
            Ok(request) => {
                span.record("order_id", tracing::field::display(&request.order_id));
                if !request.timer.is_default() {
                    span.record("timer", tracing::field::display(&request.timer));
                }
                match ctx.stores.get(&request.timer) {
                    Some(store) => {
                        let job = Job {
                            delivery,
                            acks: ctx.acks.clone(),
                            store: store.clone(),
                            request,
                            attempts,
                            in_flight,
                            span,
                        };
                        return route(worker, job, due).await;
                    }
                    None => ParkWhy::unknown_timer(&request, &ctx.stores),
                }
            }
            Err(e) => ParkWhy::Unparseable(e),
        },
    };
    // Parked in its own task (a park must not hold up the deliveries behind
    // it), counted in flight until it is.
    let ctx = ctx.clone();
    let park = async move {
        park(&ctx, delivery, &attempts, why).await;
        drop(in_flight);
    };
    worker
        .tracker
        .spawn(tracing::Instrument::instrument(park, span));
}

/// A job's way on: sent toward its deadline when that is still ahead,
/// else to the batcher.
async fn route(worker: &Worker, job: Job, due: &mpsc::Sender<Job>) {
    let now = Utc::now();
    match job.deadline() {
        Some(at) if at > now => {
            let wait = Ending::WaitUntil {
                at,
                now,
                outcome: Outcome::Rescheduled,
                duplicates: Outcome::Duplicate,
            };
            worker.end(vec![job], wait).await;
        }
        _ => {
            if let Err(mpsc::error::SendError(job)) = due.send(job).await {
                requeue(job, &worker.ctx.metrics).await;
            }
        }
    }
}
