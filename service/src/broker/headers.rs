//! The `x-*` headers this service reads and writes, each name defined once,
//! and the failure history ([`Attempts`]) a message carries in them across
//! re-schedules, parking and replay.

use chrono::{DateTime, Utc};
use lapin::types::{AMQPValue, FieldTable};

use crate::message::format_instant;

/// Header: the deadline (Unix epoch milliseconds) a re-scheduled message
/// waits for. It overrides the body's deadline, which stays as the order
/// service sent it (e.g. after the order row's deadline was extended).
pub const H_DEADLINE_MS: &str = "x-deadline-ms";
/// Header on parked messages: a short machine-readable reason.
pub const H_ERROR_KIND: &str = "x-error-kind";
/// Header on parked messages: the order id, when the body had one.
pub const H_ORDER_ID: &str = "x-order-id";
/// Header on parked messages: the queue the message was consumed from.
pub const H_SOURCE_QUEUE: &str = "x-source-queue";
/// Header on parked messages: the exchange it was last published to.
pub const H_SOURCE_EXCHANGE: &str = "x-source-exchange";
/// Header on parked messages: the routing key it was last published with.
pub const H_SOURCE_ROUTING_KEY: &str = "x-source-routing-key";
/// Header on parked messages: when it was parked (RFC 3339).
pub const H_PARKED_AT: &str = "x-parked-at";

/// Header: failed attempts so far.
pub const H_ATTEMPTS: &str = "x-attempts";
/// Header: first failure time (RFC 3339).
pub const H_FIRST_FAILURE: &str = "x-first-failure";
/// Header: last failure time (RFC 3339).
pub const H_LAST_FAILURE: &str = "x-last-failure";
/// Header: the last error's text.
pub const H_ERROR: &str = "x-error";

/// A message's failure history, carried in its headers across re-schedules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attempts {
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
    /// read as "no failures yet".
    pub fn from_headers(headers: Option<&FieldTable>) -> Self {
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
            count: map
                .get(H_ATTEMPTS)
                .and_then(header_int)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
            first_failure: time(H_FIRST_FAILURE),
            last_failure: time(H_LAST_FAILURE),
            last_error: header_str(map.get(H_ERROR)),
        }
    }

    /// The history after one more failure at `now` with `error`.
    pub fn failed(&self, now: DateTime<Utc>, error: impl Into<String>) -> Self {
        Self {
            count: self.count + 1,
            first_failure: Some(self.first_failure.unwrap_or(now)),
            last_failure: Some(now),
            last_error: Some(error.into()),
        }
    }

    /// Writes the history into `headers` (only the fields that are set).
    pub fn write(&self, headers: &mut FieldTable) {
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
pub const H_DELIVERY_COUNT: &str = "x-delivery-count";

/// The deadline header of a re-scheduled message, if present.
pub fn deadline_header(headers: Option<&FieldTable>) -> Option<DateTime<Utc>> {
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
}
