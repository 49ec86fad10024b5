//! A message on its way through the service ([`Job`]): its delivery, its
//! parsed body and failure history. How it ends is
//! [`super::ending`]'s.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use lapin::message::Delivery;

use crate::broker::acks::Acks;
use crate::broker::headers::{Attempts, deadline_header};
use crate::message::{Deadline, OrderId, TimeoutRequest};
use crate::observe::metrics::GaugeGuard;
use crate::settings::TimerName;
use crate::store::Store;

/// A parsed delivery on its way through the service.
pub(crate) struct Job {
    /// The delivery, to ack or nack when done.
    pub(crate) delivery: Delivery,
    /// Where the delivery is settled: its channel's open deliveries.
    pub(crate) acks: Arc<Acks>,
    /// The parsed body.
    pub(crate) request: TimeoutRequest,
    /// The store of the message's timer, looked up as the message came in
    /// (a message for a timer the config does not have is parked there,
    /// and never becomes a job).
    pub(crate) store: Store,
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
}
