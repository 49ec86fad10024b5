//! **The layout**: which broker objects a service declares, as its settings
//! ask (the queue type, the cascade's shards, the lanes and their shards).
//! [`super::topology`] turns it into queues, exchanges and bindings,
//! [`super::layouts`] records every layout declared on a vhost, and the
//! consumer asks it where a message waits ([`Layout::route`]).

use super::cascade::DelayRoute;
use super::lanes;
use crate::settings::{Lane, QueueType, Settings, Shards};

/// What to declare: the queue type, the number of cascade shards, the lanes
/// and their shards, as the settings ask ([`Layout::of`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Queue type of every queue.
    pub queue_type: QueueType,
    /// Copies of the cascade.
    pub shards: Shards,
    /// The lanes ([`super::lanes`]).
    pub lanes: Vec<Lane>,
    /// Copies of each lane.
    pub lane_shards: Shards,
}

impl Layout {
    /// The broker objects `settings` ask for.
    pub fn of(settings: &Settings) -> Self {
        Self {
            queue_type: settings.queue_type,
            shards: settings.cascade_shards,
            lanes: settings.lanes.clone(),
            lane_shards: settings.lane_shards,
        }
    }

    /// The cascade alone, `shards` times over, of `queue_type` queues.
    pub fn cascade(queue_type: QueueType, shards: Shards) -> Self {
        Self {
            queue_type,
            shards,
            lanes: Vec::new(),
            lane_shards: Shards::default(),
        }
    }

    /// Where a message for `order_id`, due in `remaining_ms` (≥ 1 s), waits:
    /// the lane it fits, else the cascade ([`lanes::delay_route`]).
    pub fn route(&self, remaining_ms: u64, order_id: &str) -> DelayRoute {
        lanes::delay_route(
            remaining_ms,
            order_id,
            &self.lanes,
            self.lane_shards,
            self.shards,
        )
    }

    pub(crate) fn shard_range(&self) -> std::ops::Range<u32> {
        0..self.shards.get()
    }
}
