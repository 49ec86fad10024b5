//! The row → order-state mapping: the cancel transaction (`cancel.rs`)
//! reports, per order asked about, the facts ([`StateRow`]), and one
//! function turns them into an [`OrderState`].

use chrono::{DateTime, Utc};

use super::{Cancellation, OrderState};

/// What the cancel transaction reports about one order it was asked
/// about, after its UPDATE ran.
#[derive(Debug, Default)]
pub(crate) struct StateRow {
    /// The order id asked about (canonical), as text.
    pub(crate) id: String,
    /// A row with that id exists.
    pub(crate) found: bool,
    /// Its status is `cancelled` (now, by this transaction, or before).
    pub(crate) is_cancelled: bool,
    /// Its status is `paid`.
    pub(crate) is_paid: bool,
    /// Its status is `unpaid`.
    pub(crate) is_unpaid: bool,
    /// It passes the configured guard.
    pub(crate) guard_ok: bool,
    /// Its deadline (`None`: no row, or the deadline expression is NULL).
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// When this service cancelled it (its outbox row), if it did.
    pub(crate) cancelled_at: Option<DateTime<Utc>>,
    /// This transaction cancelled it.
    pub(crate) just_cancelled: bool,
    /// The row exists and its last committed version is unpaid, overdue
    /// and passing the guard, but another transaction holds its lock, so
    /// this transaction skipped it (`FOR UPDATE SKIP LOCKED`).
    pub(crate) locked: bool,
    /// This transaction holds (took or renewed) the outbox lease.
    pub(crate) leased: bool,
    /// The outbox lease's end, if another worker holds it.
    pub(crate) claimed_until: Option<DateTime<Utc>>,
    /// An outbox row exists: this service cancelled it.
    pub(crate) has_outbox: bool,
    /// The stock release is done.
    pub(crate) stock_released: bool,
    /// The `order.cancelled` event is published.
    pub(crate) event_published: bool,
    /// The database's clock when the transaction ran.
    pub(crate) db_now: DateTime<Utc>,
}

impl StateRow {
    /// Where the order stands.
    pub(crate) fn state(&self) -> OrderState {
        if !self.found {
            return OrderState::Unknown;
        }
        if self.is_cancelled {
            return self.cancelled_state();
        }
        if self.is_paid {
            return OrderState::Paid;
        }
        // Back in the `from` status after this timer flipped it (the
        // shop reopened it): a timer flips a row at most once while its
        // outbox row is kept, so its effects never run twice.
        if self.has_outbox {
            return OrderState::LeftAlone;
        }
        match self.expires_at {
            Some(_) if !self.is_unpaid || !self.guard_ok => OrderState::LeftAlone,
            None => {
                if self.is_unpaid && self.guard_ok {
                    tracing::warn!(order_id = %self.id, "the order's deadline is NULL or no usable time (infinity, a zero date, a year before 1000 or after 9999): it is never due, left alone");
                }
                OrderState::LeftAlone
            }
            Some(expires_at) if expires_at > self.db_now => OrderState::NotYetDue {
                expires_at,
                db_now: self.db_now,
            },
            // Skipped: another transaction holds the row.
            Some(expires_at) if self.locked => OrderState::Locked {
                expires_at,
                db_now: self.db_now,
            },
            // Unpaid, overdue, passing the guard, not flipped by us: a
            // concurrent transaction got there first (our snapshot
            // predates it).
            Some(_) => OrderState::Contended,
        }
    }

    fn cancelled_state(&self) -> OrderState {
        if !self.has_outbox {
            return OrderState::CancelledElsewhere;
        }
        let work_pending = !(self.stock_released && self.event_published);
        if !self.leased && work_pending {
            return OrderState::LeasedElsewhere {
                until: self.claimed_until.unwrap_or(self.db_now),
                db_now: self.db_now,
            };
        }
        let cancelled_at = self.cancelled_at.unwrap_or(self.db_now);
        OrderState::Cancelled(Cancellation {
            just_now: self.just_cancelled,
            leased: self.leased,
            // A NULL deadline cannot be cancelled by this service; keep the
            // event well-formed all the same.
            expires_at: self.expires_at.unwrap_or(cancelled_at),
            cancelled_at,
            release_pending: !self.stock_released,
            event_pending: !self.event_published,
        })
    }
}
