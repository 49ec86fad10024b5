//! The row → order-state mapping every SQL dialect shares: a dialect's
//! cancel statement reports, per order asked about, the same facts
//! ([`StateRow`]), and one function turns them into an [`OrderState`], so
//! the dialects cannot disagree about what a row means.

use chrono::{DateTime, Utc};

use super::{Cancellation, OrderState};

/// What a dialect's cancel statement reports about one order it was asked
/// about, after its UPDATE ran.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct StateRow {
    /// The order id asked about, as text.
    pub(crate) id: String,
    /// The row's status after the statement (`None`: no such row).
    pub(crate) status: Option<String>,
    /// The row's deadline (`None`: no such row).
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// When it was cancelled, if it was.
    pub(crate) cancelled_at: Option<DateTime<Utc>>,
    /// This statement flipped it to cancelled.
    pub(crate) just_cancelled: bool,
    /// This statement holds (took or renewed) the outbox lease.
    pub(crate) leased: bool,
    /// The outbox lease's end, if another worker holds it.
    pub(crate) claimed_until: Option<DateTime<Utc>>,
    /// An outbox row exists: this service cancelled it.
    pub(crate) has_outbox: bool,
    /// The stock release is done.
    pub(crate) stock_released: bool,
    /// The `order.cancelled` event is published.
    pub(crate) event_published: bool,
    /// The database's clock when the statement ran.
    pub(crate) db_now: DateTime<Utc>,
}

impl StateRow {
    /// Where the order stands.
    pub(crate) fn state(&self) -> OrderState {
        match (self.status.as_deref(), self.expires_at) {
            (None, _) | (_, None) => OrderState::Unknown,
            (Some("PAID"), _) => OrderState::Paid,
            (Some("CANCELLED"), Some(_))
                if self.has_outbox
                    && !self.leased
                    && !(self.stock_released && self.event_published) =>
            {
                OrderState::LeasedElsewhere {
                    until: self.claimed_until.unwrap_or(self.db_now),
                    db_now: self.db_now,
                }
            }
            (Some("CANCELLED"), Some(expires_at)) if self.has_outbox => {
                OrderState::Cancelled(Cancellation {
                    just_now: self.just_cancelled,
                    leased: self.leased,
                    expires_at,
                    cancelled_at: self.cancelled_at.unwrap_or(self.db_now),
                    release_pending: !self.stock_released,
                    event_pending: !self.event_published,
                })
            }
            (Some("CANCELLED"), _) => OrderState::CancelledElsewhere,
            (Some(_), Some(expires_at)) if expires_at > self.db_now => OrderState::NotYetDue {
                expires_at,
                db_now: self.db_now,
            },
            // UNPAID, overdue, not flipped by us: a concurrent
            // transaction got there first (our snapshot predates it).
            (Some(_), Some(_)) => OrderState::Contended,
        }
    }
}
