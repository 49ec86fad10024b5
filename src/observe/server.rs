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
//!
//! **Cancellations first.** The HTTP side runs [`apart`]: on threads of
//! its own, at a lower scheduling priority than the service's (nice
//! [`HTTP_NICE`]), so a flood of clients takes only CPU that cancelling
//! leaves over. The console's requests that pass its host and rate checks
//! do their work (database, broker) on the service's runtime
//! (`ops::console::admit`), so no connection of the service's pools is
//! ever driven by these threads.

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

/// The HTTP side's nice value: under a CPU shortage, its threads get about
/// a tenth of the share of the service's (Linux's CFS weights nice 10 at
/// 110 against nice 0's 1,024). Raising it needs no privilege.
pub(crate) const HTTP_NICE: i32 = 10;

/// Worker threads of the HTTP side's runtime (its accept loop has its own).
const HTTP_THREADS: usize = 2;

/// Runs `work` (the HTTP server) on a runtime of its own, on threads at
/// [`HTTP_NICE`], until it ends; its result comes back through the
/// returned handle, awaited on the caller's runtime.
pub(crate) fn apart<F>(work: F) -> tokio::task::JoinHandle<std::io::Result<()>>
where
    F: Future<Output = std::io::Result<()>> + Send + 'static,
{
    let (done, result) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("ot-http".into())
        .spawn(move || {
            lower_priority();
            let outcome = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(HTTP_THREADS)
                .thread_name("ot-http")
                .on_thread_start(lower_priority)
                .enable_all()
                .build()
                .and_then(|runtime| runtime.block_on(work));
            let _ = done.send(outcome);
        });
    tokio::spawn(async move {
        spawned?;
        result
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the HTTP side's thread ended")))
    })
}

/// Lowers the calling thread's priority to [`HTTP_NICE`] (Linux keeps a
/// nice value per thread). A refusal is logged; the thread then runs at
/// the service's priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain system calls on the calling thread's own id.
        let refused = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, HTTP_NICE) != 0
        };
        if refused {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "cannot lower the HTTP side's priority: it competes with cancelling for CPU"
            );
        }
    }
}

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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The calling thread's nice value.
    fn nice() -> i32 {
        // SAFETY: plain system calls on the calling thread's own id.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::getpriority(libc::PRIO_PROCESS, tid)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_http_side_runs_below_the_services_priority() {
        let caller = nice();
        let (seen, spawned) = apart(async {
            // The accept loop's thread, and a task on the runtime's workers.
            let own = nice();
            let worker = tokio::spawn(async { nice() }).await.unwrap();
            assert_eq!((own, worker), (HTTP_NICE, HTTP_NICE));
            Ok(())
        })
        .await
        .map(|r| (r, nice()))
        .unwrap();
        seen.unwrap();
        assert_eq!(spawned, caller, "the service's own threads keep theirs");
    }
}
