//! The retry policy.
//!
//! A transient failure (database down, inventory unavailable or slow) is
//! first retried in-process a couple of times with a short backoff
//! ([`quick_backoff`]). If it still fails, the message is not held: it is
//! re-published through the delay store with an attempt counter in its
//! headers and the next exponential delay ([`RetryPolicy::next_delay`]), and
//! the original is acked. Other orders keep flowing meanwhile. After
//! `max_attempts` failed attempts the message is parked with the last error.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

use crate::broker::headers::Attempts;
use crate::settings::RetrySettings;

/// What to do after a transient failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RetryDecision {
    /// Re-schedule through the delay store after this delay.
    RetryIn(Duration),
    /// Give up: park with the last error.
    Park,
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
            .nth(attempt.saturating_sub(1) as usize)
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
}
