//! **The layout record**: which layouts ([`Layout`]) have been declared on
//! this vhost, so that `topology check` and `pending` can name the queues
//! of an earlier layout that still hold timeouts after `cascade_shards`,
//! `lane_shards` or `lanes` changed ([`crate::ops::leftovers`]).
//!
//! **Why a record at all.** The service never deletes a queue, and every
//! delay queue keeps its TTL and dead-letter exchange, so a timeout waiting
//! in a queue that the new layout no longer declares is still delivered
//! where it is: an old cascade shard's level dead-letters through that
//! shard's lower-level exchanges (which stay, with their bindings, as long
//! as nobody deletes them), an old lane shard into `order-timeout.ready`.
//! What an operator needs is to know which queues are left over, whether
//! they still hold messages, and when they can go. Most names can be found
//! without a record, by passive declares of every name an earlier layout
//! could have had: there are at most [`crate::settings::Shards::MAX`]
//! shards. A removed lane cannot: its window could have been any second
//! from 3 s to 49 days. The record holds the lanes (and, for the operator's
//! sake, the whole layout) of every layout ever declared.
//!
//! **Where and how.** The broker is the state every replica shares with
//! the queues themselves (a database can outlive a vhost, or serve
//! several), and the service talks AMQP only, so the record is a durable
//! queue, [`LAYOUTS_QUEUE`], of the service's queue type, holding one small
//! JSON message per distinct layout ([`RecordedLayout`]). It is read with
//! an **exclusive consumer**, which doubles as a lock: a second reader is
//! refused (`403 ACCESS_REFUSED`) and tries again, so nobody sees the
//! record while another holds half of it unacknowledged. Messages are never
//! acknowledged: closing the channel puts them back (a quorum queue counts
//! that as a return, hence [`super::topology::DELIVERY_LIMIT`] on it, as on
//! the due and parked queues). A writer ([`record`], run by every
//! [`super::topology::declare`]) reads under the lock and publishes its
//! layout only if it is not there yet, so several replicas starting at once
//! add each layout once; one that cannot get the lock within
//! [`LOCK_WAIT`] publishes anyway (a duplicate is harmless: the record is a
//! set) and never holds up the start. Nothing here can lose or delay a
//! timeout: the record only feeds reports.

use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::protocol::AMQPSoftError;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use serde::{Deserialize, Serialize};

use super::layout::Layout;
use super::refusals::{is_not_found, soft_error};
use crate::settings::{Lane, QueueType};

/// The durable queue holding one [`RecordedLayout`] per layout declared on
/// this vhost.
pub(crate) const LAYOUTS_QUEUE: &str = "order-timeout.layouts";

/// How long a writer waits for the record's lock before publishing its
/// layout without reading.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(3);

/// How long a reader waits for the lock (a reader holds it for
/// milliseconds; a wedged one is ended by the broker when its connection
/// goes).
pub(crate) const READ_WAIT: Duration = Duration::from_secs(15);

/// How long reading the record's messages may take once the lock is held.
const DELIVERY_WAIT: Duration = Duration::from_secs(5);

/// Errors reading or writing the record.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordError {
    /// The broker could not be asked, or refused.
    #[error("the layout record {LAYOUTS_QUEUE}: {0}")]
    Amqp(#[source] lapin::Error),
    /// The record does not exist (no `serve` of a version that keeps it
    /// has declared its topology on this vhost yet).
    #[error("the layout record {LAYOUTS_QUEUE} does not exist yet")]
    Missing,
    /// Another reader held the record's lock the whole time.
    #[error("the layout record {LAYOUTS_QUEUE} stayed locked by another reader for {0:?}")]
    Busy(Duration),
    /// The broker did not confirm the record's message.
    #[error("the broker did not confirm the layout record's message")]
    NotConfirmed,
}

/// One layout as recorded: what [`Layout`] says about the queues' names
/// (the queue type is left out: it changes no name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RecordedLayout {
    /// `cascade_shards`.
    pub cascade_shards: u32,
    /// The lanes, as in the config (`"1800s"`), shortest first.
    pub lanes: Vec<String>,
    /// `lane_shards`.
    pub lane_shards: u32,
    /// `quorum` or `classic`, for the operator.
    pub queue_type: String,
    /// When it was first recorded (RFC 3339).
    pub recorded_at: String,
    /// The service version that recorded it.
    pub version: String,
}

impl RecordedLayout {
    /// The record of `layout`, made now.
    pub(crate) fn of(layout: &Layout) -> Self {
        let mut lanes = layout.lanes.clone();
        lanes.sort();
        lanes.dedup();
        Self {
            cascade_shards: layout.shards.get(),
            lanes: lanes.iter().map(Lane::to_string).collect(),
            lane_shards: layout.lane_shards.get(),
            queue_type: match layout.queue_type {
                QueueType::Quorum => "quorum",
                QueueType::Classic => "classic",
            }
            .into(),
            recorded_at: crate::message::format_instant(chrono::Utc::now()),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    /// Same queue names: same shards and lanes (not the same moment).
    pub(crate) fn same_names(&self, other: &Self) -> bool {
        (self.cascade_shards, &self.lanes, self.lane_shards)
            == (other.cascade_shards, &other.lanes, other.lane_shards)
    }

    /// The lanes that parse (a record written by hand may hold others).
    pub(crate) fn lanes(&self) -> Vec<Lane> {
        self.lanes
            .iter()
            .filter_map(|l| Lane::try_from(l.clone()).ok())
            .collect()
    }
}

/// The record's lock and what it holds: an exclusive consumer on
/// [`LAYOUTS_QUEUE`]; dropping the channel returns every message.
struct Held {
    channel: Channel,
    layouts: Vec<RecordedLayout>,
}

/// True when the broker refused because another consumer holds the queue
/// exclusively (or the queue is exclusive to another connection).
fn is_locked(error: &lapin::Error) -> bool {
    soft_error(error).is_some_and(|(kind, _)| kind == AMQPSoftError::ACCESSREFUSED)
}

/// Takes the lock and reads every message, trying for at most `wait`.
async fn hold(connection: &Connection, wait: Duration) -> Result<Held, RecordError> {
    let end = tokio::time::Instant::now() + wait;
    loop {
        let channel = connection
            .create_channel()
            .await
            .map_err(RecordError::Amqp)?;
        match try_hold(&channel).await {
            Ok(layouts) => return Ok(Held { channel, layouts }),
            Err(e) if is_locked(&e) && tokio::time::Instant::now() < end => {
                super::close_channel_quietly(&channel).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) if is_locked(&e) => {
                super::close_channel_quietly(&channel).await;
                return Err(RecordError::Busy(wait));
            }
            Err(e) if is_not_found(&e) => {
                return Err(RecordError::Missing);
            }
            Err(e) => {
                super::close_channel_quietly(&channel).await;
                return Err(RecordError::Amqp(e));
            }
        }
    }
}

/// On `channel`: counts the record's messages, consumes it exclusively
/// and reads at least that many (more if a writer appended meanwhile).
async fn try_hold(channel: &Channel) -> Result<Vec<RecordedLayout>, lapin::Error> {
    let count = super::peek_queue(channel, LAYOUTS_QUEUE)
        .await?
        .message_count();
    channel.basic_qos(0, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            LAYOUTS_QUEUE.into(),
            "order-timeout-layouts".into(),
            BasicConsumeOptions {
                exclusive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    let mut layouts = Vec::new();
    let mut seen = 0u32;
    let end = tokio::time::Instant::now() + DELIVERY_WAIT;
    loop {
        // Until the counted ones are in; then whatever is already on its way.
        let wait = if seen < count {
            end.saturating_duration_since(tokio::time::Instant::now())
        } else {
            Duration::from_millis(100)
        };
        match tokio::time::timeout(wait, deliveries.next()).await {
            Ok(Some(Ok(delivery))) => {
                seen += 1;
                match serde_json::from_slice::<RecordedLayout>(&delivery.data) {
                    Ok(layout) => layouts.push(layout),
                    Err(e) => {
                        tracing::warn!(error = %e, "ignoring a message of {LAYOUTS_QUEUE} that is no layout")
                    }
                }
            }
            Ok(Some(Err(e))) => return Err(e),
            Ok(None) | Err(_) => break,
        }
    }
    if seen < count {
        tracing::warn!(
            seen,
            count,
            "read fewer messages of {LAYOUTS_QUEUE} than it held"
        );
    }
    Ok(layouts)
}

/// The layouts recorded on this vhost, oldest first, each once.
#[tracing::instrument(skip(connection))]
pub(crate) async fn read(connection: &Connection) -> Result<Vec<RecordedLayout>, RecordError> {
    let held = hold(connection, READ_WAIT).await?;
    super::close_channel_quietly(&held.channel).await;
    let mut layouts: Vec<RecordedLayout> = Vec::new();
    for layout in held.layouts {
        if !layouts.iter().any(|l| l.same_names(&layout)) {
            layouts.push(layout);
        }
    }
    Ok(layouts)
}

/// Adds `layout` to the record unless it is there (see the module docs);
/// [`LAYOUTS_QUEUE`] must exist. Returns whether it published.
#[tracing::instrument(skip(connection))]
pub(crate) async fn record(connection: &Connection, layout: &Layout) -> Result<bool, RecordError> {
    let mine = RecordedLayout::of(layout);
    let held = match hold(connection, LOCK_WAIT).await {
        Ok(held) if held.layouts.iter().any(|l| l.same_names(&mine)) => {
            super::close_channel_quietly(&held.channel).await;
            return Ok(false);
        }
        Ok(held) => Some(held),
        Err(RecordError::Busy(wait)) => {
            tracing::info!(
                ?wait,
                "the layout record stayed locked; adding this layout without reading it"
            );
            None
        }
        Err(e) => return Err(e),
    };
    let published = publish(connection, &mine).await;
    if let Some(held) = held {
        super::close_channel_quietly(&held.channel).await;
    }
    published.map(|()| true)
}

/// Publishes `layout` into [`LAYOUTS_QUEUE`] and waits for the confirm.
async fn publish(connection: &Connection, layout: &RecordedLayout) -> Result<(), RecordError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(RecordError::Amqp)?;
    let result = async {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(RecordError::Amqp)?;
        let body = serde_json::to_vec(layout).unwrap_or_default();
        let confirm = channel
            .basic_publish(
                "".into(),
                LAYOUTS_QUEUE.into(),
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_content_type("application/json".into()),
            )
            .await
            .map_err(RecordError::Amqp)?
            .await
            .map_err(RecordError::Amqp)?;
        if confirm.is_ack() {
            Ok(())
        } else {
            Err(RecordError::NotConfirmed)
        }
    }
    .await;
    super::close_channel_quietly(&channel).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Shards;

    fn layout(shards: u32, lanes: &[&str], lane_shards: u32) -> Layout {
        Layout {
            queue_type: QueueType::Quorum,
            shards: Shards::try_from(shards).unwrap(),
            lanes: lanes
                .iter()
                .map(|l| Lane::try_from(l.to_string()).unwrap())
                .collect(),
            lane_shards: Shards::try_from(lane_shards).unwrap(),
        }
    }

    #[test]
    fn a_layout_is_recorded_by_its_names_and_read_back() {
        let a = RecordedLayout::of(&layout(4, &["30m", "7s"], 3));
        assert_eq!(
            a.lanes,
            ["7s", "1800s"],
            "sorted, as the config writes them"
        );
        let json = serde_json::to_string(&a).unwrap();
        let back: RecordedLayout = serde_json::from_str(&json).unwrap();
        assert_eq!(back, a);
        assert_eq!(back.lanes(), layout(1, &["7s", "30m"], 1).lanes);
        // The order of the lanes, the moment and the version do not matter.
        let mut b = RecordedLayout::of(&layout(4, &["7s", "1800s"], 3));
        b.recorded_at = "2020-01-01T00:00:00Z".into();
        b.version = "0.0.1".into();
        assert!(a.same_names(&b));
        assert!(!a.same_names(&RecordedLayout::of(&layout(2, &["7s", "30m"], 3))));
        assert!(!a.same_names(&RecordedLayout::of(&layout(4, &["7s"], 3))));
        assert!(!a.same_names(&RecordedLayout::of(&layout(4, &["7s", "30m"], 1))));
    }
}
