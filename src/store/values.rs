//! The values the store's interface ([`super::OrderStore`]) takes and
//! gives: where an order stands after the cancel transaction
//! ([`OrderState`], [`Cancellation`]), a failed attempt at outbox work and
//! what comes next ([`OutboxFailure`], [`NextAttempt`]), an order's lines,
//! and the pages and marks of the scans.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::StoreError;
use crate::message::OrderId;

/// Where a timer's watch stands ([`OrderStore::watch_lease`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchMark {
    /// Every row due up to this instant has been scheduled.
    pub scanned_until: DateTime<Utc>,
    /// The database's clock when the lease was taken.
    pub db_now: DateTime<Utc>,
}

/// A row set aside ([`OrderStore::set_aside`]): what `order-timeout
/// set-aside list` and the console show.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct SetAsideRow {
    /// The order id, as the table spells it.
    pub order_id: String,
    /// Why its flip failed: the database's error.
    pub reason: String,
    /// When it was first set aside (as the row is now).
    pub set_aside_at: DateTime<Utc>,
    /// How often its flip failed (as the row is now).
    pub attempts: i32,
    /// When the sweeper tries it again.
    pub retry_at: DateTime<Utc>,
}

/// Where a scan in (deadline, id) order goes on from: a watch's
/// ([`OrderStore::due_between`]) or a sweep's ([`OrderStore::overdue`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowCursor {
    /// Rows due after this instant…
    pub deadline: DateTime<Utc>,
    /// …or at it, with an id after this one, as the table spells it
    /// (`None`: none at it).
    pub id: Option<String>,
}

/// One page of a scan over a timer's rows, and where the next one starts.
/// The cursor is the last row *read*: a row that is no order (its id is
/// not a valid order id, its deadline is NULL) is left out of `rows`, with
/// a warning, but never ends the scan early.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<C> {
    /// The orders read, with their deadlines.
    pub rows: Vec<(OrderId, DateTime<Utc>)>,
    /// Where the next page starts; `None` when this page read fewer rows
    /// than asked for (the last one).
    pub next: Option<C>,
}

/// Where an order stands after [`OrderStore::cancel_due`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrderState {
    /// No row with that id.
    Unknown,
    /// Paid: leave it alone.
    Paid,
    /// Neither unpaid nor paid nor cancelled, or it fails the guard
    /// (soft-deleted, say), or its deadline is NULL: left alone, like a
    /// paid order.
    LeftAlone,
    /// Still unpaid and its deadline has not passed (it may have been
    /// extended): wait until `expires_at`.
    NotYetDue {
        /// The row's deadline.
        expires_at: DateTime<Utc>,
        /// The database's clock when it answered.
        db_now: DateTime<Utc>,
    },
    /// Unpaid and overdue, yet this statement did not cancel it: another
    /// transaction holds or just changed the row. Ask again shortly.
    Contended,
    /// Unpaid and overdue as far as the last committed version of the row
    /// says, but another transaction holds the row's lock (a payment
    /// callback in flight, say), so the cancel transaction skipped it
    /// rather than make the whole batch wait: ask again shortly. Not a
    /// failure: it costs no attempt.
    Locked {
        /// The row's deadline (last committed version).
        expires_at: DateTime<Utc>,
        /// The database's clock when it answered.
        db_now: DateTime<Utc>,
    },
    /// Cancelled, by this statement or an earlier one.
    Cancelled(Cancellation),
    /// Cancelled by someone other than this service (no outbox row): nothing
    /// for us to release.
    CancelledElsewhere,
    /// The cancel transaction failed for this order alone (it ran on its
    /// own: the timer has `also` statements, or a batch failed in a way
    /// waiting cannot fix and was run again order by order to find the
    /// orders the failure belongs to). The other orders asked about were
    /// settled; whether this one is parked or retried is the error's
    /// ([`StoreError::is_permanent`]).
    Failed(OrderFailure),
    /// Cancelled, with outbox work pending that another worker has leased
    /// until `until`: check again then (if that worker crashed, the lease
    /// will have run out and this delivery takes over).
    LeasedElsewhere {
        /// When the other worker's lease runs out.
        until: DateTime<Utc>,
        /// The database's clock when it answered.
        db_now: DateTime<Utc>,
    },
}

/// Why the cancel transaction of one order failed
/// ([`OrderState::Failed`]). Compared by its text.
#[derive(Clone, Debug)]
pub struct OrderFailure(pub Arc<StoreError>);

impl OrderFailure {
    /// The failure `error`.
    pub fn new(error: StoreError) -> Self {
        Self(Arc::new(error))
    }
}

impl PartialEq for OrderFailure {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for OrderFailure {}

/// A cancellation this service made, and what is still to do for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cancellation {
    /// True when the statement just now cancelled it.
    pub just_now: bool,
    /// True when this caller holds the outbox lease (and so must finish the
    /// pending work, or give the lease back with [`OrderStore::release_leases`]).
    pub leased: bool,
    /// The deadline it was cancelled for.
    pub expires_at: DateTime<Utc>,
    /// When it was cancelled.
    pub cancelled_at: DateTime<Utc>,
    /// The stock release is still to be done.
    pub release_pending: bool,
    /// The `order.cancelled` event is still to be published.
    pub event_pending: bool,
}

/// A failed attempt at one outbox row's work, as
/// [`OrderStore::record_failures`] records it.
#[derive(Clone, Copy, Debug)]
pub struct OutboxFailure<'a> {
    /// The order.
    pub id: &'a str,
    /// What failed, for `last_error`.
    pub error: &'a str,
    /// The stock release failed (not only the event).
    pub release: bool,
    /// Waiting cannot fix it (the inventory refused the release for good).
    pub permanent: bool,
}

/// What comes after a failed attempt at an outbox row's work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NextAttempt {
    /// Try again once this much time has passed.
    After(Duration),
    /// Never again by itself: the row is marked given up with this reason,
    /// and only a replayed message finishes it.
    GiveUp(String),
}

/// One line of an order.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct OrderItem {
    /// Stock keeping unit.
    pub sku: String,
    /// Units reserved.
    pub quantity: i64,
}

/// An order's row as a timer sees it, read without changing or locking
/// anything: what `order-timeout explain` reports.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct RowFacts {
    /// In the timer's `to` status (cancelled, for the default timer).
    pub is_to: bool,
    /// In the `paid` status, if the timer has one.
    pub is_paid: bool,
    /// In the `from` status (unpaid).
    pub is_from: bool,
    /// It passes the configured guard.
    pub guard_ok: bool,
    /// Its deadline (`None`: NULL, or no usable time).
    pub expires_at: Option<DateTime<Utc>>,
}

/// What this timer's outbox records of an order it flipped.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct OutboxFacts {
    /// When it was flipped (the cancel transaction's start).
    pub created_at: DateTime<Utc>,
    /// When its stock was released, if it was.
    pub stock_released_at: Option<DateTime<Utc>>,
    /// When its event was published, if it was.
    pub event_published_at: Option<DateTime<Utc>>,
    /// Failed attempts at the release or the event.
    pub attempts: i32,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// When the sweeper tries again after a failure.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When the release was given up (refused for good, or out of attempts).
    pub gave_up_at: Option<DateTime<Utc>>,
}

/// Everything a timer's store knows of one order, read-only.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OrderFacts {
    /// The row, if there is one.
    pub row: Option<RowFacts>,
    /// The database's clock when it was read.
    pub db_now: DateTime<Utc>,
    /// The outbox row, if this timer flipped it.
    pub outbox: Option<OutboxFacts>,
    /// The set-aside mark, if its flip failed for its own values.
    pub set_aside: Option<SetAsideRow>,
}

/// One cancellation in the history (the console's history page): a
/// timer's outbox row, and the deadline of its order as the row says now.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct HistoryRow {
    /// The order id, as the table spells it.
    pub order_id: String,
    /// What the outbox records of it (`stock_released_at` is also set at
    /// the flip when `release = "none"`).
    #[sqlx(flatten)]
    #[serde(flatten)]
    pub outbox: OutboxFacts,
    /// The order's deadline as its row says now (`None`: no row any more,
    /// or no usable time): read for the rows of a page only.
    #[sqlx(skip)]
    pub deadline: Option<DateTime<Utc>>,
}

/// Where a page of the history goes on from: after this row in the
/// history's order (newest first: by flip time, then timer, then order
/// id, each descending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryCursor {
    /// The row's flip time.
    pub at: DateTime<Utc>,
    /// Its timer.
    pub timer: String,
    /// Its order id.
    pub order_id: String,
}
