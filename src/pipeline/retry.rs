//! The retry policy, and where it is applied: a failed job is retried
//! ([`fail`](super::ending): re-scheduled with backoff, or parked), one delivery per
//! order (the ending [`Ending::Fail`](super::ending::Ending::Fail)).
//!
//! A transient failure (database down, inventory unavailable or slow) is
//! first retried in-process a couple of times with a short backoff
//! ([`quick_backoff`]). If it still fails, the message is not held: it is
//! re-published through the delay store with an attempt counter in its
//! headers and the next exponential delay ([`RetryPolicy::next_delay`]), and
//! the original is acked. Other orders keep flowing meanwhile. After
//! `max_attempts` failed attempts the message is parked with the last error
//! (`retries_exhausted`).
//!
//! A failure of the environment ([`Failure::is_environment`]: the database
//! down, a privilege revoked, a table or column missing, a statement the
//! server refuses whatever the row) is retried at the backoff's pace for as
//! long as it lasts and never parked: every other order waits for the same
//! fix, and none of them is to blame.
//!
//! A failure that waiting cannot fix ([`Failure::is_permanent`]: an SQL
//! error about the row's own values, an inventory
//! answer such as `FAILED_PRECONDITION`) is not retried: it is parked at once
//! (`permanent_failure`; `release_failed` when the inventory refused the
//! stock release, whose outbox row `finish.rs` gives up), after one attempt.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use chrono::{DateTime, TimeDelta, Utc};

use super::failure::Failure;
use crate::broker::headers::Attempts;
use crate::settings::RetrySettings;
use crate::store::{NextAttempt, OutboxFailure};

/// Failures after which every delay is `max_delay` (the exponential has long
/// reached it): the backoff is not stepped further, however many attempts a
/// message claims to have behind it.
const MAX_STEPS: u32 = 64;

/// The longest an outbox row whose work keeps failing waits between
/// attempts.
pub(crate) const OUTBOX_MAX_DELAY: Duration = Duration::from_secs(3600);

/// Failed attempts after which an outbox row's stock release is given up
/// even though each failure looked transient: with the default base delay
/// of 1 s the waits reach [`OUTBOX_MAX_DELAY`] after 12 attempts, so this
/// is about a day of failures. Far more than `retry.max_attempts`: a
/// message that ran out of attempts during an inventory outage is the
/// sweeper's to finish once the inventory is back, not to give up.
pub(crate) const OUTBOX_MAX_ATTEMPTS: u32 = 30;

/// What to do after a transient failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RetryDecision {
    /// Re-schedule through the delay store after this delay.
    RetryIn(Duration),
    /// Give up: park with the last error (`retries_exhausted`).
    Park,
    /// Waiting cannot fix it: park at once (`permanent_failure`).
    ParkAtOnce,
}

/// The retry policy, built from [`RetrySettings`].
#[derive(Clone, Debug)]
pub(crate) struct RetryPolicy {
    settings: RetrySettings,
}

impl RetryPolicy {
    /// A policy with these settings.
    pub(crate) fn new(settings: RetrySettings) -> Self {
        Self { settings }
    }

    /// Exponential delay with jitter for the `attempt`-th failure (1-based):
    /// base, 2 x base, 4 x base … capped at `max_delay`, plus up to one base of
    /// random jitter so a burst of failures does not come back as a burst.
    pub(crate) fn next_delay(&self, attempt: u32) -> Duration {
        let s = &self.settings;
        ExponentialBuilder::new()
            .with_min_delay(s.base_delay)
            .with_max_delay(s.max_delay)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
            .nth(attempt.clamp(1, MAX_STEPS) as usize - 1)
            .unwrap_or(s.max_delay)
    }

    /// Retry or park, given the history *including* the failure just seen.
    pub(crate) fn decide(&self, attempts: &Attempts) -> RetryDecision {
        if attempts.count >= self.settings.max_attempts {
            RetryDecision::Park
        } else {
            RetryDecision::RetryIn(self.next_delay(attempts.count))
        }
    }

    /// [`RetryPolicy::decide`], after `failure`: park at once when waiting
    /// cannot fix it and it is the order's own; never park for a failure of
    /// the environment ([`Failure::is_environment`]: the database down, a
    /// privilege revoked, a table missing), which is retried at the
    /// backoff's pace (up to `max_delay`) for as long as it lasts, since
    /// every other order waits for the same fix.
    pub(crate) fn decide_after(&self, attempts: &Attempts, failure: &Failure) -> RetryDecision {
        if failure.is_permanent() {
            RetryDecision::ParkAtOnce
        } else if failure.is_environment() {
            RetryDecision::RetryIn(self.next_delay(attempts.count))
        } else {
            self.decide(attempts)
        }
    }

    /// How long an outbox row waits after its `attempt`-th failed attempt
    /// (1-based) before the sweeper takes it again: the exponential of
    /// [`RetryPolicy::next_delay`] (base, 2 x base, … with jitter) capped at
    /// [`OUTBOX_MAX_DELAY`] rather than `max_delay`, since a row that keeps
    /// failing should make room for newer work for longer and longer.
    pub(crate) fn outbox_delay(&self, attempt: u32) -> Duration {
        ExponentialBuilder::new()
            .with_min_delay(self.settings.base_delay)
            .with_max_delay(OUTBOX_MAX_DELAY)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
            .nth(attempt.clamp(1, MAX_STEPS) as usize - 1)
            .unwrap_or(OUTBOX_MAX_DELAY)
            .min(OUTBOX_MAX_DELAY)
    }

    /// What comes after the `attempts`-th failed attempt at a row's work: a
    /// stock release the inventory refused for good, or one that failed
    /// [`OUTBOX_MAX_ATTEMPTS`] times, is given up (with the reason); anything
    /// else is tried again after the outbox backoff.
    pub(crate) fn outbox_next(&self, f: &OutboxFailure<'_>, attempts: u32) -> NextAttempt {
        if f.release && f.permanent {
            NextAttempt::GiveUp(format!(
                "the inventory refused the stock release: {}",
                f.error
            ))
        } else if f.release && attempts >= OUTBOX_MAX_ATTEMPTS {
            NextAttempt::GiveUp(format!(
                "the stock release failed {attempts} times, the last: {}",
                f.error
            ))
        } else {
            NextAttempt::After(self.outbox_delay(attempts))
        }
    }

    /// The short in-process backoff used before falling back to a
    /// re-schedule (a blip on the inventory service should not cost a
    /// second of lateness).
    pub(crate) fn quick_backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::new()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_millis(400))
            .with_jitter()
            .with_max_times(self.settings.quick_retries)
    }
}

/// `now + delay`, saturating at the latest representable instant.
pub(crate) fn later(now: DateTime<Utc>, delay: Duration) -> DateTime<Utc> {
    let delay = TimeDelta::from_std(delay).unwrap_or(TimeDelta::MAX);
    now.checked_add_signed(delay)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    #[test]
    fn delays_grow_exponentially_with_bounded_jitter_and_a_cap() {
        let policy = RetryPolicy::new(RetrySettings::default());
        for attempt in 1..=6u32 {
            let base = Duration::from_secs(1 << (attempt - 1));
            let d = policy.next_delay(attempt);
            assert!(
                d >= base && d <= base * 2,
                "attempt {attempt}: {d:?} vs {base:?}"
            );
        }
        assert!(policy.next_delay(30) <= Duration::from_secs(240));
    }

    #[test]
    fn outbox_delays_grow_exponentially_up_to_an_hour() {
        let policy = RetryPolicy::new(RetrySettings::default());
        for attempt in 1..=10u32 {
            let base = Duration::from_secs(1 << (attempt - 1));
            let d = policy.outbox_delay(attempt);
            assert!(d >= base && d <= base * 2, "attempt {attempt}: {d:?}");
        }
        for attempt in [13, 20, 64, u32::MAX] {
            assert!(policy.outbox_delay(attempt) <= OUTBOX_MAX_DELAY);
            assert!(policy.outbox_delay(attempt) >= OUTBOX_MAX_DELAY / 2);
        }
    }

    #[test]
    fn parks_after_max_attempts() {
        let policy = RetryPolicy::new(RetrySettings {
            max_attempts: 3,
            ..Default::default()
        });
        let now = Utc::now();
        let mut a = Attempts::default();
        for _ in 0..2 {
            a = a.failed(now, "inventory unavailable");
            assert!(matches!(policy.decide(&a), RetryDecision::RetryIn(_)));
        }
        a = a.failed(now, "inventory unavailable");
        assert_eq!(policy.decide(&a), RetryDecision::Park);
    }

    #[test]
    fn a_permanent_failure_parks_at_once_and_a_transient_one_is_retried() {
        let policy = RetryPolicy::new(RetrySettings::default());
        let first = Attempts::default().failed(Utc::now(), "x");
        let permanent = Failure::from(crate::store::StoreError::Sql(sqlx::Error::Decode(
            "a value of the row".into(),
        )));
        assert_eq!(
            policy.decide_after(&first, &permanent),
            RetryDecision::ParkAtOnce
        );
        assert!(matches!(
            policy.decide_after(&first, &Failure::KeptChanging),
            RetryDecision::RetryIn(_)
        ));
    }

    #[test]
    fn a_failure_of_the_environment_is_retried_past_max_attempts_and_never_parked() {
        let policy = RetryPolicy::new(RetrySettings {
            max_attempts: 3,
            ..Default::default()
        });
        let mut attempts = Attempts::default();
        let world = Failure::from(crate::store::StoreError::Schema {
            key: "[orders].also",
            problem: "permission denied for table stock".into(),
        });
        for _ in 0..50 {
            attempts = attempts.failed(Utc::now(), "permission denied");
            match policy.decide_after(&attempts, &world) {
                RetryDecision::RetryIn(delay) => {
                    assert!(delay <= RetrySettings::default().max_delay * 2, "{delay:?}")
                }
                other => panic!("attempt {}: {other:?}", attempts.count),
            }
        }
        // A failure of the inventory still runs out of attempts.
        let inventory = Failure::from(crate::inventory::InventoryError::Call {
            call: "ReleaseStock",
            code: tonic::Code::Unavailable,
            message: "down".into(),
        });
        assert_eq!(
            policy.decide_after(&attempts, &inventory),
            RetryDecision::Park
        );
    }

    #[test]
    fn huge_attempt_counts_and_delays_neither_hang_nor_overflow() {
        let policy = RetryPolicy::new(RetrySettings {
            max_attempts: u32::MAX,
            ..Default::default()
        });
        let cap = RetrySettings::default().max_delay;
        let started = std::time::Instant::now();
        for attempt in [0, 1, 63, 64, 65, u32::MAX / 2, u32::MAX] {
            assert!(policy.next_delay(attempt) <= cap * 2, "attempt {attempt}");
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        let a = Attempts {
            count: u32::MAX,
            ..Default::default()
        };
        assert_eq!(policy.decide(&a), RetryDecision::Park);
        let now = Utc::now();
        assert_eq!(later(now, Duration::MAX), DateTime::<Utc>::MAX_UTC);
        assert_eq!(
            later(now, Duration::from_secs(u64::MAX / 4)),
            DateTime::<Utc>::MAX_UTC
        );
        assert_eq!(
            later(now, Duration::from_secs(2)),
            now + TimeDelta::seconds(2)
        );
    }

    fn failure(release: bool, permanent: bool) -> OutboxFailure<'static> {
        OutboxFailure {
            id: "o-1",
            error: "inventory: Unavailable",
            release,
            permanent,
        }
    }

    #[test]
    fn a_refused_or_worn_out_release_is_given_up_and_anything_else_waits() {
        let retry = RetryPolicy::new(RetrySettings::default());
        assert!(matches!(
            retry.outbox_next(&failure(true, true), 1),
            NextAttempt::GiveUp(reason) if reason.contains("refused") && reason.contains("Unavailable")
        ));
        assert!(matches!(
            retry.outbox_next(&failure(true, false), OUTBOX_MAX_ATTEMPTS),
            NextAttempt::GiveUp(reason) if reason.contains("30 times")
        ));
        let NextAttempt::After(first) = retry.outbox_next(&failure(true, false), 1) else {
            panic!("a first transient failure waits")
        };
        let NextAttempt::After(later) =
            retry.outbox_next(&failure(true, false), OUTBOX_MAX_ATTEMPTS - 1)
        else {
            panic!("a transient failure waits until the last attempt")
        };
        assert!(first < later, "{first:?} {later:?}");
        // Only the event failed: the release is done, nothing to give up.
        assert!(matches!(
            retry.outbox_next(&failure(false, false), 1_000),
            NextAttempt::After(_)
        ));
    }
}
