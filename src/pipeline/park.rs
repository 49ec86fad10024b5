//! Ending a job by parking it: the message moves to `order-timeout.parked`
//! with the reason ([`ParkReason`]) and its failure history, and only then
//! is the delivery acked ([`park`]).
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
use crate::message::{Deadline, OrderId, ParkReason, TimeoutRequest};
use crate::observe::metrics::{Metrics, NO_TIMER, Outcome};
use crate::settings::TimerName;

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

/// Parks a delivery returned `count` times, near the due queue's delivery
/// limit ([`near_delivery_limit`]), with the reason `delivery_limit`.
pub(crate) async fn park_near_delivery_limit(ctx: &Context, delivery: Delivery, count: i64) {
    let error = format!(
        "returned to {DUE_QUEUE} {count} times, near its delivery limit of {DELIVERY_LIMIT}: \
         parked before the broker would drop it"
    );
    let attempts = Attempts::of_delivery(
        delivery.exchange.as_str(),
        delivery.properties.headers().as_ref(),
    )
    .failed(Utc::now(), &error);
    let why = Parking {
        kind: ParkReason::DeliveryLimit,
        error,
        order_id: None,
        attempts,
        timer: None,
    };
    park(ctx, delivery, why).await;
}

/// Why a delivery is parked: its park record (`x-error`, `x-error-kind`,
/// the order and the failure history), and the timer it is counted for
/// (`None`: not known, the message could not say or named a timer the
/// config does not have).
pub(crate) struct Parking {
    /// Short label (`x-error-kind`).
    pub(crate) kind: ParkReason,
    /// Human-readable reason (`x-error`).
    pub(crate) error: String,
    /// The order, if the message named a valid one.
    pub(crate) order_id: Option<OrderId>,
    /// Failure history including this failure.
    pub(crate) attempts: Attempts,
    /// The timer it is counted for.
    pub(crate) timer: Option<TimerName>,
}

/// Parks a delivery from the due queue for `why`, then acks it. A park the
/// broker refuses is tried again with backoff
/// ([`Context::publish_patiently`]); if it still fails, the delivery is
/// returned to the queue rather than lost.
pub(crate) async fn park(ctx: &Context, delivery: Delivery, why: Parking) {
    let Parking {
        kind,
        error,
        order_id,
        attempts,
        timer,
    } = why;
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
