//! `bench --flood N`: N clients hammer every endpoint of the services'
//! HTTP side while the product's phase runs (issue 46), so the phase's
//! lateness says what anonymous HTTP traffic costs cancelling. Each client
//! loops over the endpoints in turn, one request per connection, as fast
//! as the service answers: the overview, pending, parked and set-aside
//! pages, the login page and a wrong login, `/metrics`, `/healthz`,
//! `/readyz`, and a request naming a host the console does not serve.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What every client asks for, in turn: `(method, path, host is foreign)`.
const REQUESTS: &[(&str, &str, bool)] = &[
    ("GET", "/console", false),
    ("GET", "/console/pending", false),
    ("GET", "/console/parked", false),
    ("GET", "/console/set-aside", false),
    ("GET", "/console/login", false),
    ("POST", "/console/login", false),
    ("GET", "/metrics", false),
    ("GET", "/healthz", false),
    ("GET", "/readyz", false),
    ("GET", "/console", true),
];

/// Longest wait for one answer: a client that waits longer counts a
/// timeout and goes on.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// What the flood did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FloodReport {
    /// Clients.
    pub clients: usize,
    /// Seconds it ran.
    pub seconds: f64,
    /// Requests answered, per status (`0`: no answer: refused, reset or
    /// timed out).
    pub by_status: BTreeMap<u16, u64>,
    /// Requests per second, all statuses.
    pub per_second: f64,
}

/// A running flood.
pub struct Flood {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    counts: Arc<Counts>,
    started: Instant,
    clients: usize,
}

/// Answers by status (0 to 599).
struct Counts(Vec<AtomicU64>);

impl Flood {
    /// Starts `clients` clients against the services listening on
    /// `ports` (127.0.0.1), spread evenly.
    pub fn start(ports: &[u16], clients: usize) -> Self {
        let counts = Arc::new(Counts((0..600).map(|_| AtomicU64::new(0)).collect()));
        let tasks = (0..clients)
            .filter_map(|i| {
                let port = *ports.get(i % ports.len().max(1))?;
                Some(tokio::spawn(client(port, i, counts.clone())))
            })
            .collect();
        Self {
            tasks,
            counts,
            started: Instant::now(),
            clients,
        }
    }

    /// Stops every client; what they got.
    pub async fn stop(self) -> FloodReport {
        // Clients keep nothing: a request cut short is simply not counted.
        for task in &self.tasks {
            task.abort();
        }
        for task in self.tasks {
            let _ = task.await;
        }
        let seconds = self.started.elapsed().as_secs_f64();
        let by_status: BTreeMap<u16, u64> = self
            .counts
            .0
            .iter()
            .enumerate()
            .filter_map(|(status, n)| {
                let n = n.load(Ordering::Relaxed);
                (n > 0).then_some((status as u16, n))
            })
            .collect();
        let total: u64 = by_status.values().sum();
        FloodReport {
            clients: self.clients,
            seconds,
            per_second: total as f64 / seconds.max(f64::EPSILON),
            by_status,
        }
    }
}

/// One client: the requests in turn, starting at its own offset, until
/// it is aborted.
async fn client(port: u16, offset: usize, counts: Arc<Counts>) {
    for (method, path, foreign) in REQUESTS.iter().cycle().skip(offset % REQUESTS.len()) {
        let status = tokio::time::timeout(ANSWER_WITHIN, request(port, method, path, *foreign))
            .await
            .unwrap_or(0);
        counts.0[usize::from(status).min(599)].fetch_add(1, Ordering::Relaxed);
        if status == 0 {
            // Refused or reset: the service is shedding; do not spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// One request on a connection of its own; the status (0: none).
async fn request(port: u16, method: &str, path: &str, foreign: bool) -> u16 {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)).await else {
        return 0;
    };
    let host = if foreign {
        format!("rebind.example:{port}")
    } else {
        format!("127.0.0.1:{port}")
    };
    let body = if method == "POST" {
        "token=not-the-admin-token-0123456789"
    } else {
        ""
    };
    let text = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(text.as_bytes()).await.is_err() {
        return 0;
    }
    let mut raw = Vec::new();
    if stream.read_to_end(&mut raw).await.is_err() && raw.is_empty() {
        return 0;
    }
    std::str::from_utf8(&raw[..raw.len().min(16)])
        .ok()
        .and_then(|head| head.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}
