//! Private RabbitMQ nodes for the broker-fault tests and measurements: a
//! cluster of 1..N nodes of this run's own (own names, ports, data, cookie),
//! driven through `scripts/rabbitmq-cluster.sh` — the script users run —
//! and removed on drop. The machine's own broker is never touched.
//!
//! The nodes are the machine's RabbitMQ (Debian bookworm's 3.10), or with
//! [`ClusterConfig::rabbitmq4`] RabbitMQ 4.x from the root that
//! `scripts/rabbitmq4.sh` prepares (Debian trixie's 4.0.5), started through
//! `scripts/rabbitmq4.sh cluster start`: every deprecated feature denied,
//! Khepri on, their own epmd.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

/// Where the cluster script lives in this repository.
pub fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/rabbitmq-cluster.sh")
}

/// Where the RabbitMQ 4.x script lives in this repository.
pub fn rabbitmq4_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/rabbitmq4.sh")
}

/// A failed script command, with what it printed.
#[derive(Debug, thiserror::Error)]
#[error("{command} failed ({status}): {stderr}")]
pub struct ClusterError {
    /// The command line (`scripts/rabbitmq-cluster.sh start`, …).
    pub command: String,
    /// Its exit status.
    pub status: String,
    /// The tail of its stderr (the node's log tail on a timeout).
    pub stderr: String,
}

/// What the nodes are started with.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Number of nodes.
    pub nodes: usize,
    /// The `advanced.config` every node gets (default: the repository's
    /// `deploy/rabbitmq/advanced.config`).
    pub advanced_config: Option<String>,
    /// Lines appended to every node's `rabbitmq.conf` (`@I@` and `@PORT@`
    /// are replaced by the script).
    pub extra_conf: Option<String>,
    /// The network namespace (`ip netns`) the nodes run in, and every
    /// script command with them: a node behind a link a test cuts
    /// ([`crate::netns`]). `None`: the host's network.
    pub netns: Option<String>,
    /// RabbitMQ 4.x nodes from `scripts/rabbitmq4.sh`'s root instead of
    /// the machine's RabbitMQ.
    pub rabbitmq4: bool,
    /// One network namespace and address per node (the script's
    /// `CLUSTER_NETNS` and `CLUSTER_HOSTS`): node `i` runs in the `i`-th
    /// namespace, named and reached by its address, with an epmd of its
    /// own there — the nodes of a cluster on a [`crate::netns::Bridge`],
    /// each of which a test can partition off. Empty: the host's network
    /// (or [`ClusterConfig::netns`] for all).
    pub node_netns: Vec<(String, Ipv4Addr)>,
}

impl ClusterConfig {
    /// `nodes` nodes with the repository's broker settings.
    pub fn nodes(nodes: usize) -> Self {
        Self {
            nodes,
            advanced_config: None,
            extra_conf: None,
            netns: None,
            rabbitmq4: false,
            node_netns: Vec::new(),
        }
    }
}

/// A running private cluster; stopped and deleted on drop.
pub struct PrivateCluster {
    dir: PathBuf,
    netns: Option<String>,
    /// Node `i`'s address is `hosts[i - 1]` (127.0.0.1 when empty).
    hosts: Vec<Ipv4Addr>,
    /// Number of nodes.
    pub nodes: usize,
    /// AMQP port of node 1 (node `i` listens on `port + i - 1`).
    pub port: u16,
    /// A cluster of more than one node runs alone in this process: held
    /// until its nodes are stopped (fields drop after [`Drop::drop`]).
    _alone: Option<tokio::sync::SemaphorePermit<'static>>,
}

impl PrivateCluster {
    /// Starts the nodes on free ports and waits until they form one cluster.
    ///
    /// One start at a time in this process (the others wait): three Erlang
    /// nodes booting take both of this machine's cores for a while, and two
    /// clusters booting side by side in the suite once left nodes 2 and 3
    /// unjoined for four minutes. A start whose nodes did not form a
    /// cluster is tried once more, on fresh ports and in a fresh
    /// directory (the failed nodes are killed and removed first).
    ///
    /// A cluster of several nodes also waits for the previous one to be
    /// stopped, and keeps the next one waiting until it is: two 3-node
    /// clusters running side by side with the rest of the suite on two
    /// cores left a fresh node unable to finish an AMQP handshake within
    /// 5 s, and a partition test measuring seconds measured the load.
    pub async fn start(config: ClusterConfig) -> Result<Self, ClusterError> {
        static STARTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        static SEVERAL_NODES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
        // Never closed: `acquire` only fails on a closed semaphore.
        let alone = if config.nodes > 1 {
            SEVERAL_NODES.acquire().await.ok()
        } else {
            None
        };
        let _one_at_a_time = STARTING.lock().await;
        let mut cluster = match Self::start_once(config.clone()).await {
            Err(e) if e.stderr.contains("did not form") => {
                eprintln!(
                    "[private cluster] the nodes did not form a cluster; starting afresh once: {e}"
                );
                Self::start_once(config).await
            }
            started => started,
        }?;
        cluster._alone = alone;
        Ok(cluster)
    }

    async fn start_once(config: ClusterConfig) -> Result<Self, ClusterError> {
        let unique = format!(
            "ot{}x{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() % 1_000_000)
                .unwrap_or(0)
        );
        let dir = std::env::temp_dir().join(format!("order-timeout-rabbit-{unique}"));
        std::fs::create_dir_all(&dir).map_err(|e| io_error("mkdir", e))?;
        let port = free_port_range(config.nodes);
        let mut env = vec![
            ("CLUSTER_NODES", config.nodes.to_string()),
            ("CLUSTER_PORT", port.to_string()),
            ("CLUSTER_NAME", unique.clone()),
        ];
        if let Some(text) = &config.advanced_config {
            let path = dir.join("advanced.config.in");
            std::fs::write(&path, text).map_err(|e| io_error("write advanced.config", e))?;
            env.push(("CLUSTER_ADVANCED_CONFIG", path.display().to_string()));
        }
        if let Some(text) = &config.extra_conf {
            let path = dir.join("extra.conf.in");
            std::fs::write(&path, text).map_err(|e| io_error("write extra conf", e))?;
            env.push(("CLUSTER_CONF_EXTRA", path.display().to_string()));
        }
        if !config.node_netns.is_empty() {
            let join = |f: &dyn Fn(&(String, Ipv4Addr)) -> String| {
                config
                    .node_netns
                    .iter()
                    .map(f)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            env.push(("CLUSTER_NETNS", join(&|(ns, _)| ns.clone())));
            env.push(("CLUSTER_HOSTS", join(&|(_, ip)| ip.to_string())));
        }
        let cluster = Self {
            dir: dir.join("cluster"),
            netns: config.netns.clone(),
            hosts: config.node_netns.iter().map(|(_, ip)| *ip).collect(),
            nodes: config.nodes,
            port,
            _alone: None,
        };
        if config.rabbitmq4 {
            cluster
                .run_script(&rabbitmq4_script(), &["cluster", "start"], &env)
                .await?;
        } else {
            cluster.run_with(&["start"], &env).await?;
        }
        Ok(cluster)
    }

    /// The AMQP URL of node `i` (1-based), default vhost.
    pub fn url(&self, i: usize) -> String {
        let host = self
            .hosts
            .get(i - 1)
            .copied()
            .unwrap_or(Ipv4Addr::LOCALHOST);
        format!(
            "amqp://guest:guest@{host}:{}/%2f",
            self.port as usize + i - 1
        )
    }

    /// Every node's URL, comma-separated, starting with node `first`: what
    /// `AMQP_URL` holds for a cluster.
    pub fn urls_from(&self, first: usize) -> String {
        (0..self.nodes)
            .map(|k| self.url((first - 1 + k) % self.nodes + 1))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `kill -9` of node `i`'s Erlang VM; its data is kept.
    pub async fn kill_node(&self, i: usize) -> Result<(), ClusterError> {
        self.run(&["kill-node", &i.to_string()]).await.map(drop)
    }

    /// (Re)starts node `i` and waits until it runs.
    pub async fn start_node(&self, i: usize) -> Result<(), ClusterError> {
        self.run(&["start-node", &i.to_string()]).await.map(drop)
    }

    /// Graceful stop of node `i` (`rabbitmqctl stop`).
    pub async fn stop_node(&self, i: usize) -> Result<(), ClusterError> {
        self.run(&["stop-node", &i.to_string()]).await.map(drop)
    }

    /// `rabbitmqctl stop_app` on node `i`.
    pub async fn stop_app(&self, i: usize) -> Result<(), ClusterError> {
        self.run(&["stop-app", &i.to_string()]).await.map(drop)
    }

    /// `rabbitmqctl start_app` on node `i`, waiting until it runs.
    pub async fn start_app(&self, i: usize) -> Result<(), ClusterError> {
        self.run(&["start-app", &i.to_string()]).await.map(drop)
    }

    /// `rabbitmqctl ARGS` against node `i` (the script's `ctl`: its
    /// cookie, its root if any), in the cluster's namespace if it has one.
    /// For what the script has no command of its own for (a memory alarm).
    pub async fn rabbitmqctl(&self, i: usize, args: &[&str]) -> Result<String, ClusterError> {
        let node = i.to_string();
        let mut all = vec!["ctl", node.as_str()];
        all.extend_from_slice(args);
        self.run(&all).await
    }

    /// The script's `status` lines: each node's own view, also when they
    /// disagree (a partition: the script then exits 1).
    pub async fn status(&self) -> String {
        self.status_within(Duration::from_secs(20)).await
    }

    /// [`PrivateCluster::status`], each node's view waited for at most
    /// `limit` (`app=unreachable` past it: a node in a partition's minority
    /// may not answer in time).
    pub async fn status_within(&self, limit: Duration) -> String {
        let mut command = Command::from(self.script_command(&cluster_script()));
        command
            .arg("status")
            .env("CLUSTER_DIR", &self.dir)
            .env("CLUSTER_VIEW_TIMEOUT", limit.as_secs().max(1).to_string())
            .kill_on_drop(true);
        match command.output().await {
            Ok(out) if !out.stdout.is_empty() => String::from_utf8_lossy(&out.stdout).into_owned(),
            Ok(out) => format!(
                "scripts/rabbitmq-cluster.sh status ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => format!("scripts/rabbitmq-cluster.sh status: {e}"),
        }
    }

    /// `bash SCRIPT`, in the cluster's namespace if it has one.
    fn script_command(&self, script: &Path) -> std::process::Command {
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = std::process::Command::new("ip");
                c.args(["netns", "exec", ns, "bash"]);
                c
            }
            None => std::process::Command::new("bash"),
        };
        command.arg(script);
        command
    }

    async fn run(&self, args: &[&str]) -> Result<String, ClusterError> {
        self.run_with(args, &[]).await
    }

    async fn run_with(
        &self,
        args: &[&str],
        env: &[(&str, String)],
    ) -> Result<String, ClusterError> {
        self.run_script(&cluster_script(), args, env).await
    }

    async fn run_script(
        &self,
        script: &Path,
        args: &[&str],
        env: &[(&str, String)],
    ) -> Result<String, ClusterError> {
        let mut command = Command::from(self.script_command(script));
        command
            .args(args)
            .env("CLUSTER_DIR", &self.dir)
            .kill_on_drop(true);
        for (k, v) in env {
            command.env(k, v);
        }
        let output = command
            .output()
            .await
            .map_err(|e| io_error(&args.join(" "), e))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(30).collect();
            let name = script.file_name().unwrap_or_default().to_string_lossy();
            Err(ClusterError {
                command: format!("scripts/{name} {}", args.join(" ")),
                status: output.status.to_string(),
                stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            })
        }
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        // Blocking on purpose: the nodes must be gone when the test ends.
        let _ = self
            .script_command(&cluster_script())
            .arg("stop")
            .env("CLUSTER_DIR", &self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(parent);
        }
    }
}

fn io_error(command: &str, e: std::io::Error) -> ClusterError {
    ClusterError {
        command: command.into(),
        status: "not run".into(),
        stderr: e.to_string(),
    }
}

/// A first port such that `n` AMQP ports and their distribution ports
/// (+10000) are free right now: AMQP in 12000..17000, distribution in
/// 22000..27000. Both stay below Linux's ephemeral ports (32768 and up by
/// default): a port in that range that is free now can be taken by any
/// outgoing connection's local end before a killed node boots again on it
/// (CI saw a restart fail with `dist_port_already_used` on 34346), and
/// rabbitmqctl takes 35672-35682 for itself.
fn free_port_range(n: usize) -> u16 {
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64)
            .unwrap_or(0);
    for attempt in 0..500u64 {
        let base = 12_000 + ((seed + attempt * 7919) % 4_990) as u16;
        if (0..n as u16).all(|k| free(base + k) && free(base + k + 10_000)) {
            return base;
        }
    }
    13_681
}

/// Waits up to `limit` for `check` to hold, polling every 100 ms.
pub async fn wait_for<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = tokio::time::Instant::now();
    while started.elapsed() < limit {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
