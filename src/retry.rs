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
use chrono::{DateTime, Utc};
use lapin::types::{AMQPValue, FieldTable};

use crate::config::RetrySettings;

/// Header: failed attempts so far.
pub const H_ATTEMPTS: &str = "x-attempts";
/// Header: first failure time (RFC 3339).
pub const H_FIRST_FAILURE: &str = "x-first-failure";
/// Header: last failure time (RFC 3339).
pub const H_LAST_FAILURE: &str = "x-last-failure";
/// Header: the last error's text.
pub const H_ERROR: &str = "x-error";

/// A message's failure history, carried in its headers across re-schedules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attempts {
    /// Failed attempts so far (0 for a message that never failed).
    pub count: u32,
    /// When it first failed.
    pub first_failure: Option<DateTime<Utc>>,
    /// When it last failed.
    pub last_failure: Option<DateTime<Utc>>,
    /// Why it last failed.
    pub last_error: Option<String>,
}

impl Attempts {
    /// Reads the history from message headers; absent or malformed headers
    /// read as "no failures yet".
    pub fn from_headers(headers: Option<&FieldTable>) -> Self {
        let Some(headers) = headers else {
            return Self::default();
        };
        let map = headers.inner();
        let time = |k: &str| {
            header_str(map.get(k)).and_then(|s| {
                DateTime::parse_from_rfc3339(&s)
                    .ok()
                    .map(|t| t.with_timezone(&Utc))
            })
        };
        Self {
            count: map
                .get(H_ATTEMPTS)
                .and_then(header_int)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
            first_failure: time(H_FIRST_FAILURE),
            last_failure: time(H_LAST_FAILURE),
            last_error: header_str(map.get(H_ERROR)),
        }
    }

    /// The history after one more failure at `now` with `error`.
    pub fn failed(&self, now: DateTime<Utc>, error: impl Into<String>) -> Self {
        Self {
            count: self.count + 1,
            first_failure: Some(self.first_failure.unwrap_or(now)),
            last_failure: Some(now),
            last_error: Some(error.into()),
        }
    }

    /// Writes the history into `headers` (only the fields that are set).
    pub fn write(&self, headers: &mut FieldTable) {
        if self.count == 0 {
            return;
        }
        headers.insert(H_ATTEMPTS.into(), AMQPValue::LongLongInt(self.count.into()));
        if let Some(t) = self.first_failure {
            headers.insert(
                H_FIRST_FAILURE.into(),
                AMQPValue::LongString(crate::message::format_instant(t).as_str().into()),
            );
        }
        if let Some(t) = self.last_failure {
            headers.insert(
                H_LAST_FAILURE.into(),
                AMQPValue::LongString(crate::message::format_instant(t).as_str().into()),
            );
        }
        if let Some(e) = &self.last_error {
            headers.insert(H_ERROR.into(), AMQPValue::LongString(e.as_str().into()));
        }
    }
}

/// An integer header value of any AMQP integer width.
pub fn header_int(value: &AMQPValue) -> Option<i64> {
    match value {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some((*n).into()),
        AMQPValue::LongUInt(n) => Some((*n).into()),
        AMQPValue::ShortInt(n) => Some((*n).into()),
        AMQPValue::ShortUInt(n) => Some((*n).into()),
        AMQPValue::ShortShortInt(n) => Some((*n).into()),
        AMQPValue::ShortShortUInt(n) => Some((*n).into()),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok(),
        _ => None,
    }
}

/// A string header value (long or short string).
pub fn header_str(value: Option<&AMQPValue>) -> Option<String> {
    match value? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// What to do after a transient failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    /// Re-schedule through the delay store after this delay.
    RetryIn(Duration),
    /// Give up: park with the last error.
    Park,
}

/// The retry policy, built from [`RetrySettings`].
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    settings: RetrySettings,
}

impl RetryPolicy {
    /// A policy with these settings.
    pub fn new(settings: RetrySettings) -> Self {
        Self { settings }
    }

    /// Exponential delay with jitter for the `attempt`-th failure (1-based):
    /// base, 2 x base, 4 x base … capped at `max_delay`, plus up to one base of
    /// random jitter so a burst of failures does not come back as a burst.
    pub fn next_delay(&self, attempt: u32) -> Duration {
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
    pub fn decide(&self, attempts: &Attempts) -> RetryDecision {
        if attempts.count >= self.settings.max_attempts {
            RetryDecision::Park
        } else {
            RetryDecision::RetryIn(self.next_delay(attempts.count))
        }
    }

    /// The short in-process backoff used before falling back to a
    /// re-schedule (a blip on the inventory service should not cost a
    /// second of lateness).
    pub fn quick_backoff(&self) -> ExponentialBuilder {
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

    #[test]
    fn history_round_trips_through_headers() {
        let t0 = DateTime::parse_from_rfc3339("2026-11-21T10:00:00.125Z")
            .unwrap()
            .with_timezone(&Utc);
        let a = Attempts::default()
            .failed(t0, "first")
            .failed(t0 + chrono::Duration::seconds(2), "db down");
        let mut headers = FieldTable::default();
        a.write(&mut headers);
        let back = Attempts::from_headers(Some(&headers));
        assert_eq!(back, a);
        assert_eq!(back.count, 2);
        assert_eq!(back.first_failure, Some(t0));
        assert_eq!(Attempts::from_headers(None), Attempts::default());
    }
}
