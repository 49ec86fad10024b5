//! The operations endpoints on `HTTP_ADDR`: `/metrics` (Prometheus text
//! format), `/healthz` (the process is alive) and `/readyz` (broker,
//! database and inventory are reachable; 503 otherwise, with which one is
//! not), beside whatever other routes the caller merges in (the console,
//! `ops::console`, which `app` wires up).
//!
//! Readiness is probed at most once per [`READYZ_FRESH`] whatever the
//! number of probes and page views: anonymous traffic never takes the
//! database pool from cancelling. The connections are accepted and bounded
//! by [`super::server`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;

use super::fresh::Fresh;
use super::metrics::Metrics;
use crate::settings::SecretUrl;
use crate::shutdown::Shutdown;
use crate::store::Store;

/// How long one readiness probe may take per dependency.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long `/readyz` answers with the last evaluation rather than probing
/// again: a second, so a probe still sees a dependency lost a second ago,
/// and a thousand probes a second cost one database ping.
pub(crate) const READYZ_FRESH: Duration = Duration::from_secs(1);

/// What `/readyz` checks, shared with the broker session (which says
/// whether it is consuming).
#[derive(Debug)]
pub struct Health {
    broker: AtomicBool,
    store: Store,
    inventory: InventoryProbe,
    metrics: Arc<Metrics>,
    /// The last evaluation and when it was made; the lock also makes
    /// concurrent callers of [`Health::check_cached`] wait for one probe
    /// instead of each probing.
    last: tokio::sync::Mutex<Option<(std::time::Instant, Readiness)>>,
    /// The service's runtime, where `/readyz` probes: a database
    /// connection the probe opens is then driven by the service's threads,
    /// never by the HTTP side's lower-priority ones (`server::apart`).
    runtime: tokio::runtime::Handle,
    /// `/metrics` as last rendered: one rendering per [`METRICS_FRESH`]
    /// however many clients ask (a scraper every 15 s never notices; a
    /// flood of anonymous requests costs one a second).
    rendered: Fresh,
}

/// How long a rendering of `/metrics` is served again.
const METRICS_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// How readiness checks the inventory.
#[derive(Debug)]
enum InventoryProbe {
    /// `release = "none"`: nothing calls it, nothing checks it.
    NotUsed,
    /// `INVENTORY_URL` has no host or port: never ready.
    Unparseable,
    /// A TCP connect to this host and port.
    At(String, u16),
}

/// One readiness evaluation.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Readiness {
    /// All of the below.
    pub ready: bool,
    /// A broker session is consuming.
    pub broker: bool,
    /// `SELECT 1` answers.
    pub database: bool,
    /// The inventory endpoint accepts TCP connections.
    pub inventory: bool,
    /// No timer's statements fail for a reason of the environment (a
    /// privilege revoked, a table or column missing): the database answers
    /// `SELECT 1` then, but no order of such a timer can be cancelled
    /// (`order_timeout_timer_failing` names the timer).
    pub statements: bool,
}

impl Health {
    /// Readiness for a service using `store` and the inventory at
    /// `inventory_url` (`None`: the service calls no inventory). Made on
    /// the service's runtime, where its probes will run.
    pub fn new(store: Store, inventory_url: Option<&SecretUrl>, metrics: Arc<Metrics>) -> Self {
        let inventory = match inventory_url {
            None => InventoryProbe::NotUsed,
            Some(url) => url::Url::parse(url.expose())
                .ok()
                .and_then(|u| {
                    let host = u.host_str()?.trim_matches(['[', ']']).to_owned();
                    Some(InventoryProbe::At(host, u.port_or_known_default()?))
                })
                .unwrap_or(InventoryProbe::Unparseable),
        };
        Self {
            broker: AtomicBool::new(false),
            store,
            inventory,
            metrics,
            last: tokio::sync::Mutex::new(None),
            runtime: tokio::runtime::Handle::current(),
            rendered: Fresh::new(METRICS_FRESH),
        }
    }

    /// Whether the service calls an inventory at all (`release = "grpc"`
    /// for some timer): with `release = "none"` readiness does not check
    /// one, and the console says "not used" rather than "up".
    pub fn uses_inventory(&self) -> bool {
        !matches!(self.inventory, InventoryProbe::NotUsed)
    }

    /// Records whether a broker session is consuming.
    pub fn set_broker(&self, up: bool) {
        self.broker.store(up, Ordering::Relaxed);
    }

    /// The last evaluation if it is younger than `fresh`, else a new one
    /// ([`Health::check`]); concurrent callers share one probe.
    pub async fn check_cached(&self, fresh: Duration) -> Readiness {
        let mut last = self.last.lock().await;
        if let Some((at, readiness)) = *last
            && at.elapsed() < fresh
        {
            return readiness;
        }
        let readiness = self.probe().await;
        *last = Some((std::time::Instant::now(), readiness));
        readiness
    }

    /// Probes the dependencies now, updates the `ready` gauge and keeps the
    /// answer for [`Health::check_cached`].
    pub async fn check(&self) -> Readiness {
        let mut last = self.last.lock().await;
        let readiness = self.probe().await;
        *last = Some((std::time::Instant::now(), readiness));
        readiness
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn probe(&self) -> Readiness {
        self.metrics.readiness_probed();
        let database = async {
            matches!(
                tokio::time::timeout(PROBE_TIMEOUT, self.store.ping()).await,
                Ok(Ok(()))
            )
        };
        let inventory = async {
            let (host, port) = match &self.inventory {
                InventoryProbe::NotUsed => return true,
                InventoryProbe::Unparseable => return false,
                InventoryProbe::At(host, port) => (host, port),
            };
            matches!(
                tokio::time::timeout(
                    PROBE_TIMEOUT,
                    tokio::net::TcpStream::connect((host.as_str(), *port))
                )
                .await,
                Ok(Ok(_))
            )
        };
        let (database, inventory) = tokio::join!(database, inventory);
        let broker = self.broker.load(Ordering::Relaxed);
        let statements = self.metrics.failing_timers().is_empty();
        let ready = broker && database && inventory && statements;
        self.metrics.set_ready(ready);
        Readiness {
            ready,
            broker,
            database,
            inventory,
            statements,
        }
    }
}

async fn metrics(State(health): State<Arc<Health>>) -> impl IntoResponse {
    let text = health
        .rendered
        .get_or(async || health.metrics.render())
        .await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text.to_string(),
    )
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(health): State<Arc<Health>>) -> Response {
    let probing = health.clone();
    let probe = async move { probing.check_cached(READYZ_FRESH).await };
    let Ok(r) = health.runtime.spawn(probe).await else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the readiness probe failed\n",
        )
            .into_response();
    };
    let status = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(r)).into_response()
}

/// `/metrics`, `/healthz` and `/readyz`: what a probe or a scraper asks
/// for, served before anything else when connections run short.
pub(crate) fn health_routes(health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(health)
}

/// Serves the endpoints, and the routes of `more`, on `listener` until
/// `shutdown` fires, within `limits`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
    more: Router,
    limits: super::server::Limits,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    let metrics = health.metrics.clone();
    let probes = health_routes(health);
    let all = probes.clone().merge(more);
    let reserve = probes.fallback(|| async {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "busy: too many connections; only /healthz, /readyz and /metrics answer now\n",
        )
    });
    super::server::serve(listener, all, reserve, limits, metrics, shutdown).await
}

/// Re-evaluates readiness every few seconds so the `ready` gauge (and the
/// not-ready alert) stays true even when nobody polls `/readyz`.
///
/// A lost readiness is logged at once; at start-up, only if it lasts past
/// the first check (the broker session is normally up within a second, and
/// a warning on every healthy start would teach operators to ignore it).
pub(crate) async fn refresh_readiness(health: Arc<Health>, shutdown: Shutdown) {
    let mut starting = true;
    loop {
        let r = health.check().await;
        let first_check = std::mem::replace(&mut starting, false);
        if !r.ready {
            let (broker, database, inventory, statements) =
                (r.broker, r.database, r.inventory, r.statements);
            if first_check {
                tracing::debug!(
                    broker,
                    database,
                    inventory,
                    statements,
                    "not ready yet (starting)"
                );
            } else {
                let failing = health.metrics.failing_timers().join(", ");
                tracing::warn!(broker, database, inventory, statements, failing_timers = %failing, "not ready");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = shutdown.wait() => return,
        }
    }
}
