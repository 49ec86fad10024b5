//! The two RabbitMQ versions the suite runs on: the machine's broker
//! (Debian bookworm's 3.10.8, `AMQP_URL`, managed with the machine's
//! `rabbitmqctl`) and a RabbitMQ 4.x test node beside it (Debian trixie's
//! 4.0.5 from the root `scripts/rabbitmq4.sh` prepares, on 127.0.0.1:5673,
//! every deprecated feature denied, Khepri on; managed with
//! `scripts/rabbitmq4.sh ctl`). `scripts/ensure-services.sh --rabbitmq4`
//! starts it (`scripts/test.sh` does).
//!
//! A test body runs on the broker of [`Broker::current`]: the machine's,
//! unless it runs inside [`Broker::scope`], which the test matrix
//! ([`crate::common::matrix`]) wraps around it. [`crate::common::TestEnv`]
//! makes its vhost there, so a body written for the machine's broker runs
//! unchanged on 4.x.
//!
//! When the 4.x node does not run, its tests fail with what to run if
//! `CI` or `ORDER_TIMEOUT_REQUIRE_RABBITMQ4=1` is set (`scripts/test.sh`
//! sets it); otherwise they print `SKIPPED: …` and pass, like the
//! publishers' tests.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use order_timeout::settings::SecretUrl;
use order_timeout_tools::broker_admin::Node;
use order_timeout_tools::private_broker::{ClusterConfig, rabbitmq4_script};
use order_timeout_tools::scratch;

/// Which RabbitMQ a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broker {
    /// The machine's broker (RabbitMQ 3.10.8 here) and, for private
    /// nodes, the machine's RabbitMQ installation.
    Rabbitmq3,
    /// The RabbitMQ 4.x test node, and private nodes from its root.
    Rabbitmq4,
}

tokio::task_local! {
    static BROKER: Broker;
}

impl Broker {
    /// The broker of the test running this: [`Broker::Rabbitmq3`] unless
    /// inside [`Broker::scope`].
    pub fn current() -> Self {
        BROKER.try_with(|b| *b).unwrap_or(Broker::Rabbitmq3)
    }

    /// Runs `body` with [`Broker::current`] answering `self`.
    pub async fn scope<F: std::future::Future>(self, body: F) -> F::Output {
        BROKER.scope(self, body).await
    }

    /// A private cluster of `nodes` of this version
    /// ([`ClusterConfig::rabbitmq4`]).
    pub fn cluster(self, nodes: usize) -> ClusterConfig {
        ClusterConfig {
            rabbitmq4: self == Broker::Rabbitmq4,
            ..ClusterConfig::nodes(nodes)
        }
    }

    /// The base AMQP URL of this broker (default vhost); its vhost part is
    /// replaced per test.
    pub fn base_url(self) -> SecretUrl {
        match self {
            Broker::Rabbitmq3 => SecretUrl::new(
                std::env::var("AMQP_URL")
                    .unwrap_or_else(|_| order_timeout::settings::DEFAULT_AMQP_URL.into()),
            ),
            Broker::Rabbitmq4 => SecretUrl::new(rabbitmq4().url.clone()),
        }
    }

    /// `rabbitmqctl -q ARGS` against this broker: its standard output, or
    /// the error with what it printed.
    pub fn rabbitmqctl(self, args: &[&str]) -> Result<String, String> {
        match self {
            Broker::Rabbitmq3 => scratch::rabbitmqctl(args).map_err(|e| e.to_string()),
            Broker::Rabbitmq4 => rabbitmq4_ctl(args),
        }
    }

    /// Creates vhost `name` with full permissions for the base URL's user
    /// and returns the base URL pointed at it.
    pub fn create_vhost(self, name: &str) -> Result<SecretUrl, String> {
        let base = self.base_url();
        if self == Broker::Rabbitmq3 {
            return scratch::create_vhost(&base, name).map_err(|e| e.to_string());
        }
        let user = url::Url::parse(base.expose())
            .ok()
            .map(|u| u.username().to_owned())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "guest".into());
        scratch::create_vhost_on(&rabbitmq4().node, name, &user, rabbitmq4_scratch_ctl)
            .map_err(|e| e.to_string())?;
        scratch::with_path(&base, &format!("/{name}")).map_err(|e| e.to_string())
    }

    /// Deletes vhost `name` with everything in it.
    pub fn delete_vhost(self, name: &str) -> Result<(), String> {
        match self {
            Broker::Rabbitmq3 => scratch::delete_vhost(name),
            Broker::Rabbitmq4 => {
                scratch::delete_vhost_on(&rabbitmq4().node, name, rabbitmq4_scratch_ctl)
            }
        }
        .map_err(|e| e.to_string())
    }

    /// For a test on this broker: whether it can run. On 4.x, `false` (the
    /// test then returns at once) only when the node does not run and the
    /// suite does not require it, after saying so; when required, it fails
    /// the test with what to run.
    pub fn available(self) -> bool {
        match (self, &rabbitmq4_state().missing) {
            (Broker::Rabbitmq3, _) | (Broker::Rabbitmq4, None) => true,
            (Broker::Rabbitmq4, Some(missing)) if required() => panic!(
                "{missing}. `scripts/ensure-services.sh --rabbitmq4` (or `scripts/rabbitmq4.sh start`, as root) \
                 starts it; CI / ORDER_TIMEOUT_REQUIRE_RABBITMQ4 is set, so this fails instead of skipping"
            ),
            (Broker::Rabbitmq4, Some(missing)) => {
                eprintln!(
                    "SKIPPED (RabbitMQ 4.x): {missing}; start it with `scripts/ensure-services.sh --rabbitmq4` \
                     (scripts/test.sh does)"
                );
                false
            }
        }
    }
}

/// Whether a missing 4.x node fails its tests instead of skipping them.
fn required() -> bool {
    let set =
        |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    set("CI") || set("ORDER_TIMEOUT_REQUIRE_RABBITMQ4")
}

/// What this process found out about the 4.x test node, once.
struct Rabbitmq4 {
    /// Its AMQP URL (default vhost).
    url: String,
    /// The node, for its vhosts ([`scratch::create_vhost_on`]).
    node: Node,
    /// Why it cannot be used, if it cannot.
    missing: Option<String>,
}

fn rabbitmq4_state() -> &'static Rabbitmq4 {
    static STATE: OnceLock<Rabbitmq4> = OnceLock::new();
    STATE.get_or_init(|| {
        // `scripts/rabbitmq4.sh admin`: the URL and how to join the node.
        let admin = run_script(&["admin"], Duration::from_secs(10)).unwrap_or_default();
        let value = |key: &str| {
            admin.lines().find_map(|l| {
                l.strip_prefix(key)
                    .and_then(|v| v.strip_prefix('='))
                    .map(str::to_owned)
            })
        };
        let url = value("url").unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5673/%2f".into());
        let node = Node {
            name: value("node").unwrap_or_else(|| "ot-rabbitmq4-1@localhost".into()),
            cookie_home: value("cookie_home")
                .unwrap_or_else(|| "/var/lib/order-timeout/rabbitmq4/home".into())
                .into(),
            epmd_port: value("epmd_port").and_then(|p| p.parse().ok()),
        };
        // Whether it runs: the node answers (one short Erlang call), else
        // what `scripts/rabbitmq4.sh status` says.
        let missing = match node.ping() {
            Ok(()) => None,
            Err(_) => match run_script(&["status"], Duration::from_secs(60)) {
                Ok(_) => None,
                Err(e) => Some(format!("the RabbitMQ 4.x test node does not run ({e})")),
            },
        };
        let state = Rabbitmq4 { url, node, missing };
        if state.missing.is_none() {
            sweep_abandoned(&state.node);
        }
        state
    })
}

/// The 4.x test node; panics (or the test was skipped before) when it does
/// not run.
fn rabbitmq4() -> &'static Rabbitmq4 {
    let state = rabbitmq4_state();
    if let Some(missing) = &state.missing {
        panic!("{missing}");
    }
    state
}

/// `scripts/rabbitmq4.sh ARGS`, bounded by `limit`.
fn run_script(args: &[&str], limit: Duration) -> Result<String, String> {
    let script: PathBuf = rabbitmq4_script();
    let out = Command::new("timeout")
        .args(["--kill-after=10", &limit.as_secs().to_string(), "bash"])
        .arg(&script)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(12).collect();
    Err(format!(
        "scripts/rabbitmq4.sh {} ({}): {}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    ))
}

/// `rabbitmqctl -q ARGS` against the 4.x test node
/// (`scripts/rabbitmq4.sh ctl`), bounded like the machine's
/// ([`scratch::RABBITMQCTL_TIMEOUT_SECS`]).
fn rabbitmq4_ctl(args: &[&str]) -> Result<String, String> {
    let limit = scratch::RABBITMQCTL_TIMEOUT_SECS.to_string();
    let mut all = vec!["ctl", "-q", "--timeout", &limit];
    all.extend_from_slice(args);
    run_script(
        &all,
        Duration::from_secs(u64::from(scratch::RABBITMQCTL_TIMEOUT_SECS) + 30),
    )
}

/// [`rabbitmq4_ctl`] as the scratch functions take it.
fn rabbitmq4_scratch_ctl(args: &[&str]) -> Result<String, scratch::ScratchError> {
    rabbitmq4_ctl(args).map_err(scratch::ScratchError::new)
}

/// Removes the vhosts that ended test runs left on the 4.x node (names
/// made by [`scratch::owned_name`] whose process is gone), once per
/// test run ([`crate::common::once_per_run`]), as
/// [`crate::common::sweep_abandoned`] does on the machine's.
fn sweep_abandoned(node: &Node) {
    crate::common::once_per_run("rabbitmq4-sweep", || {
        let Ok(names) = scratch::list_vhosts_on(node, rabbitmq4_scratch_ctl) else {
            return;
        };
        for vhost in names.iter().filter(|v| scratch::abandoned(v)) {
            match scratch::delete_vhost_on(node, vhost, rabbitmq4_scratch_ctl) {
                Ok(()) => {
                    eprintln!("removed a vhost an ended test run left on RabbitMQ 4.x: {vhost}")
                }
                Err(e) => eprintln!("warning: removing {vhost} from RabbitMQ 4.x: {e}"),
            }
        }
    });
}
