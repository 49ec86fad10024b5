//! Wiring: connect, declare the topology, consume, and reconnect with backoff
//! when the broker connection is lost. Used by `serve`, the demo and the
//! integration tests, so all three run the same code.

use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder;
use lapin::{Connection, ConnectionProperties};
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use crate::config::{Settings, redact_url};
use crate::consumer::{self, Context};
use crate::inventory::InventoryClient;
use crate::metrics::Stats;
use crate::publisher::Publisher;
use crate::retry::RetryPolicy;
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::topology;

/// Connects to RabbitMQ with this service's connection name.
#[tracing::instrument(skip_all, fields(url = %redact_url(url)))]
pub async fn connect_amqp(url: &str, name: &str) -> Result<Connection, lapin::Error> {
    Connection::connect(
        url,
        ConnectionProperties::default().with_connection_name(name.into()),
    )
    .await
}

/// Declares the topology on a fresh connection (used by `migrate`-style
/// commands and tests; `serve` declares on every (re)connect).
pub async fn declare_topology(settings: &Settings) -> anyhow::Result<()> {
    let conn = connect_amqp(&settings.amqp_url, "order-timeout-setup").await?;
    let channel = conn.create_channel().await?;
    topology::declare(&channel, settings.queue_type).await?;
    let _ = conn.close(200, "setup done".into()).await;
    Ok(())
}

/// Runs the service until `shutdown` fires: one broker session after
/// another, with exponential backoff between failed ones.
pub async fn run(settings: Settings, shutdown: Shutdown, stats: Arc<Stats>) -> anyhow::Result<()> {
    let store = Store::connect_lazy(&settings.database_url, settings.db_max_connections)?;
    let inventory =
        InventoryClient::connect_lazy(&settings.inventory_url, settings.inventory_timeout)?;
    tracing::info!(
        amqp = %redact_url(&settings.amqp_url),
        database = %redact_url(&settings.database_url),
        inventory = %settings.inventory_url,
        queue_type = ?settings.queue_type,
        "starting order-timeout"
    );
    let mut backoff = reconnect_backoff();
    loop {
        let started = std::time::Instant::now();
        let result = session(&settings, &store, &inventory, &shutdown, &stats).await;
        if shutdown.is_triggered() {
            if let Err(e) = result {
                tracing::warn!(error = %e, "session ended with an error during shutdown");
            }
            tracing::info!("stopped");
            return Ok(());
        }
        let error = match result {
            Ok(()) => anyhow::anyhow!("session ended unexpectedly"),
            Err(e) => e,
        };
        if started.elapsed() > Duration::from_secs(30) {
            backoff = reconnect_backoff();
        }
        let delay = backoff.next().unwrap_or(Duration::from_secs(30));
        tracing::warn!(error = %format!("{error:#}"), retry_in = ?delay, "broker session failed; reconnecting");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.wait() => return Ok(()),
        }
    }
}

fn reconnect_backoff() -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times()
        .build()
}

/// One broker connection's lifetime.
async fn session(
    settings: &Settings,
    store: &Store,
    inventory: &InventoryClient,
    shutdown: &Shutdown,
    stats: &Arc<Stats>,
) -> anyhow::Result<()> {
    let conn = connect_amqp(&settings.amqp_url, "order-timeout").await?;
    let publisher = Publisher::new(&conn).await?;
    topology::declare(publisher.channel(), settings.queue_type).await?;
    let consume_channel = conn.create_channel().await?;
    let publish_channel = publisher.channel().clone();
    let ctx = Arc::new(Context {
        settings: settings.clone(),
        publisher,
        store: store.clone(),
        inventory: inventory.clone(),
        retry: RetryPolicy::new(settings.retry.clone()),
        stats: stats.clone(),
    });
    let tracker = TaskTracker::new();
    let result = consumer::run(
        ctx,
        consume_channel.clone(),
        shutdown.clone(),
        tracker.clone(),
    )
    .await;
    tracker.close();
    if tokio::time::timeout(settings.shutdown_timeout, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            timeout = ?settings.shutdown_timeout,
            "in-flight work did not finish in time; unacked messages return to the queue"
        );
    }
    // Closing the consuming channel returns every unacked delivery to the queue.
    let _ = consume_channel.close(200, "bye".into()).await;
    let _ = publish_channel.close(200, "bye".into()).await;
    let _ = conn.close(200, "bye".into()).await;
    result?;
    Ok(())
}

/// A service instance running in the background of this process (demo,
/// tests).
pub struct RunningService {
    shutdown: Shutdown,
    handle: JoinHandle<anyhow::Result<()>>,
    /// Its outcome counters.
    pub stats: Arc<Stats>,
}

impl RunningService {
    /// Starts the service with `settings` on the current runtime.
    pub fn spawn(settings: Settings) -> Self {
        let shutdown = Shutdown::new();
        let stats = Arc::new(Stats::default());
        let handle = tokio::spawn(run(settings, shutdown.clone(), stats.clone()));
        Self {
            shutdown,
            handle,
            stats,
        }
    }

    /// Graceful stop: finishes in-flight work, then returns.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.trigger();
        self.handle.await?
    }
}
