//! Gauges of what waits: the timeouts in each level of the delay cascade
//! and in each lane,
//! the bound by which all of them fall due, and the consumers of the
//! service's queues. The running service sets them from passive queue
//! declares on an interval (`ops::pending`), never from message bodies;
//! they sit on the instance's registry beside the other metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::settings::Lane;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabels {
    shard: String,
    level: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: &'static str,
}

/// The pending-timeout gauges of one instance.
#[derive(Clone, Debug, Default)]
pub(crate) struct PendingGauges {
    messages: Family<LevelLabels, Gauge>,
    latest_due: Gauge,
    consumers: Family<QueueLabel, Gauge>,
}

impl PendingGauges {
    /// Registers the gauges on `registry` (the instance's, prefixed
    /// `order_timeout`).
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let gauges = Self::default();
        registry.register(
            "pending_messages",
            "Timeouts waiting in one delay queue: a cascade level (level=\"KK\": due within 2^(k+1) s) or a lane (level=\"lane_Ws\": due within W s)",
            gauges.messages.clone(),
        );
        registry.register_with_unit(
            "pending_latest_due",
            "Every timeout waiting in the delay cascade falls due within this many seconds (0: none waits)",
            Unit::Seconds,
            gauges.latest_due.clone(),
        );
        registry.register(
            "queue_consumers",
            "Consumers of the service's due queue",
            gauges.consumers.clone(),
        );
        gauges
    }

    /// Messages waiting in level `level` of shard `shard`.
    pub(crate) fn set_level(&self, shard: u32, level: u32, messages: u32) {
        self.set_queue(shard, format!("{level:02}"), messages);
    }

    /// Messages waiting in shard `shard` of lane `lane` (labelled
    /// `level="lane_1800s"`, so a sum over the family is every timeout
    /// waiting in the delay store).
    pub(crate) fn set_lane(&self, shard: u32, lane: Lane, messages: u32) {
        self.set_queue(shard, format!("lane_{lane}"), messages);
    }

    fn set_queue(&self, shard: u32, level: String, messages: u32) {
        self.messages
            .get_or_create(&LevelLabels {
                shard: shard.to_string(),
                level,
            })
            .set(i64::from(messages));
    }

    /// The bound by which every waiting timeout falls due (0: none).
    pub(crate) fn set_latest_due_secs(&self, secs: u64) {
        self.latest_due.set(i64::try_from(secs).unwrap_or(i64::MAX));
    }

    /// Consumers of `queue`.
    pub(crate) fn set_consumers(&self, queue: &'static str, consumers: u32) {
        self.consumers
            .get_or_create(&QueueLabel { queue })
            .set(i64::from(consumers));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gauges_are_served_under_prometheus_names() {
        let mut registry = Registry::with_prefix("order_timeout");
        let gauges = PendingGauges::register(&mut registry);
        gauges.set_level(1, 3, 7);
        gauges.set_lane(2, Lane::try_from("30m".to_string()).unwrap(), 40);
        gauges.set_latest_due_secs(16);
        gauges.set_consumers("order-timeout.due", 2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for needle in [
            r#"order_timeout_pending_messages{shard="1",level="03"} 7"#,
            r#"order_timeout_pending_messages{shard="2",level="lane_1800s"} 40"#,
            "order_timeout_pending_latest_due_seconds 16",
            r#"order_timeout_queue_consumers{queue="order-timeout.due"} 2"#,
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}
