//! A rolling upgrade from the previous release (the newest release in
//! CHANGELOG.md whose commit is not this checkout's: 0.2.0;
//! `scripts/previous-release.sh` builds its binary from exactly the commit
//! CHANGELOG.md names, cached under `target/previous-release/`, and the
//! test checks the commit it was built from) to this one, with orders
//! waiting in every store the previous release has: the delay cascade, the
//! due queue (held by the replicas), the parked queue, outbox rows whose
//! stock release is pending, and messages waiting as retries. Then the way
//! back, and the contraction (nothing is kept for 0.2.0: this release's
//! migrations only add).
//!
//! From 0.1.0, whose `ON CONFLICT (order_id)` needed the outbox's order ids
//! unique on their own (migration 20261130000001 keeps them so until
//! `migrate --contract`): on MariaDB, where its `ON DUPLICATE KEY` works
//! with the new key, a shorter case checks a 0.1.0 replica through this
//! release's `migrate`; `other_timers_wait_for_the_contraction` checks the
//! kept index and its contraction on PostgreSQL.
//!
//! This file holds the replicas of a release and what the cases read; the
//! cases are in [`rolling`] (the upgrade and the way back), [`releases`]
//! (which release is the previous one) and [`contraction`] (from 0.1.0).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::{FutureExt, StreamExt};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use order_timeout::settings::SecretUrl;
use order_timeout::testing::store::OrderItem;
use order_timeout::testing::topology::DUE_QUEUE;
use order_timeout_tools::scratch;
use order_timeout_tools::shop::{self, NewOrder, ShopDb};
use tonic::Status;

use crate::bounds::{KillOnDrop, output_within, step};
use crate::common::{TestEnv, restart_turn};

mod contraction;
mod releases;
mod rolling;

/// The release before this one: the newest release in CHANGELOG.md whose
/// commit is not this checkout's (`scripts/previous-release.sh --which`),
/// its version and the commit CHANGELOG.md names for it.
fn previous_version() -> (String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = output_within(
        Command::new(root.join("scripts/previous-release.sh"))
            .arg("--which")
            .current_dir(root),
        Duration::from_secs(60),
        "scripts/previous-release.sh --which",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let which = String::from_utf8_lossy(&out.stdout);
    let (version, commit) = which.trim().split_once(' ').expect("VERSION COMMIT");
    (version.to_owned(), commit.to_owned())
}

/// The commit CHANGELOG.md names for `version` (its `Commit:` line).
fn changelog_commit(version: &str) -> Option<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md")).unwrap();
    let heading = format!("## [{version}]");
    let entry = changelog
        .split("\n## ")
        .find(|e| format!("## {e}").starts_with(&heading))?;
    entry.lines().find_map(|l| {
        l.strip_prefix("Commit: `")
            .map(|c| c.trim_end_matches('`').to_owned())
    })
}

/// The binary of release `version` (`None`: the previous release):
/// `ORDER_TIMEOUT_PREVIOUS_BIN` for the previous release, else what
/// `scripts/previous-release.sh` builds (at once when cached, as
/// `scripts/test.sh` leaves it), checked to be **exactly the commit
/// CHANGELOG.md names**: the script records the commit it built from, and
/// the binary says the version.
fn release_binary(version: Option<&str>) -> PathBuf {
    let (version, named) = match version {
        Some(v) => (v.to_owned(), changelog_commit(v).expect("a Commit: line")),
        None => previous_version(),
    };
    assert_eq!(
        changelog_commit(&version).as_deref(),
        Some(named.as_str()),
        "the script builds the commit CHANGELOG.md names for {version}"
    );
    let bin = match std::env::var("ORDER_TIMEOUT_PREVIOUS_BIN") {
        Ok(bin) if version == previous_version().0 => PathBuf::from(bin),
        _ => {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let out = output_within(
                Command::new(root.join("scripts/previous-release.sh"))
                    .arg(&version)
                    .current_dir(root),
                Duration::from_secs(540),
                "scripts/previous-release.sh",
            );
            assert!(
                out.status.success(),
                "scripts/previous-release.sh failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            let bin = PathBuf::from(stdout.lines().last().expect("the binary's path").trim());
            let built = std::fs::read_to_string(bin.with_file_name("commit")).unwrap();
            assert_eq!(
                built.trim(),
                named,
                "{} was built from another commit than CHANGELOG.md names for {version}",
                bin.display()
            );
            bin
        }
    };
    let says = output_within(
        Command::new(&bin).arg("--version"),
        Duration::from_secs(30),
        "--version",
    );
    assert_eq!(
        String::from_utf8_lossy(&says.stdout).trim(),
        format!("order-timeout {version}"),
        "{}",
        bin.display()
    );
    bin
}

/// One `serve` replica of `bin` on the test's world, logging to a file.
struct Replica {
    name: String,
    process: KillOnDrop,
    log: PathBuf,
}

impl Replica {
    fn start(bin: &Path, env: &TestEnv, name: &str) -> Self {
        Self::start_on(bin, env, &env.settings.database_url, name)
    }

    /// [`Replica::start`] on the database `database_url`.
    fn start_on(bin: &Path, env: &TestEnv, database_url: &SecretUrl, name: &str) -> Self {
        let log = std::env::temp_dir().join(format!(
            "upgrade-{name}-{}.log",
            uuid::Uuid::new_v4().simple()
        ));
        let file = std::fs::File::create(&log).expect("log file");
        let process = Command::new(bin)
            .arg("serve")
            .env("AMQP_URL", env.settings.amqp_url.expose())
            .env("DATABASE_URL", database_url.expose())
            .env("INVENTORY_URL", env.settings.inventory_url.expose())
            .env("HTTP_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "info")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start serve");
        Self {
            name: name.to_owned(),
            process: KillOnDrop(process),
            log,
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as a rolling update stops a pod; waits for a clean exit.
    async fn stop(mut self) -> String {
        let pid = self.process.0.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let end = tokio::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.process.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                tokio::time::Instant::now() < end,
                "{} did not stop within 30 s:\n{}",
                self.name,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let logs = self.logs();
        assert!(status.success(), "{} exit {status:?}:\n{logs}", self.name);
        logs
    }
}

/// Consumers on the due queue (a passive declare).
async fn due_consumers(env: &TestEnv) -> u32 {
    let channel = env.amqp.create_channel().await.unwrap();
    let queue = channel
        .queue_declare(
            DUE_QUEUE.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    let _ = channel.close(200, "done".into()).await;
    queue.map(|q| q.consumer_count()).unwrap_or(0)
}

/// Waits until `n` replicas consume the due queue.
async fn wait_consumers(env: &TestEnv, n: u32, replicas: &[&Replica]) {
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while due_consumers(env).await != n {
        if tokio::time::Instant::now() > end {
            let logs: Vec<String> = replicas
                .iter()
                .map(|r| format!("--- {}\n{}", r.name, r.logs()))
                .collect();
            panic!(
                "{n} consumers on the due queue within 30 s:\n{}",
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `(id, expires_at, cancelled_at)` of the cancelled orders named `prefix*`.
async fn cancelled(env: &TestEnv, prefix: &str) -> Vec<(String, DateTime<Utc>, DateTime<Utc>)> {
    sqlx::query_as(
        "SELECT id, expires_at, cancelled_at FROM orders \
          WHERE starts_with(id, $1) AND status = 'CANCELLED' ORDER BY id",
    )
    .bind(prefix)
    .fetch_all(&env.pool)
    .await
    .unwrap()
}

/// Never early, and the largest lateness, of the orders named `prefix*`.
async fn lateness(env: &TestEnv, prefix: &str, expected: usize) -> chrono::Duration {
    let rows = cancelled(env, prefix).await;
    assert_eq!(rows.len(), expected, "{prefix}* cancelled");
    let mut worst = chrono::Duration::zero();
    for (id, expires_at, cancelled_at) in rows {
        assert!(
            cancelled_at >= expires_at,
            "{id} cancelled early: {cancelled_at} < {expires_at}"
        );
        worst = worst.max(cancelled_at - expires_at);
    }
    worst
}

/// The `order.cancelled` events read so far, by order id.
async fn drain_events(consumer: &mut lapin::Consumer, seen: &mut HashMap<String, usize>) {
    while let Ok(Some(Ok(delivery))) =
        tokio::time::timeout(Duration::from_millis(300), consumer.next()).await
    {
        let body: serde_json::Value =
            serde_json::from_slice(&delivery.data).expect("the event is JSON");
        let id = body["order_id"].as_str().expect("order_id").to_owned();
        *seen.entry(id).or_default() += 1;
    }
}

fn cli(bin: &Path, env: &TestEnv, args: &[&str]) -> (bool, String) {
    cli_on(bin, env, &env.settings.database_url, args)
}

/// [`cli`] on the database `database_url`.
fn cli_on(bin: &Path, env: &TestEnv, database_url: &SecretUrl, args: &[&str]) -> (bool, String) {
    let out = output_within(
        Command::new(bin)
            .args(args)
            .env("AMQP_URL", env.settings.amqp_url.expose())
            .env("DATABASE_URL", database_url.expose())
            .env("RUST_LOG", "warn"),
        Duration::from_secs(60),
        &format!("{} {}", bin.display(), args.join(" ")),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
