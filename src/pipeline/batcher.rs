//! The batcher: gathers due jobs into batches for the cancel transaction.
//!
//! Whatever is waiting is taken, up to `batch_max`, and a batch that is not
//! full waits up to `batch_linger` for more; more pile up while all
//! `batch_concurrency` cancel statements are running, so load makes batches
//! bigger, not slower. Each batch is handled in its own task, straight
//! down the pipeline: [`super::cancel::cancel_batch`] (the cancel
//! transaction, every order settled by its state), then
//! [`super::finish::finish`] (stock release, event, outbox marks, ack).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};

use super::cancel;
use super::context::catch_panic;
use super::ending::Worker;
use super::finish;
use super::job::Job;
use super::verdict::Origin;

/// Runs until every sender of `due` is gone (the consumer has stopped and
/// no held message is still waiting).
pub(crate) async fn run(worker: Worker, mut due: mpsc::Receiver<Job>) {
    let settings = &worker.ctx.settings;
    let slots = Arc::new(Semaphore::new(settings.batch_concurrency.max(1)));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = due.recv().await else {
            return;
        };
        let batch = gather(first, &mut due, settings.batch_max, settings.batch_linger).await;
        let worker2 = worker.clone();
        let work = async move {
            let to_finish = cancel::cancel_batch(&worker2, batch).await;
            // The slot bounds concurrent cancel statements only: the outbox
            // work (inventory calls, events) runs after it is given back.
            drop(slot);
            for (store, pending) in to_finish {
                finish::finish(&worker2, &store, pending, Origin::Message).await;
            }
        };
        let worker2 = worker.clone();
        worker.tracker.spawn(async move {
            // A batch that panics (a value no one foresaw) would leave its
            // deliveries unacked, holding prefetch slots until the channel
            // closes: it is logged and counted, and the session ends, so
            // that the broker returns them and the next session (started
            // at once) takes them again.
            let then = "ending the broker session so that its messages are delivered again";
            if catch_panic(&worker2.ctx.metrics, "batch", then, work)
                .await
                .is_none()
            {
                worker2.session.trigger();
            }
        });
    }
}

/// `first` and whatever else is due, up to `max` jobs.
async fn gather(
    first: Job,
    due: &mut mpsc::Receiver<Job>,
    max: usize,
    linger: Duration,
) -> Vec<Job> {
    let mut batch = vec![first];
    // Linger a moment for more: held messages fall due one timer at a
    // time, and without this most batches were 1–2 orders (measured with
    // `bench` at 1,000 orders/s: 1.6 orders per cancel statement, the
    // database the busiest process; 3 ms gave ~10, 10 ms ~18, 25 ms ~30).
    let linger_until = tokio::time::Instant::now() + linger;
    while batch.len() < max {
        match due.try_recv() {
            Ok(job) => batch.push(job),
            Err(mpsc::error::TryRecvError::Disconnected) => break,
            Err(mpsc::error::TryRecvError::Empty) => {
                match tokio::time::timeout_at(linger_until, due.recv()).await {
                    Ok(Some(job)) => batch.push(job),
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }
    batch
}
