//! The handle of a step that settles jobs ([`Worker`]): the shared
//! context, the way back into the batcher for jobs that must wait again,
//! the session's task tracker; and **the one place a job ends**
//! ([`Worker::end`], from an [`Ending`]): acked with an outcome, returned
//! to the queue, sent back toward its deadline (through the delay store,
//! or held in-process: [`Job::wait_until`]), a failed attempt retried or
//! parked as **the retry policy** says ([`Job::fail`]), or parked for a
//! reason ([`ParkWhy`], from which [`super::park`] builds the park record).
//! An order's messages end together: one is enough for whatever must
//! happen next, the others are acked as duplicates.
//!
//! Every ending acks only after its work is confirmed (broker confirm or
//! database commit); a crash anywhere redelivers the message.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use super::context::Context;
use super::failure::Failure;
use super::job::{Job, ack_each};
use super::park::{ParkWhy, park};
use crate::observe::metrics::{Metrics, Outcome};
use crate::shutdown::Shutdown;

/// What a step that settles jobs needs besides the jobs: the shared
/// context, the way back into the batcher for jobs that must wait again,
/// and the tracker that keeps the session open until spawned work ends.
#[derive(Clone)]
pub(crate) struct Worker {
    /// The session's shared context.
    pub(crate) ctx: Arc<Context>,
    /// The batcher's inbox. Weak, so that held work does not keep the
    /// batcher alive once the consumer has stopped: when it is gone, a job
    /// that must wait again is returned to the broker instead.
    pub(crate) due: mpsc::WeakSender<Job>,
    /// Tasks of this session.
    pub(crate) tracker: TaskTracker,
    /// Ends the broker session: what a batch that panicked does, so that
    /// its unacked deliveries are returned and delivered again.
    pub(crate) session: Shutdown,
}

/// Runs `work`, catching a panic (a value no one foresaw) so that it ends
/// that piece of work, not the task running it: the panic is logged, with
/// what happens next (`then`), and counted under `task`
/// (`order_timeout_task_panics_total`); `None` then.
pub(crate) async fn catch_panic<T>(
    metrics: &Metrics,
    task: &'static str,
    then: &str,
    work: impl Future<Output = T>,
) -> Option<T> {
    match AssertUnwindSafe(work).catch_unwind().await {
        Ok(value) => Some(value),
        Err(panic) => {
            metrics.task_panicked(task);
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(not a message)".into());
            tracing::error!(task, panic = %text, "a {task} ended in a panic; {then}");
            None
        }
    }
}

/// How an order's deliveries (its [`Job`]s: the first and its duplicates)
/// end: what [`Worker::end`] carries out.
pub(crate) enum Ending {
    /// Acked: the first counted as `first`, the others as `duplicates`.
    Ack {
        /// The first delivery's outcome.
        first: Outcome,
        /// The outcome of the others.
        duplicates: Outcome,
    },
    /// Returned to the queue unfinished (the batcher is gone).
    Requeue,
    /// The first sent back toward `at` (on the clock `now`) in its own
    /// task, counted as `outcome` ([`Outcome::Rescheduled`], or
    /// [`Outcome::Locked`]: through the delay store from a second on,
    /// keeping the message's attempt count); the others acked first as
    /// `duplicates`, one message is enough.
    WaitUntil {
        /// When it is due again.
        at: DateTime<Utc>,
        /// The clock `at` is measured against.
        now: DateTime<Utc>,
        /// How the message sent back is counted.
        outcome: Outcome,
        /// How the others are counted.
        duplicates: Outcome,
    },
    /// A failed attempt: the first retried with backoff or parked, as the
    /// retry policy says ([`Job::fail`], in its own task: a hold must not
    /// block the caller); the others then acked as duplicates, since one
    /// retry is enough.
    Fail(Failure),
    /// Every delivery parked for this reason.
    Park(ParkWhy),
}

impl Worker {
    /// Ends `jobs` (an order's deliveries) as `ending` says: **the one
    /// place a job ends**. A job that must wait goes back into the batcher
    /// through `due` (gone: it is returned to the queue instead); waits and
    /// retries run in the session's tasks.
    pub(crate) async fn end(&self, jobs: Vec<Job>, ending: Ending) {
        let ctx = &self.ctx;
        let mut jobs = jobs.into_iter();
        let Some(first) = jobs.next() else { return };
        let rest: Vec<Job> = jobs.collect();
        match ending {
            Ending::Ack {
                first: o,
                duplicates,
            } => {
                let acked =
                    std::iter::once((first, o)).chain(rest.into_iter().map(|j| (j, duplicates)));
                ack_each(&ctx.metrics, acked.collect()).await;
            }
            Ending::Requeue => {
                for job in std::iter::once(first).chain(rest) {
                    job.requeue(&ctx.metrics).await;
                }
            }
            Ending::WaitUntil {
                at,
                now,
                outcome,
                duplicates,
            } => {
                ack_each(
                    &ctx.metrics,
                    rest.into_iter().map(|j| (j, duplicates)).collect(),
                )
                .await;
                let Some(due) = self.due.upgrade() else {
                    return first.requeue(&ctx.metrics).await;
                };
                let ctx = ctx.clone();
                let span = first.span.clone();
                let wait = async move {
                    let attempts = first.attempts.clone();
                    first
                        .wait_until(&ctx, at, now, attempts, outcome, &due)
                        .await;
                };
                self.tracker
                    .spawn(tracing::Instrument::instrument(wait, span));
            }
            Ending::Fail(failure) => {
                let span = first.span.clone();
                let fail = fail_then_ack(self.ctx.clone(), self.due.clone(), first, failure, rest);
                self.tracker
                    .spawn(tracing::Instrument::instrument(fail, span));
            }
            Ending::Park(why) => {
                for job in std::iter::once(first).chain(rest) {
                    park(ctx, job.delivery, &job.attempts, why.clone()).await;
                }
            }
        }
    }

    /// Ends the deliveries of several orders ([`Worker::end`]), in order;
    /// the acks last, together, in as few frames as is safe
    /// ([`ack_each`]).
    pub(crate) async fn end_all(&self, endings: Vec<(Vec<Job>, Ending)>) {
        let mut acked = Vec::new();
        for (jobs, ending) in endings {
            match ending {
                Ending::Ack { first, duplicates } => {
                    let outcomes = std::iter::once(first).chain(std::iter::repeat(duplicates));
                    acked.extend(jobs.into_iter().zip(outcomes));
                }
                ending => self.end(jobs, ending).await,
            }
        }
        ack_each(&self.ctx.metrics, acked).await;
    }
}

/// [`Ending::Fail`]'s task: the first job fails (retried or parked), or is
/// returned to the queue once the batcher is gone; then its duplicates are
/// acked.
async fn fail_then_ack(
    ctx: Arc<Context>,
    due: mpsc::WeakSender<Job>,
    first: Job,
    failure: Failure,
    rest: Vec<Job>,
) {
    match due.upgrade() {
        Some(due) => first.fail(&ctx, failure, &due).await,
        None => first.requeue(&ctx.metrics).await,
    }
    let duplicates = rest.into_iter().map(|j| (j, Outcome::Duplicate));
    ack_each(&ctx.metrics, duplicates.collect()).await;
}
