//! Why a message is parked, as a value ([`ParkWhy`]), and the park record
//! built from it in one place ([`ParkWhy::parking`]): the reason
//! ([`ParkReason`]), the operator's text and the failure history that go
//! with the parked copy. Parking it is [`super::ending::park`]'s.
//!
//! Also the one decision that parks a message before anything else is
//! done with it: a delivery returned to the queue so often that the
//! broker's delivery limit is near ([`near_delivery_limit`]). Past the
//! limit a quorum queue drops the message (or dead-letters it, and the due
//! queue has no dead-letter target); parked, an operator sees and replays
//! it.

use chrono::Utc;
use lapin::types::FieldTable;

use crate::broker::headers::{Attempts, H_DELIVERY_COUNT, header_int};
use crate::broker::topology::{DELIVERY_LIMIT, DUE_QUEUE};
use crate::message::{MessageError, OrderId, ParkReason, TimeoutRequest};
use crate::settings::TimerName;
use crate::store::{IdRejected, Stores};

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
    /// Why `request`, which names a timer the config does not have, is
    /// parked: with the timers the config has (`stores`).
    pub(crate) fn unknown_timer(request: &TimeoutRequest, stores: &Stores) -> Self {
        Self::UnknownTimer {
            order_id: request.order_id.clone(),
            timer: request.timer.clone(),
            known: stores.names().iter().map(|n| n.to_string()).collect(),
        }
    }

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
    pub(crate) fn parking(self, history: &Attempts) -> Parking {
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
