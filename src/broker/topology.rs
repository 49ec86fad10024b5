//! The broker objects the service owns: the entry exchange, the due and
//! parked queues, the events exchange, and the queues and bindings of **the
//! delay cascade** (whose routing arithmetic is [`super::cascade`]):
//!
//! ```text
//! order-timeout (direct) --"schedule"--> order-timeout.due  <-- order-timeout.ready (fanout)
//!                                              |  consumer                ^
//!                                              v  (delay = d s)           |
//! order-timeout.delay.K (topic) ... bit K of d set -> queue .delay.K (TTL 2^K s) --DLX--+
//!         | bit K clear                                 dead-letters into exchange K-1 |
//!         v                                                                              |
//! order-timeout.delay.K-1 ... -> order-timeout.delay.0 -- bit 0 clear ------------------+
//!
//! order-timeout (direct) --"schedule.1800s"--> lane order-timeout.lane.1800s (TTL W - 2 s) --DLX--> order-timeout.ready
//! ```
//!
//! (the last line: a lane entry, [`lane_entry_key`], for each configured lane;
//! the consumer's re-schedules reach every lane shard through the default
//! exchange).
//!
//! The declarations are data ([`queue_specs`], [`exchange_specs`],
//! [`binding_specs`]): [`declare`] creates them, `topology check` compares
//! the broker's objects against them, and the tests below walk a message
//! through them as the broker would.
//!
//! **Changing the layout.** Nothing here deletes an object: after
//! `cascade_shards` or `lane_shards` shrink or a lane is removed, the queues
//! the new layout no longer declares keep their TTL and dead-letter
//! exchange, and an old cascade shard keeps its lower levels' exchanges and
//! bindings, so what waits there is delivered where it is (the tests below
//! walk an old shard's messages through the objects an old and a new
//! layout leave on the broker). [`super::layouts`] records every layout
//! declared, so that `topology check` and `pending` name what is left over
//! ([`crate::ops::leftovers`]).

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::protocol::AMQPSoftError;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ExchangeKind};

use super::cascade::{LEVELS, bit_pattern, shard_level_name};
use super::lanes::{lane_name, lane_ttl_ms};
use super::layouts::{self, LAYOUTS_QUEUE};
use super::refusals::soft_error;
use crate::settings::{Lane, QueueType};

/// Entry exchange the order service publishes timeouts to (direct, durable).
pub const ENTRY_EXCHANGE: &str = "order-timeout";
/// Routing key of a timeout message on [`ENTRY_EXCHANGE`].
pub const SCHEDULE_ROUTING_KEY: &str = "schedule";

/// Routing key on [`ENTRY_EXCHANGE`] that puts a fresh timeout straight
/// into lane `lane` (its shard 0), `schedule.<W>s`: a **lane entry**.
///
/// An order service whose orders all share the lane's window publishes
/// there instead of to [`SCHEDULE_ROUTING_KEY`], and the broker starts the
/// wait at once: no pass through the due queue and the consumer before it
/// (one quorum enqueue, one delivery and one publish less per order). The
/// consumer still reads the message when the lane hands it on, within 2 s
/// of its deadline, and holds it, re-schedules it (a deadline later than
/// the lane's window) or cancels it then, so a lane entry is never early;
/// an order due *sooner* than the window is late by the difference, which
/// is why it is only for orders of exactly that window.
pub fn lane_entry_key(lane: Lane) -> String {
    format!("{SCHEDULE_ROUTING_KEY}.{lane}")
}
/// The consumer's queue: fresh timeouts and messages leaving the cascade.
pub const DUE_QUEUE: &str = "order-timeout.due";
/// Exit of the cascade (fanout into [`DUE_QUEUE`]).
pub const READY_EXCHANGE: &str = "order-timeout.ready";
/// Failure queue: messages that cannot be processed, with their reason.
pub const PARKED_QUEUE: &str = "order-timeout.parked";
/// Topic exchange for `order.cancelled` events.
pub const EVENTS_EXCHANGE: &str = "order-timeout.events";
/// Routing key of the cancellation event (for tests binding to it).
pub const CANCELLED_ROUTING_KEY: &str = crate::settings::CANCELLED_EVENT;

pub use super::layout::Layout;

/// Errors declaring the topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The broker could not be reached.
    #[error("connecting to the broker: {0}")]
    Connect(lapin::Error),
    /// The broker refused a declaration, usually because an object of that
    /// name exists with other arguments (e.g. classic vs quorum).
    #[error(
        "declaring {what}: {error} (does an object of that name exist with other arguments, e.g. classic vs quorum?)"
    )]
    Declare {
        /// The object, e.g. `queue order-timeout.due`.
        what: String,
        /// The broker's answer.
        error: lapin::Error,
    },
}

/// The delivery limit of the queues the service consumes or browses (due,
/// parked) when they are quorum queues: in effect none.
///
/// A quorum queue counts how often each message was returned (nack with
/// requeue, a consumer's channel closing with it unacked, every `parked
/// list` pass) and, past its delivery limit, dead-letters or **drops** it.
/// RabbitMQ 3.x has no limit unless one is set; 4.x applies a default of
/// 20, so a service restarting in a loop, or 20 looks at the parked queue,
/// would silently lose orders. `-1` (4.x's "unlimited") means *0* on 3.x,
/// so the service sets a large explicit limit, which means the same on
/// both and which `topology check` verifies like any other argument.
pub const DELIVERY_LIMIT: i64 = 1_000_000;

/// Whether a queue is read by consumers (due, parked) or only holds
/// messages for their TTL (the cascade levels).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reads {
    /// Consumed or browsed: gets [`DELIVERY_LIMIT`] as a quorum queue.
    Consumed,
    /// Never delivered to a consumer: messages leave by dead-lettering.
    DeadLetterOnly,
}

fn queue_args(
    queue_type: QueueType,
    reads: Reads,
    ttl_ms: Option<u64>,
    dlx: Option<&str>,
) -> FieldTable {
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
            if reads == Reads::Consumed {
                put("x-delivery-limit", AMQPValue::LongLongInt(DELIVERY_LIMIT));
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
            args: queue_args(queue_type, Reads::Consumed, None, None),
        },
        QueueSpec {
            name: PARKED_QUEUE.into(),
            args: queue_args(queue_type, Reads::Consumed, None, None),
        },
        QueueSpec {
            name: LAYOUTS_QUEUE.into(),
            args: queue_args(queue_type, Reads::Consumed, None, None),
        },
    ];
    for shard in layout.shard_range() {
        for k in 0..LEVELS {
            specs.push(QueueSpec {
                name: shard_level_name(shard, k),
                args: queue_args(
                    queue_type,
                    Reads::DeadLetterOnly,
                    Some(1000u64 << k),
                    Some(&exchange_below(shard, k)),
                ),
            });
        }
    }
    for &lane in &layout.lanes {
        for shard in 0..layout.lane_shards.get() {
            specs.push(QueueSpec {
                name: lane_name(lane, shard),
                args: queue_args(
                    queue_type,
                    Reads::DeadLetterOnly,
                    Some(lane_ttl_ms(lane)),
                    Some(READY_EXCHANGE),
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
    for &lane in &layout.lanes {
        // A direct exchange copies a message to every queue bound with its
        // key, so a lane entry goes to one shard; one lane shard carried
        // 2,000 orders/s on the benchmark machine (docs/benchmarks-log.md).
        specs.push(queue(
            ENTRY_EXCHANGE,
            &lane_name(lane, 0),
            lane_entry_key(lane),
        ));
    }
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
pub(crate) fn exchange_options() -> ExchangeDeclareOptions {
    ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// Options every queue of the service is declared with.
pub(crate) fn queue_options() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// Declares every exchange, queue and binding, on a channel of its own
/// (a refused declaration closes the channel it was made on). Idempotent:
/// safe to run on every start and from several replicas at once. Adds the
/// layout to the record of the layouts declared on the vhost ([`layouts`]).
///
/// A due or parked queue declared by an older version, without
/// [`DELIVERY_LIMIT`], is used as it is, with a warning naming the fix
/// (RabbitMQ cannot change a queue's arguments; a policy can set the limit):
/// refusing to start would stop cancellations over a setting that matters
/// only on RabbitMQ 4.x.
#[tracing::instrument(skip(connection))]
pub(crate) async fn declare(connection: &Connection, layout: &Layout) -> Result<(), TopologyError> {
    let mut channel = open_channel(connection).await?;
    declare_exchanges(&channel, layout).await?;
    for spec in queue_specs(layout) {
        declare_queue(connection, &mut channel, &spec).await?;
    }
    // Before the bindings that route into a new layout's queues: a layout
    // in use is always in the record. A failure to record costs only the
    // reports of leftover queues, never a timeout, so it does not stop the
    // start.
    match layouts::record(connection, layout).await {
        Ok(added) => tracing::debug!(added, "layout recorded"),
        Err(e) => {
            tracing::warn!(error = %e, "could not record the layout in {LAYOUTS_QUEUE}; `topology check` may not name the queues of this layout once it changes")
        }
    }
    declare_bindings(&channel, layout).await?;
    let _ = channel.close(200, "declared".into()).await;
    Ok(())
}

async fn open_channel(connection: &Connection) -> Result<Channel, TopologyError> {
    connection
        .create_channel()
        .await
        .map_err(TopologyError::Connect)
}

/// Declares every exchange of [`exchange_specs`].
async fn declare_exchanges(channel: &Channel, layout: &Layout) -> Result<(), TopologyError> {
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
    Ok(())
}

/// Declares one queue. A due or parked queue that predates
/// [`DELIVERY_LIMIT`] is declared again without it, on a new channel
/// (the refusal closed `channel`, which is replaced), with a warning.
async fn declare_queue(
    connection: &Connection,
    channel: &mut Channel,
    spec: &QueueSpec,
) -> Result<(), TopologyError> {
    let declared = channel
        .queue_declare(
            spec.name.as_str().into(),
            queue_options(),
            spec.args.clone(),
        )
        .await;
    let refused = match declared {
        Ok(_) => return Ok(()),
        Err(error) if predates_delivery_limit(&error) => {
            tracing::warn!(
                queue = %spec.name,
                "the queue was declared without a delivery limit; {DELIVERY_LIMIT_FIX}"
            );
            *channel = open_channel(connection).await?;
            let mut args = FieldTable::default();
            for (key, value) in spec.args.inner() {
                if key.as_str() != "x-delivery-limit" {
                    args.insert(key.clone(), value.clone());
                }
            }
            match channel
                .queue_declare(spec.name.as_str().into(), queue_options(), args)
                .await
            {
                Ok(_) => return Ok(()),
                Err(error) => error,
            }
        }
        Err(error) => error,
    };
    Err(TopologyError::Declare {
        what: format!("queue {}", spec.name),
        error: refused,
    })
}

/// Declares every binding of [`binding_specs`]: queue bindings and the
/// cascade's exchange-to-exchange fall-throughs.
async fn declare_bindings(channel: &Channel, layout: &Layout) -> Result<(), TopologyError> {
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

/// What to do about a due or parked queue without [`DELIVERY_LIMIT`]
/// (declared by a version before it); `topology check` prints it too.
pub(crate) const DELIVERY_LIMIT_FIX: &str = "RabbitMQ 4.x gives such a quorum queue a delivery limit of 20 and \
drops messages returned more often (a restart loop of the service, 20 `parked list` passes). \
Set the limit with a policy (applies at once, no restart): rabbitmqctl set_policy -p VHOST \
--apply-to quorum_queues --priority 10 order-timeout-delivery-limit '^order-timeout\\.(due|parked)$' \
'{\"delivery-limit\": 1000000}' -- or delete the queue while it is empty and restart the service";

/// True when the broker refused a declaration because the existing queue
/// has no `x-delivery-limit` (it predates [`DELIVERY_LIMIT`]). RabbitMQ
/// says: "inequivalent arg 'x-delivery-limit' for queue '…': received the
/// value '1000000' of type 'signedint' but current is none".
pub(crate) fn predates_delivery_limit(error: &lapin::Error) -> bool {
    soft_error(error).is_some_and(|(kind, text)| {
        kind == AMQPSoftError::PRECONDITIONFAILED
            && text.contains("'x-delivery-limit'")
            && text.ends_with("current is none")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::cascade::tests::topic_matches;
    use crate::broker::cascade::{DelayRoute, HOLD_WINDOW_SECS, cascade_route, level_name};
    use crate::settings::Shards;

    fn layout(shards: u32) -> Layout {
        Layout::cascade(QueueType::Quorum, Shards::try_from(shards).unwrap())
    }

    fn with_lanes(lanes: &[&str], lane_shards: u32) -> Layout {
        Layout {
            lanes: lanes
                .iter()
                .map(|l| Lane::try_from(l.to_string()).unwrap())
                .collect(),
            lane_shards: Shards::try_from(lane_shards).unwrap(),
            ..layout(4)
        }
    }

    /// Follows a message through the declared bindings and dead-letter
    /// exchanges, as the broker would, and returns the queues it waits in.
    fn walk(layout: &Layout, route: &DelayRoute) -> Vec<String> {
        walk_on(&binding_specs(layout), &queue_specs(layout), route)
    }

    /// [`walk`] through `bindings` and `queues`: what is on the broker.
    fn walk_on(bindings: &[BindingSpec], queues: &[QueueSpec], route: &DelayRoute) -> Vec<String> {
        let key: Vec<&str> = route.routing_key.split('.').collect();
        let mut visited = Vec::new();
        let mut exchange = route.exchange.clone();
        if exchange.is_empty() {
            // The default exchange: straight into the queue of that name.
            visited.push(route.routing_key.clone());
            let spec = queues.iter().find(|s| s.name == route.routing_key);
            let spec = spec.unwrap_or_else(|| panic!("no queue {}", route.routing_key));
            exchange = match spec.args.inner().get("x-dead-letter-exchange") {
                Some(AMQPValue::LongString(dlx)) => dlx.to_string(),
                other => panic!("{} has no dead-letter exchange: {other:?}", spec.name),
            };
        }
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
    fn a_lane_is_one_hop_of_its_window_less_the_hold_straight_to_the_exit() {
        let lanes = with_lanes(&["30m", "31s"], 8);
        for (remaining_ms, window_ms) in [(1_799_990u64, 1_800_000u64), (30_995, 31_000)] {
            for i in 0..50 {
                let route = lanes.route(remaining_ms, &format!("order-{i}"));
                let visited = walk(&lanes, &route);
                assert_eq!((visited.len(), route.hops), (1, 1), "{visited:?}");
                let ttl = ttl_ms(&lanes, &visited[0]);
                assert_eq!(ttl, window_ms - HOLD_WINDOW_SECS * 1000);
                assert!(ttl <= remaining_ms, "never early");
            }
        }
        // Not a lane's window: the cascade, unchanged.
        let route = lanes.route(9_990, "order-1");
        assert_eq!(walk(&lanes, &route).len() as u32, route.hops);
        let lane_queues = queue_specs(&lanes)
            .into_iter()
            .filter(|q| q.name.starts_with("order-timeout.lane."))
            .count();
        assert_eq!(lane_queues, 2 * 8);
        let added: Vec<BindingSpec> = binding_specs(&lanes)
            .into_iter()
            .filter(|b| !binding_specs(&layout(4)).contains(b))
            .collect();
        assert_eq!(
            added.len(),
            2,
            "one lane entry per lane, nothing else: {added:?}"
        );
    }

    #[test]
    fn a_lane_entry_waits_in_its_lane_once_and_reaches_the_consumer() {
        let lanes = with_lanes(&["30m", "31s"], 4);
        for (key, queue, ttl) in [
            ("schedule.1800s", "order-timeout.lane.1800s", 1_798_000),
            ("schedule.31s", "order-timeout.lane.31s", 29_000),
        ] {
            let lane = Lane::try_from(key["schedule.".len()..].to_string()).unwrap();
            assert_eq!(lane_entry_key(lane), key);
            let route = DelayRoute {
                exchange: ENTRY_EXCHANGE.into(),
                routing_key: key.into(),
                hops: 1,
            };
            assert_eq!(walk(&lanes, &route), [queue], "one shard, one hop");
            assert_eq!(ttl_ms(&lanes, queue), ttl);
        }
        // The plain key still goes to the due queue alone, and a key of a
        // lane the config does not have matches no binding.
        let bindings = binding_specs(&lanes);
        let from_entry = |key: &str| -> Vec<&BindingDestination> {
            bindings
                .iter()
                .filter(|b| b.source == ENTRY_EXCHANGE && b.routing_key == key)
                .map(|b| &b.destination)
                .collect()
        };
        assert_eq!(
            from_entry(SCHEDULE_ROUTING_KEY),
            [&BindingDestination::Queue(DUE_QUEUE.into())]
        );
        assert!(from_entry("schedule.7200s").is_empty());
    }

    #[test]
    fn after_a_layout_change_what_waits_in_the_old_queues_is_delivered_where_it_is() {
        // The broker keeps what every layout declared: nothing is deleted.
        let old = with_lanes(&["7s", "30m"], 4);
        let new = Layout {
            shards: Shards::try_from(2).unwrap(),
            lanes: vec![Lane::try_from("30m".to_string()).unwrap()],
            lane_shards: Shards::try_from(1).unwrap(),
            ..old.clone()
        };
        let on_broker = |f: fn(&Layout) -> Vec<BindingSpec>| {
            let mut all = f(&old);
            all.extend(f(&new));
            all
        };
        let bindings = on_broker(binding_specs);
        let mut queues = queue_specs(&old);
        queues.extend(queue_specs(&new));
        let new_names: Vec<String> = queue_specs(&new).into_iter().map(|q| q.name).collect();
        // Old shards 2 and 3: every level's message takes its own shard's
        // lower levels, which the new layout does not declare, to the exit.
        for shard in [2, 3] {
            for d in [1u64, 5, 12, 1800, 86_399] {
                let route = cascade_route(d, shard);
                let visited = walk_on(&bindings, &queues, &route);
                assert_eq!(visited.len() as u32, route.hops, "d={d} shard={shard}");
                assert!(
                    visited.iter().all(|q| !new_names.contains(q)),
                    "{visited:?}"
                );
                let total: u64 = visited.iter().map(|q| ttl_ms(&old, q)).sum();
                assert_eq!(total, d * 1000, "never early, never later");
            }
        }
        // The removed lane and the lane shards beyond the new count: one hop
        // into the exit.
        for lane in ["7s", "30m"] {
            let lane = Lane::try_from(lane.to_string()).unwrap();
            for shard in 1..4 {
                let route = DelayRoute {
                    exchange: String::new(),
                    routing_key: lane_name(lane, shard),
                    hops: 1,
                };
                assert_eq!(walk_on(&bindings, &queues, &route).len(), 1);
            }
        }
        // The removed lane's entry stays bound to its shard 0: what an order
        // service still publishes with it waits there, and is delivered.
        let entry = DelayRoute {
            exchange: ENTRY_EXCHANGE.into(),
            routing_key: "schedule.7s".into(),
            hops: 1,
        };
        assert_eq!(
            walk_on(&bindings, &queues, &entry),
            ["order-timeout.lane.7s"]
        );
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
    fn only_consumed_quorum_queues_get_the_delivery_limit() {
        let limited = |layout: &Layout| -> Vec<String> {
            queue_specs(layout)
                .into_iter()
                .filter(|q| q.args.contains_key("x-delivery-limit"))
                .map(|q| q.name)
                .collect()
        };
        assert_eq!(
            limited(&layout(2)),
            [DUE_QUEUE, PARKED_QUEUE, LAYOUTS_QUEUE]
        );
        let due = &queue_specs(&layout(1))[0];
        assert_eq!(
            due.args.inner().get("x-delivery-limit"),
            Some(&AMQPValue::LongLongInt(DELIVERY_LIMIT))
        );
        let classic = Layout {
            queue_type: QueueType::Classic,
            ..layout(1)
        };
        assert!(limited(&classic).is_empty(), "classic queues refuse it");
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
            assert_eq!(queues.len(), 3 + (LEVELS * shards) as usize);
        }
    }
}
