//! The broker topology, and the **delay cascade** at its heart.
//!
//! RabbitMQ dead-letters expired messages only from the head of a queue, so a
//! queue with a different TTL per message makes short timeouts wait behind
//! long ones. Here every delay queue has one fixed TTL, so queue order is
//! expiry order:
//!
//! ```text
//! order-timeout (direct) --"schedule"--> order-timeout.due  <-- order-timeout.ready (fanout)
//!                                              |  consumer                ^
//!                                              v  (delay = d s)           |
//! order-timeout.delay.K (topic) ... bit K of d set -> queue .delay.K (TTL 2^K s) --DLX--+
//!         | bit K clear                                 dead-letters into exchange K-1 |
//!         v                                                                              |
//! order-timeout.delay.K-1 ... -> order-timeout.delay.0 -- bit 0 clear ------------------+
//! ```
//!
//! A message's routing key spells the bits of its delay in seconds, most
//! significant first (`0.0.1.0.1…`, [`LEVELS`] words). At each level's topic
//! exchange, the message goes into the level's queue if its bit is set, or
//! falls through (exchange-to-exchange binding) to the next lower level if
//! not. When the queue's TTL runs out the message dead-letters into the next
//! lower level's exchange with the same routing key, and after level 0 into
//! `order-timeout.ready`, which feeds the consumer's queue. The broker does
//! every hop; a 30-minute delay (`11100001000` in binary) makes 4 hops.
//!
//! **Shards.** The cascade is declared [`CascadeShards`] times over: shard 0
//! is `order-timeout.delay.KK`, shard s ≥ 1 is `order-timeout.delay.KK.sS`,
//! each a complete cascade that ends in `order-timeout.ready`. A message
//! enters the shard picked by a hash of its order id ([`shard_for`]) and
//! stays in it (dead-lettering keeps the exchange chain of its shard). Why:
//! RabbitMQ dead-letters each quorum queue through one worker with a small
//! window, so one queue per level caps a level at a few hundred messages per
//! second under load; `n` shards give every level `n` workers.

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, ExchangeKind};

use crate::config::{CascadeShards, QueueType};

/// Entry exchange the order service publishes timeouts to (direct, durable).
pub const ENTRY_EXCHANGE: &str = "order-timeout";
/// Routing key of a timeout message on [`ENTRY_EXCHANGE`].
pub const SCHEDULE_ROUTING_KEY: &str = "schedule";
/// The consumer's queue: fresh timeouts and messages leaving the cascade.
pub const DUE_QUEUE: &str = "order-timeout.due";
/// Exit of the cascade (fanout into [`DUE_QUEUE`]).
pub const READY_EXCHANGE: &str = "order-timeout.ready";
/// Failure queue: messages that cannot be processed, with their reason.
pub const PARKED_QUEUE: &str = "order-timeout.parked";
/// Topic exchange for `order.cancelled` events.
pub const EVENTS_EXCHANGE: &str = "order-timeout.events";
/// Routing key of the cancellation event.
pub const CANCELLED_ROUTING_KEY: &str = "order.cancelled";
/// Number of cascade levels: level k delays 2^k seconds, so 28 levels reach
/// 2^28 - 1 s, about 8.5 years. Longer delays are clamped and simply go
/// round again.
pub const LEVELS: u32 = 28;
/// The longest delay one pass through the cascade can express, in seconds.
pub const MAX_CASCADE_SECS: u64 = (1 << LEVELS) - 1;

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
pub fn shard_for(order_id: &str, shards: CascadeShards) -> u32 {
    let hash = order_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % u64::from(shards.get())) as u32
}

/// What to declare: the queue type and the number of cascade shards. Built
/// from the settings by [`crate::config::Settings::layout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Queue type of every queue.
    pub queue_type: QueueType,
    /// Copies of the cascade.
    pub shards: CascadeShards,
}

impl Layout {
    fn shard_range(&self) -> std::ops::Range<u32> {
        0..self.shards.get()
    }
}

/// Where to publish a message that must wait `delay_secs` whole seconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CascadeRoute {
    /// Exchange of the highest set bit: the first level that holds it.
    pub exchange: String,
    /// The delay's bits, most significant first, one word per level.
    pub routing_key: String,
    /// Number of delay queues the message passes through.
    pub hops: u32,
}

/// Longest remainder the consumer holds in-process after the cascade:
/// anything due sooner than this is held instead of sent through the
/// cascade, and [`cascade_delay_secs`] may leave up to this much for the
/// hold so that it can pick a delay with fewer hops.
pub const HOLD_WINDOW_SECS: u64 = 2;

/// The whole-second cascade delay for a message due in `remaining_ms`
/// (≥ 1 s; the consumer holds anything sooner, and retries from 1 s on go
/// through the cascade): of the delays that leave less than
/// [`HOLD_WINDOW_SECS`] s to hold afterwards, the one with the fewest set
/// bits (= hops), the longest among equals. Never longer than the time
/// left, so never early.
///
/// Why: a timeout arrives a few milliseconds after its order was created,
/// so a "round" 10 s timeout has 9.99 s left: 9 s = `1001` is 2 hops, while
/// 8 s = `1000` is 1 and leaves 1.99 s for the hold. Every hop is a quorum
/// enqueue and a pass through a dead-letter worker, the broker's scarcest
/// work here (docs/BENCHMARKS.md); odd second counts lose one hop, half a
/// hop saved per cascade message on average.
pub fn cascade_delay_secs(remaining_ms: u64) -> u64 {
    let longest = (remaining_ms / 1000).max(1);
    let shortest = (remaining_ms + 1)
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
pub fn cascade_route(delay_secs: u64, shard: u32) -> CascadeRoute {
    let d = delay_secs.clamp(1, MAX_CASCADE_SECS);
    let routing_key = (0..LEVELS)
        .rev()
        .map(|k| if d >> k & 1 == 1 { "1" } else { "0" })
        .collect::<Vec<_>>()
        .join(".");
    let top = 63 - d.leading_zeros();
    CascadeRoute {
        exchange: shard_level_name(shard, top),
        routing_key,
        hops: d.count_ones(),
    }
}

/// Topic pattern matching messages whose bit `k` is `bit`.
fn bit_pattern(k: u32, bit: char) -> String {
    let mut p = "*.".repeat((LEVELS - 1 - k) as usize);
    p.push(bit);
    p.push_str(".#");
    p
}

/// Errors declaring the topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The broker refused a declaration, usually because an object of that
    /// name exists with other arguments (e.g. classic vs quorum).
    #[error(
        "declaring {what}: {error} (does an object of that name exist with other arguments, e.g. classic vs quorum?)"
    )]
    Declare { what: String, error: lapin::Error },
}

fn queue_args(queue_type: QueueType, ttl_ms: Option<u64>, dlx: Option<&str>) -> FieldTable {
    let mut args = FieldTable::default();
    let mut put = |k: &str, v: AMQPValue| {
        args.insert(ShortString::from(k), v);
    };
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    match queue_type {
        QueueType::Quorum => {
            put("x-queue-type", text("quorum"));
            if dlx.is_some() {
                // Dead-letter at least once: the message leaves this level only
                // after the next level has confirmed it. Requires reject-publish.
                put("x-dead-letter-strategy", text("at-least-once"));
                put("x-overflow", text("reject-publish"));
            }
        }
        QueueType::Classic => {
            put("x-queue-type", text("classic"));
        }
    }
    if let Some(ttl) = ttl_ms {
        put("x-message-ttl", AMQPValue::LongLongInt(ttl as i64));
    }
    if let Some(dlx) = dlx {
        put("x-dead-letter-exchange", text(dlx));
    }
    args
}

/// One queue as the service expects it; also used by `topology` checks.
#[derive(Clone, Debug)]
pub struct QueueSpec {
    /// Queue name.
    pub name: String,
    /// Declaration arguments.
    pub args: FieldTable,
}

/// Every queue the service declares, with its arguments.
pub fn queue_specs(layout: &Layout) -> Vec<QueueSpec> {
    let queue_type = layout.queue_type;
    let mut specs = vec![
        QueueSpec {
            name: DUE_QUEUE.into(),
            args: queue_args(queue_type, None, None),
        },
        QueueSpec {
            name: PARKED_QUEUE.into(),
            args: queue_args(queue_type, None, None),
        },
    ];
    for shard in layout.shard_range() {
        for k in 0..LEVELS {
            specs.push(QueueSpec {
                name: shard_level_name(shard, k),
                args: queue_args(
                    queue_type,
                    Some(1000u64 << k),
                    Some(&exchange_below(shard, k)),
                ),
            });
        }
    }
    specs
}

/// Where level `k` of `shard` hands its messages on: the level below in
/// the same shard, or the cascade's exit after level 0.
fn exchange_below(shard: u32, k: u32) -> String {
    if k == 0 {
        READY_EXCHANGE.to_string()
    } else {
        shard_level_name(shard, k - 1)
    }
}

/// One exchange as the service expects it; [`declare`] creates these and
/// `topology check` compares the broker's against them.
#[derive(Clone, Debug)]
pub struct ExchangeSpec {
    /// Exchange name.
    pub name: String,
    /// Exchange type (all are durable, not auto-delete, not internal).
    pub kind: ExchangeKind,
}

/// Every exchange the service declares.
pub fn exchange_specs(layout: &Layout) -> Vec<ExchangeSpec> {
    let spec = |name: &str, kind| ExchangeSpec {
        name: name.into(),
        kind,
    };
    let mut specs = vec![
        spec(ENTRY_EXCHANGE, ExchangeKind::Direct),
        spec(READY_EXCHANGE, ExchangeKind::Fanout),
        spec(EVENTS_EXCHANGE, ExchangeKind::Topic),
    ];
    for shard in layout.shard_range() {
        specs.extend((0..LEVELS).map(|k| spec(&shard_level_name(shard, k), ExchangeKind::Topic)));
    }
    specs
}

/// Where a binding delivers: a queue, or another exchange (the cascade's
/// fall-through from one level to the next).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindingDestination {
    /// A queue binding.
    Queue(String),
    /// An exchange-to-exchange binding.
    Exchange(String),
}

/// One binding as the service expects it; [`declare`] creates these and
/// `topology check` makes sure both ends exist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindingSpec {
    /// Exchange the binding routes from.
    pub source: String,
    /// Queue or exchange it routes to.
    pub destination: BindingDestination,
    /// Binding key (a topic pattern on the cascade levels).
    pub routing_key: String,
}

/// Every binding the service declares.
pub fn binding_specs(layout: &Layout) -> Vec<BindingSpec> {
    let queue = |source: &str, queue: &str, key: String| BindingSpec {
        source: source.into(),
        destination: BindingDestination::Queue(queue.into()),
        routing_key: key,
    };
    let mut specs = vec![
        queue(ENTRY_EXCHANGE, DUE_QUEUE, SCHEDULE_ROUTING_KEY.into()),
        queue(READY_EXCHANGE, DUE_QUEUE, String::new()),
    ];
    for shard in layout.shard_range() {
        for k in 0..LEVELS {
            let level = shard_level_name(shard, k);
            specs.push(queue(&level, &level, bit_pattern(k, '1')));
            specs.push(BindingSpec {
                source: level,
                destination: BindingDestination::Exchange(exchange_below(shard, k)),
                routing_key: bit_pattern(k, '0'),
            });
        }
    }
    specs
}

/// Options every exchange of the service is declared with.
pub fn exchange_options() -> ExchangeDeclareOptions {
    ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// Options every queue of the service is declared with.
pub fn queue_options() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// Declares every exchange, queue and binding. Idempotent: safe to run on
/// every start and from several replicas at once.
#[tracing::instrument(skip(channel))]
pub async fn declare(channel: &Channel, layout: &Layout) -> Result<(), TopologyError> {
    for spec in exchange_specs(layout) {
        channel
            .exchange_declare(
                spec.name.as_str().into(),
                spec.kind,
                exchange_options(),
                FieldTable::default(),
            )
            .await
            .map_err(|error| TopologyError::Declare {
                what: format!("exchange {}", spec.name),
                error,
            })?;
    }
    for spec in queue_specs(layout) {
        channel
            .queue_declare(spec.name.as_str().into(), queue_options(), spec.args)
            .await
            .map_err(|error| TopologyError::Declare {
                what: format!("queue {}", spec.name),
                error,
            })?;
    }
    for spec in binding_specs(layout) {
        let source = spec.source.as_str().into();
        let key = spec.routing_key.as_str().into();
        let (result, destination) = match &spec.destination {
            BindingDestination::Queue(queue) => (
                channel
                    .queue_bind(
                        queue.as_str().into(),
                        source,
                        key,
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await,
                queue,
            ),
            BindingDestination::Exchange(exchange) => (
                channel
                    .exchange_bind(
                        exchange.as_str().into(),
                        source,
                        key,
                        ExchangeBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await,
                exchange,
            ),
        };
        result.map_err(|error| TopologyError::Declare {
            what: format!(
                "binding {} -> {destination} ({})",
                spec.source, spec.routing_key
            ),
            error,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(shards: u32) -> Layout {
        Layout {
            queue_type: QueueType::Quorum,
            shards: CascadeShards::try_from(shards).unwrap(),
        }
    }

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
        assert_eq!(cascade_delay_secs(2_000), 2);
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
            if remaining_ms <= MAX_CASCADE_SECS * 1000 {
                assert!(
                    left < (HOLD_WINDOW_SECS * 1000) as i64,
                    "{remaining_ms} ms: {d} s leaves {left} ms to hold"
                );
                let floor = remaining_ms / 1000;
                assert!(d.count_ones() <= floor.count_ones(), "{remaining_ms}");
            }
        }
    }

    /// AMQP topic matching: `*` is one word, `#` zero or more.
    fn topic_matches(pattern: &[&str], key: &[&str]) -> bool {
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

    /// Follows a message through the declared bindings and dead-letter
    /// exchanges, as the broker would, and returns the queues it waits in.
    fn walk(layout: &Layout, route: &CascadeRoute) -> Vec<String> {
        let bindings = binding_specs(layout);
        let queues = queue_specs(layout);
        let key: Vec<&str> = route.routing_key.split('.').collect();
        let mut visited = Vec::new();
        let mut exchange = route.exchange.clone();
        while exchange != READY_EXCHANGE {
            let matched: Vec<&BindingSpec> = bindings
                .iter()
                .filter(|b| b.source == exchange)
                .filter(|b| {
                    let p: Vec<&str> = b.routing_key.split('.').collect();
                    topic_matches(&p, &key)
                })
                .collect();
            assert_eq!(matched.len(), 1, "exactly one way on from {exchange}");
            exchange = match &matched[0].destination {
                BindingDestination::Exchange(e) => e.clone(),
                BindingDestination::Queue(q) => {
                    visited.push(q.clone());
                    let spec = queues.iter().find(|s| &s.name == q).unwrap();
                    match spec.args.inner().get("x-dead-letter-exchange") {
                        Some(AMQPValue::LongString(dlx)) => dlx.to_string(),
                        other => panic!("{q} has no dead-letter exchange: {other:?}"),
                    }
                }
            };
            assert!(visited.len() <= LEVELS as usize, "a routing loop");
        }
        visited
    }

    fn ttl_ms(layout: &Layout, queue: &str) -> u64 {
        let spec = queue_specs(layout)
            .into_iter()
            .find(|s| s.name == queue)
            .unwrap();
        match spec.args.inner().get("x-message-ttl") {
            Some(AMQPValue::LongLongInt(ms)) => *ms as u64,
            other => panic!("{queue} has no TTL: {other:?}"),
        }
    }

    #[test]
    fn every_shard_delays_exactly_the_asked_seconds_and_stays_in_its_shard() {
        for shards in [1, 4] {
            let layout = layout(shards);
            for shard in 0..shards {
                for d in [1u64, 2, 5, 9, 10, 1800, 86_399] {
                    let route = cascade_route(d, shard);
                    let visited = walk(&layout, &route);
                    assert_eq!(visited.len() as u32, route.hops, "d={d} shard={shard}");
                    let total: u64 = visited.iter().map(|q| ttl_ms(&layout, q)).sum();
                    assert_eq!(total, d * 1000, "d={d} shard={shard}: {visited:?}");
                    let names: Vec<String> =
                        (0..LEVELS).map(|k| shard_level_name(shard, k)).collect();
                    assert!(
                        visited.iter().all(|q| names.contains(q)),
                        "shard {shard} left its cascade: {visited:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn orders_spread_over_the_shards_and_keep_theirs() {
        let shards = CascadeShards::try_from(4).unwrap();
        let mut counts = [0u32; 4];
        for i in 0..4000 {
            let id = format!("order-{i}");
            let s = shard_for(&id, shards);
            assert_eq!(s, shard_for(&id, shards));
            counts[s as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
        let one = CascadeShards::try_from(1).unwrap();
        assert_eq!(shard_for("anything", one), 0);
    }

    #[test]
    fn every_level_has_a_fixed_ttl_and_dead_letters_one_level_down() {
        let layout = layout(2);
        let specs = queue_specs(&layout);
        let level3 = specs.iter().find(|s| s.name == level_name(3)).unwrap();
        let args = level3.args.inner();
        assert_eq!(
            args.get("x-message-ttl"),
            Some(&AMQPValue::LongLongInt(8000))
        );
        assert_eq!(
            args.get("x-dead-letter-exchange"),
            Some(&AMQPValue::LongString(level_name(2).as_str().into()))
        );
        assert_eq!(
            args.get("x-dead-letter-strategy"),
            Some(&AMQPValue::LongString("at-least-once".into()))
        );
        let level0 = specs.iter().find(|s| s.name == level_name(0)).unwrap();
        assert_eq!(
            level0.args.inner().get("x-dead-letter-exchange"),
            Some(&AMQPValue::LongString(READY_EXCHANGE.into()))
        );
        let shard1 = specs
            .iter()
            .find(|s| s.name == "order-timeout.delay.03.s1")
            .unwrap();
        assert_eq!(
            shard1.args.inner().get("x-dead-letter-exchange"),
            Some(&AMQPValue::LongString("order-timeout.delay.02.s1".into()))
        );
    }

    #[test]
    fn every_binding_connects_declared_objects() {
        for shards in [1u32, 4] {
            let layout = layout(shards);
            let exchanges: Vec<String> = exchange_specs(&layout)
                .into_iter()
                .map(|e| e.name)
                .collect();
            let queues: Vec<String> = queue_specs(&layout).into_iter().map(|q| q.name).collect();
            let bindings = binding_specs(&layout);
            assert_eq!(bindings.len(), 2 + 2 * (LEVELS * shards) as usize);
            for b in &bindings {
                assert!(exchanges.contains(&b.source), "{b:?}");
                match &b.destination {
                    BindingDestination::Queue(q) => assert!(queues.contains(q), "{b:?}"),
                    BindingDestination::Exchange(e) => assert!(exchanges.contains(e), "{b:?}"),
                }
            }
            assert_eq!(exchanges.len(), 3 + (LEVELS * shards) as usize);
            assert_eq!(queues.len(), 2 + (LEVELS * shards) as usize);
        }
    }
}
