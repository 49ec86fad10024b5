//! **The delay cascade**: the arithmetic of routing a delay through
//! fixed-TTL queues. [`super::topology`] declares the queues and bindings
//! this math addresses.
//!
//! RabbitMQ dead-letters expired messages only from the head of a queue, so a
//! queue with a different TTL per message makes short timeouts wait behind
//! long ones. Here every delay queue has one fixed TTL, so queue order is
//! expiry order: level k holds messages for 2^k seconds, and a message's
//! routing key spells the bits of its delay in seconds, most significant
//! first (`0.0.1.0.1…`, [`LEVELS`] words). At each level's topic exchange,
//! the message goes into the level's queue if its bit is set, or falls
//! through to the next lower level if not; when the queue's TTL runs out it
//! dead-letters into the next lower level's exchange with the same routing
//! key, and after level 0 into the cascade's exit. The broker does every hop;
//! a 30-minute delay (`11100001000` in binary) makes 4 hops.
//!
//! **Shards.** The cascade is declared `cascade_shards` times over ([`Shards`]): shard 0
//! is `order-timeout.delay.KK`, shard s ≥ 1 is `order-timeout.delay.KK.sS`,
//! each a complete cascade. A message enters the shard picked by a hash of
//! its order id ([`shard_for`]) and stays in it. Why: RabbitMQ dead-letters
//! each quorum queue through one worker with a small window, so one queue
//! per level caps a level at a few hundred messages per second under load;
//! `n` shards give every level `n` workers.

use crate::settings::Shards;

/// Number of cascade levels: level k delays 2^k seconds, so 28 levels reach
/// 2^28 - 1 s, about 8.5 years. Longer delays are clamped and simply go
/// round again.
pub(crate) const LEVELS: u32 = 28;
/// The longest delay one pass through the cascade can express, in seconds.
pub(crate) const MAX_CASCADE_SECS: u64 = (1 << LEVELS) - 1;

/// Name of cascade level `k`'s exchange and queue (they share it) in
/// shard 0.
pub fn level_name(k: u32) -> String {
    format!("order-timeout.delay.{k:02}")
}

/// Name of cascade level `k`'s exchange and queue in shard `shard`. Shard 0
/// keeps the unsharded names, so a broker declared before shards existed
/// keeps working (and its messages keep flowing) after an upgrade.
pub fn shard_level_name(shard: u32, k: u32) -> String {
    if shard == 0 {
        level_name(k)
    } else {
        format!("order-timeout.delay.{k:02}.s{shard}")
    }
}

/// The shard (0..`shards`) an order's delays go through: FNV-1a of its id,
/// so one order always takes the same shard and orders spread evenly.
pub fn shard_for(order_id: &str, shards: Shards) -> u32 {
    let hash = order_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % u64::from(shards.get())) as u32
}

/// Where to publish a message that must wait: into the cascade
/// ([`cascade_route`]) or into a lane ([`super::lanes::delay_route`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelayRoute {
    /// In the cascade, the exchange of the highest set bit: the first level
    /// that holds it. For a lane, the default exchange (`""`).
    pub exchange: String,
    /// In the cascade, the delay's bits, most significant first, one word
    /// per level. For a lane, the lane shard's queue.
    pub routing_key: String,
    /// Number of delay queues the message passes through.
    pub hops: u32,
}

/// Longest remainder the consumer holds in-process after the cascade:
/// anything due sooner than this is held instead of sent through the
/// cascade, and [`cascade_delay_secs`] may leave up to this much for the
/// hold so that it can pick a delay with fewer hops.
pub(crate) const HOLD_WINDOW_SECS: u64 = 2;

/// The least a delay leaves for the in-process hold afterwards, in
/// milliseconds: the delay is chosen from the time the message was
/// delivered, but its TTL starts only when the broker enqueues the
/// re-published copy. Without this margin a delay could leave a few
/// milliseconds, and whatever the publish waits for (the channel, a broker
/// busy starting up) made the order late by as much: the demo's first
/// second of orders came back from a 2 s delay 40–285 ms late, their
/// re-publish confirmed 170–200 ms after the delivery. With it, a publish
/// may take up to half a second before anything is late.
pub(crate) const HOLD_SLACK_MS: u64 = 500;

/// The whole-second cascade delay for a message due in `remaining_ms`
/// (≥ 1 s; the consumer holds anything sooner, and retries from 1 s on go
/// through the cascade): of the delays that leave at least
/// [`HOLD_SLACK_MS`] and less than [`HOLD_WINDOW_SECS`] s to hold
/// afterwards, the one with the fewest set bits (= hops), the longest among
/// equals. Never longer than the time left, so never early; a retry due in
/// less than 1.5 s gets the one-second delay and less slack (a retry's
/// moment is a backoff, not a deadline).
///
/// Why: a timeout arrives a few milliseconds after its order was created,
/// so a "round" 10 s timeout has 9.99 s left: 9 s = `1001` is 2 hops, while
/// 8 s = `1000` is 1 and leaves 1.99 s for the hold. Every hop is a quorum
/// enqueue and a pass through a dead-letter worker, the broker's scarcest
/// work here (docs/benchmarks-log.md); odd second counts lose one hop, half a
/// hop saved per cascade message on average.
pub(crate) fn cascade_delay_secs(remaining_ms: u64) -> u64 {
    let longest = (remaining_ms.saturating_sub(HOLD_SLACK_MS) / 1000).max(1);
    let shortest = remaining_ms
        .saturating_add(1)
        .saturating_sub(HOLD_WINDOW_SECS * 1000)
        .div_ceil(1000)
        .clamp(1, longest);
    // Not empty (shortest <= longest); `rev` + `min_by_key` keeps the first
    // minimum, i.e. the longest delay among those with the fewest hops.
    (shortest..=longest)
        .rev()
        .min_by_key(|d| d.clamp(&1, &MAX_CASCADE_SECS).count_ones())
        .unwrap_or(longest)
}

/// Routes a delay of `delay_secs` (≥ 1; clamped to [`MAX_CASCADE_SECS`])
/// through shard `shard`.
pub fn cascade_route(delay_secs: u64, shard: u32) -> DelayRoute {
    let d = delay_secs.clamp(1, MAX_CASCADE_SECS);
    let routing_key = (0..LEVELS)
        .rev()
        .map(|k| if d >> k & 1 == 1 { "1" } else { "0" })
        .collect::<Vec<_>>()
        .join(".");
    let top = 63 - d.leading_zeros();
    DelayRoute {
        exchange: shard_level_name(shard, top),
        routing_key,
        hops: d.count_ones(),
    }
}

/// Topic pattern matching messages whose bit `k` is `bit`.
pub(crate) fn bit_pattern(k: u32, bit: char) -> String {
    let mut p = "*.".repeat((LEVELS - 1 - k) as usize);
    p.push(bit);
    p.push_str(".#");
    p
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn routes_by_the_bits_of_the_delay() {
        let r = cascade_route(1800, 0);
        assert_eq!(r.hops, 4, "a 30-minute timeout makes 4 hops");
        assert_eq!(r.exchange, "order-timeout.delay.10");
        let words: Vec<&str> = r.routing_key.split('.').collect();
        assert_eq!(words.len(), LEVELS as usize);
        let set: Vec<u32> = (0..LEVELS)
            .filter(|k| words[(LEVELS - 1 - k) as usize] == "1")
            .collect();
        assert_eq!(set, vec![3, 8, 9, 10]);

        let r = cascade_route(1, 0);
        assert_eq!((r.exchange.as_str(), r.hops), ("order-timeout.delay.00", 1));
        assert!(r.routing_key.ends_with(".0.1"));
        assert_eq!(
            cascade_route(0, 0),
            cascade_route(1, 0),
            "0 is clamped up to 1"
        );
        let r = cascade_route(u64::MAX, 0);
        assert_eq!(
            (r.exchange.as_str(), r.hops),
            ("order-timeout.delay.27", LEVELS)
        );
        let r = cascade_route(1800, 3);
        assert_eq!(r.exchange, "order-timeout.delay.10.s3");
        assert_eq!(r.routing_key, cascade_route(1800, 0).routing_key);
    }

    #[test]
    fn delay_choice_saves_hops_and_is_never_early() {
        // 10 s timeout seen 10 ms late: 8 s (1 hop), not 9 s (2 hops).
        assert_eq!(cascade_delay_secs(9_990), 8);
        // Even second counts are already the cheapest.
        assert_eq!(cascade_delay_secs(4_990), 4);
        // 30 minutes: 1,799 s (6 hops) -> 1,798 s (5 hops).
        assert_eq!(cascade_delay_secs(1_799_990), 1_798);
        // The hold keeps its slack: 2 s would leave 10 ms.
        assert_eq!(cascade_delay_secs(2_010), 1);
        assert_eq!(cascade_delay_secs(2_500), 2);
        assert_eq!(cascade_delay_secs(3_500), 2);
        // A retry due in 1-2 s: one second, the rest held.
        assert_eq!(cascade_delay_secs(1_000), 1);
        assert_eq!(cascade_delay_secs(1_999), 1);
        for remaining_ms in (2_000..200_000)
            .step_by(7)
            .chain([MAX_CASCADE_SECS * 1000 + 5])
        {
            let d = cascade_delay_secs(remaining_ms);
            let left = remaining_ms as i64 - (d * 1000) as i64;
            assert!(left >= 0, "{remaining_ms} ms: {d} s would be early");
            assert!(
                left >= HOLD_SLACK_MS as i64,
                "{remaining_ms} ms: {d} s leaves only {left} ms to hold"
            );
            if remaining_ms <= MAX_CASCADE_SECS * 1000 {
                assert!(
                    left < (HOLD_WINDOW_SECS * 1000) as i64,
                    "{remaining_ms} ms: {d} s leaves {left} ms to hold"
                );
                // No more hops than the longest delay that keeps the slack.
                let longest = (remaining_ms - HOLD_SLACK_MS) / 1000;
                assert!(d.count_ones() <= longest.count_ones(), "{remaining_ms}");
            }
        }
    }

    /// AMQP topic matching: `*` is one word, `#` zero or more.
    pub(crate) fn topic_matches(pattern: &[&str], key: &[&str]) -> bool {
        match pattern.split_first() {
            None => key.is_empty(),
            Some((&"#", rest)) => (0..=key.len()).any(|i| topic_matches(rest, &key[i..])),
            Some((p, rest)) => match key.split_first() {
                Some((k, krest)) => (*p == "*" || p == k) && topic_matches(rest, krest),
                None => false,
            },
        }
    }

    #[test]
    fn patterns_select_exactly_one_bit() {
        for d in [1u64, 2, 3, 5, 8, 15, 1800, 86_400 * 30] {
            let key = cascade_route(d, 0).routing_key;
            let key: Vec<&str> = key.split('.').collect();
            for k in 0..LEVELS {
                let set = d >> k & 1 == 1;
                let one = bit_pattern(k, '1');
                let zero = bit_pattern(k, '0');
                let one: Vec<&str> = one.split('.').collect();
                let zero: Vec<&str> = zero.split('.').collect();
                assert_eq!(topic_matches(&one, &key), set, "d={d} k={k}");
                assert_eq!(topic_matches(&zero, &key), !set, "d={d} k={k}");
            }
        }
    }

    #[test]
    fn orders_spread_over_the_shards_and_keep_theirs() {
        let shards = Shards::try_from(4).unwrap();
        let mut counts = [0u32; 4];
        for i in 0..4000 {
            let id = format!("order-{i}");
            let s = shard_for(&id, shards);
            assert_eq!(s, shard_for(&id, shards));
            counts[s as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
        let one = Shards::try_from(1).unwrap();
        assert_eq!(shard_for("anything", one), 0);
    }
}
