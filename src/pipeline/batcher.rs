//! The batcher: gathers due jobs into batches for the cancel transaction.
//!
//! Whatever is waiting is taken, up to `batch_max`; more pile up while all
//! `batch_concurrency` cancel statements are running, so load makes batches
//! bigger, not slower. Each batch is handled in its own task by
//! [`super::cancel::cancel_batch`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};

use super::cancel;
use super::context::Worker;
use super::job::Job;

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
        worker.tracker.spawn(async move {
            cancel::cancel_batch(&worker2, batch, slot).await;
        });
    }
}

/// How long the batcher always waits for a second due order before it
/// sends a batch of one: no load, no more lateness than this.
const FIRST_LOOK: Duration = Duration::from_millis(3);

/// `first` and whatever else is due, up to `max` jobs: whatever arrives
/// within [`FIRST_LOOK`]; if anything did (there is load), whatever arrives
/// within `linger` of the start.
///
/// Why: held messages fall due one timer at a time; without a wait most
/// batches were 1–2 orders (measured with `bench` at 1,000 orders/s: 1.6
/// orders per cancel statement, the database the busiest process), and a
/// longer wait under load makes fewer, larger statements (at 1,000/s a
/// 15 ms linger halved the statements and cut the database's CPU per order
/// by a third, docs/BENCHMARKS.md) while an order that falls due alone
/// waits only the first look.
async fn gather<T>(first: T, due: &mut mpsc::Receiver<T>, max: usize, linger: Duration) -> Vec<T> {
    let start = tokio::time::Instant::now();
    let mut batch = vec![first];
    let mut until = start + FIRST_LOOK.min(linger);
    while batch.len() < max {
        match due.try_recv() {
            Ok(job) => batch.push(job),
            Err(mpsc::error::TryRecvError::Disconnected) => break,
            Err(mpsc::error::TryRecvError::Empty) => {
                match tokio::time::timeout_at(until, due.recv()).await {
                    Ok(Some(job)) => batch.push(job),
                    Ok(None) => break,
                    Err(_) if batch.len() > 1 && until < start + linger => until = start + linger,
                    Err(_) => break,
                }
            }
        }
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn linger() -> Duration {
        Duration::from_millis(15)
    }

    #[tokio::test(start_paused = true)]
    async fn an_order_due_alone_waits_only_the_first_look() {
        let (tx, mut rx) = mpsc::channel::<u32>(16);
        let start = Instant::now();
        let batch = gather(1, &mut rx, 200, linger()).await;
        assert_eq!(batch, [1]);
        assert_eq!(start.elapsed(), FIRST_LOOK);
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn under_load_it_lingers_for_more_up_to_the_linger_or_the_max() {
        let (tx, mut rx) = mpsc::channel::<u32>(1000);
        let feeder = tokio::spawn(async move {
            for n in 2..100 {
                tokio::time::sleep(Duration::from_millis(1)).await;
                if tx.send(n).await.is_err() {
                    return;
                }
            }
        });
        let start = Instant::now();
        let batch = gather(1, &mut rx, 200, linger()).await;
        assert_eq!(start.elapsed(), linger());
        assert!((14..=16).contains(&batch.len()), "{}", batch.len());
        assert!(batch.windows(2).all(|w| w[0] < w[1]), "in order");
        let full = gather(0, &mut rx, 5, linger()).await;
        assert_eq!(full.len(), 5, "the max ends a batch at once");
        // No linger at all: the first look is not taken either.
        let start = Instant::now();
        let _ = gather(0, &mut rx, 200, Duration::ZERO).await;
        assert!(start.elapsed() < Duration::from_millis(1));
        feeder.abort();
    }
}
