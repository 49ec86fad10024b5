//! Operator tooling for parked messages: list, show, replay and purge them
//! (the `order-timeout parked …` commands and the console's parked pages).
//!
//! Parked messages arrive in the queue `order-timeout.parked` (the park
//! path and the parked format are unchanged, [`crate::broker::parked`]).
//! [`keep_parked::take_in`] moves them from there into **the parked store**
//! (`order_timeout_parked`, [`crate::store::ParkedRow`]): one `basic.get`,
//! the insert, then the ack, so each message is delivered once, to be
//! kept. Every replica does this continuously ([`keep_parked::run`]),
//! and every command here does it first, so messages parked by an earlier
//! release, or while no replica runs, are moved too.
//!
//! Everything an operator does then reads or changes the store, never the
//! queue: listing and viewing deliver nothing, so however often and however
//! concurrently they run, no message's delivery count changes, none is
//! reordered and none can reach a delivery limit and be dropped. Replay
//! republishes a message (publisher confirm) and only then deletes its row;
//! purge deletes exactly the rows it counted when it was prepared.
//! Messages parked after an operation began are left alone, so it always
//! ends.

use std::collections::BTreeMap;

use lapin::Connection;

use crate::broker::parked::replay_properties;
/// The parked format (written by the service, read back here) lives in
/// [`crate::broker::parked`]; named here too for the commands' callers.
pub use crate::broker::parked::{ParkedJson, ParkedMessage};
use crate::broker::publisher::{PublishError, Publisher};
use crate::broker::topology::{ENTRY_EXCHANGE, SCHEDULE_ROUTING_KEY};
use crate::pipeline::keep_parked::{self, KeepError};
/// Which parked messages an operation acts on.
pub use crate::store::ParkedFilter as Selection;
use crate::store::{Store, StoreError};

/// Errors of the parked-message operations. A message an operation had not
/// finished with is still parked when one of these is returned.
#[derive(Debug, thiserror::Error)]
pub enum ParkedError {
    /// Opening a channel failed.
    #[error("talking to the broker: {0}")]
    Amqp(#[source] lapin::Error),
    /// Moving the messages waiting in the parked queue into the store
    /// failed; they are still in the queue.
    #[error(transparent)]
    TakeIn(#[from] KeepError),
    /// The parked store (the database) failed.
    #[error("the parked store (order_timeout_parked): {0}")]
    Store(#[from] StoreError),
    /// Republishing a message failed; it stays parked. `replayed` messages
    /// were replayed (and removed from the parked store) before.
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

/// Moves the messages waiting in the parked queue into the parked store
/// ([`keep_parked::take_in`]), as every command here does first, so that
/// it shows messages parked while no replica of this release ran.
pub async fn take_in(connection: &Connection, store: &Store) -> Result<usize, ParkedError> {
    Ok(keep_parked::take_in(connection, store, keep_parked::TAKE_IN_AT_MOST).await?)
}

/// Messages waiting in the parked queue to be moved into the store (a
/// passive declare: reads nothing).
pub async fn waiting(connection: &Connection) -> Result<u32, ParkedError> {
    Ok(keep_parked::waiting(connection).await?)
}

/// What a listing shows.
#[derive(Clone, Debug)]
pub struct Listing {
    /// Up to the limit of messages the selection names, in the order they
    /// were parked (oldest first), after the cursor.
    pub messages: Vec<ParkedMessage>,
    /// Every message kept in the store.
    pub total: usize,
    /// Every message kept, by its short reason (`x-error-kind`;
    /// [`NO_REASON`] when it has none).
    pub by_reason: BTreeMap<String, usize>,
}

/// The reason [`Listing::by_reason`] counts a message without
/// `x-error-kind` under.
pub const NO_REASON: &str = "(none)";

/// What a listing reads.
#[derive(Clone, Debug)]
pub struct Page {
    /// Which messages.
    pub selection: Selection,
    /// Those after this row id (0: from the first).
    pub after: i64,
    /// At most this many.
    pub limit: u32,
    /// Each with at most this many bytes of its body (`None`: the body
    /// as kept).
    pub excerpt: Option<usize>,
}

/// Lists parked messages from the store. Reading delivers nothing:
/// nothing is removed, reordered or counted.
#[tracing::instrument(skip(store))]
pub async fn list(store: &Store, page: &Page) -> Result<Listing, ParkedError> {
    let rows = store
        .parked_page(&page.selection, page.after, page.limit, page.excerpt)
        .await?;
    let mut total = 0;
    let mut by_reason = BTreeMap::new();
    for (kind, n) in store.parked_counts().await? {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        total += n;
        *by_reason
            .entry(kind.unwrap_or_else(|| NO_REASON.into()))
            .or_default() += n;
    }
    Ok(Listing {
        messages: rows.into_iter().map(ParkedMessage::from_row).collect(),
        total,
        by_reason,
    })
}

/// The parked message with row id `id`, with its body as kept.
#[tracing::instrument(skip(store))]
pub async fn show(store: &Store, id: i64) -> Result<Option<ParkedMessage>, ParkedError> {
    let rows = store
        .parked_page(&Selection::Ids(vec![id]), 0, 1, None)
        .await?;
    Ok(rows.into_iter().next().map(ParkedMessage::from_row))
}

/// How many parked messages the store keeps.
pub async fn count(store: &Store) -> Result<u64, ParkedError> {
    Ok(store.parked_counts().await?.iter().map(|(_, n)| n).sum())
}

/// Outcome of a replay.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Messages republished (confirmed) and removed from the parked store.
    pub replayed: usize,
    /// Selected messages left parked because the store kept only the first
    /// the parked store's 4 MiB of their body: republishing a part would be
    /// wrong (they were parked as too large and would be again).
    pub cut: usize,
    /// Messages still parked after the replay.
    pub kept: usize,
}

/// Republishes the selected parked messages to the entry exchange
/// (`order-timeout` / `schedule`) with a fresh attempt budget, each deleted
/// from the parked store only after the broker confirmed the republish. A
/// crash in between leaves it in both places; replaying twice is harmless
/// (the cancellation is idempotent). Stops at the first failed publish.
#[tracing::instrument(skip(connection, store))]
pub async fn replay(
    connection: &Connection,
    store: &Store,
    selection: &Selection,
) -> Result<ReplayReport, ParkedError> {
    let upto = store.parked_last_id().await?;
    let ids = store.parked_ids(selection, upto).await?;
    let publisher = Publisher::new(connection)
        .await
        .map_err(ParkedError::Amqp)?;
    let mut report = ReplayReport::default();
    let result = replay_each(&publisher, store, &ids, &mut report).await;
    publisher.close().await;
    result?;
    report.kept = usize::try_from(count(store).await?).unwrap_or(usize::MAX);
    Ok(report)
}

/// Replays the messages `ids`, one at a time, counting in `report`.
async fn replay_each(
    publisher: &Publisher,
    store: &Store,
    ids: &[i64],
    report: &mut ReplayReport,
) -> Result<(), ParkedError> {
    for &id in ids {
        // Gone meanwhile: replayed or purged by someone else.
        let Some(parked) = show(store, id).await? else {
            continue;
        };
        if !parked.body_is_whole() {
            report.cut += 1;
            continue;
        }
        if let Err(error) = publish_replay(publisher, &parked).await {
            return Err(ParkedError::Replay {
                replayed: report.replayed,
                order_id: parked.order_id.unwrap_or_else(|| "-".into()),
                error,
            });
        }
        store.delete_parked(&[id]).await?;
        report.replayed += 1;
    }
    Ok(())
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
    /// Messages still parked.
    pub kept: usize,
}

/// A purge in two steps, so the operator can confirm the exact count: the
/// plan knows which parked messages match when it is prepared;
/// [`PurgePlan::commit`] deletes those (and reports how many it found
/// still there), [`PurgePlan::abort`] deletes nothing. Messages parked
/// after the plan was prepared are never deleted by it.
pub struct PurgePlan {
    store: Store,
    ids: Vec<i64>,
    total: usize,
}

impl PurgePlan {
    /// Counts the parked messages `selection` names now.
    #[tracing::instrument(skip(store))]
    pub async fn prepare(store: &Store, selection: &Selection) -> Result<Self, ParkedError> {
        let upto = store.parked_last_id().await?;
        let ids = store.parked_ids(selection, upto).await?;
        let total = usize::try_from(count(store).await?).unwrap_or(usize::MAX);
        Ok(Self {
            store: store.clone(),
            ids,
            total,
        })
    }

    /// How many messages [`commit`](Self::commit) would delete.
    pub fn selected(&self) -> usize {
        self.ids.len()
    }

    /// The row ids it would delete.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }

    /// How many messages stay parked.
    pub fn kept(&self) -> usize {
        self.total.saturating_sub(self.ids.len())
    }

    /// Deletes the selected messages.
    #[tracing::instrument(skip_all, fields(selected = self.ids.len()))]
    pub async fn commit(self) -> Result<PurgeReport, ParkedError> {
        let deleted = self.store.delete_parked(&self.ids).await?;
        let kept = usize::try_from(count(&self.store).await?).unwrap_or(usize::MAX);
        Ok(PurgeReport {
            deleted: usize::try_from(deleted).unwrap_or(usize::MAX),
            kept,
        })
    }

    /// Deletes nothing.
    pub fn abort(self) -> PurgeReport {
        PurgeReport {
            deleted: 0,
            kept: self.total,
        }
    }
}
