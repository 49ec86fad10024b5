//! `--baseline broker-paths`: what the broker alone spends per message on
//! each way an order's timeout can cross it, paced at `--rate` for
//! `--duration`, with no database and no service in the way.
//!
//! The workload phases report the broker's CPU per order for a whole
//! design, on a machine that the database, the service and the generator
//! keep busy at the same time. That figure cannot tell which part of the
//! broker's work a design choice costs: two quorum queues against two
//! classic ones, at-least-once dead-lettering against at-most-once, the
//! `order.cancelled` event. Here each path runs alone, one after the
//! other, with the generator's pacing (100 ticks a second, confirms) and
//! the consumer's acking as the service or the seed consumer does it, and
//! the broker's CPU is read over the steady part of the run: publishing
//! and dead-lettering at the same rate.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::join_all;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, ExchangeKind};

use super::BenchError;
use super::amqp::confirm_channels;
use super::amqp::{QueuePair, declare_pair};
use super::report::PathCost;
use super::sys::Sampling;
use order_timeout::settings::SecretUrl;
use order_timeout::testing::broker::connect_amqp;

/// How long a message waits in a path's delay queue.
pub const PATH_TTL: Duration = Duration::from_secs(2);
/// Readings start this long after the first message was due to be acked,
/// so that the window holds only the steady state.
const WARM_UP: Duration = Duration::from_secs(1);
/// The shortest `--duration` for the paths: the TTL, the longest hold and
/// the warm-up before the readings, and 3 s of readings.
pub const MIN_DURATION: Duration =
    Duration::from_secs(PATH_TTL.as_secs() + LANE_HOLD.as_secs() + WARM_UP.as_secs() + 3);
/// Generator ticks per second (as the workload's generator).
const TICKS_PER_SEC: u64 = 100;
/// The consumer acks what it got every this often, as the service acks a
/// batch after its commit (the default `batch_linger`).
const ACK_EVERY: Duration = Duration::from_millis(25);
/// The service's default prefetch.
const PREFETCH: u16 = 4000;
/// The topic exchange the event-publishing path publishes into, unbound as
/// the bench's `order-timeout.events` is.
const EVENTS_EXCHANGE: &str = "bench.paths.events";

/// One way through the broker.
#[derive(Clone, Copy, Debug)]
struct Path {
    name: &'static str,
    what: &'static str,
    queues: QueuePair,
    /// Each message carries its TTL (`expiration`) instead of the queue.
    per_message_ttl: bool,
    /// The consumer publishes each message on as an `order.cancelled`
    /// event, with confirms, before it acks.
    event: bool,
    /// The consumer acks every message on its own, at once.
    ack_each: bool,
    /// The consumer keeps each message unacked this long before it acks
    /// it, as the service holds a message that leaves a lane 2 s before its
    /// deadline until the deadline.
    hold: Duration,
}

impl Path {
    /// The path's delay queue and due queue: `bench.paths.<name>.delay` and
    /// `.due`, the name without spaces and with `-` for commas.
    fn queue_names(&self) -> (String, String) {
        let slug: String = self
            .name
            .chars()
            .filter_map(|c| match c {
                ' ' => None,
                ',' => Some('-'),
                c => Some(c),
            })
            .collect();
        (
            format!("bench.paths.{slug}.delay"),
            format!("bench.paths.{slug}.due"),
        )
    }
}

/// The service holds a message leaving a lane this long (the lane's TTL is
/// the window less 2 s).
const LANE_HOLD: Duration = Duration::from_secs(2);

/// The paths measured, in order.
const PATHS: [Path; 5] = [
    Path {
        name: "lane, acked at once",
        what: "quorum delay queue (queue TTL) → at-least-once dead-letter → quorum due queue; acks multiple every 25 ms",
        queues: QueuePair::Quorum {
            at_least_once: true,
        },
        per_message_ttl: false,
        event: false,
        ack_each: false,
        hold: Duration::ZERO,
    },
    Path {
        name: "lane, held",
        what: "the same, each message held unacked for 2 s first, as the service holds a message leaving a lane",
        queues: QueuePair::Quorum {
            at_least_once: true,
        },
        per_message_ttl: false,
        event: false,
        ack_each: false,
        hold: LANE_HOLD,
    },
    Path {
        name: "lane, held, event",
        what: "the same, and an order.cancelled event per message (confirms): the service's broker work per cancelled order",
        queues: QueuePair::Quorum {
            at_least_once: true,
        },
        per_message_ttl: false,
        event: true,
        ack_each: false,
        hold: LANE_HOLD,
    },
    Path {
        name: "lane, held, at most once",
        what: "the held lane with at-most-once dead-lettering (a broker crash loses what is between the queues; not allowed, for comparison)",
        queues: QueuePair::Quorum {
            at_least_once: false,
        },
        per_message_ttl: false,
        event: false,
        ack_each: false,
        hold: LANE_HOLD,
    },
    Path {
        name: "seed",
        what: "classic delay queue (per-message TTL) → dead-letter → classic queue; each message acked on its own at once (the seed design)",
        queues: QueuePair::Classic,
        per_message_ttl: true,
        event: false,
        ack_each: true,
        hold: Duration::ZERO,
    },
];

/// Measures every path in turn at `rate` messages/s, each for `duration`,
/// `rounds` times over.
pub async fn measure(
    amqp_url: &SecretUrl,
    rate: f64,
    duration: Duration,
    rounds: usize,
    sampling: &Sampling,
) -> Result<Vec<PathCost>, BenchError> {
    let mut out = Vec::new();
    for round in 1..=rounds.max(1) {
        for path in PATHS {
            eprintln!("   round {round}, path {}: {}", path.name, path.what);
            let mut cost = measure_one(amqp_url, path, rate, duration, sampling).await?;
            cost.round = round;
            if let Some(ms) = cost.broker_ms_per_message {
                eprintln!(
                    "   = broker {ms:.3} ms per message over {} messages",
                    cost.messages
                );
            }
            out.push(cost);
        }
    }
    Ok(out)
}

/// One path's figures over its rounds.
#[derive(Clone, Debug, PartialEq)]
pub struct PathSummary {
    /// The path's name.
    pub path: String,
    /// What it is.
    pub what: String,
    /// The broker's CPU per message, ms, in each round that had a reading.
    pub ms: Vec<f64>,
    /// The broker's switches per message, in each round that had a reading.
    pub switches: Vec<f64>,
    /// Messages not consumed, all rounds together.
    pub lost: u64,
}

/// `costs` grouped by path, in the order the paths first appear.
pub fn summarize(costs: &[PathCost]) -> Vec<PathSummary> {
    let mut out: Vec<PathSummary> = Vec::new();
    for c in costs {
        let i = match out.iter().position(|s| s.path == c.path) {
            Some(i) => i,
            None => {
                out.push(PathSummary {
                    path: c.path.clone(),
                    what: c.what.clone(),
                    ms: Vec::new(),
                    switches: Vec::new(),
                    lost: 0,
                });
                out.len() - 1
            }
        };
        let s = &mut out[i];
        s.ms.extend(c.broker_ms_per_message);
        s.switches.extend(c.broker_switches_per_message);
        s.lost += c.lost;
    }
    out
}

/// Runs one path: declares its queues, consumes and publishes for
/// `duration`, waits for the last messages, and removes the queues.
async fn measure_one(
    amqp_url: &SecretUrl,
    path: Path,
    rate: f64,
    duration: Duration,
    sampling: &Sampling,
) -> Result<PathCost, BenchError> {
    let pub_conn = connect_amqp(amqp_url, "order-timeout-bench-paths-pub").await?;
    let sub_conn = connect_amqp(amqp_url, "order-timeout-bench-paths-sub").await?;
    let setup = pub_conn.create_channel().await?;
    let (delay, due) = path.queue_names();
    let queue_ttl = (!path.per_message_ttl).then_some(PATH_TTL);
    declare_pair(&setup, path.queues, &delay, &due, queue_ttl).await?;
    setup
        .exchange_declare(
            EVENTS_EXCHANGE.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let consumed = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let events = if path.event {
        Some(confirm_channels(&sub_conn, 1).await?.remove(0))
    } else {
        None
    };
    let consumer = tokio::spawn(consume(
        sub_conn.create_channel().await?,
        events,
        due.clone(),
        path,
        consumed.clone(),
        stopped,
    ));
    let publisher = confirm_channels(&pub_conn, 1).await?.remove(0);
    let window = Window {
        from: PATH_TTL + path.hold + WARM_UP,
        to: duration,
    };
    let (published, mut cost) =
        publish_paced(&publisher, &delay, path, rate, window, &consumed, sampling).await?;
    // Let the last messages expire, arrive and be held.
    let deadline = Instant::now() + PATH_TTL + path.hold + Duration::from_secs(5);
    while consumed.load(Ordering::Relaxed) < published && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    match consumer.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("warning: path {}: the consumer stopped: {e}", path.name),
        Err(e) => eprintln!("warning: path {}: the consumer task failed: {e}", path.name),
    }
    cost.lost = published.saturating_sub(consumed.load(Ordering::Relaxed));
    for q in [&delay, &due] {
        let _ = setup
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = setup
        .exchange_delete(EVENTS_EXCHANGE.into(), ExchangeDeleteOptions::default())
        .await;
    let _ = pub_conn.close(200, "done".into()).await;
    let _ = sub_conn.close(200, "done".into()).await;
    Ok(cost)
}

/// The measured part of a path's run, from its start.
#[derive(Clone, Copy)]
struct Window {
    from: Duration,
    to: Duration,
}

/// Publishes `rate` messages/s into `delay` for `window.to`, in ticks,
/// waiting for each tick's confirms; reads the broker's CPU over `window`.
/// Returns how many were confirmed, and the cost.
async fn publish_paced(
    channel: &Channel,
    delay: &str,
    path: Path,
    rate: f64,
    window: Window,
    consumed: &AtomicU64,
    sampling: &Sampling,
) -> Result<(u64, PathCost), BenchError> {
    let started = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / TICKS_PER_SEC as u32);
    let mut mark: Option<(Instant, u64)> = None;
    let mut sent = 0u64;
    let mut confirmed = 0u64;
    while started.elapsed() < window.to {
        ticks.tick().await;
        if mark.is_none() && started.elapsed() >= window.from {
            sampling.reset();
            mark = Some((Instant::now(), consumed.load(Ordering::Relaxed)));
        }
        // Whole messages due by now at `rate`.
        let due_by_now = (started.elapsed().as_secs_f64() * rate) as u64;
        confirmed += publish_numbered(channel, delay, path, sent + 1..=due_by_now).await?;
        sent = sent.max(due_by_now);
    }
    let mut cost = PathCost {
        path: path.name.into(),
        what: path.what.into(),
        ..Default::default()
    };
    if let Some((t0, n0)) = mark {
        let usage = sampling.usage();
        cost.messages = consumed.load(Ordering::Relaxed) - n0;
        cost.seconds = t0.elapsed().as_secs_f64();
        if let Some(broker) = usage.get("broker")
            && cost.messages > 0
        {
            let n = cost.messages as f64;
            cost.broker_ms_per_message = broker.cpu_seconds.map(|s| s * 1000.0 / n);
            cost.broker_switches_per_message = broker.switches.map(|s| s as f64 / n);
        }
    }
    Ok((confirmed, cost))
}

/// Publishes the messages numbered `numbers` into `delay` (a contract
/// body each, persistent) and waits for their confirms; returns how many
/// the broker confirmed.
async fn publish_numbered(
    channel: &Channel,
    delay: &str,
    path: Path,
    numbers: std::ops::RangeInclusive<u64>,
) -> Result<u64, BenchError> {
    let ttl_ms = PATH_TTL.as_millis().to_string();
    let mut confirms = Vec::new();
    for n in numbers {
        let body = format!(
            r#"{{"order_id":"bench-paths-{n:012}","cancel_at":"2026-11-27T10:30:00.000Z"}}"#
        );
        let mut props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into());
        if path.per_message_ttl {
            props = props.with_expiration(ttl_ms.as_str().into());
        }
        confirms.push(
            channel
                .basic_publish(
                    "".into(),
                    delay.into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    props,
                )
                .await?,
        );
    }
    Ok(join_all(confirms)
        .await
        .into_iter()
        .filter(|c| matches!(c, Ok(c) if c.is_ack()))
        .count() as u64)
}

/// Consumes `queue` until `stop`: acks every message at once
/// (`path.ack_each`) or, as the service does, every [`ACK_EVERY`] the
/// messages held for `path.hold`, with one `multiple` ack, after
/// publishing an event per message on `events` (confirmed) when given.
async fn consume(
    channel: Channel,
    events: Option<Channel>,
    queue: String,
    path: Path,
    consumed: Arc<AtomicU64>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), BenchError> {
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut ticks = tokio::time::interval(ACK_EVERY);
    // Unacked deliveries in order: when each came, its tag, its body.
    let mut held: VecDeque<(Instant, u64, Vec<u8>)> = VecDeque::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            d = deliveries.next() => {
                let Some(Ok(d)) = d else { break };
                if path.ack_each {
                    d.ack(BasicAckOptions::default()).await?;
                    consumed.fetch_add(1, Ordering::Relaxed);
                } else {
                    held.push_back((Instant::now(), d.delivery_tag, d.data));
                }
            }
            _ = ticks.tick() => {
                let ready = held.partition_point(|(at, _, _)| at.elapsed() >= path.hold);
                if ready == 0 {
                    continue;
                }
                let batch: Vec<_> = held.drain(..ready).collect();
                if let Some(events) = &events {
                    publish_events(events, &batch).await?;
                }
                if let Some(&(_, last, _)) = batch.last() {
                    channel
                        .basic_ack(last, BasicAckOptions { multiple: true })
                        .await?;
                }
                consumed.fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// Publishes each message of `batch` as an event and waits for the
/// confirms.
async fn publish_events(
    events: &Channel,
    batch: &[(Instant, u64, Vec<u8>)],
) -> Result<(), BenchError> {
    let mut confirms = Vec::with_capacity(batch.len());
    for (_, _, body) in batch {
        confirms.push(
            events
                .basic_publish(
                    EVENTS_EXCHANGE.into(),
                    "order.cancelled".into(),
                    BasicPublishOptions::default(),
                    body,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?,
        );
    }
    join_all(confirms).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::report::median;
    use super::*;

    #[test]
    fn every_path_has_queues_of_its_own() {
        let names: HashSet<_> = PATHS.iter().map(Path::queue_names).collect();
        assert_eq!(names.len(), PATHS.len());
        for (delay, due) in &names {
            assert!(
                delay
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-".contains(c)),
                "{delay}"
            );
            assert_ne!(delay, due);
        }
        assert_eq!(
            PATHS[2].queue_names().0,
            "bench.paths.lane-held-event.delay"
        );
    }

    #[test]
    fn rounds_are_grouped_by_path_with_their_median() {
        let cost = |path: &str, round, ms| PathCost {
            path: path.into(),
            round,
            broker_ms_per_message: ms,
            lost: u64::from(ms.is_none()),
            ..Default::default()
        };
        let costs = [
            cost("lane", 1, Some(0.30)),
            cost("seed", 1, Some(0.20)),
            cost("lane", 2, Some(0.10)),
            cost("seed", 2, None),
            cost("lane", 3, Some(0.20)),
        ];
        let s = summarize(&costs);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].path.as_str(), s[1].path.as_str()), ("lane", "seed"));
        assert_eq!(s[0].ms, [0.30, 0.10, 0.20]);
        assert_eq!(median(&s[0].ms), Some(0.20));
        assert_eq!(s[1].ms, [0.20]);
        assert_eq!(s[1].lost, 1);
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn a_path_acks_either_at_once_or_after_its_hold() {
        for p in PATHS {
            assert!(
                !(p.ack_each && (p.event || !p.hold.is_zero())),
                "{}",
                p.name
            );
            // A per-message TTL is the seed's way; the lanes use the queue's.
            assert_eq!(
                p.per_message_ttl,
                p.queues == QueuePair::Classic,
                "{}",
                p.name
            );
        }
    }
}
