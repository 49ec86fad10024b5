//! The sweeper: the safety net for the dual-write gap.
//!
//! The order service inserts the order row, then publishes the timeout; if
//! it dies in between, no message will ever come. Every `interval` the
//! sweeper cancels UNPAID orders overdue by more than `grace` (the normal
//! path settles everything younger), and finishes cancellations whose stock
//! release is still pending (a parked or lost delivery), through the same
//! cancel statement and outbox leases as the consumer — so several replicas
//! sweeping at once, or a sweep racing a late message, still release stock
//! once.

use std::collections::HashSet;

use super::finish::{self, Pending};
use super::job::Worker;
use crate::message::OrderId;
use crate::shutdown::Shutdown;
use crate::store::{OrderState, StoreError};

/// Most batches one sweep takes before yielding to the next interval.
const MAX_BATCHES: usize = 100;

/// Sweeps every `interval` until `stop` fires.
pub(crate) async fn run(worker: Worker, stop: Shutdown) {
    let settings = worker.ctx.settings.sweeper.clone();
    if !settings.enabled {
        return;
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(settings.interval) => {}
            _ = stop.wait() => return,
        }
        match sweep_once(&worker).await {
            Ok(0) => tracing::debug!("sweep: nothing overdue"),
            Ok(n) => tracing::warn!(
                orders = n,
                "sweep: settled orders no timeout message did (dual-write gap or lost work)"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "sweep failed; next one in {:?}", settings.interval)
            }
        }
    }
}

/// One sweep; returns how many orders it cancelled or finished.
#[tracing::instrument(skip_all)]
pub(crate) async fn sweep_once(worker: &Worker) -> Result<u64, StoreError> {
    let ctx = &worker.ctx;
    let s = &ctx.settings.sweeper;
    let mut settled = 0u64;
    let mut seen: HashSet<OrderId> = HashSet::new();
    for round in 0..MAX_BATCHES {
        let mut ids = ctx.store.overdue(s.grace, s.batch).await?;
        if round == 0 {
            ids.extend(ctx.store.stale_outbox(s.grace, s.batch).await?);
        }
        // An order that did not settle in this sweep (contended, inventory
        // down) waits for the next one rather than spinning here.
        ids.retain(|id| seen.insert(id.clone()));
        if ids.is_empty() {
            break;
        }
        let full = ids.len() >= s.batch as usize;
        let states = ctx
            .store
            .cancel_due(&ids, ctx.settings.outbox_lease)
            .await?;
        let to_finish: Vec<Pending> = states
            .into_iter()
            .filter_map(|(id, state)| match state {
                OrderState::Cancelled(cancellation) if cancellation.leased => Some(Pending {
                    id,
                    cancellation,
                    jobs: Vec::new(),
                }),
                _ => None,
            })
            .collect();
        settled += to_finish.len() as u64;
        ctx.metrics.swept(to_finish.len() as u64);
        finish::finish(worker, to_finish).await;
        if !full {
            break;
        }
    }
    Ok(settled)
}
