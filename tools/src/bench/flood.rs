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

use chrono::{DateTime, Utc};
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
                Some(clients_runtime().spawn(client(port, i, counts.clone())))
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

impl FloodReport {
    /// This report and `other` (a later window of the same flood) as one.
    fn and(mut self, other: FloodReport) -> Self {
        for (status, n) in other.by_status {
            *self.by_status.entry(status).or_default() += n;
        }
        self.clients = self.clients.max(other.clients);
        self.seconds += other.seconds;
        let total: u64 = self.by_status.values().sum();
        self.per_second = total as f64 / self.seconds.max(f64::EPSILON);
        self
    }
}

/// When the flood was on: `(from, to)`, in the order they came.
pub type Windows = Vec<(DateTime<Utc>, DateTime<Utc>)>;

/// A flood switched on and off in turns of one window each, quiet first
/// (`bench --flood N --flood-every W`): orders due in quiet and in flooded
/// windows share one run, one machine and one load, so the difference of
/// their lateness is the flood's, whatever else the machine does.
pub struct Alternating {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(FloodReport, Windows)>,
}

impl Alternating {
    /// Starts the turns: `every` quiet, `every` with `clients` clients on
    /// the services at `ports`, and so on until stopped.
    pub fn start(ports: &[u16], clients: usize, every: Duration) -> Self {
        let ports = ports.to_vec();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut report = FloodReport {
                clients,
                ..FloodReport::default()
            };
            let mut windows = Windows::new();
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    () = tokio::time::sleep(every) => {}
                }
                let on = Utc::now();
                let flood = Flood::start(&ports, clients);
                let ended = tokio::select! {
                    _ = &mut stopped => true,
                    () = tokio::time::sleep(every) => false,
                };
                report = report.and(flood.stop().await);
                windows.push((on, Utc::now()));
                if ended {
                    break;
                }
            }
            (report, windows)
        });
        Self { stop, task }
    }

    /// Stops the turns (a flood on is stopped); what the clients got and
    /// when the flood was on.
    pub async fn stop(self) -> (FloodReport, Windows) {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}

/// Where the flood's clients run: two threads at nice 19. An attacker's
/// clients are on machines of their own; here they share the service's two
/// cores, and at the bench's normal priority they took half a core from
/// the very thing measured (2,500 connections a second). At nice 19 they
/// get what the services leave over, so the lateness says what answering
/// the flood costs the service, not what making it costs this machine.
fn clients_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bench-flood")
            .on_thread_start(|| {
                // SAFETY: plain system calls on the calling thread's own id.
                unsafe {
                    let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                    libc::setpriority(libc::PRIO_PROCESS, tid, 19);
                }
            })
            .enable_all()
            .build()
            .expect("the flood clients' runtime")
    })
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
