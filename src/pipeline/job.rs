//! A message on its way through the service ([`Job`]): its delivery, its
//! parsed body and failure history, and the two plain ways it ends — acked
//! with an outcome, or returned to the queue.
//!
//! The other endings have modules of their own: held or sent back through
//! the delay store ([`super::schedule`]), retried with backoff
//! ([`super::retry`]), parked ([`super::park`]). Every ending acks only after
//! its work is confirmed (broker confirm or database commit); a crash
//! anywhere redelivers the message.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::types::DeliveryTag;

use crate::broker::acks::Acks;
use crate::broker::headers::{Attempts, deadline_header};
use crate::message::{Deadline, OrderId, TimeoutRequest};
use crate::observe::metrics::{GaugeGuard, Metrics, Outcome};
use crate::settings::TimerName;

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
}

/// Acks every job with `outcome`.
pub(crate) async fn ack_all(metrics: &Metrics, jobs: Vec<Job>, outcome: Outcome) {
    ack_each(
        metrics,
        jobs.into_iter().map(|job| (job, outcome)).collect(),
    )
    .await;
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

/// Returns `delivery` to the queue (a nack with requeue), counted. A failed
/// nack (lost channel) returns it all the same.
pub(crate) async fn requeue(acks: &Acks, delivery: &Delivery, metrics: &Metrics) {
    metrics.requeued();
    let _ = acks.requeue(delivery.delivery_tag).await;
}
