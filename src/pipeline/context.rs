//! What every step of the pipeline shares: the session's [`Context`]
//! (settings, publisher, the timers' stores, inventory, retry policy,
//! metrics), and the one way every step publishes a message it must not
//! lose ([`Context::publish_patiently`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, Utc};

use super::retry::RetryPolicy;
use crate::broker::acks::Acks;
use crate::broker::headers::Attempts;
use crate::broker::publisher::{PublishError, Publisher};
use crate::broker::topology::Layout;
use crate::inventory::InventoryClient;
use crate::message::OrderId;
use crate::observe::metrics::{Metrics, Stage};
use crate::settings::Settings;
use crate::store::Stores;

/// How long a publish the broker refuses (a nack from a full queue with
/// `reject-publish`, a channel error) is retried in-process, with backoff,
/// before the delivery it belongs to goes back to the queue. Returned at
/// once, the delivery would come straight back and fail again: a hot loop
/// for as long as the broker refuses. Held, it keeps its prefetch slot, so
/// the consumer slows down with the broker instead.
pub(crate) const PUBLISH_PATIENCE: Duration = Duration::from_secs(8);

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

impl Context {
    /// A confirmed publish (`publish`: a re-schedule, a parked copy), timed,
    /// and tried again with backoff while the broker refuses it, for at most
    /// [`PUBLISH_PATIENCE`] and only while the publishing channel is open
    /// (a lost connection ends the session, which returns the delivery).
    /// Every failed try is counted in `order_timeout_publish_failures_total`.
    pub(crate) async fn publish_patiently<T, F, Fut>(
        &self,
        what: &'static str,
        publish: F,
    ) -> Result<T, PublishError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, PublishError>>,
    {
        let mut publish = publish;
        let timed = || {
            let started = std::time::Instant::now();
            let attempt = publish();
            async move {
                let result = attempt.await;
                self.metrics.stage(Stage::Publish, started.elapsed());
                if result.is_err() {
                    self.metrics.publish_failed();
                }
                result
            }
        };
        timed
            .retry(publish_backoff())
            .when(|_| self.publisher.channel().status().connected())
            .notify(|error, pause| {
                tracing::warn!(%error, ?pause, what, "the broker refused a publish; trying again");
            })
            .await
    }

    /// Publishes `body` into the delay store toward `deadline`, tried again
    /// like [`Self::publish_patiently`]. Each try routes by the time left
    /// at that try (`now`, on the caller's clock, moved on by the time
    /// spent since): a message the broker took after two seconds of
    /// refusals would otherwise come back two seconds late, and the time
    /// left picks another route, around a full queue. Once less than
    /// `hold_below` is left, nothing is published and the caller gets the
    /// time left to wait out another way ([`Delayed::TooClose`]).
    pub(crate) async fn delay_patiently(
        &self,
        body: &[u8],
        order_id: &OrderId,
        deadline: DateTime<Utc>,
        now: DateTime<Utc>,
        attempts: &Attempts,
        hold_below: Duration,
    ) -> Result<Delayed, PublishError> {
        let since = std::time::Instant::now();
        let (publisher, layout) = (&self.publisher, &self.layout);
        self.publish_patiently("delay", move || async move {
            let now = now + since.elapsed();
            let left = (deadline - now).to_std().unwrap_or_default();
            if left < hold_below {
                return Ok(Delayed::TooClose(left));
            }
            let hops = publisher
                .delay(body, order_id, deadline, now, attempts, layout)
                .await?;
            Ok(Delayed::Published { hops })
        })
        .await
    }
}

/// What [`Context::delay_patiently`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delayed {
    /// The broker took it, on a route of `hops` delay queues.
    Published {
        /// Delay queues on its route.
        hops: u32,
    },
    /// Nothing was published: only this much is left, less than the hold
    /// threshold asked for.
    TooClose(Duration),
}

/// 100 ms doubling to 2 s, with jitter, [`PUBLISH_PATIENCE`] in all.
fn publish_backoff() -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .with_total_delay(Some(PUBLISH_PATIENCE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use backon::BackoffBuilder;

    #[test]
    fn a_refused_publish_backs_off_within_its_patience() {
        let pauses: Vec<Duration> = publish_backoff().build().collect();
        assert!(pauses.len() >= 5, "{pauses:?}");
        assert!(pauses[0] >= Duration::from_millis(100), "{pauses:?}");
        assert!(pauses.iter().all(|p| *p <= Duration::from_secs(4)));
        let total: Duration = pauses.iter().sum();
        assert!(total <= PUBLISH_PATIENCE, "{total:?}");
        assert!(total >= PUBLISH_PATIENCE / 2, "{total:?}");
    }
}
