//! CPU and memory of the processes taking part, read from `/proc`: the
//! load generator (this process), the service, inventory and seed-consumer
//! children, the broker (the `beam.smp` listening on the AMQP port, so a
//! private test node beside it is not counted), PostgreSQL (the server's
//! own processes and the backends of the bench's database, not those of
//! other databases on a shared server) and MariaDB (`mariadbd`). What
//! cannot be read (no `/proc`, another user's process) is reported as
//! missing, never guessed.
//!
//! Beside CPU time, each group's context switches (every thread's,
//! voluntary or not): at the rates the bench runs, most of a process's CPU
//! goes to waking up, so switches per order explain CPU per order. And
//! PostgreSQL's time split by whose statements it ran
//! ([`Who::PostgresClients`]), so that the service's share of the database
//! is not hidden in the server's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Which processes a [`Group`] covers.
#[derive(Clone, Debug)]
pub enum Who {
    /// These process ids.
    Pids(Vec<u32>),
    /// Every process whose `comm` is this name (looked up at each sample).
    Comm(&'static str),
    /// PostgreSQL's processes that work for these databases, looked up at
    /// each sample (backends come and go): the server's own (postmaster,
    /// checkpointer, WAL writer…) and the client backends connected to one
    /// of them. Backends of other databases are left out.
    Postgres(Vec<String>),
    /// The client backends of these databases whose client is one of these
    /// processes (matched by the backend's client port, from its process
    /// title, and the TCP sockets the clients hold): the server's work on
    /// their statements.
    PostgresClients {
        /// The databases, as in [`Who::Postgres`].
        databases: Vec<String>,
        /// The client processes.
        clients: Vec<u32>,
    },
}

/// A named set of processes to watch.
#[derive(Clone, Debug)]
pub struct Group {
    /// Label in the report (`service`, `broker`, …).
    pub name: String,
    /// The processes.
    pub who: Who,
}

/// What one process has spent so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Spent {
    /// utime + stime, clock ticks.
    ticks: u64,
    /// Context switches of all its threads, voluntary and not (those of
    /// threads that have ended are gone from `/proc`).
    switches: u64,
}

impl Spent {
    /// What was spent from `earlier` to `self` (0 where a count fell, as a
    /// thread's does when it ends).
    fn since(self, earlier: Spent) -> Spent {
        Spent {
            ticks: self.ticks.saturating_sub(earlier.ticks),
            switches: self.switches.saturating_sub(earlier.switches),
        }
    }
}

/// One reading of one group.
#[derive(Clone, Debug, Default)]
struct Reading {
    /// What each process has spent.
    ticks: BTreeMap<u32, Spent>,
    /// Resident memory (PSS where readable, which does not count shared
    /// pages several times; else RSS), bytes, summed; carried over from
    /// the group's last reading when this one did not read memory (see
    /// [`MEM_EVERY`]).
    mem_bytes: u64,
    /// Processes read.
    procs: usize,
}

/// CPU and memory of one group over a phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Usage {
    /// Average CPU over the phase, in cores (1.0 = one core busy).
    pub cpu_cores: Option<f64>,
    /// CPU time over the phase, seconds (user + system).
    pub cpu_seconds: Option<f64>,
    /// Peak memory seen (PSS, or RSS where PSS is unreadable), MiB.
    pub mem_peak_mib: Option<f64>,
    /// Memory at the last sample, MiB.
    pub mem_last_mib: Option<f64>,
    /// Processes counted at the last sample (0: none found or unreadable).
    pub processes: usize,
    /// Context switches over the phase (every thread's, voluntary and
    /// not): how often its processes went to sleep and were woken, or were
    /// preempted.
    pub switches: Option<u64>,
}

/// One memory sample of one group, for memory-over-time.
#[derive(Clone, Debug, Serialize)]
pub struct MemSample {
    /// Seconds since the sampler started.
    pub t_s: f64,
    /// Memory, MiB.
    pub mib: f64,
}

fn clock_ticks_per_sec() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

/// Process ids whose `/proc/PID/comm` is `name`.
pub fn pids_named(name: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim() == name)
                .unwrap_or(false)
        })
        .collect()
}

fn read_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are
    // fields 14 and 15 of the whole line.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Context switches of every thread of `pid` so far (`/proc/PID/task/*/
/// status`, voluntary and not).
fn read_switches(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut sum = 0;
    for task in tasks.filter_map(|e| e.ok()) {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        sum += number_field(&status, "voluntary_ctxt_switches:").unwrap_or(0)
            + number_field(&status, "nonvoluntary_ctxt_switches:").unwrap_or(0);
    }
    Some(sum)
}

/// The number after `key` on its line of a `/proc` status-like text.
fn number_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn read_mem(pid: u32) -> Option<u64> {
    if let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        && let Some(pss) = number_field(&rollup, "Pss:")
    {
        return Some(pss * 1024);
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(number_field(&status, "VmRSS:")? * 1024)
}

/// A PostgreSQL client backend, read from its process title (`postgres:
/// 15/main: user db 127.0.0.1(45878) idle`, the cluster name optional).
#[derive(Debug, PartialEq)]
struct PgBackend<'a> {
    /// Its database.
    database: &'a str,
    /// The client's TCP port; `None` for a Unix-socket client (`[local]`).
    client_port: Option<u16>,
}

/// The backend a process title describes; `None` for the server's own
/// processes (`postgres: 15/main: checkpointer`, the postmaster).
fn pg_backend(title: &str) -> Option<PgBackend<'_>> {
    let rest = title.trim().strip_prefix("postgres: ")?;
    let mut words: Vec<&str> = rest.split_whitespace().collect();
    if words.first().is_some_and(|w| w.ends_with(':')) {
        words.remove(0);
    }
    let host = *words.get(2)?;
    let client_port = match host.strip_suffix(')').and_then(|h| h.rsplit_once('(')) {
        Some((_, port)) => Some(port.parse().ok()),
        None if host == "[local]" => Some(None),
        None => None,
    }?;
    Some(PgBackend {
        database: words[1],
        client_port,
    })
}

/// The process title of `pid` (its command line, NULs as spaces).
fn title_of(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&cmdline).replace('\0', " "))
}

/// Socket inodes `pid` holds open.
fn socket_inodes(pid: u32) -> Vec<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.filter_map(|e| e.ok())
        .filter_map(|e| {
            let l = std::fs::read_link(e.path()).ok()?;
            let l = l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?;
            l.parse::<u64>().ok()
        })
        .collect()
}

/// One line of `/proc/net/tcp` or `/proc/net/tcp6`.
struct TcpRow {
    local_port: u16,
    /// In the `LISTEN` state (`0A`).
    listening: bool,
    inode: u64,
}

/// The machine's TCP sockets (this network namespace's).
fn tcp_table() -> Vec<TcpRow> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if let (Some(local_port), Ok(inode)) = (port, inode.parse()) {
                out.push(TcpRow {
                    local_port,
                    listening: *state == "0A",
                    inode,
                });
            }
        }
    }
    out
}

/// Socket inodes listening on TCP `port` (IPv4 or IPv6).
fn listening_inodes(port: u16) -> Vec<u64> {
    tcp_table()
        .into_iter()
        .filter(|row| row.local_port == port && row.listening)
        .map(|row| row.inode)
        .collect()
}

/// The process named `name` that listens on TCP `port`, if readable.
pub fn pid_listening_on(port: u16, name: &str) -> Option<u32> {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return None;
    }
    let holds = |pid: &u32| socket_inodes(*pid).iter().any(|i| inodes.contains(i));
    pids_named(name).into_iter().find(holds)
}

/// PostgreSQL's processes at one sample: each one's database (`None` for
/// the server's own) and, for a client backend on TCP, the client process.
#[derive(Default)]
struct PgProcesses {
    procs: Vec<PgProcess>,
}

struct PgProcess {
    pid: u32,
    database: Option<String>,
    client: Option<u32>,
}

/// Which process holds the client end of each PostgreSQL backend's
/// connection, by (backend pid, client port). A backend lives as long as
/// its pool connection, and reading the TCP table costs milliseconds
/// (~8 ms here), so each backend is looked up once.
#[derive(Default)]
struct PgClients {
    known: std::collections::HashMap<(u32, u16), Option<u32>>,
}

impl PgClients {
    /// Looks up the backends not seen before among `candidates`' sockets.
    fn resolve(&mut self, backends: &[(u32, u16)], candidates: &[u32]) {
        let new: Vec<(u32, u16)> = backends
            .iter()
            .filter(|b| !self.known.contains_key(b))
            .copied()
            .collect();
        if new.is_empty() {
            return;
        }
        let holder: std::collections::HashMap<u64, u32> = candidates
            .iter()
            .flat_map(|pid| socket_inodes(*pid).into_iter().map(move |i| (i, *pid)))
            .collect();
        let by_port: std::collections::HashMap<u16, u32> = tcp_table()
            .into_iter()
            .filter_map(|row| Some((row.local_port, *holder.get(&row.inode)?)))
            .collect();
        for b in new {
            self.known.insert(b, by_port.get(&b.1).copied());
        }
    }

    /// The client process of backend `pid` on client port `port`.
    fn of(&self, pid: u32, port: u16) -> Option<u32> {
        self.known.get(&(pid, port)).copied().flatten()
    }
}

impl PgProcesses {
    /// PostgreSQL's processes now, with the clients of the backends of
    /// `groups`' [`Who::PostgresClients`] looked up.
    fn read(groups: &[Group], clients: &mut PgClients) -> Self {
        let candidates: Vec<u32> = groups
            .iter()
            .filter_map(|g| match &g.who {
                Who::PostgresClients { clients, .. } => Some(clients.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        // (pid, database, client port) of every process, the server's own
        // with neither.
        let read: Vec<(u32, Option<String>, Option<u16>)> = pids_named("postgres")
            .into_iter()
            .filter_map(|pid| {
                let title = title_of(pid)?;
                let backend = pg_backend(&title);
                let port = backend.as_ref().and_then(|b| b.client_port);
                Some((pid, backend.map(|b| b.database.to_owned()), port))
            })
            .collect();
        if !candidates.is_empty() {
            let backends: Vec<(u32, u16)> = read
                .iter()
                .filter_map(|(pid, _, port)| Some((*pid, (*port)?)))
                .collect();
            clients.resolve(&backends, &candidates);
        }
        let procs = read
            .into_iter()
            .map(|(pid, database, port)| PgProcess {
                pid,
                database,
                client: port.and_then(|port| clients.of(pid, port)),
            })
            .collect();
        Self { procs }
    }

    /// The server's own processes and the backends of `databases`.
    fn serving(&self, databases: &[String]) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|p| p.database.as_ref().is_none_or(|d| databases.contains(d)))
            .map(|p| p.pid)
            .collect()
    }

    /// The backends of `databases` whose client is one of `clients`.
    fn for_clients(&self, databases: &[String], clients: &[u32]) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|p| p.database.as_ref().is_some_and(|d| databases.contains(d)))
            .filter(|p| p.client.is_some_and(|c| clients.contains(&c)))
            .map(|p| p.pid)
            .collect()
    }
}

/// One reading of the processes of `who`: CPU and context switches
/// always, memory only when `with_mem` (see [`MEM_EVERY`]).
fn read(who: &Who, with_mem: bool, pg: &PgProcesses) -> Reading {
    let pids = match who {
        Who::Pids(p) => p.clone(),
        Who::Comm(name) => pids_named(name),
        Who::Postgres(databases) => pg.serving(databases),
        Who::PostgresClients { databases, clients } => pg.for_clients(databases, clients),
    };
    let mut r = Reading::default();
    for pid in pids {
        let Some(ticks) = read_ticks(pid) else {
            continue;
        };
        if with_mem {
            let Some(m) = read_mem(pid) else { continue };
            r.mem_bytes += m;
        }
        let switches = read_switches(pid).unwrap_or(0);
        r.ticks.insert(pid, Spent { ticks, switches });
        r.procs += 1;
    }
    r
}

/// Memory is read at every this many-th sample (CPU at every one), and at
/// the first of a phase. PSS comes from `/proc/PID/smaps_rollup`, which
/// walks the process's page tables: read every second, the broker's and
/// PostgreSQL's made up ~40 % of the bench's own CPU in a 1,000 orders/s
/// cancel phase (`perf`), counted as the load generator's work. Memory
/// moves slowly; a reading every 5 s keeps its peak and curve.
pub const MEM_EVERY: u64 = 5;

/// Samples groups over time. Call [`Sampler::sample`] periodically (about
/// once a second); [`Sampler::usage`] summarises.
pub struct Sampler {
    groups: Vec<Group>,
    /// Samples taken, to read memory at every [`MEM_EVERY`]-th.
    samples: u64,
    tck: u64,
    started: Instant,
    first: Vec<Option<(Instant, Reading)>>,
    last: Vec<Option<(Instant, Reading)>>,
    peak: Vec<u64>,
    /// CPU of a process is counted from the first reading it appears in
    /// (from 0 if it started during the phase) to its last; a process that
    /// exits before the end of the phase is left out. PostgreSQL backends
    /// live as long as their pool connection, so this is small.
    series: Vec<Vec<MemSample>>,
    seen: Vec<BTreeMap<u32, (Spent, Spent)>>,
    /// The client process of each PostgreSQL backend seen.
    pg_clients: PgClients,
}

impl Sampler {
    /// A sampler for `groups`, taking its first reading now.
    pub fn new(groups: Vec<Group>) -> Self {
        let n = groups.len();
        let mut s = Self {
            groups,
            samples: 0,
            tck: clock_ticks_per_sec(),
            started: Instant::now(),
            first: vec![None; n],
            last: vec![None; n],
            peak: vec![0; n],
            series: vec![Vec::new(); n],
            seen: vec![BTreeMap::new(); n],
            pg_clients: PgClients::default(),
        };
        s.sample();
        s
    }

    /// Takes one reading of every group (memory only every
    /// [`MEM_EVERY`]-th time, or where the phase has none yet).
    pub fn sample(&mut self) {
        let now = Instant::now();
        let mem_due = self.samples.is_multiple_of(MEM_EVERY);
        self.samples += 1;
        let pg = if self
            .groups
            .iter()
            .any(|g| matches!(g.who, Who::Postgres(_) | Who::PostgresClients { .. }))
        {
            PgProcesses::read(&self.groups, &mut self.pg_clients)
        } else {
            PgProcesses::default()
        };
        for (i, g) in self.groups.iter().enumerate() {
            let first_reading = self.first[i].is_none();
            let with_mem = mem_due || first_reading;
            let mut r = read(&g.who, with_mem, &pg);
            if r.procs == 0 {
                continue;
            }
            if !with_mem {
                r.mem_bytes = self.last[i].as_ref().map_or(0, |(_, l)| l.mem_bytes);
            }
            for (pid, t) in &r.ticks {
                let base = if first_reading { *t } else { Spent::default() };
                self.seen[i]
                    .entry(*pid)
                    .and_modify(|e| e.1 = *t)
                    .or_insert((base, *t));
            }
            if first_reading {
                self.first[i] = Some((now, r.clone()));
            }
            if with_mem {
                self.peak[i] = self.peak[i].max(r.mem_bytes);
                self.series[i].push(MemSample {
                    t_s: (now - self.started).as_secs_f64(),
                    mib: r.mem_bytes as f64 / 1048576.0,
                });
            }
            self.last[i] = Some((now, r));
        }
    }

    /// Starts a new phase: CPU averages and peaks count from now.
    pub fn reset(&mut self) {
        let n = self.groups.len();
        self.first = vec![None; n];
        self.last = vec![None; n];
        self.peak = vec![0; n];
        self.seen = vec![BTreeMap::new(); n];
        self.samples = 0;
        self.sample();
    }

    /// Usage per group name since the last [`Sampler::reset`].
    pub fn usage(&self) -> BTreeMap<String, Usage> {
        let mut out = BTreeMap::new();
        for (i, g) in self.groups.iter().enumerate() {
            let u = match (&self.first[i], &self.last[i]) {
                (Some((t0, _)), Some((t1, r1))) => {
                    let dt = (*t1 - *t0).as_secs_f64();
                    // Processes alive at the last reading, from their first.
                    let spent: Vec<Spent> = r1
                        .ticks
                        .keys()
                        .filter_map(|pid| self.seen[i].get(pid))
                        .map(|(a, b)| b.since(*a))
                        .collect();
                    let ticks: u64 = spent.iter().map(|s| s.ticks).sum();
                    let switches: u64 = spent.iter().map(|s| s.switches).sum();
                    let cpu_seconds = ticks as f64 / self.tck as f64;
                    Usage {
                        cpu_cores: (dt > 0.5).then(|| cpu_seconds / dt),
                        cpu_seconds: (dt > 0.5).then_some(cpu_seconds),
                        mem_peak_mib: Some(self.peak[i] as f64 / 1048576.0),
                        mem_last_mib: Some(r1.mem_bytes as f64 / 1048576.0),
                        processes: r1.procs,
                        switches: (dt > 0.5).then_some(switches),
                    }
                }
                _ => Usage::default(),
            };
            out.insert(g.name.clone(), u);
        }
        out
    }

    /// Points the group called `name` at other processes (a service
    /// instance restarted), from the next reading on.
    pub fn set_who(&mut self, name: &str, who: Who) {
        if let Some(g) = self.groups.iter_mut().find(|g| g.name == name) {
            g.who = who;
        }
    }

    /// Memory over time of the group called `name`.
    pub fn series(&self, name: &str) -> Vec<MemSample> {
        self.groups
            .iter()
            .position(|g| g.name == name)
            .map(|i| self.series[i].clone())
            .unwrap_or_default()
    }
}

/// A [`Sampler`] read once a second in the background while the bench
/// runs its phases; [`Sampling::reset`] starts a phase, [`Sampling::usage`]
/// ends one.
///
/// The readings are blocking `/proc` reads, so they run on a thread of
/// their own, never on one of the runtime's workers that publish and
/// insert the load.
pub struct Sampling {
    sampler: Arc<Mutex<Sampler>>,
    /// Tells the thread to end (dropping the sender does too).
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampling {
    /// Starts sampling `groups` every second.
    pub fn start(groups: Vec<Group>) -> Self {
        let sampler = Arc::new(Mutex::new(Sampler::new(groups)));
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bench-sampler".into())
            .spawn({
                let sampler = sampler.clone();
                move || {
                    // A message or a dropped sender ends it; a timeout is
                    // the next second.
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        stopped.recv_timeout(Duration::from_secs(1))
                    {
                        if let Ok(mut s) = sampler.lock() {
                            s.sample();
                        }
                    }
                }
            })
            .map_err(|e| eprintln!("warning: no CPU and memory readings: {e}"))
            .ok();
        Self {
            sampler,
            stop: Some(stop),
            thread,
        }
    }

    /// Runs `f` on the sampler (nothing if a panic poisoned it).
    pub fn with<T>(&self, f: impl FnOnce(&mut Sampler) -> T) -> Option<T> {
        self.sampler.lock().ok().map(|mut s| f(&mut s))
    }

    /// Starts a new phase ([`Sampler::reset`]).
    pub fn reset(&self) {
        self.with(Sampler::reset);
    }

    /// A last reading, then the usage since the last reset.
    pub fn usage(&self) -> BTreeMap<String, Usage> {
        self.with(|s| {
            s.sample();
            s.usage()
        })
        .unwrap_or_default()
    }

    /// Stops the background readings.
    pub async fn stop(mut self) {
        self.end();
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }

    /// Tells the thread to end (it does within a reading).
    fn end(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for Sampling {
    fn drop(&mut self) {
        self.end();
    }
}

/// Disk used under `path` in bytes (`du -sb`), if readable.
pub fn disk_usage(path: &str) -> Option<u64> {
    let out = std::process::Command::new("du")
        .args(["-sb", path])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(read_ticks(me).is_some());
        assert!(read_mem(me).unwrap() > 0);
        let mut s = Sampler::new(vec![
            Group {
                name: "me".into(),
                who: Who::Pids(vec![me]),
            },
            Group {
                name: "nobody".into(),
                who: Who::Comm("no-such-process-name"),
            },
        ]);
        s.sample();
        let u = s.usage();
        assert_eq!(u["me"].processes, 1);
        assert!(u["me"].mem_peak_mib.unwrap() > 0.0);
        assert_eq!(u["nobody"].processes, 0);
        assert!(u["nobody"].mem_peak_mib.is_none());
    }

    #[test]
    fn memory_is_read_every_few_samples_and_at_each_phase_start() {
        let me = std::process::id();
        let mut s = Sampler::new(vec![Group {
            name: "me".into(),
            who: Who::Pids(vec![me]),
        }]);
        for _ in 1..MEM_EVERY {
            s.sample();
        }
        assert_eq!(s.series("me").len(), 1, "only the first reading's");
        let u = s.usage();
        assert!(u["me"].mem_last_mib.unwrap() > 0.0, "carried over");
        s.sample();
        assert_eq!(s.series("me").len(), 2);
        s.reset();
        assert_eq!(s.series("me").len(), 3, "a phase starts with one");
        assert!(s.usage()["me"].mem_peak_mib.unwrap() > 0.0);
    }

    #[test]
    fn tells_postgres_backends_by_database() {
        let t = "postgres: 15/main: postgres ot_bench_1 127.0.0.1(45878) idle";
        assert_eq!(pg_backend(t).map(|b| b.database), Some("ot_bench_1"));
        let t = "postgres: app shop [local] UPDATE waiting";
        assert_eq!(pg_backend(t).map(|b| b.database), Some("shop"));
        for own in [
            "postgres: 15/main: checkpointer ",
            "postgres: 15/main: logical replication launcher",
            "postgres: 15/main: autovacuum worker ot_bench_1",
            "/usr/lib/postgresql/15/bin/postgres -D /var/lib/postgresql/15/main",
        ] {
            assert_eq!(pg_backend(own), None, "{own}");
        }
    }

    #[test]
    fn reads_a_backends_client_port() {
        let t = "postgres: 15/main: postgres ot_bench_1 127.0.0.1(45878) idle";
        assert_eq!(pg_backend(t).and_then(|b| b.client_port), Some(45878));
        let t = "postgres: app shop ::1(40001) UPDATE waiting";
        assert_eq!(pg_backend(t).and_then(|b| b.client_port), Some(40001));
        for none in [
            "postgres: app shop [local] idle",
            "postgres: 15/main: checkpointer ",
            "postgres: 15/main: autovacuum worker ot_bench_1",
        ] {
            assert_eq!(pg_backend(none).and_then(|b| b.client_port), None, "{none}");
        }
    }

    #[test]
    fn counts_the_context_switches_of_every_thread() {
        let me = std::process::id();
        let before = read_switches(me).unwrap();
        // A thread that sleeps and is woken a few times before it ends.
        let worker = std::thread::spawn(|| {
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(200));
        });
        std::thread::sleep(Duration::from_millis(100));
        let meanwhile = read_switches(me).unwrap();
        assert!(meanwhile >= before + 20, "{before} -> {meanwhile}");
        worker.join().unwrap();
    }

    #[tokio::test]
    async fn tells_postgres_work_by_whose_statements_it_ran() {
        use crate::{scratch, shop};
        let db = scratch::ScratchDatabase::on_test_server("ot_tools_pg_clients");
        let pool = shop::prepare_database(&db.url().unwrap(), 1)
            .await
            .expect("prepare the database");
        let databases = vec![db.name().to_owned()];
        let me = std::process::id();
        let group = |name: &str, clients: Vec<u32>| Group {
            name: name.into(),
            who: Who::PostgresClients {
                databases: databases.clone(),
                clients,
            },
        };
        // pid 1 holds no connection to this database.
        let mut s = Sampler::new(vec![group("mine", vec![me]), group("others", vec![1])]);
        sqlx::query("SELECT count(*) FROM generate_series(1, 3000000)")
            .execute(&pool)
            .await
            .unwrap();
        // Usage is reported for phases longer than half a second.
        tokio::time::sleep(Duration::from_millis(600)).await;
        s.sample();
        let u = s.usage();
        assert_eq!(u["mine"].processes, 1, "{u:?}");
        assert!(u["mine"].cpu_seconds.unwrap() > 0.0, "{u:?}");
        assert!(u["mine"].switches.is_some(), "{u:?}");
        assert_eq!(u["others"].processes, 0, "{u:?}");
        pool.close().await;
    }

    #[test]
    fn finds_who_listens_on_a_port() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(pid_listening_on(port, me.trim()), Some(std::process::id()));
        drop(l);
        assert_eq!(pid_listening_on(port, me.trim()), None);
    }
}
