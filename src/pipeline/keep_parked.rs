//! **The parked keeper**: moves parked messages from the queue
//! `order-timeout.parked` into the parked store (`order_timeout_parked`,
//! `store/parked.rs`), where operators read them without delivering them.
//!
//! The park path is unchanged (`park.rs` publishes a copy with its reasons
//! to the queue, confirmed), so a message parked while the database is
//! down waits safely in the queue. Each replica's keeper takes what waits
//! there every [`EVERY`]: one `basic.get`, the insert, then the ack. A
//! crash between the insert and the ack delivers the copy again, and the
//! store keeps it once (its `x-parked-id`). Messages parked by an earlier
//! release are moved the same way on the first start after an upgrade.

use std::time::Duration;

use chrono::Utc;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::{Channel, Connection};

use crate::broker::parked::{ParkedMessage, without_bookkeeping};
use crate::broker::topology::PARKED_QUEUE;
use crate::observe::metrics::Metrics;
use crate::shutdown::Shutdown;
use crate::store::{Store, StoreError};

/// How often the keeper looks for parked messages to move.
pub(crate) const EVERY: Duration = Duration::from_secs(1);

/// How often it counts what the store keeps (the gauge).
const COUNT_EVERY: Duration = Duration::from_secs(15);

/// How many messages one [`take_in`] moves at most, so that a command or a
/// tick of the keeper ends even while a flood is being parked.
pub(crate) const TAKE_IN_AT_MOST: usize = 10_000;

/// Why moving parked messages into the store stopped. Every message not
/// moved is still in the queue.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
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
    /// The store could not keep a message; it went back to the queue.
    #[error("keeping a parked message in order_timeout_parked: {0}")]
    Store(#[from] StoreError),
    /// A message kept in the store could not be acked; it is in the queue
    /// too, and moving it again keeps it once.
    #[error("acknowledging a parked message kept in order_timeout_parked: {0}")]
    Ack(String),
}

/// Moves the messages waiting in the parked queue into the parked store,
/// at most `limit`: each is taken (`basic.get`), kept, then acked. Returns
/// how many it moved. A message the store cannot keep goes back to the
/// queue (its channel is closed) and the error is returned.
#[tracing::instrument(skip_all)]
pub(crate) async fn take_in(
    connection: &Connection,
    store: &Store,
    limit: usize,
) -> Result<usize, KeepError> {
    let channel = parked_channel(connection).await?;
    let result = take_in_on(&channel, store, limit).await;
    crate::broker::close_channel_quietly(&channel).await;
    result
}

/// [`take_in`] on an open channel.
async fn take_in_on(channel: &Channel, store: &Store, limit: usize) -> Result<usize, KeepError> {
    let mut moved = 0;
    while moved < limit {
        let Some(got) = channel
            .basic_get(PARKED_QUEUE.into(), BasicGetOptions { no_ack: false })
            .await
            .map_err(KeepError::Get)?
        else {
            break;
        };
        let delivery = got.delivery;
        let message =
            ParkedMessage::from_parts(without_bookkeeping(&delivery.properties), delivery.data);
        let key = message.store_key();
        let properties = message.properties_json();
        store
            .keep_parked(&message.to_new(&key, &properties, Utc::now()))
            .await?;
        match delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => moved += 1,
            Ok(false) => return Err(KeepError::Ack("the channel closed".into())),
            Err(e) => return Err(KeepError::Ack(e.to_string())),
        }
    }
    Ok(moved)
}

/// A channel on which the parked queue exists (passive declare, so a
/// missing queue is reported, never created).
async fn parked_channel(connection: &Connection) -> Result<Channel, KeepError> {
    let channel = connection.create_channel().await.map_err(KeepError::Amqp)?;
    if let Err(e) = crate::broker::peek_queue(&channel, PARKED_QUEUE).await {
        return Err(if crate::broker::refusals::is_not_found(&e) {
            KeepError::QueueMissing
        } else {
            KeepError::Amqp(e)
        });
    }
    Ok(channel)
}

/// Messages waiting in the parked queue to be moved (a passive declare:
/// reads nothing).
pub(crate) async fn waiting(connection: &Connection) -> Result<u32, KeepError> {
    let channel = connection.create_channel().await.map_err(KeepError::Amqp)?;
    let depth = crate::broker::peek_queue(&channel, PARKED_QUEUE).await;
    crate::broker::close_channel_quietly(&channel).await;
    match depth {
        Ok(queue) => Ok(queue.message_count()),
        Err(e) if crate::broker::refusals::is_not_found(&e) => Err(KeepError::QueueMissing),
        Err(e) => Err(KeepError::Amqp(e)),
    }
}

/// The keeper of one broker session: moves parked messages into `store`
/// every [`EVERY`] and counts what it keeps (`order_timeout_parked_messages`)
/// every [`COUNT_EVERY`], until `stop`. A failure (the database down, a
/// grant missing) is logged and tried again at the next tick; the messages
/// wait in the queue meanwhile.
pub(crate) async fn run(
    connection: std::sync::Arc<Connection>,
    store: Store,
    metrics: std::sync::Arc<Metrics>,
    stop: Shutdown,
) {
    let mut counted_at: Option<tokio::time::Instant> = None;
    let mut failing = false;
    loop {
        match take_in(&connection, &store, TAKE_IN_AT_MOST).await {
            Ok(moved) => {
                if failing {
                    tracing::info!("parked messages are moved into the parked store again");
                }
                failing = false;
                if moved > 0 {
                    tracing::debug!(moved, "parked messages moved into the parked store");
                    counted_at = None;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "parked messages cannot be moved into the parked store; they wait in {PARKED_QUEUE}");
                }
                failing = true;
            }
        }
        if counted_at.is_none_or(|at| at.elapsed() >= COUNT_EVERY)
            && let Ok(counts) = store.parked_counts().await
        {
            metrics.set_parked_messages(counts.iter().map(|(_, n)| n).sum());
            counted_at = Some(tokio::time::Instant::now());
        }
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            () = stop.wait() => return,
        }
    }
}
