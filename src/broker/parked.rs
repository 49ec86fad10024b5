//! **The parked-message format**, written and read in this one place: a
//! message the service gives up on is republished to
//! [`PARKED_QUEUE`](super::topology::PARKED_QUEUE) with its original body,
//! the sender's properties ([`kept_properties`]) and headers saying why
//! ([`ParkInfo`] → [`park_properties`]); operators read it back
//! ([`ParkedMessage::from_parts`], [`ParkedJson`]) and replay it with a
//! fresh attempt budget ([`replay_properties`]).
//!
//! The header names are in [`super::headers`]; which headers are the park
//! record ([`PARK_HEADERS`]) and which are broker bookkeeping
//! ([`is_broker_bookkeeping`]) is decided here, once.
//! `ops::parked` holds the passes over the queue (list, replay, purge).

use std::time::Duration;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};
use serde::Serialize;

use super::headers::{
    Attempts, H_ATTEMPTS, H_DEADLINE_MS, H_DELIVERY_COUNT, H_ERROR, H_ERROR_KIND, H_FIRST_FAILURE,
    H_LAST_FAILURE, H_ORDER_ID, H_PARKED_AT, H_PARKED_ID, H_SOURCE_EXCHANGE, H_SOURCE_QUEUE,
    H_SOURCE_ROUTING_KEY, header_int, header_str,
};
use crate::message::{OrderId, ParkReason, format_instant};
use crate::settings::DEFAULT_TIMER;
use crate::store::{NewParked, ParkedRow};

/// The headers this service writes on a parked message: the park record.
/// A replay removes them all, so the message starts over with a fresh
/// attempt budget, as if the order service had just published it.
pub(crate) const PARK_HEADERS: &[&str] = &[
    H_ERROR,
    H_ERROR_KIND,
    H_ATTEMPTS,
    H_FIRST_FAILURE,
    H_LAST_FAILURE,
    H_ORDER_ID,
    H_SOURCE_QUEUE,
    H_SOURCE_EXCHANGE,
    H_SOURCE_ROUTING_KEY,
    H_PARKED_AT,
    H_PARKED_ID,
];

/// Headers RabbitMQ adds to a delivery (`x-death` and its
/// `x-first-death-*` / `x-last-death-*` summaries of the cascade's
/// dead-lettering, `x-delivery-count` of quorum queues): they describe the
/// old delivery and are dropped when a message is parked or replayed.
pub(crate) fn is_broker_bookkeeping(name: &str) -> bool {
    name == "x-death"
        || name.starts_with("x-first-death-")
        || name.starts_with("x-last-death-")
        || name == H_DELIVERY_COUNT
}

/// Headers a replay removes: the park record ([`PARK_HEADERS`]), the
/// re-schedule deadline and broker bookkeeping.
pub(crate) fn dropped_on_replay(name: &str) -> bool {
    PARK_HEADERS.contains(&name) || name == H_DEADLINE_MS || is_broker_bookkeeping(name)
}

/// Headers of the original message not carried onto its parked copy:
/// broker bookkeeping, our re-schedule deadline, and the order id (written
/// afresh, or not at all when the body had none).
fn dropped_on_park(name: &str) -> bool {
    is_broker_bookkeeping(name) || name == H_DEADLINE_MS || name == H_ORDER_ID
}

/// Why and where a message is parked; written as headers beside the
/// original body ([`park_properties`]).
#[derive(Clone, Debug)]
pub(crate) struct ParkInfo {
    /// Human-readable reason (`x-error`).
    pub error: String,
    /// Short label (`x-error-kind`), e.g. `not_json`, `unknown_order`.
    pub kind: ParkReason,
    /// Order id if the body had a valid one.
    pub order_id: Option<OrderId>,
    /// Failure history including this failure.
    pub attempts: Attempts,
    /// Queue it was consumed from.
    pub source_queue: String,
    /// Exchange and routing key it arrived with.
    pub source_exchange: String,
    /// See `source_exchange`.
    pub source_routing_key: String,
}

/// The properties a message is parked with: the sender's
/// ([`kept_properties`]) and its application headers, minus broker
/// bookkeeping and our re-schedule deadline, plus the park record of
/// `info`, parked at `now`.
pub(crate) fn park_properties(
    original: &BasicProperties,
    info: &ParkInfo,
    now: DateTime<Utc>,
) -> BasicProperties {
    let mut headers = filtered_headers(original, dropped_on_park);
    info.attempts.write(&mut headers);
    let mut text = |k: &str, v: &str| {
        headers.insert(k.into(), AMQPValue::LongString(LongString::from(v)));
    };
    text(H_ERROR, &info.error);
    text(H_ERROR_KIND, info.kind.as_str());
    text(H_SOURCE_QUEUE, &info.source_queue);
    text(H_SOURCE_EXCHANGE, &info.source_exchange);
    text(H_SOURCE_ROUTING_KEY, &info.source_routing_key);
    text(H_PARKED_AT, &format_instant(now));
    text(H_PARKED_ID, &uuid::Uuid::new_v4().to_string());
    if let Some(id) = &info.order_id {
        text(H_ORDER_ID, id.as_str());
    }
    kept_properties(original).with_headers(headers)
}

/// The properties a replayed message is published with: those it was
/// parked with (content type, message id, application headers …) minus
/// the park record, the re-schedule deadline and broker bookkeeping
/// ([`dropped_on_replay`]), minus `expiration` and `user-id` (which would
/// expire it or get it refused), with `content-type: application/json` if
/// it had none.
pub(crate) fn replay_properties(parked: &BasicProperties) -> BasicProperties {
    let content_type = parked
        .content_type()
        .clone()
        .unwrap_or_else(|| "application/json".into());
    kept_properties(parked)
        .with_content_type(content_type)
        .with_headers(filtered_headers(parked, dropped_on_replay))
}

/// `properties` without broker bookkeeping (the parked queue's own
/// `x-delivery-count`): what the parked store keeps of a copy it moves in.
pub(crate) fn without_bookkeeping(properties: &BasicProperties) -> BasicProperties {
    properties
        .clone()
        .with_headers(filtered_headers(properties, is_broker_bookkeeping))
}

/// The headers of `properties` without those `dropped` names.
fn filtered_headers(properties: &BasicProperties, dropped: fn(&str) -> bool) -> FieldTable {
    let mut headers = FieldTable::default();
    if let Some(theirs) = properties.headers() {
        for (key, value) in theirs.inner() {
            if !dropped(key.as_str()) {
                headers.insert(key.clone(), value.clone());
            }
        }
    }
    headers
}

/// The sender's properties worth keeping on a parked or replayed copy:
/// everything but the headers (which the caller rebuilds), `expiration`
/// (which would expire the copy), `user-id` (which the broker checks
/// against our login) and the delivery mode (always 2).
pub(crate) fn kept_properties(original: &BasicProperties) -> BasicProperties {
    let mut p = BasicProperties::default();
    if let Some(v) = original.content_type() {
        p = p.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        p = p.with_content_encoding(v.clone());
    }
    if let Some(v) = original.priority() {
        p = p.with_priority(*v);
    }
    if let Some(v) = original.correlation_id() {
        p = p.with_correlation_id(v.clone());
    }
    if let Some(v) = original.reply_to() {
        p = p.with_reply_to(v.clone());
    }
    if let Some(v) = original.message_id() {
        p = p.with_message_id(v.clone());
    }
    if let Some(v) = original.timestamp() {
        p = p.with_timestamp(*v);
    }
    if let Some(v) = original.kind() {
        p = p.with_type(v.clone());
    }
    if let Some(v) = original.app_id() {
        p = p.with_app_id(v.clone());
    }
    p
}

/// One parked message, decoded from its headers, for display and selection.
#[derive(Clone, Debug, PartialEq)]
pub struct ParkedMessage {
    /// Its row id in the parked store (`None` for a copy read from the
    /// queue, not yet moved).
    pub id: Option<i64>,
    /// The order id (`x-order-id`, else the body's `order_id` if valid).
    pub order_id: Option<String>,
    /// The timer the body is for: its `"timer"` field, `cancel_unpaid`
    /// for a body without one (or a bare id); `None` when the body is not
    /// a timeout message at all.
    pub timer: Option<String>,
    /// Short reason (`x-error-kind`), e.g. `unknown_order`.
    pub error_kind: Option<String>,
    /// Human-readable reason (`x-error`).
    pub error: Option<String>,
    /// Failed attempts before parking (`x-attempts`).
    pub attempts: Option<i64>,
    /// First failure (`x-first-failure`).
    pub first_failure: Option<DateTime<Utc>>,
    /// Last failure (`x-last-failure`).
    pub last_failure: Option<DateTime<Utc>>,
    /// When it was parked (`x-parked-at`).
    pub parked_at: Option<DateTime<Utc>>,
    /// Queue it was consumed from (`x-source-queue`).
    pub source_queue: Option<String>,
    /// Exchange it arrived through (`x-source-exchange`).
    pub source_exchange: Option<String>,
    /// Routing key it arrived with (`x-source-routing-key`).
    pub source_routing_key: Option<String>,
    /// Times the broker returned it to the parked queue
    /// (`x-delivery-count`, quorum queues; listing passes count too).
    pub redeliveries: Option<i64>,
    /// The AMQP properties it was parked with.
    pub properties: BasicProperties,
    /// The original body, unchanged; or, read in a listing or kept from a
    /// body over the parked store's 4 MiB, its
    /// first bytes ([`ParkedMessage::body_is_whole`]).
    pub body: Vec<u8>,
    /// The original body's length in bytes.
    pub body_size: u64,
}

impl ParkedMessage {
    /// Decodes a message taken from the parked queue. Never fails: missing
    /// or malformed headers read as unknown.
    pub fn from_parts(properties: BasicProperties, body: Vec<u8>) -> Self {
        let headers = properties.headers().clone().unwrap_or_default();
        let map = headers.inner();
        let text = |k: &str| header_str(map.get(k)).filter(|s| !s.is_empty());
        let time = |k: &str| {
            text(k).and_then(|s| {
                DateTime::parse_from_rfc3339(&s)
                    .ok()
                    .map(|t| t.with_timezone(&Utc))
            })
        };
        let int = |k: &str| map.get(k).and_then(header_int);
        let order_id = text(H_ORDER_ID).or_else(|| order_id_from_body(&body));
        Self {
            id: None,
            body_size: body.len() as u64,
            order_id,
            timer: timer_from_body(&body),
            error_kind: text(H_ERROR_KIND),
            error: text(H_ERROR),
            attempts: int(H_ATTEMPTS),
            first_failure: time(H_FIRST_FAILURE),
            last_failure: time(H_LAST_FAILURE),
            parked_at: time(H_PARKED_AT),
            source_queue: text(H_SOURCE_QUEUE),
            source_exchange: text(H_SOURCE_EXCHANGE),
            source_routing_key: text(H_SOURCE_ROUTING_KEY),
            redeliveries: int(H_DELIVERY_COUNT),
            properties,
            body,
        }
    }

    /// Decodes a message kept in the parked store. The order id, timer and
    /// reason are the ones recorded when it was moved (read from the whole
    /// body then, so a listing's excerpt does not change them).
    pub fn from_row(row: ParkedRow) -> Self {
        let properties = serde_json::from_str::<BasicProperties>(&row.properties).unwrap_or_else(|e| {
            tracing::warn!(id = row.id, error = %e, "a parked message's properties do not read back; shown without them");
            BasicProperties::default()
        });
        let mut message = Self::from_parts(properties, row.body);
        message.id = Some(row.id);
        message.body_size = u64::try_from(row.body_size).unwrap_or(0);
        message.order_id = row.order_id;
        message.timer = row.timer;
        message.error_kind = row.error_kind;
        message.parked_at = message.parked_at.or(Some(row.parked_at));
        message
    }

    /// What the parked store keeps of this copy, its properties written as
    /// `properties` (JSON, [`ParkedMessage::properties_json`]).
    pub(crate) fn to_new<'a>(
        &'a self,
        key: &'a str,
        properties: &'a str,
        now: DateTime<Utc>,
    ) -> NewParked<'a> {
        NewParked {
            key,
            parked_at: self.parked_at.unwrap_or(now),
            order_id: self.order_id.as_deref(),
            timer: self.timer.as_deref(),
            error_kind: self.error_kind.as_deref(),
            properties,
            body: &self.body,
        }
    }

    /// The properties as the parked store keeps them: JSON, read back by
    /// [`ParkedMessage::from_row`].
    pub(crate) fn properties_json(&self) -> String {
        serde_json::to_string(&self.properties).unwrap_or_else(|_| "{}".to_owned())
    }

    /// The key the parked store keeps this copy under: its `x-parked-id`,
    /// or, for a copy parked by a release without it, a digest of its park
    /// record and body ([`ParkedMessage::key`]).
    pub(crate) fn store_key(&self) -> String {
        let headers = self.properties.headers().clone().unwrap_or_default();
        header_str(headers.inner().get(H_PARKED_ID))
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("digest:{}", self.key()))
    }

    /// Whether [`ParkedMessage::body`] is the whole body (not an excerpt).
    pub fn body_is_whole(&self) -> bool {
        self.body.len() as u64 >= self.body_size
    }

    /// Time since it was parked, if the message says when.
    pub fn age(&self, now: DateTime<Utc>) -> Option<Duration> {
        self.parked_at
            .map(|at| (now - at).to_std().unwrap_or_default())
    }

    /// `kind: error`, the reason as one line.
    pub fn reason(&self) -> String {
        match (&self.error_kind, &self.error) {
            (Some(k), Some(e)) => format!("{k}: {e}"),
            (Some(k), None) => k.clone(),
            (None, Some(e)) => e.clone(),
            (None, None) => "(no reason recorded)".into(),
        }
    }

    /// The body as text when it is valid UTF-8, else `None` (see
    /// [`ParkedMessage::body_base64`]).
    pub fn body_text(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }

    /// The body in base64 (standard alphabet, padded), for bodies that are
    /// not valid UTF-8.
    pub fn body_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.body)
    }

    /// A short key naming this message among the parked ones, stable
    /// across passes (so a page can name the messages to act on): a hash
    /// of the park record and the body, not of the broker's bookkeeping.
    /// Identical copies (same body, parked at the same millisecond for the
    /// same reason) share a key and are acted on together.
    pub fn key(&self) -> String {
        // FNV-1a, 64 bits: identifies, does not protect (the console's
        // write actions are behind ADMIN_TOKEN).
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        let mut feed = |bytes: &[u8]| {
            for b in bytes.iter().chain(&[0xff]) {
                hash = (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
            }
        };
        let time = |t: Option<DateTime<Utc>>| t.map(format_instant).unwrap_or_default();
        feed(self.order_id.as_deref().unwrap_or("").as_bytes());
        feed(self.error_kind.as_deref().unwrap_or("").as_bytes());
        feed(self.error.as_deref().unwrap_or("").as_bytes());
        feed(time(self.parked_at).as_bytes());
        feed(time(self.first_failure).as_bytes());
        feed(&self.body);
        format!("{hash:016x}")
    }

    /// The JSON view printed by `parked list --json` (one object per line).
    /// The body is `body` (text) when it is valid UTF-8; otherwise `body` is
    /// null and `body_base64` holds the bytes (standard alphabet, padded).
    pub fn to_json(&self, now: DateTime<Utc>) -> ParkedJson {
        let (body, body_base64) = match self.body_text() {
            Some(text) => (Some(text.to_owned()), None),
            None => (None, Some(self.body_base64())),
        };
        ParkedJson {
            id: self.id,
            body_size: Some(self.body_size),
            body_whole: Some(self.body_is_whole()),
            order_id: self.order_id.clone(),
            timer: self.timer.clone(),
            error_kind: self.error_kind.clone(),
            error: self.error.clone(),
            attempts: self.attempts,
            first_failure: self.first_failure.map(format_instant),
            last_failure: self.last_failure.map(format_instant),
            parked_at: self.parked_at.map(format_instant),
            age_secs: self.age(now).map(|d| d.as_secs()),
            source_queue: self.source_queue.clone(),
            source_exchange: self.source_exchange.clone(),
            source_routing_key: self.source_routing_key.clone(),
            redeliveries: self.redeliveries,
            content_type: self
                .properties
                .content_type()
                .as_ref()
                .map(|c| c.to_string()),
            body,
            body_base64,
        }
    }
}

/// The JSON form of a [`ParkedMessage`] (see [`ParkedMessage::to_json`]);
/// a stable contract for scripts.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct ParkedJson {
    /// See [`ParkedMessage::id`]: what `parked show` and `--id` take.
    #[serde(default)]
    pub id: Option<i64>,
    /// See [`ParkedMessage::body_size`].
    #[serde(default)]
    pub body_size: Option<u64>,
    /// `false` when `body` is only the first bytes of it (a body over the
    /// store's 4 MiB, or an excerpt).
    #[serde(default)]
    pub body_whole: Option<bool>,
    /// See [`ParkedMessage::order_id`].
    pub order_id: Option<String>,
    /// See [`ParkedMessage::timer`].
    #[serde(default)]
    pub timer: Option<String>,
    /// See [`ParkedMessage::error_kind`].
    pub error_kind: Option<String>,
    /// See [`ParkedMessage::error`].
    pub error: Option<String>,
    /// See [`ParkedMessage::attempts`].
    pub attempts: Option<i64>,
    /// RFC 3339.
    pub first_failure: Option<String>,
    /// RFC 3339.
    pub last_failure: Option<String>,
    /// RFC 3339.
    pub parked_at: Option<String>,
    /// Whole seconds since `parked_at`.
    pub age_secs: Option<u64>,
    /// See [`ParkedMessage::source_queue`].
    pub source_queue: Option<String>,
    /// See [`ParkedMessage::source_exchange`].
    pub source_exchange: Option<String>,
    /// See [`ParkedMessage::source_routing_key`].
    pub source_routing_key: Option<String>,
    /// See [`ParkedMessage::redeliveries`].
    pub redeliveries: Option<i64>,
    /// AMQP content type, if the parked message had one.
    pub content_type: Option<String>,
    /// The body as text, when it is valid UTF-8.
    pub body: Option<String>,
    /// The body in base64, when it is not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub body_base64: Option<String>,
}

/// The timer a body names (`"timer"`, as written), the default one for a
/// JSON object without it or a bare id; `None` for anything else.
fn timer_from_body(body: &[u8]) -> Option<String> {
    match serde_json::from_slice::<serde_json::Value>(body).ok()? {
        serde_json::Value::Object(fields) => match fields.get("timer") {
            None | Some(serde_json::Value::Null) => Some(DEFAULT_TIMER.to_owned()),
            Some(serde_json::Value::String(name)) => Some(name.clone()),
            Some(_) => None,
        },
        serde_json::Value::String(_) | serde_json::Value::Number(_) => {
            Some(DEFAULT_TIMER.to_owned())
        }
        _ => None,
    }
}

/// The body's `order_id`, when the body is JSON with a valid one (bad
/// messages are parked without `x-order-id`).
pub(crate) fn order_id_from_body(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let raw = match value.get("order_id")? {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
        _ => return None,
    };
    OrderId::parse(&raw).ok().map(|id| id.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    fn text(s: &str) -> AMQPValue {
        AMQPValue::LongString(s.into())
    }

    fn base64(bytes: &[u8]) -> String {
        ParkedMessage::from_parts(BasicProperties::default(), bytes.to_vec()).body_base64()
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (raw, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), encoded);
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn decodes_the_park_headers_and_tolerates_junk() {
        let props = BasicProperties::default().with_headers(headers(&[
            (H_ERROR, text("unknown order")),
            (H_ERROR_KIND, text("unknown_order")),
            (H_ATTEMPTS, AMQPValue::LongLongInt(3)),
            (H_FIRST_FAILURE, text("2026-11-21T10:00:00.000Z")),
            (H_LAST_FAILURE, text("not a time")),
            (H_PARKED_AT, text("2026-11-21T10:00:05.000Z")),
            (H_ORDER_ID, text("o-1")),
            (H_DELIVERY_COUNT, AMQPValue::LongInt(2)),
        ]));
        let m = ParkedMessage::from_parts(props, b"{}".to_vec());
        assert_eq!(m.order_id.as_deref(), Some("o-1"));
        assert_eq!(m.reason(), "unknown_order: unknown order");
        assert_eq!(m.attempts, Some(3));
        assert!(m.first_failure.is_some());
        assert_eq!(m.last_failure, None, "unparseable times read as unknown");
        assert_eq!(m.redeliveries, Some(2));
        let now = m.parked_at.unwrap() + chrono::Duration::seconds(90);
        assert_eq!(m.age(now), Some(Duration::from_secs(90)));
        // A clock behind the parking host: age 0, not a panic.
        let before = m.parked_at.unwrap() - chrono::Duration::seconds(5);
        assert_eq!(m.age(before), Some(Duration::ZERO));

        let bare = ParkedMessage::from_parts(BasicProperties::default(), b"\xff".to_vec());
        assert_eq!(bare.order_id, None);
        assert_eq!(bare.reason(), "(no reason recorded)");
        let json = bare.to_json(Utc::now());
        assert_eq!(
            (json.body, json.body_base64.as_deref()),
            (None, Some("/w=="))
        );
    }

    #[test]
    fn order_id_falls_back_to_a_valid_one_in_the_body() {
        let from = |body: &str| ParkedMessage::from_parts(BasicProperties::default(), body.into());
        assert_eq!(
            from(r#"{"order_id":"a-1"}"#).order_id.as_deref(),
            Some("a-1")
        );
        assert_eq!(from(r#"{"order_id":42}"#).order_id.as_deref(), Some("42"));
        assert_eq!(from(r#"{"order_id":""}"#).order_id, None);
        assert_eq!(from(r#"{"order_id":1.5}"#).order_id, None);
        assert_eq!(from("[1]").order_id, None);
    }

    #[test]
    fn a_replay_drops_the_failure_history_and_keeps_the_rest() {
        let parked = BasicProperties::default()
            .with_message_id("m-1".into())
            .with_expiration("1000".into())
            .with_user_id("someone".into())
            .with_headers(headers(&[
                (H_ERROR, text("boom")),
                (H_ATTEMPTS, AMQPValue::LongLongInt(8)),
                (H_FIRST_FAILURE, text("2026-11-21T10:00:00.000Z")),
                (H_DELIVERY_COUNT, AMQPValue::LongInt(4)),
                (H_DEADLINE_MS, AMQPValue::LongLongInt(1)),
                ("x-trace-id", text("abc")),
            ]));
        let out = replay_properties(&parked);
        assert_eq!(
            out.content_type().as_ref().map(|c| c.as_str()),
            Some("application/json")
        );
        assert_eq!(out.message_id().as_ref().map(|c| c.as_str()), Some("m-1"));
        assert_eq!(out.expiration(), &None);
        assert_eq!(out.user_id(), &None);
        let h = out.headers().clone().unwrap();
        let keys: Vec<&str> = h.inner().keys().map(|k| k.as_str()).collect();
        assert_eq!(keys, vec!["x-trace-id"]);
        // A fresh attempt budget, as the consumer reads it.
        assert_eq!(Attempts::from_headers(Some(&h)).count, 0);

        let kept =
            replay_properties(&BasicProperties::default().with_content_type("text/plain".into()));
        assert_eq!(
            kept.content_type().as_ref().map(|c| c.as_str()),
            Some("text/plain")
        );
    }

    #[test]
    fn a_parked_copy_reads_back_as_it_was_written_and_replays_clean() {
        let t0 = DateTime::parse_from_rfc3339("2026-11-21T10:00:00.125Z")
            .unwrap()
            .with_timezone(&Utc);
        let original = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id("m-7".into())
            .with_expiration("5000".into())
            .with_headers(headers(&[
                ("x-death", AMQPValue::LongString("…".into())),
                ("x-first-death-queue", text("order-timeout.delay.03")),
                (H_DEADLINE_MS, AMQPValue::LongLongInt(1)),
                (H_ORDER_ID, text("stale")),
                ("x-trace-id", text("abc")),
            ]));
        let info = ParkInfo {
            error: "no row".into(),
            kind: ParkReason::UnknownOrder,
            order_id: Some(OrderId::parse("o-9").unwrap()),
            attempts: Attempts::default().failed(t0, "no row"),
            source_queue: "order-timeout.due".into(),
            source_exchange: "order-timeout".into(),
            source_routing_key: "schedule".into(),
        };
        let parked = park_properties(&original, &info, t0);
        assert_eq!(parked.expiration(), &None, "a parked copy never expires");
        let h = parked.headers().clone().unwrap();
        let mut keys: Vec<&str> = h.inner().keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        let mut expected: Vec<&str> = PARK_HEADERS.to_vec();
        expected.push("x-trace-id");
        expected.sort_unstable();
        assert_eq!(keys, expected, "bookkeeping and the deadline are dropped");

        let m = ParkedMessage::from_parts(parked.clone(), br#"{"order_id":"o-9"}"#.to_vec());
        assert_eq!(m.order_id.as_deref(), Some("o-9"));
        assert_eq!(m.error_kind.as_deref(), Some(info.kind.as_str()));
        assert_eq!(m.attempts, Some(1));
        assert_eq!(
            (m.first_failure, m.last_failure, m.parked_at),
            (Some(t0), Some(t0), Some(t0))
        );
        assert_eq!(m.source_queue.as_deref(), Some("order-timeout.due"));
        assert_eq!(m.key(), m.clone().key(), "stable");
        let other = ParkedMessage::from_parts(parked.clone(), br#"{"order_id":"o-8"}"#.to_vec());
        assert_ne!(m.key(), other.key());

        let replay = replay_properties(&parked);
        let h = replay.headers().clone().unwrap();
        let keys: Vec<&str> = h.inner().keys().map(|k| k.as_str()).collect();
        assert_eq!(keys, vec!["x-trace-id"]);
        assert_eq!(
            replay.message_id().as_ref().map(|c| c.as_str()),
            Some("m-7")
        );
    }
}
