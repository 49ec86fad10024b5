//! Wiring: bind the operations endpoint, create the clients, then run one
//! broker session after another (`session.rs`), reconnecting with backoff
//! when the broker connection is lost. Used by `serve`, the demo and the
//! integration tests, so all three run the same code.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder;
use tokio::task::JoinHandle;

use crate::inventory::InventoryClient;
use crate::observe::http::{self, Health};
use crate::observe::metrics::Metrics;
use crate::observe::recent::Recent;
use crate::ops::console::{self, Console};
use crate::ops::pending::PendingBoard;
use crate::settings::Release;
use crate::settings::Settings;
use crate::shutdown::Shutdown;
use crate::store::{self, Stores};

mod session;

/// A service instance, built (endpoint bound, clients created) but not yet
/// running.
pub struct Service {
    settings: Settings,
    /// This instance's name among the replicas (a watch's lease holder).
    instance: Arc<str>,
    stores: Stores,
    inventory: InventoryClient,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    board: Arc<PendingBoard>,
    listener: tokio::net::TcpListener,
}

impl Service {
    /// Refuses settings that contradict themselves, binds `HTTP_ADDR` and
    /// creates the (lazy) database and inventory clients. Fails only on bad
    /// settings, a bad address or URL, never because a dependency is down:
    /// those are waited for.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        settings.validate()?;
        store::check_batch_sizes(&settings)?;
        crate::broker::tls::check(settings.amqp_url.expose())?;
        let stores = store::connect_timers(
            &settings.database_url,
            store::PoolSettings::of(&settings),
            &settings.timers()?,
        )?;
        let inventory = InventoryClient::connect_lazy_with(
            &settings.inventory_url,
            settings.inventory_timeout,
            settings.liveness.inventory_keepalive,
        )?;
        let listener = tokio::net::TcpListener::bind(settings.http_addr)
            .await
            .map_err(|e| {
                anyhow::anyhow!("cannot listen on HTTP_ADDR {}: {e}", settings.http_addr)
            })?;
        let metrics = Arc::new(Metrics::for_timers(
            stores.names().iter().map(|n| n.as_str()),
        ));
        // With `release = "none"` for every timer nothing calls the
        // inventory, so readiness does not ask for it either.
        let inventory_url = stores
            .iter()
            .any(|s| s.timer().release == Release::Grpc)
            .then_some(&settings.inventory_url);
        let health = Arc::new(Health::new(
            stores.default_timer().clone(),
            inventory_url,
            metrics.clone(),
        ));
        Ok(Self {
            settings,
            instance: instance_name().into(),
            stores,
            inventory,
            metrics,
            health,
            board: Arc::default(),
            listener,
        })
    }

    /// Where `/metrics`, `/healthz`, `/readyz` and the console are served.
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
            instance,
            stores,
            inventory,
            metrics,
            health,
            board,
            listener,
        } = self;
        log_start(&settings, &listener, health.uses_inventory());
        let http_task = serve_http(
            &settings, listener, &health, &metrics, &board, &stores, &shutdown,
        );
        if !prepare_stores(&stores, &shutdown).await? {
            return Ok(());
        }
        let replica = tokio::spawn(record_replica(
            stores.default_timer().clone(),
            instance.clone(),
            shutdown.clone(),
        ));

        let mut backoff = reconnect_backoff();
        let dialer = crate::broker::Dialer::of(&settings.liveness);
        loop {
            let started = std::time::Instant::now();
            let result = session::run(
                &settings, &instance, &stores, &inventory, &shutdown, &metrics, &health, &board,
                &dialer,
            )
            .await;
            health.set_broker(false);
            if shutdown.is_triggered() {
                if let Err(e) = result {
                    tracing::warn!(error = %format!("{e:#}"), "session ended with an error during shutdown");
                }
                let _ = http_task.await;
                let _ = replica.await;
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

/// Checks the shop's schema against every timer's mapping before anything
/// is consumed: a configuration error stops the service (naming the config
/// key); a database that does not answer yet is waited for. `false` when
/// `shutdown` fired meanwhile.
async fn prepare_stores(stores: &Stores, shutdown: &Shutdown) -> anyhow::Result<bool> {
    for store in stores.iter() {
        if !prepare_store(store, shutdown).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// [`prepare_stores`] for one timer.
async fn prepare_store(store: &store::Store, shutdown: &Shutdown) -> anyhow::Result<bool> {
    loop {
        match store.prepare().await {
            Ok(report) => {
                tracing::info!(
                    timer = %report.timer,
                    table = %report.table,
                    id = ?report.id_kind,
                    deadline = %report.deadline,
                    unpaid = report.waiting.0,
                    overdue = report.waiting.1,
                    release = ?report.release,
                    zone = %report.zone,
                    "shop schema checked"
                );
                if report.zone.differs_from_utc_default() {
                    tracing::warn!(
                        timer = %report.timer,
                        zone = %report.zone.zone,
                        "time_zone is not set: the deadlines (zone-less) are read in the database's default zone for new sessions, where its NOW() runs, not in UTC as before 0.3.0; set time_zone = \"UTC\" to keep the old reading"
                    );
                }
                if let Some(warning) = &report.zone_warning {
                    tracing::warn!(timer = %report.timer, "{warning}");
                }
                if !report.unvacuumed.is_empty() {
                    tracing::warn!(
                        timer = %report.timer,
                        tables = %report.unvacuumed.join(", "),
                        "PostgreSQL's autovacuum is off for these tables: every cancellation leaves a dead row version in them, and unvacuumed they slow the cancel statement down over hours; turn autovacuum on or schedule VACUUM (ANALYZE) of them"
                    );
                }
                return Ok(true);
            }
            Err(e) if e.is_config() => return Err(e.into()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot check the shop's schema yet; retrying in 2 s");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    _ = shutdown.wait() => return Ok(false),
                }
            }
        }
    }
}

/// The start-up line: the release and where it connects.
fn log_start(settings: &Settings, listener: &tokio::net::TcpListener, uses_inventory: bool) {
    let inventory = if uses_inventory {
        settings.inventory_url.to_string()
    } else {
        "none (release = \"none\" for every timer)".to_owned()
    };
    tracing::info!(
        version = crate::observe::metrics::VERSION,
        amqp = %settings.amqp_url,
        database = %settings.database_url,
        inventory = %inventory,
        http = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        queue_type = ?settings.queue_type,
        cascade_shards = settings.cascade_shards.get(),
        "starting order-timeout"
    );
}

/// How often a replica records itself in `order_timeout_replicas`.
const RECORD_REPLICA_EVERY: Duration = Duration::from_secs(10);

/// Records this replica as serving, now and every
/// [`RECORD_REPLICA_EVERY`], until `shutdown` fires; then forgets it.
/// `migrate --contract` compares these records with the due queue's
/// consumers: one more consumer than replicas recorded is a replica of an
/// earlier release, which does not record itself.
async fn record_replica(store: store::Store, instance: Arc<str>, shutdown: Shutdown) {
    let version = crate::observe::metrics::VERSION;
    loop {
        if let Err(e) = store.record_replica(&instance, version).await {
            tracing::debug!(error = %e, "cannot record this replica; trying again");
        }
        tokio::select! {
            _ = tokio::time::sleep(RECORD_REPLICA_EVERY) => {}
            _ = shutdown.wait() => break,
        }
    }
    if let Err(e) = store.forget_replica(&instance).await {
        tracing::debug!(error = %e, "cannot forget this replica's record; it ages out");
    }
}

/// A name for this instance among the replicas: host, process id and the
/// start time's nanoseconds (several instances in one process, as in the
/// tests, differ by it).
fn instance_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "order-timeout".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nth = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("{host}:{}:{nanos:09}:{nth}", std::process::id());
    // The holder column is VARCHAR(64) in MySQL.
    name.chars()
        .rev()
        .take(64)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect()
}

/// Builds and runs a service (what `serve` does).
pub async fn run(settings: Settings, shutdown: Shutdown) -> anyhow::Result<()> {
    Service::build(settings).await?.run(shutdown).await
}

/// Between broker sessions: 200 ms, growing to at most 500 ms (plus as much
/// jitter), so that a broker that is back is consumed from within about a
/// second. Each attempt is one TCP connect per configured node; the old
/// 30 s ceiling left a restarted broker unused for up to 15 s (issue 12's
/// crash run).
fn reconnect_backoff() -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_millis(500))
        .with_jitter()
        .without_max_times()
        .build()
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

/// Starts what the HTTP port serves (`/metrics`, `/healthz`, `/readyz`,
/// the console, with its record of recent minutes) and the readiness
/// refresher; the server's task, which ends with `shutdown`.
fn serve_http(
    settings: &Settings,
    listener: tokio::net::TcpListener,
    health: &Arc<Health>,
    metrics: &Arc<Metrics>,
    board: &Arc<PendingBoard>,
    stores: &Stores,
    shutdown: &Shutdown,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let recent = Arc::new(Recent::default());
    tokio::spawn(recent.clone().record(metrics.clone(), shutdown.clone()));
    let console = Arc::new(
        Console::new(
            settings,
            health.clone(),
            metrics.clone(),
            recent,
            board.clone(),
        )
        .with_stores(stores.clone()),
    );
    tokio::spawn(console.clone().learn_logouts(shutdown.clone()));
    let console = console::router(console);
    let http_task = crate::observe::server::apart(http::serve(
        listener,
        health.clone(),
        console,
        crate::observe::server::Limits::of(&settings.http),
        shutdown.clone(),
    ));
    tokio::spawn(http::refresh_readiness(health.clone(), shutdown.clone()));
    http_task
}
