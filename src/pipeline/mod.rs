//! The path of a message, one module per step:
//!
//! ```text
//! order-timeout.due ──> consumer ──(not due: schedule: delay cascade / hold)──> ack
//!                          │ due         └──(near the delivery limit, unparseable)──> park
//!                          v
//!                       batcher ──> cancel (the cancel transaction) ──> finish (outbox) ──> ack
//!                          ^                       │ failure
//!                          └──── retry (transient: backoff through the delay store;
//!                                       used up, or permanent: park)
//! sweeper ──(orders no message came for)──> cancel statement ──> finish
//! watch ──(rows of a timer nobody publishes for, due within its window)──> delay store
//! ```
//!
//! Every step works per timer (`cancel_unpaid`, `[[timers]]`): a message
//! names its timer, and that timer's store flips its rows.
//!
//! What the steps share: [`job`] (the job, acked or returned to the queue),
//! [`context`] (the session's context and the worker handle, the patient
//! publish), [`failure`] (why a step failed, and whether waiting can fix
//! it). Each other way a job ends has its module: [`schedule`] (held, or
//! sent back through the delay store), [`retry`] (the retry policy and
//! where it is applied), [`park`] (parked with the reason).
//!
//! Dependencies point downwards:
//! consumer → park, schedule; batcher → cancel → finish → retry → park,
//! schedule → context → job; sweeper → finish. (The context holds the
//! [`retry::RetryPolicy`], which lives beside where it is applied.)

pub(crate) mod batcher;
pub(crate) mod cancel;
pub(crate) mod consumer;
pub(crate) mod context;
pub(crate) mod failure;
pub(crate) mod finish;
pub(crate) mod job;
pub(crate) mod park;
pub(crate) mod retry;
pub(crate) mod schedule;
pub(crate) mod sweeper;
pub(crate) mod watch;
