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
//! What the steps share: [`verdict`] (**what an order's state means**, one
//! pure function for the consumer's path and the sweeper alike), [`ending`]
//! (the handle of a step that settles jobs, and **the one place a job
//! ends**, top to bottom: acked, returned to the queue, held or sent back
//! through the delay store, retried or parked as the retry policy says,
//! and the patient publish those share), [`job`] (the job), [`context`]
//! (the session's context, the panic guard), [`failure`] (why a step failed, and whether
//! waiting can fix it), [`park`] (why a message is parked, and its record
//! built from that reason), [`retry`] (**the retry policy**, pure).
//! [`keep_parked`] moves parked messages from their queue into the parked
//! store, where operators read them.
//!
//! Dependencies point downwards, with no cycle:
//! consumer, batcher → cancel → finish → ending → park → job;
//! ending → context → retry; cancel, finish, sweeper → verdict → retry;
//! sweeper → finish; watch → ending.

pub(crate) mod batcher;
pub(crate) mod cancel;
pub(crate) mod consumer;
pub(crate) mod context;
pub(crate) mod ending;
pub(crate) mod failure;
pub(crate) mod finish;
pub(crate) mod job;
pub(crate) mod keep_parked;
pub(crate) mod park;
pub(crate) mod retry;
pub(crate) mod sweeper;
pub(crate) mod verdict;
pub(crate) mod watch;
