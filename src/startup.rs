//! Wiring: bind the operations endpoint, connect, declare the topology,
//! consume, and reconnect with backoff when the broker connection is lost.
//! Used by `serve`, the demo and the integration tests, so all three run the
//! same code.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use crate::config::{Settings, redact_url};
use crate::consumer::{self, Context};
use crate::http::{self, Health};
use crate::inventory::InventoryClient;
use crate::metrics::Metrics;
use crate::publisher::Publisher;
use crate::retry::RetryPolicy;
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::topology::{self, DUE_QUEUE, PARKED_QUEUE};

/// How long opening a broker connection (TCP, AMQP handshake, vhost) may
/// take. A broker that accepts TCP but never answers the handshake would
/// otherwise hold a (re)connect forever; with this it is an error, which the
/// reconnect loop retries with backoff (and readiness stays red).
pub const AMQP_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects to RabbitMQ with this service's connection name, within
/// [`AMQP_CONNECT_TIMEOUT`].
#[tracing::instrument(skip_all, fields(url = %redact_url(url)))]
pub async fn connect_amqp(url: &str, name: &str) -> Result<Connection, lapin::Error> {
    connect_amqp_within(url, name, AMQP_CONNECT_TIMEOUT).await
}

async fn connect_amqp_within(
    url: &str,
    name: &str,
    limit: Duration,
) -> Result<Connection, lapin::Error> {
    let connect = Connection::connect(
        url,
        ConnectionProperties::default().with_connection_name(name.into()),
    );
    match tokio::time::timeout(limit, connect).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the broker did not complete the connection within {limit:?}"),
        )
        .into()),
    }
}

/// Declares the topology on a fresh connection (for the demo and tests;
/// `serve` declares on every (re)connect).
pub async fn declare_topology(settings: &Settings) -> anyhow::Result<()> {
    let conn = connect_amqp(&settings.amqp_url, "order-timeout-setup").await?;
    let channel = conn.create_channel().await?;
    topology::declare(&channel, &settings.layout()).await?;
    let _ = conn.close(200, "setup done".into()).await;
    Ok(())
}

/// A service instance, built (endpoint bound, clients created) but not yet
/// running.
pub struct Service {
    settings: Settings,
    store: Store,
    inventory: InventoryClient,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    listener: tokio::net::TcpListener,
}

impl Service {
    /// Binds `HTTP_ADDR` and creates the (lazy) database and inventory
    /// clients. Fails only on a bad address or URL, never because a
    /// dependency is down: those are waited for.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let store = Store::connect_lazy(&settings.database_url, settings.db_max_connections)?;
        let inventory =
            InventoryClient::connect_lazy(&settings.inventory_url, settings.inventory_timeout)?;
        let listener = tokio::net::TcpListener::bind(settings.http_addr)
            .await
            .map_err(|e| {
                anyhow::anyhow!("cannot listen on HTTP_ADDR {}: {e}", settings.http_addr)
            })?;
        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(Health::new(
            store.clone(),
            &settings.inventory_url,
            metrics.clone(),
        ));
        Ok(Self {
            settings,
            store,
            inventory,
            metrics,
            health,
            listener,
        })
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub fn http_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(self.settings.http_addr)
    }

    /// This instance's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Runs until `shutdown` fires: the endpoints, and one broker session
    /// after another with exponential backoff between failed ones.
    pub async fn run(self, shutdown: Shutdown) -> anyhow::Result<()> {
        let Self {
            settings,
            store,
            inventory,
            metrics,
            health,
            listener,
        } = self;
        tracing::info!(
            amqp = %redact_url(&settings.amqp_url),
            database = %redact_url(&settings.database_url),
            inventory = %redact_url(&settings.inventory_url),
            http = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            queue_type = ?settings.queue_type,
            cascade_shards = settings.cascade_shards.get(),
            "starting order-timeout"
        );
        let http_task = tokio::spawn(http::serve(listener, health.clone(), shutdown.clone()));
        tokio::spawn(http::refresh_readiness(health.clone(), shutdown.clone()));

        let mut backoff = reconnect_backoff();
        loop {
            let started = std::time::Instant::now();
            let result = session(&settings, &store, &inventory, &shutdown, &metrics, &health).await;
            health.set_broker(false);
            if shutdown.is_triggered() {
                if let Err(e) = result {
                    tracing::warn!(error = %format!("{e:#}"), "session ended with an error during shutdown");
                }
                let _ = http_task.await;
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
            metrics.reconnect();
            tracing::warn!(error = %format!("{error:#}"), retry_in = ?delay, "broker session failed; reconnecting");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.wait() => return Ok(()),
            }
        }
    }
}

/// Builds and runs a service (what `serve` does).
pub async fn run(settings: Settings, shutdown: Shutdown) -> anyhow::Result<()> {
    Service::build(settings).await?.run(shutdown).await
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
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
) -> anyhow::Result<()> {
    let conn = connect_amqp(&settings.amqp_url, "order-timeout").await?;
    // Publishing gets its own connection: RabbitMQ's flow control throttles
    // a connection that publishes fast, and the deliveries and acks of the
    // consumer must not wait behind it (measured with `bench`: on one shared
    // connection publishes took 325 ms on average at 1,000 orders/s, and
    // the consumer fell behind).
    let pub_conn = connect_amqp(&settings.amqp_url, "order-timeout-publish").await?;
    let publisher = Publisher::new(&pub_conn).await?;
    topology::declare(publisher.channel(), &settings.layout()).await?;
    let consume_channel = conn.create_channel().await?;
    let depth_channel = conn.create_channel().await?;
    let publish_channels = publisher.channels().to_vec();
    let ctx = Arc::new(Context {
        settings: settings.clone(),
        publisher,
        store: store.clone(),
        inventory: inventory.clone(),
        retry: RetryPolicy::new(settings.retry.clone()),
        metrics: metrics.clone(),
    });
    let tracker = TaskTracker::new();
    // The session ends (and reconnects) if either connection is lost.
    let session_stop = shutdown.child();
    tokio::spawn(watch_connection(
        pub_conn.status().clone(),
        session_stop.clone(),
    ));
    let stop_depths = shutdown.child();
    tokio::spawn(poll_queue_depths(
        depth_channel.clone(),
        metrics.clone(),
        stop_depths.clone(),
    ));
    health.set_broker(true);
    let result = consumer::run(
        ctx,
        consume_channel.clone(),
        session_stop.clone(),
        tracker.clone(),
    )
    .await;
    session_stop.trigger();
    health.set_broker(false);
    stop_depths.trigger();
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
    let _ = depth_channel.close(200, "bye".into()).await;
    for channel in publish_channels {
        let _ = channel.close(200, "bye".into()).await;
    }
    let _ = conn.close(200, "bye".into()).await;
    let _ = pub_conn.close(200, "bye".into()).await;
    result?;
    Ok(())
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

/// Keeps `order_timeout_queue_messages` current for the due and parked
/// queues (the parked-backlog alert reads it).
async fn poll_queue_depths(channel: lapin::Channel, metrics: Arc<Metrics>, stop: Shutdown) {
    loop {
        for queue in [DUE_QUEUE, PARKED_QUEUE] {
            let declared = channel
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await;
            match declared {
                Ok(q) => metrics.set_queue_depth(queue, q.message_count()),
                Err(e) => {
                    tracing::debug!(error = %e, queue, "queue depth poll failed");
                    return;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.wait() => return,
        }
    }
}

/// A service instance running in the background of this process (demo,
/// tests).
pub struct RunningService {
    shutdown: Shutdown,
    handle: JoinHandle<anyhow::Result<()>>,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    /// Where its `/metrics`, `/healthz`, `/readyz` are served.
    pub http_addr: SocketAddr,
}

impl RunningService {
    /// Builds the service with `settings` and runs it on the current runtime.
    pub async fn start(settings: Settings) -> anyhow::Result<Self> {
        let service = Service::build(settings).await?;
        let shutdown = Shutdown::new();
        let metrics = service.metrics();
        let http_addr = service.http_addr();
        let handle = tokio::spawn(service.run(shutdown.clone()));
        Ok(Self {
            shutdown,
            handle,
            metrics,
            http_addr,
        })
    }

    /// Graceful stop: finishes in-flight work, then returns.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.trigger();
        self.handle.await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_broker_that_never_answers_the_handshake_is_an_error_not_a_hang() {
        // Accepts TCP, then says nothing: what a wedged broker looks like.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(socket);
        });
        let started = std::time::Instant::now();
        let err = connect_amqp_within(
            &format!("amqp://guest:guest@{addr}/%2f"),
            "test",
            Duration::from_millis(500),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("did not complete"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        silent.abort();
    }
}
