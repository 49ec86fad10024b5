//! The `x-*` headers this service reads and writes, each name defined once,
//! and the failure history ([`Attempts`]) a message carries in them across
//! re-schedules, parking and replay.

use chrono::{DateTime, Utc};
use lapin::types::{AMQPValue, FieldTable};

use super::topology::ENTRY_EXCHANGE;
use crate::message::format_instant;

/// Header: the deadline (Unix epoch milliseconds) a re-scheduled message
/// waits for. It overrides the body's deadline, which stays as the order
/// service sent it (e.g. after the order row's deadline was extended).
pub(crate) const H_DEADLINE_MS: &str = "x-deadline-ms";
/// Header on parked messages: a short machine-readable reason.
pub(crate) const H_ERROR_KIND: &str = "x-error-kind";
/// Header on parked messages: the order id, when the body had one.
pub(crate) const H_ORDER_ID: &str = "x-order-id";
/// Header on parked messages: the queue the message was consumed from.
pub(crate) const H_SOURCE_QUEUE: &str = "x-source-queue";
/// Header on parked messages: the exchange it was last published to.
pub(crate) const H_SOURCE_EXCHANGE: &str = "x-source-exchange";
/// Header on parked messages: the routing key it was last published with.
pub(crate) const H_SOURCE_ROUTING_KEY: &str = "x-source-routing-key";
/// Header on parked messages: when it was parked (RFC 3339).
pub(crate) const H_PARKED_AT: &str = "x-parked-at";
/// Names one parked copy (a random UUID): the parked store keeps a copy
/// moved into it twice (a crash between its insert and its ack) once.
pub(crate) const H_PARKED_ID: &str = "x-parked-id";

/// Header: failed attempts so far.
pub(crate) const H_ATTEMPTS: &str = "x-attempts";
/// Header: first failure time (RFC 3339).
pub(crate) const H_FIRST_FAILURE: &str = "x-first-failure";
/// Header: last failure time (RFC 3339).
pub(crate) const H_LAST_FAILURE: &str = "x-last-failure";
/// Header: the last error's text.
pub(crate) const H_ERROR: &str = "x-error";

/// A message's failure history, carried in its headers across re-schedules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Attempts {
    /// Failed attempts so far (0 for a message that never failed).
    pub count: u32,
    /// When it first failed.
    pub first_failure: Option<DateTime<Utc>>,
    /// When it last failed.
    pub last_failure: Option<DateTime<Utc>>,
    /// Why it last failed.
    pub last_error: Option<String>,
}

impl Attempts {
    /// Reads the history from message headers; absent or malformed headers
    /// read as "no failures yet". The count saturates: any number past
    /// `u32::MAX` (or a huge one in a string or a float) is `u32::MAX`, a
    /// negative one 0 — never a wrap-around that would start the retries
    /// over.
    pub(crate) fn from_headers(headers: Option<&FieldTable>) -> Self {
        let Some(headers) = headers else {
            return Self::default();
        };
        let map = headers.inner();
        let time = |k: &str| {
            header_str(map.get(k)).and_then(|s| {
                DateTime::parse_from_rfc3339(&s)
                    .ok()
                    .map(|t| t.with_timezone(&Utc))
            })
        };
        Self {
            count: map.get(H_ATTEMPTS).map_or(0, attempt_count),
            first_failure: time(H_FIRST_FAILURE),
            last_failure: time(H_LAST_FAILURE),
            last_error: header_str(map.get(H_ERROR)),
        }
    }

    /// The history a delivery carries, if this service wrote it: a message
    /// as the order service published it ([`from_the_sender`]) starts with
    /// none, whatever its headers say. The history headers are the
    /// service's own bookkeeping; a sender's `x-attempts: 999` (a header
    /// copied from a consumed message, a test tool, a mistake) would
    /// otherwise park the order on its first transient failure and skip
    /// every retry.
    pub(crate) fn of_delivery(exchange: &str, headers: Option<&FieldTable>) -> Self {
        if from_the_sender(exchange, headers) {
            let claimed = headers.is_some_and(|h| {
                HISTORY_HEADERS
                    .iter()
                    .any(|name| h.inner().contains_key(*name))
            });
            if claimed {
                tracing::info!(
                    "the message's failure history headers (x-attempts, x-first-failure, …) \
                     came from its sender, not from this service: ignored, the order gets \
                     its full retry budget"
                );
            }
            Self::default()
        } else {
            Self::from_headers(headers)
        }
    }

    /// The history after one more failure at `now` with `error` (the count
    /// stays at `u32::MAX` once there).
    pub(crate) fn failed(&self, now: DateTime<Utc>, error: impl Into<String>) -> Self {
        Self {
            count: self.count.saturating_add(1),
            first_failure: Some(self.first_failure.unwrap_or(now)),
            last_failure: Some(now),
            last_error: Some(error.into()),
        }
    }

    /// Writes the history into `headers` (only the fields that are set).
    pub(crate) fn write(&self, headers: &mut FieldTable) {
        if self.count == 0 {
            return;
        }
        headers.insert(H_ATTEMPTS.into(), AMQPValue::LongLongInt(self.count.into()));
        if let Some(t) = self.first_failure {
            headers.insert(
                H_FIRST_FAILURE.into(),
                AMQPValue::LongString(format_instant(t).as_str().into()),
            );
        }
        if let Some(t) = self.last_failure {
            headers.insert(
                H_LAST_FAILURE.into(),
                AMQPValue::LongString(format_instant(t).as_str().into()),
            );
        }
        if let Some(e) = &self.last_error {
            headers.insert(H_ERROR.into(), AMQPValue::LongString(e.as_str().into()));
        }
    }
}

/// The headers of a failure history ([`Attempts`]).
const HISTORY_HEADERS: [&str; 4] = [H_ATTEMPTS, H_FIRST_FAILURE, H_LAST_FAILURE, H_ERROR];

/// RabbitMQ's note on a dead-lettered message of the exchange it was first
/// published to.
const H_FIRST_DEATH_EXCHANGE: &str = "x-first-death-exchange";

/// Whether a delivery is a message as the order service published it, not
/// one this service re-scheduled: it came through the entry exchange,
/// straight to the due queue (`delivery.exchange` is the entry exchange)
/// or through a lane entry, which dead-letters it to the due queue (its
/// first death names the entry exchange). The service's own re-schedules
/// go to the cascade's exchanges or, for lanes, through the default
/// exchange, never through the entry exchange.
pub(crate) fn from_the_sender(exchange: &str, headers: Option<&FieldTable>) -> bool {
    exchange == ENTRY_EXCHANGE
        || headers
            .and_then(|h| header_str(h.inner().get(H_FIRST_DEATH_EXCHANGE)))
            .is_some_and(|first| first == ENTRY_EXCHANGE)
}

/// The attempt count an `x-attempts` value says, saturated to `u32`: an
/// integer of any width, a timestamp, a float, or a number in a string;
/// anything else (a boolean, a table, text that is no number) is 0.
fn attempt_count(value: &AMQPValue) -> u32 {
    fn saturate(n: i128) -> u32 {
        u32::try_from(n.max(0)).unwrap_or(u32::MAX)
    }
    fn from_float(x: f64) -> u32 {
        // `as` saturates (NaN is 0).
        x as u32
    }
    match value {
        AMQPValue::Timestamp(n) => saturate(i128::from(*n)),
        AMQPValue::Float(x) => from_float(f64::from(*x)),
        AMQPValue::Double(x) => from_float(*x),
        AMQPValue::LongString(_) | AMQPValue::ShortString(_) => {
            let text = header_str(Some(value)).unwrap_or_default();
            let text = text.trim();
            match text.parse::<i128>() {
                Ok(n) => saturate(n),
                Err(_) => text.parse::<f64>().map_or(0, from_float),
            }
        }
        other => header_int(other).map_or(0, |n| saturate(i128::from(n))),
    }
}

/// An integer header value of any AMQP integer width.
pub fn header_int(value: &AMQPValue) -> Option<i64> {
    match value {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some((*n).into()),
        AMQPValue::LongUInt(n) => Some((*n).into()),
        AMQPValue::ShortInt(n) => Some((*n).into()),
        AMQPValue::ShortUInt(n) => Some((*n).into()),
        AMQPValue::ShortShortInt(n) => Some((*n).into()),
        AMQPValue::ShortShortUInt(n) => Some((*n).into()),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok(),
        _ => None,
    }
}

/// A string header value (long or short string).
pub fn header_str(value: Option<&AMQPValue>) -> Option<String> {
    match value? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// Header RabbitMQ quorum queues put on a redelivered message: how many
/// times it was returned to the queue (each listing pass counts one).
pub(crate) const H_DELIVERY_COUNT: &str = "x-delivery-count";

/// The deadline header of a re-scheduled message, if present.
pub(crate) fn deadline_header(headers: Option<&FieldTable>) -> Option<DateTime<Utc>> {
    let ms = header_int(headers?.inner().get(H_DEADLINE_MS)?)?;
    DateTime::from_timestamp_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_round_trips_through_headers() {
        let t0 = DateTime::parse_from_rfc3339("2026-11-21T10:00:00.125Z")
            .unwrap()
            .with_timezone(&Utc);
        let a = Attempts::default()
            .failed(t0, "first")
            .failed(t0 + chrono::Duration::seconds(2), "db down");
        let mut headers = FieldTable::default();
        a.write(&mut headers);
        let back = Attempts::from_headers(Some(&headers));
        assert_eq!(back, a);
        assert_eq!(back.count, 2);
        assert_eq!(back.first_failure, Some(t0));
        assert_eq!(Attempts::from_headers(None), Attempts::default());
    }

    #[test]
    fn a_senders_history_is_not_the_services() {
        let mut headers = FieldTable::default();
        Attempts::default()
            .failed(Utc::now(), "copied")
            .write(&mut headers);
        headers.insert(H_ATTEMPTS.into(), AMQPValue::LongLongInt(999));
        // Straight from the entry exchange, or dead-lettered out of a lane
        // it entered through the entry exchange: the sender's.
        assert_eq!(
            Attempts::of_delivery(ENTRY_EXCHANGE, Some(&headers)),
            Attempts::default()
        );
        let mut laned = headers.clone();
        laned.insert(
            H_FIRST_DEATH_EXCHANGE.into(),
            AMQPValue::LongString(ENTRY_EXCHANGE.into()),
        );
        assert_eq!(
            Attempts::of_delivery("order-timeout.ready", Some(&laned)),
            Attempts::default()
        );
        // Out of the cascade or a lane the service re-scheduled it into
        // (first published to a delay exchange or the default exchange).
        for first in ["order-timeout.delay.03", ""] {
            let mut ours = headers.clone();
            ours.insert(
                H_FIRST_DEATH_EXCHANGE.into(),
                AMQPValue::LongString(first.into()),
            );
            assert_eq!(
                Attempts::of_delivery("order-timeout.ready", Some(&ours)).count,
                999
            );
        }
        assert_eq!(Attempts::of_delivery("", Some(&headers)).count, 999);
    }

    fn count_of(value: AMQPValue) -> u32 {
        let mut headers = FieldTable::default();
        headers.insert(H_ATTEMPTS.into(), value);
        Attempts::from_headers(Some(&headers)).count
    }

    #[test]
    fn attempt_counts_saturate_and_never_wrap_to_zero() {
        let max = u32::MAX;
        assert_eq!(count_of(AMQPValue::LongLongInt(4_294_967_295)), max);
        assert_eq!(count_of(AMQPValue::LongLongInt(4_294_967_296)), max);
        assert_eq!(count_of(AMQPValue::LongLongInt(i64::MAX)), max);
        assert_eq!(count_of(AMQPValue::LongUInt(max)), max);
        assert_eq!(count_of(AMQPValue::Timestamp(u64::MAX)), max);
        assert_eq!(count_of(AMQPValue::Double(1e300)), max);
        assert_eq!(count_of(AMQPValue::Double(f64::INFINITY)), max);
        assert_eq!(
            count_of(AMQPValue::LongString("99999999999999999999999".into())),
            max
        );
        assert_eq!(count_of(AMQPValue::LongString(" 7 ".into())), 7);
        assert_eq!(count_of(AMQPValue::LongLongInt(-1)), 0);
        assert_eq!(count_of(AMQPValue::LongLongInt(i64::MIN)), 0);
        assert_eq!(count_of(AMQPValue::ShortShortInt(-5)), 0);
        assert_eq!(count_of(AMQPValue::Double(f64::NAN)), 0);
        assert_eq!(count_of(AMQPValue::Boolean(true)), 0);
        assert_eq!(count_of(AMQPValue::LongString("many".into())), 0);
        assert_eq!(count_of(AMQPValue::ShortInt(3)), 3);

        let most = Attempts {
            count: max,
            ..Default::default()
        };
        assert_eq!(most.failed(Utc::now(), "again").count, max);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn any_value() -> impl Strategy<Value = AMQPValue> {
            prop_oneof![
                any::<i64>().prop_map(AMQPValue::LongLongInt),
                any::<i32>().prop_map(AMQPValue::LongInt),
                any::<u32>().prop_map(AMQPValue::LongUInt),
                any::<i16>().prop_map(AMQPValue::ShortInt),
                any::<u16>().prop_map(AMQPValue::ShortUInt),
                any::<i8>().prop_map(AMQPValue::ShortShortInt),
                any::<u8>().prop_map(AMQPValue::ShortShortUInt),
                any::<u64>().prop_map(AMQPValue::Timestamp),
                any::<f32>().prop_map(AMQPValue::Float),
                any::<f64>().prop_map(AMQPValue::Double),
                any::<bool>().prop_map(AMQPValue::Boolean),
                ".{0,40}".prop_map(|s| AMQPValue::LongString(s.as_str().into())),
                any::<i128>().prop_map(|n| AMQPValue::LongString(n.to_string().as_str().into())),
            ]
        }

        proptest! {
            /// Any value reads without a panic as a count that one more
            /// failure never lowers, and what the service writes back
            /// reads as the same count.
            #[test]
            fn any_attempts_header_reads_saturated_and_round_trips(
                value in any_value(),
                first in proptest::option::of(".{0,40}"),
            ) {
                let mut headers = FieldTable::default();
                headers.insert(H_ATTEMPTS.into(), value.clone());
                if let Some(first) = first {
                    headers.insert(H_FIRST_FAILURE.into(), AMQPValue::LongString(first.as_str().into()));
                }
                let read = Attempts::from_headers(Some(&headers));
                let wide = match &value {
                    AMQPValue::LongLongInt(n) => Some(i128::from(*n)),
                    AMQPValue::LongInt(n) => Some(i128::from(*n)),
                    AMQPValue::LongUInt(n) => Some(i128::from(*n)),
                    AMQPValue::Timestamp(n) => Some(i128::from(*n)),
                    _ => None,
                };
                if let Some(n) = wide {
                    prop_assert_eq!(i128::from(read.count), n.clamp(0, i128::from(u32::MAX)));
                }
                let after = read.failed(Utc::now(), "again");
                prop_assert!(after.count >= read.count);
                prop_assert!(after.count > 0);
                let mut written = FieldTable::default();
                after.write(&mut written);
                prop_assert_eq!(Attempts::from_headers(Some(&written)).count, after.count);
            }
        }
    }
}
