//! The handle of a step that settles jobs ([`Worker`]): the shared
//! context, the way back into the batcher for jobs that must wait again,
//! the session's task tracker; and the two ways such a step hands an
//! order's messages on ([`Worker::wait_again`], [`Worker::retry_later`]).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use super::context::Context;
use super::failure::Failure;
use super::job::{Job, ack_all};
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

impl Worker {
    /// Sends one of an order's messages back toward `at` (on the database's
    /// clock, `db_now`) in its own task; duplicates are acked with
    /// `duplicates` as their outcome, one message is enough.
    pub(crate) async fn wait_again(
        &self,
        jobs: Vec<Job>,
        at: DateTime<Utc>,
        db_now: DateTime<Utc>,
        duplicates: Outcome,
    ) {
        self.wait_again_as(jobs, at, db_now, Outcome::Rescheduled, duplicates)
            .await;
    }

    /// [`Worker::wait_again`], the message sent back counted as `outcome`
    /// ([`Outcome::Rescheduled`], or [`Outcome::Locked`]: a wait of a
    /// second or more, always through the delay store, keeping the
    /// message's attempt count).
    pub(crate) async fn wait_again_as(
        &self,
        jobs: Vec<Job>,
        at: DateTime<Utc>,
        db_now: DateTime<Utc>,
        outcome: Outcome,
        duplicates: Outcome,
    ) {
        let mut jobs = jobs.into_iter();
        let first = jobs.next();
        ack_all(&self.ctx.metrics, jobs.collect(), duplicates).await;
        let Some(job) = first else { return };
        let Some(due) = self.due.upgrade() else {
            return job.requeue(&self.ctx.metrics).await;
        };
        let ctx = self.ctx.clone();
        let span = job.span.clone();
        self.tracker.spawn(tracing::Instrument::instrument(
            async move {
                let attempts = job.attempts.clone();
                job.wait_until(&ctx, at, db_now, attempts, outcome, &due)
                    .await;
            },
            span,
        ));
    }

    /// A failure for an order: the first message is retried with backoff
    /// or parked (in its own task: a hold must not block the caller);
    /// duplicates are acked as `duplicate`, since one retry is enough.
    pub(crate) fn retry_later(&self, jobs: Vec<Job>, failure: Failure) {
        let mut jobs = jobs.into_iter();
        let Some(first) = jobs.next() else { return };
        let ctx = self.ctx.clone();
        let due = self.due.clone();
        let span = first.span.clone();
        self.tracker.spawn(tracing::Instrument::instrument(
            async move {
                match due.upgrade() {
                    Some(due) => first.fail(&ctx, failure, &due).await,
                    None => first.requeue(&ctx.metrics).await,
                }
                ack_all(&ctx.metrics, jobs.collect(), Outcome::Duplicate).await;
            },
            span,
        ));
    }
}
