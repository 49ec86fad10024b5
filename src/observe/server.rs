//! The HTTP side's accept loop: hyper's HTTP/1 connection with a
//! header-read timeout (a half-sent request or an idle keep-alive
//! connection is closed after [`Limits::header_read_timeout`]) and a cap on
//! open connections, so that no number of slow or idle clients can use up
//! the process's file descriptors.
//!
//! Past the cap, [`HEALTH_RESERVE`] more connections are taken, each for
//! one request to the health routes only (`/healthz`, `/readyz`,
//! `/metrics`), with a shorter header timeout: a flood of console clients
//! never fails a liveness probe. Past those, a connection is closed as soon
//! as it is accepted.
//!
//! Each request carries its client's address as axum's
//! [`ConnectInfo`](axum::extract::ConnectInfo), for the console's login
//! limits and logs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt as _;

use super::metrics::Metrics;
use crate::shutdown::Shutdown;

/// Connections taken past [`Limits::max_connections`] for the health
/// routes only.
pub(crate) const HEALTH_RESERVE: usize = 32;

/// Header-read timeout of a reserve connection: a probe sends its request
/// at once.
const RESERVE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a graceful shutdown waits for the requests in flight.
const DRAIN: Duration = Duration::from_secs(5);

/// What one listener accepts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// A connection sends a request's headers within this, and an idle
    /// keep-alive connection is closed after it.
    pub(crate) header_read_timeout: Duration,
    /// Connections served at once (beside the [`HEALTH_RESERVE`]).
    pub(crate) max_connections: usize,
}

impl Limits {
    /// The limits of `[http]`.
    pub(crate) fn of(http: &crate::settings::HttpSettings) -> Self {
        Self {
            header_read_timeout: http.header_read_timeout,
            max_connections: http.max_connections.max(1),
        }
    }
}

/// What a connection may ask for.
struct Slot {
    app: Router,
    header_read_timeout: Duration,
    keep_alive: bool,
    _permit: OwnedSemaphorePermit,
}

/// Serves `all` on `listener`, and `reserve` (the health routes) on the
/// connections past [`Limits::max_connections`], until `shutdown` fires;
/// then lets the requests in flight finish (at most [`DRAIN`]).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    all: Router,
    reserve: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    let general = Arc::new(Semaphore::new(limits.max_connections));
    let spare = Arc::new(Semaphore::new(HEALTH_RESERVE));
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: the cap keeps
                    // this rare; wait a moment rather than spin.
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.wait() => break,
        };
        let slot = if let Ok(permit) = general.clone().try_acquire_owned() {
            Slot {
                app: all.clone(),
                header_read_timeout: limits.header_read_timeout,
                keep_alive: true,
                _permit: permit,
            }
        } else if let Ok(permit) = spare.clone().try_acquire_owned() {
            Slot {
                app: reserve.clone(),
                header_read_timeout: RESERVE_HEADER_TIMEOUT.min(limits.header_read_timeout),
                keep_alive: false,
                _permit: permit,
            }
        } else {
            metrics.http_refused("connections");
            drop(stream);
            continue;
        };
        connections.spawn(connection(stream, peer, slot, shutdown.clone()));
    }
    connections.close();
    let _ = tokio::time::timeout(DRAIN, connections.wait()).await;
    Ok(())
}

/// One connection, until the client closes it, a timeout does, or
/// `shutdown` fires (then after its request in flight).
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    slot: Slot,
    shutdown: Shutdown,
) {
    let app = slot.app.clone();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        app.clone().oneshot(request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(slot.header_read_timeout)
        .keep_alive(slot.keep_alive);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let ended = tokio::select! {
        ended = conn.as_mut() => ended,
        () = shutdown.wait() => {
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(DRAIN, conn.as_mut()).await.unwrap_or(Ok(()))
        }
    };
    if let Err(e) = ended {
        tracing::debug!(%peer, error = %e, "HTTP connection ended");
    }
}
