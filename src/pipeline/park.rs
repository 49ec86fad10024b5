//! Ending a job by parking it: the message moves to `order-timeout.parked`
//! with the reason ([`ParkReason`]) and its failure history, and only then
//! is the delivery acked ([`park`]). Every park record is built from a
//! reason in one place ([`ParkWhy`]).
//!
//! Also the one decision that parks a message before anything else is
//! done with it: a delivery returned to the queue so often that the
//! broker's delivery limit is near ([`near_delivery_limit`]). Past the
//! limit a quorum queue drops the message (or dead-letters it, and the due
//! queue has no dead-letter target); parked, an operator sees and replays
//! it.

use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::types::FieldTable;

use super::context::Context;
use crate::broker::acks::Acks;
use crate::broker::headers::{Attempts, H_DELIVERY_COUNT, header_int};
use crate::broker::parked::{ParkInfo, order_id_from_body};
use crate::broker::publisher::PublishError;
use crate::broker::topology::{DELIVERY_LIMIT, DUE_QUEUE};
use crate::message::{Deadline, MessageError, OrderId, ParkReason, TimeoutRequest};
use crate::observe::metrics::{Metrics, NO_TIMER, Outcome};
use crate::settings::TimerName;
use crate::store::IdRejected;

/// How many returns before the due queue's delivery limit
/// ([`DELIVERY_LIMIT`]) a delivery is parked instead of handled. Every
/// return is followed by a delivery that looks at the count, so a margin of
/// one would do; ten leaves room for brokers that count a little
/// differently (RabbitMQ 4.x counts returns of several kinds apart).
pub(crate) const DELIVERY_LIMIT_MARGIN: i64 = 10;

/// Whether a delivery that the queue has handed out before
/// (`x-delivery-count`, set by quorum queues on redelivery) is so close to
/// the queue's delivery `limit` that it must be parked now: returned once
/// more, it could be dropped by the broker. Absent, negative or non-integer
/// counts are a first delivery.
pub(crate) fn near_delivery_limit(headers: Option<&FieldTable>, limit: i64) -> Option<i64> {
    let count = header_int(headers?.inner().get(H_DELIVERY_COUNT)?)?;
    (count >= limit.saturating_sub(DELIVERY_LIMIT_MARGIN)).then_some(count)
}

/// Why a delivery is parked, with what its park record needs: the one
/// place a park record ([`Parking`]) is built from a reason
/// ([`ParkWhy::parking`]).
#[derive(Clone, Debug)]
pub(crate) enum ParkWhy {
    /// Returned this many times to the due queue, near its delivery limit
    /// ([`near_delivery_limit`]): `delivery_limit`.
    DeliveryLimit(i64),
    /// Not a timeout message the service accepts (the parser's reason).
    Unparseable(MessageError),
    /// It names a timer the config does not have (`unknown_timer`): a
    /// publisher ahead of the service's config, or a typo. Replaying it once
    /// the timer is configured runs it.
    UnknownTimer {
        /// The order it names.
        order_id: OrderId,
        /// The timer it names.
        timer: TimerName,
        /// The timers the config has.
        known: Vec<String>,
    },
    /// No row in the timer's table has its id (`unknown_order`).
    UnknownOrder {
        /// The order id (canonical, as the table has it).
        id: OrderId,
        /// The timer's table.
        table: String,
        /// The timer it is counted for.
        timer: TimerName,
        /// Why no row can have that id, when none can.
        rejected: Option<IdRejected>,
    },
    /// The retry policy gave up on it (`kind`: used up, or a failure
    /// waiting cannot fix), after `attempts` (this failure included).
    GaveUp {
        /// The park reason the retry policy chose.
        kind: ParkReason,
        /// The last failure.
        error: String,
        /// The order.
        order_id: OrderId,
        /// Its timer.
        timer: TimerName,
        /// The failure history, the last failure included.
        attempts: Attempts,
    },
}

impl ParkWhy {
    /// `x-error`: the reason as an operator reads it.
    fn error(&self) -> String {
        match self {
            Self::DeliveryLimit(count) => format!(
                "returned to {DUE_QUEUE} {count} times, near its delivery limit of {DELIVERY_LIMIT}: \
                 parked before the broker would drop it"
            ),
            Self::Unparseable(e) => e.to_string(),
            Self::UnknownTimer { timer, known, .. } => format!(
                "unknown timer {:?}: this service's config has {}",
                timer.as_str(),
                known.join(", ")
            ),
            Self::UnknownOrder {
                id,
                table,
                rejected: Some(why),
                ..
            } => format!(
                "unknown order: no row in {table} can have id {:?}: {why}",
                id.as_str()
            ),
            Self::UnknownOrder { id, table, .. } => {
                format!("unknown order: no row in {table} with id {:?}", id.as_str())
            }
            Self::GaveUp { error, .. } => error.clone(),
        }
    }

    /// The park record of a delivery whose failure history so far is
    /// `history`: this park counts as one more failure (the retry policy's
    /// [`ParkWhy::GaveUp`] brings its own, already counted).
    fn parking(self, history: &Attempts) -> Parking {
        let error = self.error();
        let counted = || history.failed(Utc::now(), error.clone());
        let (kind, attempts, order_id, timer) = match self {
            Self::DeliveryLimit(_) => (ParkReason::DeliveryLimit, counted(), None, None),
            Self::Unparseable(e) => (e.kind(), counted(), None, None),
            Self::UnknownTimer { order_id, .. } => {
                (ParkReason::UnknownTimer, counted(), Some(order_id), None)
            }
            Self::UnknownOrder { id, timer, .. } => {
                (ParkReason::UnknownOrder, counted(), Some(id), Some(timer))
            }
            Self::GaveUp {
                kind,
                order_id,
                timer,
                attempts,
                ..
            } => (kind, attempts, Some(order_id), Some(timer)),
        };
        Parking {
            kind,
            error,
            order_id,
            attempts,
            timer,
        }
    }
}

/// A parked delivery's record (`x-error`, `x-error-kind`, the order and
/// the failure history), and the timer it is counted for (`None`: not
/// known, the message could not say or named a timer the config does not
/// have). Built from a [`ParkWhy`] only.
struct Parking {
    /// Short label (`x-error-kind`).
    kind: ParkReason,
    /// Human-readable reason (`x-error`).
    error: String,
    /// The order, if the message named a valid one.
    order_id: Option<OrderId>,
    /// Failure history including this failure.
    attempts: Attempts,
    /// The timer it is counted for.
    timer: Option<TimerName>,
}

/// Parks a delivery from the due queue for `why` (its failure history so
/// far: `history`), then acks it. A park the broker refuses is tried again
/// with backoff ([`Context::publish_patiently`]); if it still fails, the
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
    let parked = ctx
        .publish_patiently("park", || {
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
            requeue(&ctx.acks, &delivery, &ctx.metrics).await;
        }
    }
}

/// Returns `delivery` to the queue (a nack with requeue), counted in
/// `order_timeout_requeued_total`: a park that failed, or a job that could
/// not go on ([`super::job::Job::requeue`]). A failed nack (lost channel)
/// returns it all the same.
pub(crate) async fn requeue(acks: &Acks, delivery: &Delivery, metrics: &Metrics) {
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
    ctx.publish_patiently("park", || ctx.publisher.park(&body, &properties, &info))
        .await?;
    tracing::warn!(order_id = %id, %timer, kind = %info.kind, error = %info.error, "parked a row the sweeper found");
    ctx.metrics.parked(kind);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{AMQPValue, LongString};

    fn with_count(value: AMQPValue) -> FieldTable {
        let mut headers = FieldTable::default();
        headers.insert(H_DELIVERY_COUNT.into(), value);
        headers
    }

    #[test]
    fn a_delivery_is_parked_only_near_the_delivery_limit() {
        let limit = 1_000;
        assert_eq!(near_delivery_limit(None, limit), None);
        assert_eq!(
            near_delivery_limit(Some(&FieldTable::default()), limit),
            None
        );
        for (count, parked) in [
            (0, false),
            (1, false),
            (limit - DELIVERY_LIMIT_MARGIN - 1, false),
            (limit - DELIVERY_LIMIT_MARGIN, true),
            (limit - 1, true),
            (limit, true),
            (limit + 5, true),
            (-3, false),
        ] {
            let headers = with_count(AMQPValue::LongLongInt(count));
            assert_eq!(
                near_delivery_limit(Some(&headers), limit).is_some(),
                parked,
                "count {count}"
            );
        }
        // Whatever integer width the broker uses.
        let headers = with_count(AMQPValue::LongInt(995));
        assert_eq!(near_delivery_limit(Some(&headers), limit), Some(995));
        let headers = with_count(AMQPValue::LongString(LongString::from("999")));
        assert_eq!(near_delivery_limit(Some(&headers), limit), None);
    }

    #[test]
    fn the_service_limit_leaves_room_and_never_overflows() {
        let headers = with_count(AMQPValue::LongLongInt(
            DELIVERY_LIMIT - DELIVERY_LIMIT_MARGIN,
        ));
        assert!(near_delivery_limit(Some(&headers), DELIVERY_LIMIT).is_some());
        let headers = with_count(AMQPValue::LongLongInt(i64::MAX));
        assert!(near_delivery_limit(Some(&headers), i64::MIN).is_some());
        assert!(near_delivery_limit(Some(&headers), i64::MAX).is_some());
        let headers = with_count(AMQPValue::LongLongInt(i64::MIN));
        assert!(near_delivery_limit(Some(&headers), i64::MAX).is_none());
    }
}
