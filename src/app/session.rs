//! One broker session: two connections (consume, publish), the topology
//! declared, and the session's tasks — consumer, batcher, sweeper, the
//! timers' watches, the parked keeper, pending poller (`ops::pending`, the queue depths) — started and, when the
//! session ends (connection lost or shutdown), drained within
//! `shutdown_timeout`.

use std::sync::Arc;
use std::time::Duration;

use lapin::{Channel, Connection};
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use crate::broker::acks::Acks;
use crate::broker::publisher::Publisher;
use crate::broker::topology;
use crate::broker::{Dialer, connect_amqp_with};
use crate::inventory::InventoryClient;
use crate::observe::http::Health;
use crate::observe::metrics::Metrics;
use crate::ops::pending::{self, PendingBoard};
use crate::pipeline::consumer::{Consumer, ConsumerError};
use crate::pipeline::context::Context;
use crate::pipeline::ending::Worker;
use crate::pipeline::job::Job;
use crate::pipeline::retry::RetryPolicy;
use crate::pipeline::{batcher, keep_parked, sweeper, watch};
use crate::settings::Settings;
use crate::shutdown::Shutdown;
use crate::store::Stores;

/// How long a lost session's in-flight work is waited for before the next
/// session starts (a graceful stop waits `shutdown_timeout`).
const LOST_SESSION_DRAIN: Duration = Duration::from_secs(1);

/// One broker connection's lifetime: connect, run the session's tasks
/// until the connection is lost or `shutdown` fires, then drain and close.
#[allow(
    clippy::too_many_arguments,
    reason = "the instance's parts, handed to each session as they are"
)]
pub(super) async fn run(
    settings: &Settings,
    instance: &Arc<str>,
    stores: &Stores,
    inventory: &InventoryClient,
    shutdown: &Shutdown,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
    board: &Arc<PendingBoard>,
    dialer: &Dialer,
) -> anyhow::Result<()> {
    let (broker, publisher) = Connections::open(settings, dialer).await?;
    let ctx = Arc::new(Context {
        settings: settings.clone(),
        layout: topology::Layout::of(settings),
        publisher,
        acks: Arc::new(Acks::new(broker.consume_channel.clone())),
        stores: stores.clone(),
        inventory: inventory.clone(),
        retry: RetryPolicy::new(settings.retry.clone()),
        metrics: metrics.clone(),
        instance: instance.clone(),
    });
    let tracker = TaskTracker::new();
    // The session ends (and reconnects) if either connection is lost.
    let session_stop = shutdown.child();
    tokio::spawn(watch_connection(
        broker.publish.status().clone(),
        session_stop.clone(),
    ));
    tokio::spawn(crate::broker::alarms::watch(
        broker.publish.events_listener(),
        session_stop.clone(),
    ));
    let stop_depths = shutdown.child();
    tokio::spawn(pending::poll(
        broker.depth_channel.clone(),
        topology::Layout::of(settings),
        metrics.clone(),
        board.clone(),
        stop_depths.clone(),
    ));
    // Parked messages move from their queue into the parked store.
    tracker.spawn(keep_parked::run(
        broker.consume.clone(),
        stores.default_timer().clone(),
        metrics.clone(),
        session_stop.clone(),
    ));
    let acks = ctx.acks.clone();
    let result = consume(
        ctx,
        broker.consume_channel.clone(),
        &session_stop,
        &tracker,
        health,
    )
    .await;
    session_stop.trigger();
    health.set_broker(false);
    metrics.set_broker_session_up(false);
    stop_depths.trigger();
    wind_down(settings, shutdown, dialer, &broker, &tracker, &acks).await;
    broker.close().await;
    result?;
    Ok(())
}

/// After the session's tasks were told to stop: marks its nodes as the
/// ones to try last if the session was lost, then waits for its in-flight
/// work (see below) before the connections close.
async fn wind_down(
    settings: &Settings,
    shutdown: &Shutdown,
    dialer: &Dialer,
    broker: &Connections,
    tracker: &TaskTracker,
    acks: &Acks,
) {
    let lost = !shutdown.is_triggered();
    if lost {
        // The session was lost: its nodes are tried last on reconnect (a
        // silent node would cost its connect timeout first).
        dialer.failed(broker.publish_node);
        dialer.failed(broker.consume_node);
    }
    // A graceful stop lets in-flight work finish; a lost session only
    // briefly: nothing it does can be acked any more (the broker returns
    // its deliveries), and its publishes wait for confirms that will not
    // come. What still runs finishes in the background, idempotently,
    // while the next session starts (measured: a 10 s drain made a silent
    // node's orders 18 s late instead of 11 s).
    let drain_for = if lost {
        settings.shutdown_timeout.min(LOST_SESSION_DRAIN)
    } else {
        settings.shutdown_timeout
    };
    drain(tracker, drain_for).await;
    let unsettled = acks.open();
    if unsettled > 0 {
        tracing::info!(
            deliveries = unsettled,
            "closing the session with deliveries not yet settled; the broker returns them to the queue"
        );
    }
}

/// Starts the consumer, then the batcher and the sweeper it feeds, and
/// consumes until `stop` fires or the channel fails.
async fn consume(
    ctx: Arc<Context>,
    channel: Channel,
    stop: &Shutdown,
    tracker: &TaskTracker,
    health: &Health,
) -> Result<(), ConsumerError> {
    let ctx_metrics = ctx.metrics.clone();
    let consumer = Consumer::start(ctx.clone(), channel).await?;
    // Due jobs flow from the consumer (and from held timers) to the
    // batcher; the sweeper feeds the same cancel path. The batcher ends
    // once every sender is gone, the sweeper with the session.
    let (due_tx, due_rx) = mpsc::channel::<Job>(usize::from(ctx.settings.prefetch).max(1));
    let worker = Worker {
        ctx,
        due: due_tx.downgrade(),
        tracker: tracker.clone(),
        session: stop.clone(),
    };
    let sweeper_stop = stop.child();
    tracker.spawn(sweeper::run(worker.clone(), sweeper_stop.clone()));
    tracker.spawn(watch::run(worker.clone(), sweeper_stop.clone()));
    tracker.spawn(batcher::run(worker, due_rx));
    health.set_broker(true);
    ctx_metrics.set_broker_session_up(true);
    let result = consumer.run(due_tx, stop.clone(), tracker.clone()).await;
    sweeper_stop.trigger();
    result
}

/// Waits up to `timeout` for the session's in-flight work to finish.
async fn drain(tracker: &TaskTracker, timeout: Duration) {
    tracker.close();
    if tokio::time::timeout(timeout, tracker.wait()).await.is_err() {
        tracing::warn!(
            ?timeout,
            "in-flight work did not finish in time; unacked messages return to the queue"
        );
    }
}

/// The broker connections of one session.
struct Connections {
    /// Consuming connection: deliveries and acks (shared with the parked
    /// keeper).
    consume: Arc<Connection>,
    /// Publishing connection, with the publisher's channels.
    publish: Connection,
    /// The index (in `AMQP_URL`) of the node `consume` is on.
    consume_node: usize,
    /// The index of the node `publish` is on.
    publish_node: usize,
    consume_channel: Channel,
    depth_channel: Channel,
    publish_channels: Vec<Channel>,
}

impl Connections {
    /// Connects, declares the topology, opens the channels.
    async fn open(settings: &Settings, dialer: &Dialer) -> anyhow::Result<(Self, Publisher)> {
        let (consume, consume_node) =
            connect_amqp_with(&settings.amqp_url, "order-timeout", dialer).await?;
        // Publishing gets its own connection: RabbitMQ's flow control throttles
        // a connection that publishes fast, and the deliveries and acks of the
        // consumer must not wait behind it (measured with `bench`: on one shared
        // connection publishes took 325 ms on average at 1,000 orders/s, and
        // the consumer fell behind).
        let (publish, publish_node) =
            connect_amqp_with(&settings.amqp_url, "order-timeout-publish", dialer).await?;
        let publisher = Publisher::new(&publish)
            .await?
            .with_confirm_timeout(settings.liveness.confirm_timeout);
        topology::declare(&publish, &topology::Layout::of(settings)).await?;
        let consume_channel = consume.create_channel().await?;
        let depth_channel = consume.create_channel().await?;
        let publish_channels = publisher.channels().to_vec();
        let connections = Self {
            consume: Arc::new(consume),
            publish,
            consume_node,
            publish_node,
            consume_channel,
            depth_channel,
            publish_channels,
        };
        Ok((connections, publisher))
    }

    /// Closes everything. Closing the consuming channel returns every
    /// unacked delivery to the queue.
    async fn close(self) {
        // Bounded as a whole: on a connection cut off, no close is ever
        // confirmed (the heartbeat ends it; shutdown must not wait).
        let close = async {
            let _ = self.consume_channel.close(200, "bye".into()).await;
            let _ = self.depth_channel.close(200, "bye".into()).await;
            for channel in &self.publish_channels {
                let _ = channel.close(200, "bye".into()).await;
            }
            let _ = self.consume.close(200, "bye".into()).await;
            let _ = self.publish.close(200, "bye".into()).await;
        };
        if tokio::time::timeout(crate::broker::CLOSE_TIMEOUT, close)
            .await
            .is_err()
        {
            tracing::debug!("the broker did not confirm closing the session in time");
        }
    }
}

/// Fires `stop` once the connection behind `status` is no longer connected.
async fn watch_connection(status: lapin::ConnectionStatus, stop: Shutdown) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.wait() => return,
        }
        if !status.connected() {
            tracing::warn!("publishing connection lost; ending the session");
            stop.trigger();
            return;
        }
    }
}
