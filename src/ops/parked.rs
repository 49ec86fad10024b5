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

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use lapin::message::BasicGetMessage;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions};
use lapin::{Acker, Channel, Connection};

use crate::broker::parked::replay_properties;
/// The parked format (written by the service, read back here) lives in
/// [`crate::broker::parked`]; named here too for the commands' callers.
pub use crate::broker::parked::{ParkedJson, ParkedMessage};
use crate::broker::publisher::{PublishError, Publisher};
use crate::broker::topology::{ENTRY_EXCHANGE, PARKED_QUEUE, SCHEDULE_ROUTING_KEY};

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
        let queue = crate::broker::peek_queue(&channel, PARKED_QUEUE)
            .await
            .map_err(|e| {
                if crate::broker::refusals::is_not_found(&e) {
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
    /// closed by an earlier error) and that the returned messages are
    /// counted in the queue again, then closes the channel.
    ///
    /// The round trip alone does not show the return: a quorum queue
    /// applies it a few milliseconds after the channel answers (a passive
    /// declare right after the nack counted 0 of 1 returned message in 295
    /// of 300 tries on RabbitMQ 3.10.8, and 4 in 300 still did on a new
    /// channel after the close). Without the wait, an operator's next
    /// command (`pending` right after `parked list`) could report a parked
    /// message as gone.
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
        let returned = u32::try_from(self.held).unwrap_or(u32::MAX);
        let deadline = tokio::time::Instant::now() + RETURN_WAIT;
        loop {
            let ready = self.ready().await.map_err(|e| {
                ParkedError::Ack(format!("the broker did not confirm the pass: {e}"))
            })?;
            if ready >= returned {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                // Another pass may hold some of them; the broker has them
                // either way.
                tracing::warn!(
                    returned,
                    ready,
                    "the returned parked messages are not all counted in the queue yet"
                );
                break;
            }
            tokio::time::sleep(RETURN_POLL).await;
        }
        crate::broker::close_channel_quietly(&self.channel).await;
        Ok(())
    }

    /// The queue's ready messages (a passive declare on the pass's channel).
    async fn ready(&self) -> Result<u32, lapin::Error> {
        let queue = crate::broker::peek_queue(&self.channel, PARKED_QUEUE).await?;
        Ok(queue.message_count())
    }
}

/// How long [`Pass::finish`] waits for the messages it returned to be
/// counted in the queue again (a few milliseconds on a healthy broker).
const RETURN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How often it looks meanwhile.
const RETURN_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// What `parked list` shows.
#[derive(Clone, Debug)]
pub struct Listing {
    /// Up to `limit` messages, oldest (front of the queue) first.
    pub messages: Vec<ParkedMessage>,
    /// Messages seen in the pass (all of the queue's ready messages).
    pub total: usize,
    /// Every message of the pass counted by its short reason
    /// (`x-error-kind`; [`NO_REASON`] when it has none).
    pub by_reason: BTreeMap<String, usize>,
}

/// The reason [`Listing::by_reason`] counts a message without
/// `x-error-kind` under.
pub const NO_REASON: &str = "(none)";

/// Lists parked messages without removing or reordering them (see the
/// module docs); keeps the first `limit` (all if `None`) and counts every
/// one by reason.
#[tracing::instrument(skip(connection))]
pub async fn list(connection: &Connection, limit: Option<usize>) -> Result<Listing, ParkedError> {
    let mut pass = Pass::open(connection).await?;
    let mut messages = Vec::new();
    let mut total = 0;
    let mut by_reason = BTreeMap::new();
    while let Some((msg, _)) = pass.next().await? {
        total += 1;
        let delivery = msg.delivery;
        let keep = limit.is_none_or(|l| messages.len() < l);
        // Only the messages shown need their body.
        let body = if keep { delivery.data } else { Vec::new() };
        let parked = ParkedMessage::from_parts(delivery.properties, body);
        *by_reason
            .entry(
                parked
                    .error_kind
                    .clone()
                    .unwrap_or_else(|| NO_REASON.into()),
            )
            .or_default() += 1;
        if keep {
            messages.push(parked);
        }
        pass.hold(delivery.acker);
    }
    pass.finish().await?;
    Ok(Listing {
        messages,
        total,
        by_reason,
    })
}

/// Which parked messages a replay republishes or a purge deletes. Only
/// messages that were parked when the operation began are ever selected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Every one.
    All,
    /// Those whose order id (header, or body) is this one.
    OrderId(String),
    /// Those for this timer (the body's `"timer"`, `cancel_unpaid` when
    /// it names none).
    Timer(String),
    /// Those parked (`x-parked-at`) at or before this instant; a message
    /// without a readable `x-parked-at` is not selected.
    ParkedBefore(DateTime<Utc>),
    /// Those whose [`ParkedMessage::key`] is one of these (the console's
    /// choice of one message or several).
    Keys(BTreeSet<String>),
}

impl Selection {
    fn matches(&self, msg: &ParkedMessage) -> bool {
        match self {
            Self::All => true,
            Self::OrderId(id) => msg.order_id.as_deref() == Some(id.as_str()),
            Self::Timer(name) => msg.timer.as_deref() == Some(name.as_str()),
            Self::ParkedBefore(cutoff) => msg.parked_at.is_some_and(|at| at <= *cutoff),
            Self::Keys(keys) => keys.contains(&msg.key()),
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

/// Republishes the selected parked messages to the entry exchange
/// (`order-timeout` / `schedule`) with a fresh attempt budget, each acked
/// from the parked queue only after the broker confirmed the republish. A
/// crash in between leaves it in both places; replaying twice is harmless
/// (the cancellation is idempotent). Stops at the first failed publish.
#[tracing::instrument(skip(connection))]
pub async fn replay(
    connection: &Connection,
    selection: &Selection,
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
    crate::broker::close_channel_quietly(publisher.channel()).await;
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
    /// Takes every parked message and selects those `selection` names
    /// (see [`Selection`]). Messages parked after the plan began are never
    /// selected.
    #[tracing::instrument(skip(connection))]
    pub async fn prepare(
        connection: &Connection,
        selection: &Selection,
    ) -> Result<Self, ParkedError> {
        let mut pass = Pass::open(connection).await?;
        let mut delete = Vec::new();
        let mut keep = 0;
        while let Some((msg, was_there)) = pass.next().await? {
            let delivery = msg.delivery;
            let selected = was_there
                && selection.matches(&ParkedMessage::from_parts(
                    delivery.properties,
                    delivery.data,
                ));
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
    use lapin::BasicProperties;
    use lapin::types::{AMQPValue, FieldTable};

    use crate::broker::headers::H_PARKED_AT;

    use super::*;

    #[test]
    fn selection_by_order_id() {
        let m =
            ParkedMessage::from_parts(BasicProperties::default(), br#"{"order_id":"x"}"#.to_vec());
        assert!(Selection::All.matches(&m));
        assert!(Selection::OrderId("x".into()).matches(&m));
        assert!(!Selection::OrderId("y".into()).matches(&m));
    }

    #[test]
    fn selection_by_timer() {
        let parked =
            |body: &[u8]| ParkedMessage::from_parts(BasicProperties::default(), body.to_vec());
        let receive = parked(br#"{"order_id":"x","timer":"auto_receive"}"#);
        let cancel = parked(br#"{"order_id":"x"}"#);
        let bare = parked(b"12345");
        let junk = parked(b"not json");
        let by = |name: &str| Selection::Timer(name.into());
        assert!(by("auto_receive").matches(&receive));
        assert!(!by("auto_receive").matches(&cancel));
        assert!(by("cancel_unpaid").matches(&cancel));
        assert!(by("cancel_unpaid").matches(&bare));
        assert!(!by("cancel_unpaid").matches(&junk));
        assert_eq!(receive.timer.as_deref(), Some("auto_receive"));
        assert_eq!(junk.timer, None);
        assert_eq!(
            receive.to_json(chrono::Utc::now()).timer.as_deref(),
            Some("auto_receive")
        );
    }

    #[test]
    fn selection_by_parking_time_and_by_key() {
        let at = |t: &str| {
            let mut h = FieldTable::default();
            h.insert(H_PARKED_AT.into(), AMQPValue::LongString(t.into()));
            ParkedMessage::from_parts(BasicProperties::default().with_headers(h), b"{}".to_vec())
        };
        let old = at("2026-11-01T00:00:00.000Z");
        let new = at("2026-11-20T00:00:00.000Z");
        let cutoff = Selection::ParkedBefore("2026-11-10T00:00:00Z".parse().unwrap());
        assert!(cutoff.matches(&old));
        assert!(!cutoff.matches(&new));
        let undated = ParkedMessage::from_parts(BasicProperties::default(), b"{}".to_vec());
        assert!(!cutoff.matches(&undated), "no x-parked-at: kept");
        let keys = Selection::Keys([old.key()].into());
        assert!(keys.matches(&old));
        assert!(!keys.matches(&new));
    }
}
