//! **Lanes**: a fixed-TTL queue for each payment window most orders share
//! (the `lanes` setting), beside the cascade ([`super::cascade`]), and the
//! choice between the two ([`delay_route`]).
//!
//! Real shops give every order the same window. Through the cascade a
//! 30-minute timeout makes 3–5 hops, and every order of the shop makes the
//! same ones, through the same few queues; each hop is a quorum enqueue
//! and a pass through the queue's one dead-letter worker, the broker's
//! scarcest work here. A lane makes it one hop.
//!
//! Lane W is `lane_shards` quorum queues, `order-timeout.lane.<W>s` (shard
//! 0) and `order-timeout.lane.<W>s.sS`, each holding messages W − 2 s
//! ([`lane_ttl_ms`]) and dead-lettering them, at least once, into the
//! cascade's exit (`order-timeout.ready`). A message fits lane W when it is
//! due in [W − 1.5 s, W): after the lane's TTL it is due in 0.5–2 s
//! ([`HOLD_SLACK_MS`]: room for the re-publish to reach the queue), and the
//! consumer holds it in-process until its exact deadline, as after the
//! cascade, so a lane is never early. A fresh order with the shop's window
//! is seen a few milliseconds after it was created, so it fits; anything
//! else (other windows, retries, a deadline past W by clock skew) takes the
//! cascade. An order's lane shard is [`shard_for`] of its id.
//!
//! The service sends to a lane's queue through the default exchange; the
//! order service may also publish a fresh order straight into a lane with
//! routing key `schedule.<W>s` on the entry exchange (a lane entry,
//! [`super::topology::lane_entry_key`], bound to shard 0), which skips the
//! due queue and the consumer before the wait.

use super::cascade::{
    DelayRoute, HOLD_SLACK_MS, HOLD_WINDOW_SECS, cascade_delay_secs, cascade_route, shard_for,
};
use crate::settings::{Lane, Shards};

/// Name of lane `lane`'s queue in shard `shard`.
pub fn lane_name(lane: Lane, shard: u32) -> String {
    if shard == 0 {
        format!("order-timeout.lane.{lane}")
    } else {
        format!("order-timeout.lane.{lane}.s{shard}")
    }
}

/// How long lane `lane` holds a message: its window less the hold window,
/// in milliseconds.
pub(crate) fn lane_ttl_ms(lane: Lane) -> u64 {
    (lane.secs() - HOLD_WINDOW_SECS) * 1000
}

/// The lane a message due in `remaining_ms` fits, if any: the one whose
/// TTL leaves it at least [`HOLD_SLACK_MS`] and less than the hold window
/// to wait afterwards (the longest such lane when windows overlap).
pub(crate) fn lane_for(remaining_ms: u64, lanes: &[Lane]) -> Option<Lane> {
    lanes
        .iter()
        .copied()
        .filter(|&lane| {
            let ttl = lane_ttl_ms(lane);
            ttl + HOLD_SLACK_MS <= remaining_ms && remaining_ms < ttl + HOLD_WINDOW_SECS * 1000
        })
        .max()
}

/// Where the delay store sends a message for order `order_id` that is due
/// in `remaining_ms` (≥ 1 s): the lane it fits, else the cascade.
pub(crate) fn delay_route(
    remaining_ms: u64,
    order_id: &str,
    lanes: &[Lane],
    lane_shards: Shards,
    cascade_shards: Shards,
) -> DelayRoute {
    match lane_for(remaining_ms, lanes) {
        Some(lane) => DelayRoute {
            exchange: String::new(),
            routing_key: lane_name(lane, shard_for(order_id, lane_shards)),
            hops: 1,
        },
        None => cascade_route(
            cascade_delay_secs(remaining_ms),
            shard_for(order_id, cascade_shards),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(text: &str) -> Lane {
        Lane::try_from(text.to_string()).unwrap()
    }

    fn shards(n: u32) -> Shards {
        Shards::try_from(n).unwrap()
    }

    #[test]
    fn the_shared_window_takes_its_lane_in_one_hop() {
        let lanes = [lane("30m"), lane("2h")];
        // A 30-minute order seen 8 ms after it was created.
        let r = delay_route(1_799_992, "order-1", &lanes, shards(8), shards(4));
        assert_eq!(r.exchange, "", "the default exchange");
        assert!(
            r.routing_key.starts_with("order-timeout.lane.1800s"),
            "{r:?}"
        );
        assert_eq!(r.hops, 1);
        let r = delay_route(7_199_990, "order-1", &lanes, shards(8), shards(4));
        assert!(
            r.routing_key.starts_with("order-timeout.lane.7200s"),
            "{r:?}"
        );
        // Another window, a retry, a deadline past the window: the cascade.
        for remaining_ms in [600_000, 4_000, 1_800_000, 1_797_999, 1_798_400] {
            let r = delay_route(remaining_ms, "order-1", &lanes, shards(8), shards(4));
            assert!(r.exchange.starts_with("order-timeout.delay."), "{r:?}");
        }
    }

    #[test]
    fn a_lane_is_never_early_and_leaves_less_than_the_hold_window() {
        let lanes = [lane("3s"), lane("31s"), lane("32s"), lane("30m")];
        for remaining_ms in (0..2_000_000).step_by(97) {
            if let Some(l) = lane_for(remaining_ms, &lanes) {
                let left = remaining_ms as i64 - lane_ttl_ms(l) as i64;
                assert!(left >= 0, "{remaining_ms} ms in {l} would be early");
                assert!(
                    left >= HOLD_SLACK_MS as i64,
                    "{remaining_ms} ms in {l}: {left} ms"
                );
                assert!(left < (HOLD_WINDOW_SECS * 1000) as i64, "{remaining_ms}");
            }
        }
        // Overlapping windows: the longer TTL, the shorter hold.
        assert_eq!(lane_for(30_500, &lanes), Some(lane("32s")));
        assert_eq!(lane_ttl_ms(lane("3s")), 1_000, "the shortest lane");
    }

    #[test]
    fn orders_keep_their_lane_shard() {
        let lanes = [lane("30m")];
        let names: std::collections::BTreeSet<String> = (0..400)
            .map(|i| {
                let id = format!("order-{i}");
                let a = delay_route(1_799_000, &id, &lanes, shards(8), shards(4));
                let b = delay_route(1_798_500, &id, &lanes, shards(8), shards(4));
                assert_eq!(a, b);
                a.routing_key
            })
            .collect();
        assert_eq!(names.len(), 8, "{names:?}");
        assert!(names.contains("order-timeout.lane.1800s"));
        assert!(names.contains("order-timeout.lane.1800s.s7"));
    }
}
