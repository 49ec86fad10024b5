//! Operator tooling for the failure queue `order-timeout.parked`: list,
//! replay and purge parked messages (the `order-timeout parked …` commands).
//!
//! Every operation is one **pass** over the queue on its own channel:
//! `basic.get` without auto-ack until the queue has nothing ready, holding
//! each message unacknowledged so it is seen exactly once. Messages the
//! operation is done with are acked (replayed after the publisher confirm,
//! or deleted); every other message is returned with one `basic.nack
//! multiple requeue` at the end.
//!
//! Why a whole pass, even for `list --limit 10`: on RabbitMQ 3.10+ a quorum
//! queue without a delivery limit puts requeued messages at the *back* of
//! the queue (measured on 3.10.8, also for a closed channel), one with a
//! limit near the head. Returning the first 10 of 50 would rotate the
//! queue; returning all of them at once, in the order they were taken,
//! leaves it as it was either way. Each pass adds one to every message's
//! `x-delivery-count`; the parked queue's limit
//! ([`crate::broker::topology::DELIVERY_LIMIT`]) is high enough that this
//! stays a counter, never a reason to drop.
//!
//! Replay and purge only act on the messages that were in the queue when
//! the pass began (the count from a passive declare): a replayed message
//! that fails again and is parked anew during the pass is left alone, so a
//! pass always ends.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::message::BasicGetMessage;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Acker, BasicProperties, Channel, Connection};
use serde::Serialize;

use crate::broker::headers::{
    H_ATTEMPTS, H_DEADLINE_MS, H_DELIVERY_COUNT, H_ERROR, H_ERROR_KIND, H_FIRST_FAILURE,
    H_LAST_FAILURE, H_ORDER_ID, H_PARKED_AT, H_SOURCE_EXCHANGE, H_SOURCE_QUEUE,
    H_SOURCE_ROUTING_KEY, header_int, header_str,
};
use crate::broker::publisher::{PublishError, Publisher};
use crate::broker::topology::{ENTRY_EXCHANGE, PARKED_QUEUE, SCHEDULE_ROUTING_KEY};
use crate::message::{OrderId, format_instant};

/// Headers a replay removes: the failure history this service wrote, and
/// broker bookkeeping that belongs to the old delivery. A replayed message
/// starts with a fresh attempt budget, as if the order service had just
/// published it.
pub const REPLAY_DROPPED_HEADERS: &[&str] = &[
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
    H_DEADLINE_MS,
    H_DELIVERY_COUNT,
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
];

/// Errors of the parked-queue operations. Messages the operation had not
/// finished with are back in the queue when one of these is returned
/// (the broker requeues whatever an errored channel held).
#[derive(Debug, thiserror::Error)]
pub enum ParkedError {
    /// Opening a channel or another channel-level step failed.
    #[error("talking to the broker: {0}")]
    Amqp(#[source] lapin::Error),
    /// The parked queue does not exist in this vhost.
    #[error(
        "queue {PARKED_QUEUE} does not exist in this vhost (wrong AMQP_URL? run `order-timeout topology check`)"
    )]
    QueueMissing,
    /// `basic.get` failed.
    #[error("reading {PARKED_QUEUE}: {0}")]
    Get(#[source] lapin::Error),
    /// An ack could not be sent, or the channel died before the broker
    /// processed it.
    #[error("acknowledging a parked message: {0}")]
    Ack(String),
    /// Returning the untouched messages to the queue failed; the broker
    /// returns them anyway when the connection closes.
    #[error("returning messages to {PARKED_QUEUE}: {0}")]
    Release(#[source] lapin::Error),
    /// Republishing a message failed; it stays parked. `replayed` messages
    /// were replayed (and removed from the parked queue) before.
    #[error(
        "replaying a parked message (order {order_id}) failed after {replayed} replayed: {error}"
    )]
    Replay {
        /// Messages replayed before the failure.
        replayed: usize,
        /// Order id of the message that failed, or `-`.
        order_id: String,
        /// The publish error.
        #[source]
        error: PublishError,
    },
}

/// One parked message, decoded from its headers, for display and selection.
#[derive(Clone, Debug, PartialEq)]
pub struct ParkedMessage {
    /// The order id (`x-order-id`, else the body's `order_id` if valid).
    pub order_id: Option<String>,
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
    /// The original body, unchanged.
    pub body: Vec<u8>,
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
            order_id,
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

    /// The JSON view printed by `parked list --json` (one object per line).
    /// The body is `body` (text) when it is valid UTF-8; otherwise `body` is
    /// null and `body_base64` holds the bytes (standard alphabet, padded).
    pub fn to_json(&self, now: DateTime<Utc>) -> ParkedJson {
        let (body, body_base64) = match std::str::from_utf8(&self.body) {
            Ok(text) => (Some(text.to_owned()), None),
            Err(_) => (None, Some(base64(&self.body))),
        };
        ParkedJson {
            order_id: self.order_id.clone(),
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
    /// See [`ParkedMessage::order_id`].
    pub order_id: Option<String>,
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

/// The body's `order_id`, when the body is JSON with a valid one (bad
/// messages are parked without `x-order-id`).
fn order_id_from_body(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let raw = match value.get("order_id")? {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
        _ => return None,
    };
    OrderId::parse(&raw).ok().map(|id| id.as_str().to_owned())
}

/// Standard base64 with padding (RFC 4648), for non-UTF-8 bodies in JSON.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One pass over the parked queue on a dedicated channel (see the module
/// docs): every message is taken once and held until [`Pass::finish`].
struct Pass {
    channel: Channel,
    /// Messages ready when the pass began: the ones replay/purge may act on.
    initial: u32,
    /// Messages taken so far.
    taken: u32,
    /// The highest-tagged message still held (to return it and every held
    /// one before it with one `nack multiple`).
    last_held: Option<Acker>,
    /// The last message taken (held or not).
    last_taken: Option<Acker>,
    /// Messages held (to be returned).
    held: usize,
}

impl Pass {
    /// Opens a channel and counts the ready messages (passive declare, so
    /// a missing queue is reported, never created).
    #[tracing::instrument(skip_all)]
    async fn open(connection: &Connection) -> Result<Self, ParkedError> {
        let channel = connection
            .create_channel()
            .await
            .map_err(ParkedError::Amqp)?;
        let queue = channel
            .queue_declare(
                PARKED_QUEUE.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                if super::topology_check::is_not_found(&e) {
                    ParkedError::QueueMissing
                } else {
                    ParkedError::Amqp(e)
                }
            })?;
        Ok(Self {
            channel,
            initial: queue.message_count(),
            taken: 0,
            last_held: None,
            last_taken: None,
            held: 0,
        })
    }

    /// The next message, and whether it was already in the queue when the
    /// pass began; `None` once nothing is ready.
    async fn next(&mut self) -> Result<Option<(BasicGetMessage, bool)>, ParkedError> {
        let got = self
            .channel
            .basic_get(PARKED_QUEUE.into(), BasicGetOptions { no_ack: false })
            .await
            .map_err(ParkedError::Get)?;
        Ok(got.map(|msg| {
            self.taken += 1;
            self.last_taken = Some(msg.delivery.acker.clone());
            (msg, self.taken <= self.initial)
        }))
    }

    /// Keeps a message to return at the end. Messages must be held in the
    /// order they were taken.
    fn hold(&mut self, acker: Acker) {
        self.last_held = Some(acker);
        self.held += 1;
    }

    /// Removes a message for good.
    async fn ack(&self, acker: &Acker) -> Result<(), ParkedError> {
        match acker.ack(BasicAckOptions::default()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ParkedError::Ack(
                "the channel closed before the ack was sent; the message stays parked".into(),
            )),
            Err(e) => Err(ParkedError::Ack(e.to_string())),
        }
    }

    /// Returns every held message to the queue in the order taken, then
    /// makes sure the broker processed all acks and the return (a
    /// synchronous round trip on the same channel fails if the channel was
    /// closed by an earlier error), then closes the channel.
    #[tracing::instrument(skip_all, fields(held = self.held))]
    async fn finish(self) -> Result<(), ParkedError> {
        if let Some(last) = &self.last_held {
            let sent = last
                .nack(BasicNackOptions {
                    multiple: true,
                    requeue: true,
                })
                .await
                .map_err(ParkedError::Release)?;
            if !sent {
                return Err(ParkedError::Ack(
                    "the channel closed during the pass; its messages were returned by the broker"
                        .into(),
                ));
            }
        }
        self.channel
            .queue_declare(
                PARKED_QUEUE.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| ParkedError::Ack(format!("the broker did not confirm the pass: {e}")))?;
        let _ = self.channel.close(200, "done".into()).await;
        Ok(())
    }
}

/// What `parked list` shows.
#[derive(Clone, Debug)]
pub struct Listing {
    /// Up to `limit` messages, oldest (front of the queue) first.
    pub messages: Vec<ParkedMessage>,
    /// Messages seen in the pass (all of the queue's ready messages).
    pub total: usize,
}

/// Lists parked messages without removing or reordering them (see the
/// module docs); keeps the first `limit` (all if `None`).
#[tracing::instrument(skip(connection))]
pub async fn list(connection: &Connection, limit: Option<usize>) -> Result<Listing, ParkedError> {
    let mut pass = Pass::open(connection).await?;
    let mut messages = Vec::new();
    let mut total = 0;
    while let Some((msg, _)) = pass.next().await? {
        total += 1;
        let delivery = msg.delivery;
        if limit.is_none_or(|l| messages.len() < l) {
            messages.push(ParkedMessage::from_parts(
                delivery.properties,
                delivery.data,
            ));
        }
        pass.hold(delivery.acker);
    }
    pass.finish().await?;
    Ok(Listing { messages, total })
}

/// Which parked messages `parked replay` republishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplaySelection {
    /// Every message that was parked when the replay began.
    All,
    /// Those whose order id (header, or body) is this one.
    OrderId(String),
}

impl ReplaySelection {
    fn matches(&self, msg: &ParkedMessage) -> bool {
        match self {
            Self::All => true,
            Self::OrderId(id) => msg.order_id.as_deref() == Some(id.as_str()),
        }
    }
}

/// Outcome of a replay.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Messages republished (confirmed) and removed from the parked queue.
    pub replayed: usize,
    /// Messages left in the parked queue.
    pub kept: usize,
}

/// The properties a replayed message is published with: those it was
/// parked with (content type, message id, application headers …) minus
/// the failure history and broker bookkeeping ([`REPLAY_DROPPED_HEADERS`]),
/// minus `expiration` and `user-id` (which would expire it or get it
/// refused), with `content-type: application/json` if it had none.
pub fn replay_properties(parked: &BasicProperties) -> BasicProperties {
    let mut out = BasicProperties::default().with_content_type(
        parked
            .content_type()
            .clone()
            .unwrap_or_else(|| "application/json".into()),
    );
    let copy = |v: &Option<ShortString>| v.clone();
    if let Some(v) = copy(parked.content_encoding()) {
        out = out.with_content_encoding(v);
    }
    if let Some(v) = copy(parked.correlation_id()) {
        out = out.with_correlation_id(v);
    }
    if let Some(v) = copy(parked.reply_to()) {
        out = out.with_reply_to(v);
    }
    if let Some(v) = copy(parked.message_id()) {
        out = out.with_message_id(v);
    }
    if let Some(v) = copy(parked.kind()) {
        out = out.with_type(v);
    }
    if let Some(v) = copy(parked.app_id()) {
        out = out.with_app_id(v);
    }
    if let Some(v) = *parked.timestamp() {
        out = out.with_timestamp(v);
    }
    if let Some(v) = *parked.priority() {
        out = out.with_priority(v);
    }
    let mut headers = FieldTable::default();
    if let Some(old) = parked.headers() {
        for (k, v) in old.inner() {
            if !REPLAY_DROPPED_HEADERS.contains(&k.as_str()) {
                headers.insert(k.clone(), v.clone());
            }
        }
    }
    out.with_headers(headers)
}

/// Republishes the selected parked messages to the entry exchange
/// (`order-timeout` / `schedule`) with a fresh attempt budget, each acked
/// from the parked queue only after the broker confirmed the republish. A
/// crash in between leaves it in both places; replaying twice is harmless
/// (the cancellation is idempotent). Stops at the first failed publish.
#[tracing::instrument(skip(connection))]
pub async fn replay(
    connection: &Connection,
    selection: &ReplaySelection,
) -> Result<ReplayReport, ParkedError> {
    let publisher = Publisher::new(connection)
        .await
        .map_err(ParkedError::Amqp)?;
    let mut pass = Pass::open(connection).await?;
    let mut report = ReplayReport::default();
    while let Some((msg, was_there)) = pass.next().await? {
        let delivery = msg.delivery;
        let parked = ParkedMessage::from_parts(delivery.properties, delivery.data);
        if !(was_there && selection.matches(&parked)) {
            report.kept += 1;
            pass.hold(delivery.acker);
            continue;
        }
        let published = publish_replay(&publisher, &parked).await;
        if let Err(error) = published {
            pass.hold(delivery.acker);
            // Return what we hold; the error says what happened.
            let _ = pass.finish().await;
            return Err(ParkedError::Replay {
                replayed: report.replayed,
                order_id: parked.order_id.unwrap_or_else(|| "-".into()),
                error,
            });
        }
        if let Err(e) = pass.ack(&delivery.acker).await {
            // Replayed but still parked: a later replay repeats it, which
            // is harmless. Return the rest in order.
            let _ = pass.finish().await;
            return Err(e);
        }
        report.replayed += 1;
    }
    pass.finish().await?;
    let _ = publisher.channel().close(200, "done".into()).await;
    Ok(report)
}

#[tracing::instrument(skip_all, fields(order_id = ?parked.order_id))]
async fn publish_replay(publisher: &Publisher, parked: &ParkedMessage) -> Result<(), PublishError> {
    publisher
        .publish(
            ENTRY_EXCHANGE,
            SCHEDULE_ROUTING_KEY,
            true,
            &parked.body,
            replay_properties(&parked.properties),
        )
        .await
}

/// Outcome of a purge.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Messages deleted.
    pub deleted: usize,
    /// Messages left in the parked queue.
    pub kept: usize,
}

/// A purge in two steps, so the operator can confirm the exact count: the
/// plan holds every parked message (unacked) and knows which ones match;
/// [`PurgePlan::commit`] deletes exactly those, [`PurgePlan::abort`]
/// deletes nothing. Dropping a plan without either also deletes nothing
/// (the broker returns held messages when the connection closes).
///
/// RabbitMQ's `consumer_timeout` (30 min by default) closes a channel that
/// holds a delivery longer; a prompt left open that long makes `commit`
/// fail with nothing deleted.
pub struct PurgePlan {
    pass: Pass,
    delete: Vec<Acker>,
    keep: usize,
}

impl PurgePlan {
    /// Takes every parked message and selects those parked before
    /// `now - older_than` (all of them when `older_than` is `None`). A
    /// message without a readable `x-parked-at` is kept when `older_than`
    /// is given. Messages parked after the plan began are never selected.
    #[tracing::instrument(skip(connection))]
    pub async fn prepare(
        connection: &Connection,
        older_than: Option<Duration>,
    ) -> Result<Self, ParkedError> {
        let cutoff = older_than
            .map(|d| Utc::now() - chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX));
        let mut pass = Pass::open(connection).await?;
        let mut delete = Vec::new();
        let mut keep = 0;
        while let Some((msg, was_there)) = pass.next().await? {
            let delivery = msg.delivery;
            let selected = was_there
                && match cutoff {
                    None => true,
                    Some(cutoff) => ParkedMessage::from_parts(delivery.properties, Vec::new())
                        .parked_at
                        .is_some_and(|at| at <= cutoff),
                };
            if selected {
                delete.push(delivery.acker);
            } else {
                keep += 1;
                pass.hold(delivery.acker);
            }
        }
        Ok(Self { pass, delete, keep })
    }

    /// How many messages [`commit`](Self::commit) would delete.
    pub fn selected(&self) -> usize {
        self.delete.len()
    }

    /// How many messages stay in the queue.
    pub fn kept(&self) -> usize {
        self.keep
    }

    /// Deletes the selected messages and returns the others.
    #[tracing::instrument(skip_all, fields(selected = self.delete.len()))]
    pub async fn commit(self) -> Result<PurgeReport, ParkedError> {
        let mut deleted = 0;
        for acker in &self.delete {
            if let Err(e) = self.pass.ack(acker).await {
                let _ = self.pass.finish().await;
                return Err(e);
            }
            deleted += 1;
        }
        self.pass.finish().await?;
        Ok(PurgeReport {
            deleted,
            kept: self.keep,
        })
    }

    /// Deletes nothing: returns every message to the queue, in order.
    #[tracing::instrument(skip_all)]
    pub async fn abort(mut self) -> Result<PurgeReport, ParkedError> {
        // Nothing was acked: the last message taken covers all of them.
        let kept = self.keep + self.delete.len();
        self.pass.last_held = self.pass.last_taken.clone();
        self.pass.finish().await?;
        Ok(PurgeReport { deleted: 0, kept })
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::AMQPValue;

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
        assert_eq!(
            crate::broker::headers::Attempts::from_headers(Some(&h)).count,
            0
        );

        let kept =
            replay_properties(&BasicProperties::default().with_content_type("text/plain".into()));
        assert_eq!(
            kept.content_type().as_ref().map(|c| c.as_str()),
            Some("text/plain")
        );
    }

    #[test]
    fn selection_by_order_id() {
        let m =
            ParkedMessage::from_parts(BasicProperties::default(), br#"{"order_id":"x"}"#.to_vec());
        assert!(ReplaySelection::All.matches(&m));
        assert!(ReplaySelection::OrderId("x".into()).matches(&m));
        assert!(!ReplaySelection::OrderId("y".into()).matches(&m));
    }
}
