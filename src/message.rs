//! The timeout message: what the order service publishes, parsed into domain
//! types once at the edge so the rest of the service never sees raw JSON.
//!
//! Accepted bodies (a JSON object, unknown fields ignored; or a bare id):
//! - `{"order_id": "A1", "cancel_at": "2026-11-21T10:30:00.000Z"}`
//! - `{"order_id": "A1", "created_at": "2026-11-21T10:00:00+08:00", "timeout_ms": 1800000}`
//! - `{"order_id": "A1"}`: the deadline is the order row's (`[orders].deadline`);
//! - `"A1"` or `12345` alone: the same as `{"order_id": …}` (many shops
//!   publish only the id).
//!
//! `order_id` is a JSON string or integer. An object may name its timer
//! (`"timer": "auto_receive"`, a `[[timers]]` name of the config); without
//! it, and for every bare id, the message is for the default timer,
//! `cancel_unpaid`. Everything else is a [`MessageError`], which the
//! consumer parks with the error's text.

use std::fmt;

use chrono::{DateTime, Datelike, Duration as ChronoDuration, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::settings::TimerName;

/// Longest order id accepted. Ids travel in AMQP headers and gRPC calls;
/// a kilobyte-long id is a bug upstream, not an order.
pub const MAX_ORDER_ID_LEN: usize = 128;
/// Longest timeout accepted in `timeout_ms`: 10 years.
pub const MAX_TIMEOUT_MS: u64 = 10 * 366 * 24 * 3600 * 1000;
/// Deadlines outside [2000, 2100) are absurd: almost surely a unit mix-up
/// (seconds for milliseconds) or a zero value upstream.
pub const MIN_YEAR: i32 = 2000;
/// See [`MIN_YEAR`].
pub const MAX_YEAR_EXCLUSIVE: i32 = 2100;

/// Why a message body was rejected. The `Display` text is what operators
/// see in the parked queue's `x-error` header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// Nothing to read.
    #[error("empty body")]
    Empty,
    /// Over `max_body_bytes`; not read.
    #[error("body is {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        /// The body's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Not UTF-8.
    #[error("body is not valid UTF-8")]
    NotUtf8,
    /// Not JSON (the parser's message).
    #[error("body is not JSON: {0}")]
    NotJson(String),
    /// JSON, but not one of the accepted forms.
    #[error("body is neither a JSON object nor a bare order id")]
    NotObject,
    /// No `order_id`.
    #[error("missing order_id")]
    MissingOrderId,
    /// An `order_id` of the wrong type or shape (why).
    #[error("invalid order_id: {0}")]
    InvalidOrderId(String),
    /// Another field of the wrong type or value.
    #[error("invalid {field}: {reason}")]
    InvalidField {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Fields that contradict each other (which).
    #[error("{0}")]
    Ambiguous(&'static str),
}

impl MessageError {
    /// Why such a message is parked (`x-error-kind`, the metrics label).
    pub fn kind(&self) -> ParkReason {
        match self {
            Self::Empty => ParkReason::Empty,
            Self::TooLarge { .. } => ParkReason::TooLarge,
            Self::NotUtf8 => ParkReason::NotUtf8,
            Self::NotJson(_) => ParkReason::NotJson,
            Self::NotObject => ParkReason::NotObject,
            Self::MissingOrderId => ParkReason::MissingOrderId,
            Self::InvalidOrderId(_) => ParkReason::InvalidOrderId,
            Self::InvalidField { .. } => ParkReason::InvalidField,
            Self::Ambiguous(_) => ParkReason::Ambiguous,
        }
    }
}

/// Why a message was parked: a short, stable label, written as the parked
/// message's `x-error-kind` header and used as the `reason` label of
/// `order_timeout_parked_total`. Operators filter and alert on these, so
/// the strings are part of the contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParkReason {
    /// The body is empty.
    Empty,
    /// The body is over `max_body_bytes`.
    TooLarge,
    /// The body is not UTF-8.
    NotUtf8,
    /// The body is not JSON.
    NotJson,
    /// The body is JSON but not an object.
    NotObject,
    /// No `order_id`.
    MissingOrderId,
    /// An `order_id` of the wrong type or shape.
    InvalidOrderId,
    /// Another field of the wrong type or value.
    InvalidField,
    /// Both `cancel_at` and `timeout_ms` (or a half of the latter).
    Ambiguous,
    /// A `timer` the service's config has no timer of that name for.
    UnknownTimer,
    /// No order row with that id.
    UnknownOrder,
    /// Transient failures went on for `retry.max_attempts` attempts.
    RetriesExhausted,
    /// A failure waiting cannot fix (a configuration or SQL error about
    /// the statement or the data, an inventory answer such as
    /// `FAILED_PRECONDITION`): parked at once, after one attempt.
    PermanentFailure,
    /// Returned to the due queue so often that the broker's delivery limit
    /// was near: parked before the broker would drop it.
    DeliveryLimit,
    /// A stock release that can never succeed (the inventory refused it
    /// for good, or the sweeper's attempts ran out): the outbox row is
    /// given up and the sweeper no longer takes it; replaying the message
    /// tries the release again.
    ReleaseFailed,
}

impl ParkReason {
    /// Every reason, in a fixed order (the parked-counter series that exist
    /// from the start). Reasons are only ever added, never renamed.
    pub const ALL: [ParkReason; 15] = [
        ParkReason::Empty,
        ParkReason::TooLarge,
        ParkReason::NotUtf8,
        ParkReason::NotJson,
        ParkReason::NotObject,
        ParkReason::MissingOrderId,
        ParkReason::InvalidOrderId,
        ParkReason::InvalidField,
        ParkReason::Ambiguous,
        ParkReason::UnknownOrder,
        ParkReason::RetriesExhausted,
        ParkReason::PermanentFailure,
        ParkReason::DeliveryLimit,
        ParkReason::ReleaseFailed,
        ParkReason::UnknownTimer,
    ];

    /// The label, e.g. `not_json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::TooLarge => "too_large",
            Self::NotUtf8 => "not_utf8",
            Self::NotJson => "not_json",
            Self::NotObject => "not_object",
            Self::MissingOrderId => "missing_order_id",
            Self::InvalidOrderId => "invalid_order_id",
            Self::InvalidField => "invalid_field",
            Self::Ambiguous => "ambiguous",
            Self::UnknownOrder => "unknown_order",
            Self::RetriesExhausted => "retries_exhausted",
            Self::PermanentFailure => "permanent_failure",
            Self::DeliveryLimit => "delivery_limit",
            Self::ReleaseFailed => "release_failed",
            Self::UnknownTimer => "unknown_timer",
        }
    }
}

impl fmt::Display for ParkReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An order id: non-empty, at most [`MAX_ORDER_ID_LEN`] bytes, no control
/// characters. Integers in the JSON become their decimal string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct OrderId(String);

impl OrderId {
    /// Parses an id from its text form.
    pub fn parse(raw: &str) -> Result<Self, MessageError> {
        if raw.trim().is_empty() {
            return Err(MessageError::InvalidOrderId("empty".into()));
        }
        if raw.len() > MAX_ORDER_ID_LEN {
            return Err(MessageError::InvalidOrderId(format!(
                "{} bytes, over {MAX_ORDER_ID_LEN}",
                raw.len()
            )));
        }
        if raw.chars().any(char::is_control) {
            return Err(MessageError::InvalidOrderId(
                "contains control characters".into(),
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    fn from_json(value: &Value) -> Result<Self, MessageError> {
        match value {
            Value::String(s) => Self::parse(s),
            Value::Number(n) if n.is_i64() || n.is_u64() => Self::parse(&n.to_string()),
            Value::Number(_) => Err(MessageError::InvalidOrderId(
                "a number that is not an integer".into(),
            )),
            Value::Null => Err(MessageError::MissingOrderId),
            other => Err(MessageError::InvalidOrderId(format!(
                "expected a string or integer, got {}",
                json_type(other)
            ))),
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// When the order's payment window closes, as far as the message knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// An instant given by the message (`cancel_at`, or `created_at + timeout_ms`).
    At(DateTime<Utc>),
    /// The message named only the order: read `orders.expires_at`.
    FromOrderRow,
}

/// A parsed timeout message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeoutRequest {
    /// The order to cancel if still unpaid (the row to flip, for another
    /// timer).
    pub order_id: OrderId,
    /// When, per the message.
    pub deadline: Deadline,
    /// The timer the message is for: its `"timer"` field, else the default
    /// one (`cancel_unpaid`). Whether the config has it is the consumer's
    /// check.
    pub timer: TimerName,
}

impl TimeoutRequest {
    /// Parses a message body, enforcing `max_bytes`.
    pub fn parse(body: &[u8], max_bytes: usize) -> Result<Self, MessageError> {
        if body.len() > max_bytes {
            return Err(MessageError::TooLarge {
                size: body.len(),
                limit: max_bytes,
            });
        }
        let text = std::str::from_utf8(body).map_err(|_| MessageError::NotUtf8)?;
        if text.trim().is_empty() {
            return Err(MessageError::Empty);
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| MessageError::NotJson(e.to_string()))?;
        let fields = match value {
            Value::Object(fields) => fields,
            // A bare id: the deadline is the row's.
            bare @ (Value::String(_) | Value::Number(_)) => {
                return Ok(Self {
                    order_id: OrderId::from_json(&bare)?,
                    deadline: Deadline::FromOrderRow,
                    timer: TimerName::default_timer(),
                });
            }
            _ => return Err(MessageError::NotObject),
        };
        let order_id =
            OrderId::from_json(fields.get("order_id").ok_or(MessageError::MissingOrderId)?)?;
        let timer = parse_timer(fields.get("timer"))?;
        Ok(Self {
            order_id,
            deadline: parse_deadline(&fields)?,
            timer,
        })
    }

    /// A request for the default timer (`cancel_unpaid`).
    pub fn new(order_id: OrderId, deadline: Deadline) -> Self {
        Self {
            order_id,
            deadline,
            timer: TimerName::default_timer(),
        }
    }

    /// The canonical body this service's own publisher sends. It parses
    /// back to the same request: a deadline finer than the wire's
    /// milliseconds keeps its digits.
    /// The default timer's name is left out, so its messages are the ones
    /// every version of the contract knows.
    pub fn to_json(&self) -> Vec<u8> {
        let mut value = match self.deadline {
            Deadline::At(at) => serde_json::json!({
                "order_id": self.order_id,
                "cancel_at": if at.timestamp_subsec_nanos() % 1_000_000 == 0 {
                    format_instant(at)
                } else {
                    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
                },
            }),
            Deadline::FromOrderRow => serde_json::json!({ "order_id": self.order_id }),
        };
        if !self.timer.is_default() {
            value["timer"] = Value::from(self.timer.as_str());
        }
        // A `Value` of strings only: serializing it cannot fail.
        serde_json::to_vec(&value).unwrap_or_default()
    }
}

/// RFC 3339 in UTC with milliseconds, the form used on the wire.
pub fn format_instant(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn parse_instant(field: &'static str, value: &Value) -> Result<DateTime<Utc>, MessageError> {
    let Value::String(text) = value else {
        return Err(MessageError::InvalidField {
            field,
            reason: format!("expected an RFC 3339 string, got {}", json_type(value)),
        });
    };
    let at = DateTime::parse_from_rfc3339(text)
        .map_err(|e| MessageError::InvalidField {
            field,
            reason: format!("{text:?} is not RFC 3339: {e}"),
        })?
        .with_timezone(&Utc);
    check_year(field, at)?;
    Ok(at)
}

/// The deadline a JSON object gives: `cancel_at`, or `created_at` plus
/// `timeout_ms`, or neither (the row's deadline); both forms, or half of
/// the second, are refused.
fn parse_deadline(fields: &serde_json::Map<String, Value>) -> Result<Deadline, MessageError> {
    let present = |name: &str| fields.get(name).is_some_and(|v| !v.is_null());
    Ok(
        match (
            present("cancel_at"),
            present("created_at"),
            present("timeout_ms"),
        ) {
            (false, false, false) => Deadline::FromOrderRow,
            (true, false, false) => Deadline::At(parse_instant("cancel_at", &fields["cancel_at"])?),
            (false, true, true) => {
                let created = parse_instant("created_at", &fields["created_at"])?;
                let timeout = parse_timeout_ms(&fields["timeout_ms"])?;
                let at = created + timeout;
                check_year("created_at + timeout_ms", at)?;
                Deadline::At(at)
            }
            (true, _, _) => {
                return Err(MessageError::Ambiguous(
                    "cancel_at given together with created_at/timeout_ms; send one form",
                ));
            }
            (false, true, false) => {
                return Err(MessageError::InvalidField {
                    field: "timeout_ms",
                    reason: "missing (created_at needs timeout_ms)".into(),
                });
            }
            (false, false, true) => {
                return Err(MessageError::InvalidField {
                    field: "created_at",
                    reason: "missing (timeout_ms needs created_at)".into(),
                });
            }
        },
    )
}

/// The `timer` field: absent or null is the default timer; otherwise a
/// string that is a timer name (`[a-z0-9_]{1,64}`).
fn parse_timer(value: Option<&Value>) -> Result<TimerName, MessageError> {
    match value {
        None | Some(Value::Null) => Ok(TimerName::default_timer()),
        Some(Value::String(name)) => {
            TimerName::parse(name).map_err(|reason| MessageError::InvalidField {
                field: "timer",
                reason,
            })
        }
        Some(other) => Err(MessageError::InvalidField {
            field: "timer",
            reason: format!(
                "expected a timer's name (a string), got {}",
                json_type(other)
            ),
        }),
    }
}

fn check_year(field: &'static str, at: DateTime<Utc>) -> Result<(), MessageError> {
    if (MIN_YEAR..MAX_YEAR_EXCLUSIVE).contains(&at.year()) {
        Ok(())
    } else {
        Err(MessageError::InvalidField {
            field,
            reason: format!(
                "{} is outside {MIN_YEAR}..{MAX_YEAR_EXCLUSIVE}",
                format_instant(at)
            ),
        })
    }
}

fn parse_timeout_ms(value: &Value) -> Result<ChronoDuration, MessageError> {
    let invalid = |reason: String| MessageError::InvalidField {
        field: "timeout_ms",
        reason,
    };
    match value {
        Value::Number(n) => match n.as_u64() {
            Some(ms) if ms <= MAX_TIMEOUT_MS => Ok(ChronoDuration::milliseconds(ms as i64)),
            Some(ms) => Err(invalid(format!("{ms} is over the {MAX_TIMEOUT_MS} limit"))),
            None if n.as_i64().is_some() => Err(invalid(format!("{n} is negative"))),
            None => Err(invalid(format!("{n} is not a whole number"))),
        },
        other => Err(invalid(format!(
            "expected an integer, got {}",
            json_type(other)
        ))),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 64 * 1024;

    fn parse(body: &str) -> Result<TimeoutRequest, MessageError> {
        TimeoutRequest::parse(body.as_bytes(), MAX)
    }

    fn at(s: &str) -> Deadline {
        Deadline::At(DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc))
    }

    #[test]
    fn accepts_every_documented_form() {
        let r =
            parse(r#"{"order_id":"202611210001","cancel_at":"2026-11-21T10:30:00.000Z"}"#).unwrap();
        assert_eq!(r.order_id.as_str(), "202611210001");
        assert_eq!(r.deadline, at("2026-11-21T10:30:00Z"));

        let r = parse(r#"{"order_id":42,"cancel_at":"2026-11-21T18:30:00.250+08:00"}"#).unwrap();
        assert_eq!(r.order_id.as_str(), "42");
        assert_eq!(r.deadline, at("2026-11-21T10:30:00.250Z"));

        let r = parse(
            r#"{"order_id":"a","created_at":"2026-11-21T10:00:00Z","timeout_ms":1800000,"x":[1]}"#,
        )
        .unwrap();
        assert_eq!(r.deadline, at("2026-11-21T10:30:00Z"));

        let r = parse(r#"{"order_id":"a"}"#).unwrap();
        assert_eq!(r.deadline, Deadline::FromOrderRow);
        assert!(r.timer.is_default());

        // A timer by name; null is the default one.
        let r =
            parse(r#"{"order_id":"a","timer":"auto_receive","cancel_at":"2026-11-21T10:30:00Z"}"#)
                .unwrap();
        assert_eq!(r.timer.as_str(), "auto_receive");
        assert_eq!(r.deadline, at("2026-11-21T10:30:00Z"));
        let r = parse(r#"{"order_id":"a","timer":null}"#).unwrap();
        assert!(r.timer.is_default());
        let r = parse(r#"{"order_id":"a","cancel_at":null}"#).unwrap();
        assert_eq!(r.deadline, Deadline::FromOrderRow);

        // A bare id, string or integer: the deadline is the row's.
        let r = parse(r#""A-1""#).unwrap();
        assert_eq!(
            (r.order_id.as_str(), r.deadline),
            ("A-1", Deadline::FromOrderRow)
        );
        let r = parse(" 12345\n").unwrap();
        assert_eq!(
            (r.order_id.as_str(), r.deadline),
            ("12345", Deadline::FromOrderRow)
        );
        for bad in [r#""""#, "1.5", "-0.5", "true", "null"] {
            assert!(parse(bad).is_err(), "{bad} is not an order id");
        }
    }

    #[test]
    fn round_trips_its_own_form() {
        for body in [
            r#"{"order_id":"a","cancel_at":"2026-11-21T10:30:00.123Z"}"#,
            r#"{"order_id":"a","cancel_at":"2026-11-21T10:30:00.123Z","timer":"coupon_expiry"}"#,
            r#"{"order_id":7,"timer":"auto_receive"}"#,
        ] {
            let r = parse(body).unwrap();
            assert_eq!(
                TimeoutRequest::parse(&r.to_json(), MAX).unwrap(),
                r,
                "{}",
                String::from_utf8_lossy(&r.to_json())
            );
        }
        // The default timer's messages stay as they were.
        let r = parse(r#"{"order_id":"a","timer":"cancel_unpaid"}"#).unwrap();
        assert_eq!(r.to_json(), br#"{"order_id":"a"}"#);
    }

    #[test]
    #[allow(clippy::too_many_lines)] // one table of cases
    fn rejects_bad_bodies_with_a_clear_reason() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "empty"),
            (b"  \n", "empty"),
            (b"\xff\xfe", "not_utf8"),
            (b"{not json", "not_json"),
            (b"[1,2]", "not_object"),
            (b"{}", "missing_order_id"),
            (br#"{"order_id":null}"#, "missing_order_id"),
            (br#"{"order_id":""}"#, "invalid_order_id"),
            (br#"{"order_id":"  "}"#, "invalid_order_id"),
            (br#"{"order_id":1.5}"#, "invalid_order_id"),
            (br#"{"order_id":true}"#, "invalid_order_id"),
            (br#"{"order_id":{"a":1}}"#, "invalid_order_id"),
            (br#"{"order_id":["a"]}"#, "invalid_order_id"),
            (br#"{"order_id":"a\u0000b"}"#, "invalid_order_id"),
            (
                br#"{"order_id":"a","cancel_at":"tomorrow"}"#,
                "invalid_field",
            ),
            (
                br#"{"order_id":"a","cancel_at":1700000000}"#,
                "invalid_field",
            ),
            (
                br#"{"order_id":"a","cancel_at":"1970-01-01T00:00:00Z"}"#,
                "invalid_field",
            ),
            (
                br#"{"order_id":"a","cancel_at":"2150-01-01T00:00:00Z"}"#,
                "invalid_field",
            ),
            (
                br#"{"order_id":"a","created_at":"2026-11-21T10:00:00Z","timeout_ms":-5}"#,
                "invalid_field",
            ),
            (
                br#"{"order_id":"a","created_at":"2026-11-21T10:00:00Z","timeout_ms":1.5}"#,
                "invalid_field",
            ),
            (
                br#"{"order_id":"a","created_at":"2026-11-21T10:00:00Z","timeout_ms":"5"}"#,
                "invalid_field",
            ),
            (
                br#"{"order_id":"a","created_at":"2026-11-21T10:00:00Z"}"#,
                "invalid_field",
            ),
            (br#"{"order_id":"a","timeout_ms":5}"#, "invalid_field"),
            (
                br#"{"order_id":"a","timer":"Auto-Receive"}"#,
                "invalid_field",
            ),
            (br#"{"order_id":"a","timer":""}"#, "invalid_field"),
            (br#"{"order_id":"a","timer":3}"#, "invalid_field"),
            (
                br#"{"order_id":"a","cancel_at":"2026-11-21T10:00:00Z","timeout_ms":5}"#,
                "ambiguous",
            ),
        ];
        for (body, kind) in cases {
            let err = TimeoutRequest::parse(body, MAX).unwrap_err();
            assert_eq!(
                err.kind().as_str(),
                *kind,
                "{:?} -> {err}",
                String::from_utf8_lossy(body)
            );
            assert!(!err.to_string().is_empty());
        }
        let long_id = format!(r#"{{"order_id":"{}"}}"#, "x".repeat(MAX_ORDER_ID_LEN + 1));
        assert_eq!(
            parse(&long_id).unwrap_err().kind().as_str(),
            "invalid_order_id"
        );
        let big = format!(r#"{{"order_id":"a","pad":"{}"}}"#, "x".repeat(MAX));
        assert_eq!(parse(&big).unwrap_err().kind().as_str(), "too_large");
    }

    mod properties {
        use super::*;
        use chrono::FixedOffset;
        use proptest::prelude::*;
        use serde_json::{Map, Number};

        /// Accepted requests parse back from their own body unchanged.
        fn assert_round_trips(r: &TimeoutRequest) -> Result<(), TestCaseError> {
            let body = r.to_json();
            let back = TimeoutRequest::parse(&body, MAX);
            prop_assert_eq!(back.as_ref(), Ok(r), "{}", String::from_utf8_lossy(&body));
            if let Deadline::At(at) = r.deadline {
                prop_assert!((MIN_YEAR..MAX_YEAR_EXCLUSIVE).contains(&at.year()));
            }
            Ok(())
        }

        fn json_number() -> impl Strategy<Value = Value> {
            prop_oneof![
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<f64>().prop_map(|x| Number::from_f64(x).map_or(Value::Null, Value::Number)),
            ]
        }

        /// RFC 3339 text for instants from 1900 to 2200, in any offset and
        /// precision.
        fn instant_text() -> impl Strategy<Value = String> {
            (
                -2_208_988_800i64..7_258_118_400i64,
                0u32..1_000_000_000,
                -1439i32..1440,
                0usize..6,
                any::<bool>(),
            )
                .prop_map(|(secs, nanos, offset_min, format, z)| {
                    let at = DateTime::from_timestamp(secs, nanos).unwrap_or_default();
                    let offset = FixedOffset::east_opt(offset_min * 60)
                        .unwrap_or(FixedOffset::east_opt(0).unwrap());
                    let format = [
                        SecondsFormat::Secs,
                        SecondsFormat::Millis,
                        SecondsFormat::Micros,
                        SecondsFormat::Nanos,
                        SecondsFormat::AutoSi,
                        SecondsFormat::Millis,
                    ][format];
                    at.with_timezone(&offset).to_rfc3339_opts(format, z)
                })
        }

        fn field_value() -> impl Strategy<Value = Value> {
            prop_oneof![
                3 => instant_text().prop_map(Value::from),
                2 => json_number(),
                2 => (0u64..=MAX_TIMEOUT_MS + 10).prop_map(Value::from),
                1 => ".{0,20}".prop_map(Value::from),
                1 => Just(Value::Null),
                1 => any::<bool>().prop_map(Value::from),
            ]
        }

        fn order_id() -> impl Strategy<Value = Value> {
            prop_oneof![
                "\\PC{0,140}".prop_map(Value::from),
                "[A-Za-z0-9 _-]{0,20}".prop_map(Value::from),
                json_number(),
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
            ]
        }

        /// Any JSON value, nested a few levels deep.
        fn any_json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                json_number(),
                ".{0,30}".prop_map(Value::from),
            ];
            leaf.prop_recursive(4, 64, 8, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                    proptest::collection::vec(
                        (
                            prop_oneof![
                                Just("order_id".to_owned()),
                                Just("cancel_at".to_owned()),
                                Just("created_at".to_owned()),
                                Just("timeout_ms".to_owned()),
                                Just("timer".to_owned()),
                                "[a-z_]{0,10}",
                            ],
                            inner
                        ),
                        0..6
                    )
                    .prop_map(|fields| Value::Object(fields.into_iter().collect())),
                ]
            })
        }

        /// Objects of the accepted shapes, with values of every kind.
        fn timeout_object() -> impl Strategy<Value = Value> {
            (
                order_id(),
                proptest::option::of(field_value()),
                proptest::option::of(field_value()),
                proptest::option::of(field_value()),
                proptest::option::of(any_json()),
            )
                .prop_map(|(id, cancel_at, created_at, timeout_ms, extra)| {
                    let mut fields = Map::new();
                    fields.insert("order_id".into(), id);
                    for (name, value) in [
                        ("cancel_at", cancel_at),
                        ("created_at", created_at),
                        ("timeout_ms", timeout_ms),
                        ("extra", extra),
                    ] {
                        if let Some(value) = value {
                            fields.insert(name.into(), value);
                        }
                    }
                    Value::Object(fields)
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..600)) {
                if let Ok(r) = TimeoutRequest::parse(&body, 512) {
                    assert_round_trips(&r)?;
                }
            }

            #[test]
            fn arbitrary_json_never_panics_and_what_is_accepted_round_trips(value in any_json()) {
                let body = serde_json::to_vec(&value).unwrap();
                if let Ok(r) = TimeoutRequest::parse(&body, MAX) {
                    assert_round_trips(&r)?;
                }
            }

            #[test]
            fn timeout_objects_parse_or_say_why_and_accepted_ones_round_trip(value in timeout_object()) {
                let body = serde_json::to_vec(&value).unwrap();
                match TimeoutRequest::parse(&body, MAX) {
                    Ok(r) => assert_round_trips(&r)?,
                    Err(e) => prop_assert!(!e.to_string().is_empty()),
                }
            }

            #[test]
            fn bare_ids_round_trip(id in order_id()) {
                let body = serde_json::to_vec(&id).unwrap();
                if let Ok(r) = TimeoutRequest::parse(&body, MAX) {
                    prop_assert_eq!(r.deadline, Deadline::FromOrderRow);
                    assert_round_trips(&r)?;
                }
            }
        }
    }
}
