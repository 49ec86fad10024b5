//! The comparisons a bench run measures the product against.
//!
//! - **Single queue** (`--baseline single-queue`): the design most tutorials
//!   show. One delay queue, each message carrying its own `expiration`
//!   (the time left to the order's deadline), dead-lettering into the
//!   consumer. To compare the delay store and nothing else, the delay queue
//!   dead-letters into the service's own entry point (exchange
//!   `order-timeout`, key `schedule`): the same service instances then
//!   cancel those orders with the same code, batching and database work.
//!   The broker only dead-letters from the head of a queue, so a short
//!   timeout waits behind a longer one published before it.
//! - **Broker ceiling** (`--baseline broker-ceiling`): publish (confirms,
//!   persistent) → one fixed-TTL queue → dead-letter → consume and ack, no
//!   database, no service, publishing as fast as confirms allow. The
//!   consumed rate is the most one hop can carry on this machine; every
//!   other figure can be read as a share of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use tokio::sync::Semaphore;

use super::BenchError;
use super::amqp::{SINGLE_DELAY_QUEUE, args, confirm_channels, declare};
use super::report::{CeilingReport, LatenessStats};
use order_timeout::settings::{QueueType, SecretUrl};
use order_timeout::testing::broker::connect_amqp;
use order_timeout::testing::topology::{ENTRY_EXCHANGE, SCHEDULE_ROUTING_KEY};

/// The ceiling's fixed-TTL queue.
pub const CEILING_DELAY_QUEUE: &str = "bench.ceiling.delay";
/// The ceiling's consumer queue.
pub const CEILING_SINK_QUEUE: &str = "bench.ceiling.sink";
/// TTL of the ceiling's delay queue.
pub const CEILING_TTL_MS: u64 = 1000;
/// Most messages the ceiling keeps between publish and consume: more than
/// one TTL's worth at any rate this machine reaches.
const IN_FLIGHT: u64 = 15_000;

/// Declares the single-queue baseline's delay queue (per-message TTL,
/// dead-lettering into the service's entry point).
pub async fn declare_single_queue(
    conn: &Connection,
    queue_type: QueueType,
) -> Result<(), BenchError> {
    let ch = conn.create_channel().await?;
    declare(
        &ch,
        SINGLE_DELAY_QUEUE,
        args(
            queue_type,
            None,
            Some((ENTRY_EXCHANGE, SCHEDULE_ROUTING_KEY)),
        ),
    )
    .await?;
    let _ = ch.close(200, "ok".into()).await;
    Ok(())
}

/// Measures the one-hop ceiling for `duration` of publishing.
pub async fn broker_ceiling(
    amqp_url: &SecretUrl,
    queue_type: QueueType,
    duration: Duration,
) -> Result<CeilingReport, BenchError> {
    let pub_conn = connect_amqp(amqp_url, "order-timeout-bench-ceiling-pub").await?;
    let sub_conn = connect_amqp(amqp_url, "order-timeout-bench-ceiling-sub").await?;
    let setup = pub_conn.create_channel().await?;
    declare(&setup, CEILING_SINK_QUEUE, args(queue_type, None, None)).await?;
    declare(
        &setup,
        CEILING_DELAY_QUEUE,
        args(
            queue_type,
            Some(CEILING_TTL_MS),
            Some(("", CEILING_SINK_QUEUE)),
        ),
    )
    .await?;
    // The total published, once publishing is over.
    let (total_tx, total_rx) = tokio::sync::watch::channel::<Option<u64>>(None);
    let consumed = Arc::new(AtomicU64::new(0));
    let consumer = CeilingConsumer::start(&sub_conn, total_rx, consumed.clone()).await?;
    let started = std::time::Instant::now();
    let total = publish_closed_loop(&pub_conn, duration, &consumed).await?;
    let publish_end = std::time::Instant::now();
    let _ = total_tx.send(Some(total));
    let arrivals = consumer
        .await
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    for q in [CEILING_DELAY_QUEUE, CEILING_SINK_QUEUE] {
        let _ = setup
            .queue_delete(q.into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = pub_conn.close(200, "done".into()).await;
    let _ = sub_conn.close(200, "done".into()).await;
    Ok(arrivals.report(queue_type, total, started, publish_end))
}

/// What the ceiling's consumer saw.
struct Arrivals {
    /// Lateness of each message (delivery − publish − TTL), ms.
    lateness: Vec<f64>,
    /// When each message arrived.
    at: Vec<std::time::Instant>,
    first: Option<std::time::Instant>,
    last: std::time::Instant,
}

impl Arrivals {
    /// The ceiling's figures, publishing having run from `started` to
    /// `publish_end` and confirmed `total` messages.
    fn report(
        self,
        queue_type: QueueType,
        total: u64,
        started: std::time::Instant,
        publish_end: std::time::Instant,
    ) -> CeilingReport {
        let publish_secs = (publish_end - started).as_secs_f64();
        let consumed = self.lateness.len() as u64;
        // Deliveries while the publisher was still running: the rate the
        // broker sustains while also taking publishes (the ceiling proper).
        let sustained = self.first.and_then(|f| {
            let from = f + Duration::from_secs(1);
            let window = publish_end.checked_duration_since(from)?.as_secs_f64();
            let n = self
                .at
                .iter()
                .filter(|t| **t >= from && **t <= publish_end)
                .count();
            (window > 0.5).then(|| n as f64 / window)
        });
        let consume_secs = match self.first {
            Some(f) => (self.last - f).as_secs_f64(),
            None => 0.0,
        };
        CeilingReport {
            queue_type: format!("{queue_type:?}").to_lowercase(),
            ttl_ms: CEILING_TTL_MS,
            published: total,
            consumed,
            publish_rate: total as f64 / publish_secs.max(1e-9),
            consume_rate: if consume_secs > 0.0 {
                consumed as f64 / consume_secs
            } else {
                0.0
            },
            sustained_rate: sustained,
            lateness: LatenessStats::from_ms(&self.lateness),
            ..Default::default()
        }
    }
}

/// The ceiling's consumer: acks in blocks (multiple) so acking is not
/// what is measured; stops once it has seen the total published, or 5 s
/// after publishing ended with nothing more arriving.
struct CeilingConsumer;

impl CeilingConsumer {
    async fn start(
        conn: &Connection,
        total_rx: tokio::sync::watch::Receiver<Option<u64>>,
        consumed: Arc<AtomicU64>,
    ) -> Result<tokio::task::JoinHandle<Arrivals>, BenchError> {
        let sub = conn.create_channel().await?;
        sub.basic_qos(2000, BasicQosOptions::default()).await?;
        let consumer = sub
            .basic_consume(
                CEILING_SINK_QUEUE.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(tokio::spawn(Self::run(consumer, total_rx, consumed)))
    }

    async fn run(
        mut consumer: lapin::Consumer,
        total_rx: tokio::sync::watch::Receiver<Option<u64>>,
        consumed: Arc<AtomicU64>,
    ) -> Arrivals {
        let mut a = Arrivals {
            lateness: Vec::new(),
            at: Vec::new(),
            first: None,
            last: std::time::Instant::now(),
        };
        let mut unacked: Option<lapin::message::Delivery> = None;
        let mut unacked_n = 0u32;
        loop {
            let total = *total_rx.borrow();
            if let Some(t) = total
                && a.lateness.len() as u64 >= t
            {
                break;
            }
            match tokio::time::timeout(Duration::from_millis(200), consumer.next()).await {
                Ok(Some(Ok(d))) => {
                    a.record(&d);
                    consumed.fetch_add(1, Ordering::Relaxed);
                    unacked_n += 1;
                    if unacked_n >= 200 {
                        let _ = d.ack(BasicAckOptions { multiple: true }).await;
                        unacked_n = 0;
                        unacked = None;
                    } else {
                        unacked = Some(d);
                    }
                }
                Ok(_) => break,
                Err(_) => {
                    // Idle; give up 5 s after publishing ended.
                    if total.is_some() && a.last.elapsed() > Duration::from_secs(5) {
                        break;
                    }
                }
            }
        }
        if let Some(d) = unacked {
            let _ = d.ack(BasicAckOptions { multiple: true }).await;
        }
        a
    }
}

impl Arrivals {
    fn record(&mut self, d: &lapin::message::Delivery) {
        let now = std::time::Instant::now();
        self.first.get_or_insert(now);
        self.last = now;
        self.at.push(now);
        if let Ok(bytes) = <[u8; 8]>::try_from(&d.data[..8.min(d.data.len())]) {
            let sent_ms = i64::from_be_bytes(bytes);
            let now_ms = chrono::Utc::now().timestamp_millis();
            self.lateness
                .push((now_ms - sent_ms - CEILING_TTL_MS as i64) as f64);
        }
    }
}

/// The ceiling's publisher: as fast as confirms allow, a bounded window in
/// flight, and a closed loop: at most [`IN_FLIGHT`] published but not yet
/// consumed, so the publisher cannot starve the dead-lettering of CPU; it
/// runs at the speed of the whole hop. Returns how many were confirmed.
async fn publish_closed_loop(
    conn: &Connection,
    duration: Duration,
    consumed: &AtomicU64,
) -> Result<u64, BenchError> {
    let channels = confirm_channels(conn, 2).await?;
    let window = Arc::new(Semaphore::new(4000));
    let ok = Arc::new(AtomicU64::new(0));
    let started = std::time::Instant::now();
    let mut i = 0usize;
    let mut tasks = Vec::new();
    while started.elapsed() < duration {
        while ok.load(Ordering::Relaxed) >= consumed.load(Ordering::Relaxed) + IN_FLIGHT {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let permits = window
            .clone()
            .acquire_many_owned(100)
            .await
            .map_err(|e| BenchError::Setup(e.to_string()))?;
        let ch = channels[i % channels.len()].clone();
        i += 1;
        let confirms = publish_hundred(&ch).await;
        let ok = ok.clone();
        tasks.push(tokio::spawn(async move {
            let _permits = permits;
            let n = join_all(confirms)
                .await
                .into_iter()
                .filter(|c| matches!(c, Ok(c) if c.is_ack()))
                .count();
            ok.fetch_add(n as u64, Ordering::Relaxed);
        }));
    }
    join_all(tasks).await;
    Ok(ok.load(Ordering::Relaxed))
}

/// Publishes 100 timestamped persistent messages into the ceiling's delay
/// queue; returns their pending confirms.
async fn publish_hundred(ch: &Channel) -> Vec<lapin::PublisherConfirm> {
    let mut confirms = Vec::with_capacity(100);
    for _ in 0..100 {
        let body = chrono::Utc::now().timestamp_millis().to_be_bytes();
        if let Ok(c) = ch
            .basic_publish(
                "".into(),
                CEILING_DELAY_QUEUE.into(),
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
        {
            confirms.push(c);
        }
    }
    confirms
}
