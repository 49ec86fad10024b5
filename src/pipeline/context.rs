//! What every step of the pipeline shares: the session's [`Context`]
//! (settings, publisher, the timers' stores, inventory, retry policy,
//! metrics), and the guard that turns a panic into a logged, counted end
//! of one piece of work ([`catch_panic`]). The handle of a step that
//! settles jobs, and their endings, are [`super::ending`]'s.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;

use super::retry::RetryPolicy;
use crate::broker::acks::Acks;
use crate::broker::publisher::Publisher;
use crate::broker::topology::Layout;
use crate::inventory::InventoryClient;
use crate::observe::metrics::Metrics;
use crate::settings::Settings;
use crate::store::Stores;

/// Everything the message-handling tasks of one broker session share.
pub(crate) struct Context {
    /// Settings of this instance.
    pub(crate) settings: Settings,
    /// The delay store's queues (cascade shards, lanes) the settings ask
    /// for: where re-schedules go.
    pub(crate) layout: Layout,
    /// Confirm-mode publisher (re-schedules, parking, events).
    pub(crate) publisher: Publisher,
    /// The consuming channel's open deliveries, through which every one is
    /// settled.
    pub(crate) acks: Arc<Acks>,
    /// The database: one store per timer, the default one first.
    pub(crate) stores: Stores,
    /// The inventory service.
    pub(crate) inventory: InventoryClient,
    /// Retry policy.
    pub(crate) retry: RetryPolicy,
    /// Metrics of this instance.
    pub(crate) metrics: Arc<Metrics>,
    /// This instance's name among the replicas, as the holder of a
    /// watch's lease (`pipeline/watch.rs`).
    pub(crate) instance: Arc<str>,
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
