//! What an order's state means, decided in one place, as a value.
//!
//! Every path that asks the cancel transaction about an order gets an
//! answer ([`OrderState`]), and then its outbox work done or failed. What
//! that means — finish it, leave it alone, wait and ask again, park it, set
//! its row aside, retry — depends also on where the order came from:
//! deliveries of the due queue wait on the answer (the consumer's batch,
//! [`Origin::Message`]), the sweeper's scan has none to settle
//! ([`Origin::Sweep`]). The watch decides nothing of its own: the rows it
//! finds are published as timeout messages and come back through the
//! consumer, as [`Origin::Message`].
//!
//! [`verdict`] is that decision, pure (no I/O, no clock), so that the
//! consumer's path ([`super::cancel`], [`super::finish`]) and the sweeper
//! ([`super::sweeper`]) cannot drift apart, and one table test states
//! every case. Carrying a verdict out is the caller's (the I/O); a
//! delivery's ending is [`super::ending::Ending`].

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::failure::Failure;
use super::retry::later;
use crate::observe::metrics::Outcome;
use crate::settings::UnknownOrderPolicy;
use crate::store::{Cancellation, OrderFailure, OrderState};

/// Where an order came from: what is waiting on its verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Deliveries of the due queue (a published message, or one a watch
    /// scheduled), batched by the consumer's path: acked, retried or parked
    /// by the verdict.
    Message,
    /// The sweeper's scan: a row no delivery waits on.
    Sweep,
}

/// What the service learnt about an order, to give a verdict on.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Seen<'a> {
    /// The cancel transaction's answer.
    State(&'a OrderState),
    /// The outbox work (stock release, event) of an order cancelled now
    /// (`just_now`) or earlier is done.
    WorkDone {
        /// Whether this batch's statement cancelled it.
        just_now: bool,
    },
    /// The outbox work of a cancelled order failed, given up for good when
    /// `given_up` (a release that can never succeed).
    WorkFailed {
        /// Why.
        failure: &'a Failure,
        /// Whether its outbox row was given up.
        given_up: bool,
    },
}

/// Why an order's message waits and is asked about again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The row's deadline is later than the message's (extended, or a bare
    /// order id): wait for the row's deadline.
    NotYetDue {
        /// The row's deadline.
        expires_at: DateTime<Utc>,
    },
    /// Another worker holds the lease of the order's outbox work until
    /// `until` (finishing its release right now): look again shortly.
    LeasedElsewhere {
        /// When the other worker's lease runs out.
        until: DateTime<Utc>,
    },
    /// Another transaction holds the row (a payment in flight): not a
    /// failure, asked again after `wait`.
    Locked {
        /// How long before it is asked about again.
        wait: Duration,
    },
}

impl Wait {
    /// How the message sent back is counted: a lock wait as `locked`
    /// (always through the delay store, keeping its attempt count), the
    /// others as `rescheduled`.
    pub(crate) fn outcome(self) -> Outcome {
        match self {
            Self::Locked { .. } => Outcome::Locked,
            Self::NotYetDue { .. } | Self::LeasedElsewhere { .. } => Outcome::Rescheduled,
        }
    }

    /// How the order's other messages are counted (one message waiting is
    /// enough): already cancelled when another worker is finishing it,
    /// duplicates otherwise.
    pub(crate) fn duplicates(self) -> Outcome {
        match self {
            Self::LeasedElsewhere { .. } => Outcome::AlreadyCancelled,
            Self::NotYetDue { .. } | Self::Locked { .. } => Outcome::Duplicate,
        }
    }
}

/// What the service does about one order.
#[derive(Clone, Debug)]
pub(crate) enum Verdict {
    /// Cancelled, now or earlier, with outbox work this caller holds:
    /// release the stock and publish the event ([`super::finish`]).
    Finish(Cancellation),
    /// Nothing more to do: its deliveries are acked, the first counted as
    /// `first`, the others as `duplicates`.
    Ack {
        /// The first delivery's outcome.
        first: Outcome,
        /// The outcome of the others.
        duplicates: Outcome,
    },
    /// Nothing for this caller to do (the sweep: paid, left alone,
    /// finished or being finished elsewhere, not yet due, gone).
    Skip,
    /// One message sent back toward `at` (on the database's clock
    /// `db_now`), for `why`; the others acked.
    WaitUntil {
        /// When to ask again.
        at: DateTime<Utc>,
        /// The database's clock when it answered.
        db_now: DateTime<Utc>,
        /// Why it waits.
        why: Wait,
    },
    /// Another transaction changed the row as the statement ran: asked
    /// about again within the batch.
    AskAgain,
    /// Held or contended: left for the next sweep.
    LeftBehind,
    /// No row with its id: parked (`unknown_order`).
    ParkUnknown,
    /// No row with its id, and the config says to drop such messages.
    DropUnknown,
    /// Failed in a way waiting may fix: the retry policy retries the
    /// message (or parks it once its attempts are used up); the sweeper
    /// leaves the row to its next sweep.
    Retry(Failure),
    /// The flip fails for the row's own values: the row is set aside (the
    /// sweeper skips it until it changes) and the order parked
    /// (`permanent_failure`) the first time.
    SetAside(Failure),
    /// The sweeper gave up the stock release of an order no delivery
    /// brings back: a message is parked for it (`release_failed`).
    GiveUp,
}

/// The verdict on an order from what the service `seen` about it, for
/// `origin`, with the config's policy for ids with no row (`unknown`):
/// one arm per case.
pub(crate) fn verdict(origin: Origin, seen: Seen<'_>, unknown: UnknownOrderPolicy) -> Verdict {
    use OrderState as S;
    use Origin::{Message, Sweep};
    use Outcome as O;
    use Seen::{State, WorkDone, WorkFailed};
    let ack = |first, duplicates| Verdict::Ack { first, duplicates };
    let wait = |at, db_now, why| Verdict::WaitUntil { at, db_now, why };
    match (origin, seen) {
        (Message, State(S::Cancelled(c))) => Verdict::Finish(c.clone()),
        (Sweep, State(S::Cancelled(c))) if c.leased => Verdict::Finish(c.clone()),
        (Message, State(S::Paid)) => ack(O::AlreadyPaid, O::AlreadyPaid),
        (Message, State(S::LeftAlone)) => ack(O::LeftAlone, O::LeftAlone),
        (Message, State(S::CancelledElsewhere)) => ack(O::AlreadyCancelled, O::AlreadyCancelled),
        (Message, State(S::Contended)) => Verdict::AskAgain,
        (Sweep, State(S::Contended | S::Locked { .. })) => Verdict::LeftBehind,
        (Message, State(&S::NotYetDue { expires_at, db_now })) => {
            wait(expires_at, db_now, Wait::NotYetDue { expires_at })
        }
        (Message, State(&S::LeasedElsewhere { until, db_now })) => {
            let at = leased_look_again_at(until, db_now);
            wait(at, db_now, Wait::LeasedElsewhere { until })
        }
        (Message, State(&S::Locked { expires_at, db_now })) => {
            let held_for = locked_wait(expires_at, db_now);
            let at = later(db_now, held_for);
            wait(at, db_now, Wait::Locked { wait: held_for })
        }
        (Message, State(S::Unknown)) if unknown == UnknownOrderPolicy::Park => Verdict::ParkUnknown,
        (Message, State(S::Unknown)) => Verdict::DropUnknown,
        // The flip failed for this order alone: about the row's own values
        // ([`Failure::is_permanent`]), or the environment's (retried, never
        // parked for it).
        (_, State(S::Failed(f))) if f.0.is_row_fault() => Verdict::SetAside(store_failure(f)),
        (_, State(S::Failed(f))) => Verdict::Retry(store_failure(f)),
        // Paid, left alone, finished or being finished elsewhere, not yet
        // due, gone: nothing for the sweep.
        (Sweep, State(_)) => Verdict::Skip,
        (Message, WorkDone { just_now: true }) => ack(O::Cancelled, O::AlreadyCancelled),
        (Message, WorkDone { just_now: false }) => ack(O::AlreadyCancelled, O::AlreadyCancelled),
        (Message, WorkFailed { failure, .. }) => Verdict::Retry(failure.clone()),
        (Sweep, WorkFailed { given_up: true, .. }) => Verdict::GiveUp,
        // Done, or its next attempt planned on its outbox row.
        (Sweep, WorkDone { .. } | WorkFailed { .. }) => Verdict::Skip,
    }
}

/// The failure of an order's own cancel transaction, as a step's failure.
fn store_failure(failure: &OrderFailure) -> Failure {
    Failure::Store(failure.0.clone())
}

/// The shortest and longest wait of an order whose row another transaction
/// holds ([`OrderState::Locked`]) before it is asked about again.
const LOCKED_WAIT: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(4));

/// How long an order whose row another transaction holds waits before it is
/// asked about again: a quarter of how long it has been overdue, between
/// [`LOCKED_WAIT`]'s bounds. A row held for a moment (a payment callback)
/// is asked about again after a second; one held for minutes every few
/// seconds, so that the order is cancelled within seconds of the lock
/// going away, and the messages of many held rows do not churn the broker.
/// No state is needed for the wait to grow: how long the order has been
/// overdue grows by itself.
fn locked_wait(expires_at: DateTime<Utc>, db_now: DateTime<Utc>) -> Duration {
    let overdue = (db_now - expires_at).to_std().unwrap_or_default();
    (overdue / 4).clamp(LOCKED_WAIT.0, LOCKED_WAIT.1)
}

/// When to look again at an order whose release another worker holds the
/// lease of: 100 ms after the lease ends, and at most a second from now.
fn leased_look_again_at(until: DateTime<Utc>, db_now: DateTime<Utc>) -> DateTime<Utc> {
    later(until, Duration::from_millis(100)).min(later(db_now, Duration::from_secs(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    #[test]
    fn a_held_order_waits_a_second_then_longer_up_to_a_few_seconds() {
        let due = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let after = |ms: i64| due + chrono::Duration::milliseconds(ms);
        assert_eq!(locked_wait(due, after(5)), Duration::from_secs(1));
        // Clock skew: the deadline later than the database's clock.
        assert_eq!(locked_wait(due, after(-500)), Duration::from_secs(1));
        assert_eq!(locked_wait(due, after(8_000)), Duration::from_secs(2));
        assert_eq!(locked_wait(due, after(12_000)), Duration::from_secs(3));
        assert_eq!(locked_wait(due, after(600_000)), Duration::from_secs(4));
    }

    fn cancellation(just_now: bool, leased: bool) -> Cancellation {
        let at = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        Cancellation {
            just_now,
            leased,
            release_pending: leased,
            event_pending: leased,
            expires_at: at,
            cancelled_at: at,
        }
    }

    /// Every state × origin, and the verdict (compared by its `Debug` text:
    /// a [`Failure`] has no equality of its own).
    #[test]
    #[rustfmt::skip] // One row per case.
    #[allow(clippy::too_many_lines)] // One row per case.
    fn every_state_for_every_origin() {
        use Origin::{Message, Sweep};
        use Outcome as O;
        use UnknownOrderPolicy::{Drop, Park};
        use Verdict as V;
        let now = DateTime::from_timestamp(1_800_000_100, 0).unwrap();
        let secs = |s: i64| now + chrono::Duration::seconds(s);
        let ms = |m: i64| now + chrono::Duration::milliseconds(m);
        let row_fault = OrderFailure::new(StoreError::Sql(sqlx::Error::Decode("bad".into())));
        let env_fault = OrderFailure::new(StoreError::Sql(sqlx::Error::PoolTimedOut));
        let (permanent, transient) = (store_failure(&row_fault), store_failure(&env_fault));
        let ack = |first, duplicates| V::Ack { first, duplicates };
        let wait = |at, why| V::WaitUntil {
            at,
            db_now: now,
            why,
        };
        let (flipped, finished) = (cancellation(true, true), cancellation(false, false));
        let c_now = OrderState::Cancelled(flipped.clone());
        let c_done = OrderState::Cancelled(finished.clone());
        let (paid, left) = (OrderState::Paid, OrderState::LeftAlone);
        let elsewhere = OrderState::CancelledElsewhere;
        let (contended, unknown) = (OrderState::Contended, OrderState::Unknown);
        let not_yet = OrderState::NotYetDue { expires_at: secs(60), db_now: now };
        let leased = OrderState::LeasedElsewhere { until: ms(300), db_now: now };
        let leased_long = OrderState::LeasedElsewhere { until: secs(30), db_now: now };
        let held = OrderState::Locked { expires_at: secs(-8), db_now: now };
        let bad_row = OrderState::Failed(row_fault.clone());
        let env = OrderState::Failed(env_fault.clone());
        let locked = Wait::Locked { wait: Duration::from_secs(2) };
        let rows: Vec<(Origin, &OrderState, UnknownOrderPolicy, Verdict)> = vec![
            (Message, &c_now, Park, V::Finish(flipped.clone())),
            (Message, &c_done, Park, V::Finish(finished.clone())),
            (Message, &paid, Park, ack(O::AlreadyPaid, O::AlreadyPaid)),
            (Message, &left, Park, ack(O::LeftAlone, O::LeftAlone)),
            (Message, &elsewhere, Park, ack(O::AlreadyCancelled, O::AlreadyCancelled)),
            (Message, &contended, Park, V::AskAgain),
            (Message, &not_yet, Park, wait(secs(60), Wait::NotYetDue { expires_at: secs(60) })),
            (Message, &leased, Park, wait(ms(400), Wait::LeasedElsewhere { until: ms(300) })),
            (Message, &leased_long, Park, wait(secs(1), Wait::LeasedElsewhere { until: secs(30) })),
            (Message, &held, Park, wait(secs(2), locked)),
            (Message, &unknown, Park, V::ParkUnknown),
            (Message, &unknown, Drop, V::DropUnknown),
            (Message, &bad_row, Park, V::SetAside(permanent.clone())),
            (Message, &env, Park, V::Retry(transient.clone())),
            (Sweep, &c_now, Park, V::Finish(flipped.clone())),
            (Sweep, &c_done, Park, V::Skip),
            (Sweep, &paid, Park, V::Skip),
            (Sweep, &left, Park, V::Skip),
            (Sweep, &elsewhere, Park, V::Skip),
            (Sweep, &contended, Park, V::LeftBehind),
            (Sweep, &not_yet, Park, V::Skip),
            (Sweep, &leased, Park, V::Skip),
            (Sweep, &leased_long, Park, V::Skip),
            (Sweep, &held, Park, V::LeftBehind),
            (Sweep, &unknown, Park, V::Skip),
            (Sweep, &unknown, Drop, V::Skip),
            (Sweep, &bad_row, Park, V::SetAside(permanent.clone())),
            (Sweep, &env, Park, V::Retry(transient.clone())),
        ];
        for (origin, state, unknown, expected) in rows {
            let got = verdict(origin, Seen::State(state), unknown);
            let case = format!("{origin:?} {state:?} {unknown:?}");
            assert_eq!(format!("{got:?}"), format!("{expected:?}"), "{case}");
        }
        let done = |just_now| Seen::WorkDone { just_now };
        let failed = |failure, given_up| Seen::WorkFailed { failure, given_up };
        let rows: Vec<(Origin, Seen<'_>, Verdict)> = vec![
            (Message, done(true), ack(O::Cancelled, O::AlreadyCancelled)),
            (Message, done(false), ack(O::AlreadyCancelled, O::AlreadyCancelled)),
            (Message, failed(&transient, false), V::Retry(transient.clone())),
            (Message, failed(&permanent, true), V::Retry(permanent.clone())),
            (Sweep, done(true), V::Skip),
            (Sweep, done(false), V::Skip),
            (Sweep, failed(&transient, false), V::Skip),
            (Sweep, failed(&permanent, true), V::GiveUp),
        ];
        for (origin, seen, expected) in rows {
            let got = verdict(origin, seen, Park);
            let case = format!("{origin:?} {seen:?}");
            assert_eq!(format!("{got:?}"), format!("{expected:?}"), "{case}");
        }
    }

    #[test]
    fn a_wait_is_counted_as_its_why_says() {
        let at = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let not_yet = Wait::NotYetDue { expires_at: at };
        let leased = Wait::LeasedElsewhere { until: at };
        let locked = Wait::Locked {
            wait: Duration::from_secs(1),
        };
        assert_eq!(not_yet.outcome(), Outcome::Rescheduled);
        assert_eq!(not_yet.duplicates(), Outcome::Duplicate);
        assert_eq!(leased.outcome(), Outcome::Rescheduled);
        assert_eq!(leased.duplicates(), Outcome::AlreadyCancelled);
        assert_eq!(locked.outcome(), Outcome::Locked);
        assert_eq!(locked.duplicates(), Outcome::Duplicate);
    }
}
