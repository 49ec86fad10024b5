//! What happened to each message, counted per service instance.
//!
//! The outcome names are the `result` label values the Prometheus exporter
//! uses; the counters here are what tests and the demo read directly.

use std::sync::atomic::{AtomicU64, Ordering};

/// The end of one message's visit to the consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This delivery cancelled the order (and released stock).
    Cancelled,
    /// The order was paid: left alone.
    AlreadyPaid,
    /// The order was already cancelled (a duplicate or a redelivery);
    /// pending release work, if any, was finished.
    AlreadyCancelled,
    /// Sent (back) through the delay store toward its deadline.
    Rescheduled,
    /// A transient failure: re-scheduled with backoff.
    Retried,
    /// Moved to the parked queue.
    Parked,
    /// Unknown order dropped by configuration.
    Dropped,
}

impl Outcome {
    /// Every outcome, in a fixed order.
    pub const ALL: [Outcome; 7] = [
        Outcome::Cancelled,
        Outcome::AlreadyPaid,
        Outcome::AlreadyCancelled,
        Outcome::Rescheduled,
        Outcome::Retried,
        Outcome::Parked,
        Outcome::Dropped,
    ];

    /// The label value, e.g. `already_paid`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Cancelled => "cancelled",
            Outcome::AlreadyPaid => "already_paid",
            Outcome::AlreadyCancelled => "already_cancelled",
            Outcome::Rescheduled => "rescheduled",
            Outcome::Retried => "retried",
            Outcome::Parked => "parked",
            Outcome::Dropped => "dropped",
        }
    }
}

/// Outcome counters of one service instance.
#[derive(Debug, Default)]
pub struct Stats {
    outcomes: [AtomicU64; Outcome::ALL.len()],
}

impl Stats {
    /// Counts one message ending with `outcome`.
    pub fn record(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// How many messages ended with `outcome`.
    pub fn count(&self, outcome: Outcome) -> u64 {
        self.outcomes[outcome as usize].load(Ordering::Relaxed)
    }

    /// Messages processed to any outcome.
    pub fn total(&self) -> u64 {
        Outcome::ALL.iter().map(|o| self.count(*o)).sum()
    }
}
