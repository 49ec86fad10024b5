//! The path of a message, one module per step:
//!
//! ```text
//! order-timeout.due ──> consumer ──(not due: delay cascade / hold)──> ack
//!                          │ due
//!                          v
//!                       batcher ──> cancel (the cancel transaction) ──> finish (outbox) ──> ack
//!                          ^                       │ transient failure
//!                          └──── retry (backoff through the delay store, then park)
//! sweeper ──(orders no message came for)──> cancel statement ──> finish
//! ```
//!
//! [`job`] holds what every step shares (the job, its context, the ways it
//! ends); the steps depend on it and on each other only downwards:
//! consumer → job; batcher → cancel → finish → job; sweeper → finish.

pub(crate) mod batcher;
pub(crate) mod cancel;
pub(crate) mod consumer;
pub(crate) mod finish;
pub(crate) mod job;
pub(crate) mod retry;
pub(crate) mod sweeper;
