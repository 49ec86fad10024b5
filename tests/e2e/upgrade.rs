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
use order_timeout::broker::topology::DUE_QUEUE;
use order_timeout::settings::SecretUrl;
use order_timeout::store::OrderItem;
use order_timeout_tools::scratch;
use order_timeout_tools::shop::{self, NewOrder, ShopDb};
use tonic::Status;

use crate::bounds::{KillOnDrop, output_within, step};
use crate::common::{RESTARTS, TestEnv};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_from_the_previous_release_keeps_every_order_in_flight() {
    step("building (or finding) the previous release");
    let previous = release_binary(None);
    let (old, _) = previous_version();
    let current = PathBuf::from(env!("CARGO_BIN_EXE_order-timeout"));
    let _turn = RESTARTS.lock().await;
    let env = TestEnv::migrated_by(&previous).await;
    env.stock_skus(5).await;
    // Releases of held-* fail until the roll is over: their outbox rows
    // stay pending through the upgrade.
    let open = Arc::new(AtomicBool::new(false));
    let opened = open.clone();
    let (_inventory, _stop_inventory) = env
        .inventory_refusing(move |id, _| {
            (id.starts_with("held-") && !opened.load(Ordering::SeqCst))
                .then(|| Status::unavailable("the stock shard is down"))
        })
        .await;

    step("two replicas of the previous release");
    let old_a = Replica::start(&previous, &env, "old-a");
    let old_b = Replica::start(&previous, &env, "old-b");
    wait_consumers(&env, 2, &[&old_a, &old_b]).await;
    let mut events = env.subscribe_events().await;
    let mut seen = HashMap::new();

    // What waits in the previous release's stores when the upgrade starts
    // (t = 0 now; the migration runs at 8 s, the replicas are replaced at
    // 14 s and 22 s):
    // - held-*: due at 2 s; cancelled by the old replicas, their releases
    //   failing until the end of the upgrade (outbox rows pending, their
    //   messages waiting as retries in the cascade);
    // - stream-*: one due every 150 ms from 4 s to 34 s, through the
    //   migration and both replacements (the due queue, held messages);
    // - cascade-*: due at 40–55 s, in the delay cascade all along;
    // - paid-*: due at 10–30 s, paid before: left alone;
    // - late-row: a timeout whose row does not exist yet, parked.
    let start = Utc::now();
    let at = |ms: u64| {
        let due = start + chrono::Duration::milliseconds(ms as i64);
        (due - Utc::now()).to_std().unwrap_or(Duration::ZERO)
    };
    // (id, due in ms from `start`, its one item): created and published sixteen
    // at a time, so that a loaded machine still publishes within the 4 s
    // the timeline allows (one at a time took 5.7 s in CI).
    let mut plan: Vec<(String, u64, (usize, i64))> = Vec::new();
    for i in 0..20u64 {
        plan.push((format!("held-{i:02}"), 2_000, (i as usize % 5, 1)));
    }
    for i in 0..200u64 {
        let item = (i as usize % 5, 1 + i as i64 % 3);
        plan.push((format!("stream-{i:03}"), 4_000 + i * 150, item));
    }
    for i in 0..60u64 {
        plan.push((
            format!("cascade-{i:02}"),
            40_000 + i * 250,
            (i as usize % 5, 2),
        ));
    }
    let n_orders = plan.len() as i64;
    for i in 0..20u64 {
        plan.push((
            format!("paid-{i:02}"),
            10_000 + i * 1_000,
            (i as usize % 5, 1),
        ));
    }
    futures_util::stream::iter(plan)
        .for_each_concurrent(16, |(id, due, item)| {
            let env = &env;
            async move {
                let o = env.create_order(&id, at(due), &[item]).await;
                env.publish_timeout(&o).await;
            }
        })
        .await;
    sqlx::query("UPDATE orders SET status = 'PAID' WHERE starts_with(id, 'paid-')")
        .execute(&env.pool)
        .await
        .unwrap();
    let late_row = serde_json::json!({
        "order_id": "late-row",
        "cancel_at": order_timeout::message::format_instant(Utc::now()),
    });
    env.publish_raw(late_row.to_string().as_bytes()).await;
    let publishing = Utc::now() - start;
    assert!(
        publishing < chrono::Duration::seconds(4),
        "publishing took {publishing}: the timeline below needs it under 4 s"
    );

    env.eventually(
        Duration::from_secs(20),
        "held-* cancelled, releases pending",
        || async {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM order_timeout_cancel_outbox \
              WHERE starts_with(order_id, 'held-') AND stock_released_at IS NULL",
            )
            .fetch_one(&env.pool)
            .await
            .unwrap();
            pending == 20
        },
    )
    .await;
    env.eventually(Duration::from_secs(10), "late-row parked", || async {
        env.parked_count().await == 1
    })
    .await;

    step("migrate with the new release while the old replicas run");
    tokio::time::sleep(at(8_000)).await;
    let (ok, out) = cli(&current, &env, &["migrate"]);
    assert!(ok, "migrate: {out}");
    // Since 0.2.0 every migration is additive: nothing is kept for the
    // previous release (0.1.0 needed an index kept until the contraction;
    // on_mariadb_the_previous_release_runs_against_the_migrated_outbox
    // still upgrades from it).
    assert!(!out.contains("kept for"), "nothing kept for {old}: {out}");
    let migrated_at = Utc::now();

    step("replace the first replica");
    tokio::time::sleep(at(14_000)).await;
    let old_a_logs = old_a.stop().await;
    let stopped_a = Utc::now();
    let new_a = Replica::start(&current, &env, "new-a");
    wait_consumers(&env, 2, &[&new_a, &old_b]).await;
    // Only old replicas ran between the migration and the first stop: the
    // orders cancelled then were cancelled by the previous release, against
    // the migrated outbox.
    let by_old_after_migration: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE status = 'CANCELLED' \
            AND cancelled_at > $1 AND cancelled_at < $2",
    )
    .bind(migrated_at)
    .bind(stopped_a)
    .fetch_one(&env.pool)
    .await
    .unwrap();

    step("replace the second replica");
    tokio::time::sleep(at(22_000)).await;
    let old_b_logs = old_b.stop().await;
    let new_b = Replica::start(&current, &env, "new-b");
    wait_consumers(&env, 2, &[&new_a, &new_b]).await;
    for (name, logs) in [("old-a", &old_a_logs), ("old-b", &old_b_logs)] {
        assert!(
            !logs.contains("no unique or exclusion constraint"),
            "{name} failed against the migrated outbox:\n{logs}"
        );
    }
    assert!(
        by_old_after_migration >= 10,
        "the old replicas cancelled orders after the migration ({by_old_after_migration})"
    );

    step("every order cancelled once, the pending releases finished");
    tokio::time::sleep(at(26_000)).await;
    open.store(true, Ordering::SeqCst);
    env.eventually(Duration::from_secs(60), "every order cancelled", || async {
        env.count("held-", "CANCELLED").await
            + env.count("stream-", "CANCELLED").await
            + env.count("cascade-", "CANCELLED").await
            == n_orders
    })
    .await;
    env.wait_outbox_done(Duration::from_secs(60)).await;
    env.assert_stock_exact(5).await;
    assert_eq!(
        env.count("paid-", "PAID").await,
        20,
        "paid orders left alone"
    );
    let held = lateness(&env, "held-", 20).await;
    let stream = lateness(&env, "stream-", 200).await;
    let cascade = lateness(&env, "cascade-", 60).await;
    eprintln!(
        "upgrade: {n_orders} orders; lateness max: held {held}, stream {stream}, cascade {cascade}; \
         {by_old_after_migration} cancelled by {old} after the migration"
    );
    assert!(
        stream < chrono::Duration::seconds(3),
        "orders due through the migration and the replacements are on time (max {stream})"
    );
    assert!(
        cascade < chrono::Duration::seconds(3),
        "orders waiting in the cascade are on time (max {cascade})"
    );
    let releases: i64 = sqlx::query_scalar("SELECT count(*) FROM inventory.releases")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(releases, n_orders, "one release per cancelled order");
    for i in 0..20 {
        let id = format!("held-{i:02}");
        assert_eq!(env.release_calls(&id).await, Some(1), "{id} released once");
    }
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    while (seen.len() as i64) < n_orders && tokio::time::Instant::now() < end {
        drain_events(&mut events, &mut seen).await;
    }
    drain_events(&mut events, &mut seen).await;
    assert_eq!(seen.len() as i64, n_orders, "an event per order");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "events published twice: {twice:?}");

    step("the parked message of the previous release, replayed by this one");
    let (ok, out) = cli(&current, &env, &["parked", "list"]);
    assert!(
        ok && out.contains("late-row") && out.contains("unknown_order"),
        "parked list: {out}"
    );
    let o = env
        .create_order("late-row", Duration::ZERO, &[(0, 1)])
        .await;
    let _ = o;
    let (ok, out) = cli(&current, &env, &["parked", "replay", "--all"]);
    assert!(ok, "parked replay: {out}");
    env.eventually(Duration::from_secs(20), "late-row cancelled", || async {
        env.order_state("late-row").await.0 == "CANCELLED"
    })
    .await;
    let (_, parked) = cli(&current, &env, &["parked", "list"]);
    assert_eq!(env.parked_count().await, 0, "{parked}");
    new_a.stop().await;
    new_b.stop().await;

    step("the way back before the contraction: the previous release works");
    let back = Replica::start(&previous, &env, "back");
    wait_consumers(&env, 1, &[&back]).await;
    for i in 0..10 {
        let o = env
            .create_order(&format!("back-{i}"), Duration::from_secs(2), &[(1, 1)])
            .await;
        env.publish_timeout(&o).await;
    }
    env.eventually(
        Duration::from_secs(20),
        "back-* cancelled by the previous release",
        || async { env.count("back-", "CANCELLED").await == 10 },
    )
    .await;
    env.wait_outbox_done(Duration::from_secs(20)).await;
    let back_logs = back.stop().await;
    assert!(!back_logs.contains("ERROR"), "{back_logs}");

    step("contract: nothing was kept, and the previous release still works");
    let (ok, out) = cli(&current, &env, &["migrate", "--contract"]);
    assert!(
        ok && out.contains("nothing was kept"),
        "migrate --contract: {out}"
    );
    let again = Replica::start(&previous, &env, "again");
    wait_consumers(&env, 1, &[&again]).await;
    let o = env
        .create_order("after-contract", Duration::from_millis(500), &[(2, 1)])
        .await;
    env.publish_timeout(&o).await;
    env.eventually(
        Duration::from_secs(30),
        "after-contract cancelled",
        || async { env.order_state("after-contract").await.0 == "CANCELLED" },
    )
    .await;
    env.wait_outbox_done(Duration::from_secs(20)).await;
    again.stop().await;
    env.assert_stock_exact(5).await;
}

/// The version is one everywhere a shop reads it: the binary, the newest
/// release in CHANGELOG.md, the Kubernetes image tag and its docs.
#[test]
fn the_version_is_the_changelogs_newest_release_and_the_images_tag() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let version = env!("CARGO_PKG_VERSION");
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_order-timeout")).arg("--version"),
        Duration::from_secs(30),
        "order-timeout --version",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("order-timeout {version}")
    );
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md")).unwrap();
    let newest = changelog
        .lines()
        .find_map(|l| {
            l.strip_prefix("## [")
                .and_then(|r| r.split(']').next())
                .filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit()))
        })
        .expect("a release in CHANGELOG.md");
    assert_eq!(newest, version, "CHANGELOG.md's newest release");
    for (file, needle) in [
        (
            "deploy/kubernetes/kustomization.yaml",
            format!("newTag: \"{version}\""),
        ),
        ("docs/kubernetes.md", format!("order-timeout:{version}")),
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert!(text.contains(&needle), "{file} names {needle}");
    }
    // Every release but the newest names its commit, which
    // scripts/previous-release.sh builds.
    let mut release = None;
    for line in changelog.lines() {
        if let Some(v) = line.strip_prefix("## [").and_then(|r| r.split(']').next()) {
            release = Some(v.to_owned());
        } else if let (Some(v), Some(commit)) = (&release, line.strip_prefix("Commit: `")) {
            let sha = commit.trim_end_matches('`');
            assert!(
                sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
                "release {v}: a full commit hash, not {sha:?}"
            );
        }
    }
}

/// The release the rolling upgrade starts from is exactly the commit
/// CHANGELOG.md names for it, and that commit is the release: it says the
/// version in `Cargo.toml`, and its CHANGELOG.md holds the entry's lists of
/// changes as they are now (an entry named by a commit that lacked some of
/// them, as 0.2.0's first commit `ea41d19` lacked the layout record, fails
/// here). Every named commit is in this checkout's history and says its
/// version. No build: `scripts/previous-release.sh --which`.
#[test]
fn the_previous_release_is_the_commit_the_changelog_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (version, commit) = previous_version();
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md")).unwrap();
    let newest_named = changelog
        .split("\n## [")
        .skip(1)
        .find_map(|e| {
            let v = e.split(']').next()?;
            let c = e.lines().find_map(|l| l.strip_prefix("Commit: `"))?;
            Some((v.to_owned(), c.trim_end_matches('`').to_owned()))
        })
        .expect("a release with a Commit: line");
    assert_eq!(
        (version.clone(), commit.clone()),
        newest_named,
        "the newest named release"
    );
    assert_ne!(
        git(&["rev-parse", "HEAD"]).trim(),
        commit,
        "not this checkout"
    );
    assert_eq!(changelog_commit(&version).as_deref(), Some(commit.as_str()));
    // The entry's lists of changes (from its first `###`), then and now.
    let lists = |text: &str| -> String {
        let entry = text
            .split("\n## ")
            .find(|e| e.starts_with(&format!("[{version}]")))
            .unwrap_or_else(|| panic!("no entry for {version}"));
        entry[entry.find("\n### ").expect("lists of changes")..]
            .trim()
            .to_owned()
    };
    let then = git(&["show", &format!("{commit}:CHANGELOG.md")]);
    assert_eq!(
        lists(&then),
        lists(&changelog),
        "{commit} carries {version}'s entry"
    );
    for line in changelog.lines() {
        let Some(named) = line.strip_prefix("Commit: `") else {
            continue;
        };
        let named = named.trim_end_matches('`');
        let manifest = git(&["show", &format!("{named}:Cargo.toml")]);
        let said = manifest
            .lines()
            .find_map(|l| l.strip_prefix("version = \""))
            .map(|v| v.trim_end_matches('"'))
            .expect("a version");
        assert!(
            changelog.contains(&format!("## [{said}]"))
                && changelog_commit(said).as_deref() == Some(named),
            "{named} says version {said}, which CHANGELOG.md does not name it for"
        );
    }
}

/// A timer other than `cancel_unpaid` is refused while the outbox keeps
/// order ids unique for the previous release, and accepted after `migrate
/// --contract`; a new database is contracted by `migrate` at once.
#[tokio::test]
async fn other_timers_wait_for_the_contraction() {
    let env = TestEnv::new().await;
    let current = PathBuf::from(env!("CARGO_BIN_EXE_order-timeout"));
    let kept: bool = sqlx::query_scalar(
        "SELECT to_regclass('order_timeout_cancel_outbox_order_id') IS NOT NULL",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(!kept, "a new database keeps nothing for an earlier release");
    let config = std::env::temp_dir().join(format!(
        "upgrade-timers-{}.toml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &config,
        r#"
[[timers]]
name = "auto_complete"
from = "PAID"
to = "COMPLETED"
deadline = "expires_at + interval '7 days'"
"#,
    )
    .unwrap();
    let check = || {
        cli(
            &current,
            &env,
            &["--config", config.to_str().unwrap(), "schema", "check"],
        )
    };
    let (ok, out) = check();
    assert!(ok, "schema check on a contracted database: {out}");
    // As 0.1.0's database is after `migrate`: the index kept for it.
    sqlx::query(
        "CREATE UNIQUE INDEX order_timeout_cancel_outbox_order_id \
             ON order_timeout_cancel_outbox (order_id)",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let (ok, out) = check();
    assert!(!ok, "refused while the index is kept: {out}");
    assert!(
        out.contains("auto_complete") && out.contains("migrate --contract"),
        "says which timer and what to run: {out}"
    );
    let (ok, out) = cli(&current, &env, &["migrate"]);
    assert!(
        ok && out.contains("kept for 0.1.0 replicas"),
        "migrate says what it keeps: {out}"
    );
    let (ok, out) = cli(&current, &env, &["migrate", "--contract"]);
    assert!(ok, "{out}");
    let (ok, out) = check();
    assert!(ok, "accepted after the contraction: {out}");
    let _ = std::fs::remove_file(&config);
}

/// MariaDB, from 0.1.0 (built from the commit CHANGELOG.md names for it,
/// whatever the previous release is now): 0.1.0's `ON DUPLICATE KEY` works
/// with the outbox's new key, but
/// its sweeper names no timer, so `migrate` keeps `[[timers]]` refused (a
/// marker row) until `migrate --contract`, which waits for no consumer but
/// this release's replicas. A 0.1.0 replica cancels orders before and after
/// 0.2.0's `migrate`, which rebuilds the outbox while it runs; then a 0.2.0
/// replica takes over. Every order is cancelled, released and recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_mariadb_the_previous_release_runs_against_the_migrated_outbox() {
    step("building (or finding) 0.1.0");
    let previous = release_binary(Some("0.1.0"));
    let current = PathBuf::from(env!("CARGO_BIN_EXE_order-timeout"));
    let _turn = RESTARTS.lock().await;
    let env = TestEnv::new().await;
    env.stock_skus(3).await;
    let name = scratch::owned_name("ot_upgrade");
    let url = scratch::with_path(&crate::store::mysql_base(), &name).unwrap();
    step("0.1.0's migrate on a new MariaDB database");
    let (ok, out) = cli_on(&previous, &env, &url, &["migrate"]);
    assert!(ok, "0.1.0 migrate: {out}");
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(3)
        .connect_with(order_timeout::store::mysql_options(&url).unwrap())
        .await
        .unwrap();
    shop::create_reference_schema_mysql(&pool).await.unwrap();
    let orders = ShopDb::MySql(pool.clone());
    let old = Replica::start_on(&previous, &env, &url, "old-mariadb");
    wait_consumers(&env, 1, &[&old]).await;

    // a-*: due at 2 s, before the migration (at 5 s); b-*: one every
    // 200 ms from 4 s to 12 s, across it; c-*: at 20 s, for 0.2.0.
    let start = Utc::now();
    let mut ids = Vec::new();
    let plan = (0..20u64)
        .map(|i| (format!("a-{i:02}"), 2_000))
        .chain((0..40u64).map(|i| (format!("b-{i:02}"), 4_000 + i * 200)))
        .chain((0..20u64).map(|i| (format!("c-{i:02}"), 20_000)));
    for (i, (id, ms)) in plan.enumerate() {
        let order = NewOrder {
            id: id.clone(),
            expires_at: start + chrono::Duration::milliseconds(ms as i64),
            items: vec![OrderItem {
                sku: env.sku(i % 3),
                quantity: 1,
            }],
        };
        env.inventory
            .reserve(&order.id, &order.items)
            .await
            .unwrap();
        orders.insert_order(&order).await.unwrap();
        env.publish_timeout(&order).await;
        ids.push(id);
    }
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    env.eventually(Duration::from_secs(20), "a-* cancelled by 0.1.0", || {
        count("SELECT COUNT(*) FROM orders WHERE id LIKE 'a-%' AND status = 'CANCELLED'")
            .map(|n| n == 20)
    })
    .await;

    step("0.2.0's migrate while 0.1.0 runs");
    let wait = (start + chrono::Duration::seconds(5) - Utc::now())
        .to_std()
        .unwrap_or(Duration::ZERO);
    tokio::time::sleep(wait).await;
    let migrated_at = Utc::now().naive_utc();
    let (ok, out) = cli_on(&current, &env, &url, &["migrate"]);
    assert!(ok, "migrate: {out}");
    assert!(
        out.contains("kept for 0.1.0 replicas"),
        "a database 0.1.0 ran on keeps [[timers]] refused for it: {out}"
    );
    // What was kept for 0.1.0 stays while a 0.1.0 replica consumes (it
    // records itself nowhere, so its consumer is one too many).
    let (ok, out) = cli_on(&current, &env, &url, &["migrate", "--contract"]);
    assert!(
        !ok && out.contains("1 consumer(s)") && out.contains("earlier release"),
        "migrate --contract beside a 0.1.0 replica: {out}"
    );
    let wait = (start + chrono::Duration::seconds(13) - Utc::now())
        .to_std()
        .unwrap_or(Duration::ZERO);
    tokio::time::sleep(wait).await;
    let old_logs = old.stop().await;
    let stopped_at = Utc::now().naive_utc();
    let by_old: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED' \
            AND cancelled_at > ? AND cancelled_at < ?",
    )
    .bind(migrated_at)
    .bind(stopped_at)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        by_old >= 10,
        "0.1.0 cancelled orders after the migration ({by_old}):\n{old_logs}"
    );
    assert!(!old_logs.contains("ERROR"), "{old_logs}");

    step("0.2.0 takes over");
    let new = Replica::start_on(&current, &env, &url, "new-mariadb");
    env.eventually(Duration::from_secs(40), "every order cancelled", || {
        count("SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED'").map(|n| n == 80)
    })
    .await;
    env.eventually(Duration::from_secs(20), "no outbox work pending", || {
        count(
            "SELECT COUNT(*) FROM order_timeout_cancel_outbox \
              WHERE stock_released_at IS NULL OR event_published_at IS NULL",
        )
        .map(|n| n == 0)
    })
    .await;
    step("[[timers]] refused until the contraction, which waits for 0.1.0 to stop");
    let config = std::env::temp_dir().join(format!(
        "upgrade-timers-{}.toml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &config,
        "[[timers]]\nname = \"auto_complete\"\nfrom = \"PAID\"\nto = \"COMPLETED\"\n\
         deadline = \"expires_at + INTERVAL 7 DAY\"\n",
    )
    .unwrap();
    let config_arg = config.to_str().unwrap();
    let (ok, out) = cli_on(
        &current,
        &env,
        &url,
        &["--config", config_arg, "schema", "check"],
    );
    assert!(
        !ok && out.contains("auto_complete") && out.contains("migrate --contract"),
        "a timer beside 0.1.0 replicas: {out}"
    );
    let (ok, out) = cli_on(&current, &env, &url, &["migrate", "--contract"]);
    assert!(ok, "contract once only this release runs: {out}");
    let (ok, out) = cli_on(
        &current,
        &env,
        &url,
        &["--config", config_arg, "schema", "check"],
    );
    assert!(ok, "the timer accepted after the contraction: {out}");
    let _ = std::fs::remove_file(&config);
    new.stop().await;
    // `now()` in the default `set` has whole seconds on MySQL: a flip at or
    // after the deadline writes at least the deadline's second.
    let early = count(
        "SELECT COUNT(*) FROM orders \
          WHERE cancelled_at < expires_at - INTERVAL MICROSECOND(expires_at) MICROSECOND",
    )
    .await;
    assert_eq!(early, 0, "none early");
    let rows =
        count("SELECT COUNT(*) FROM order_timeout_cancel_outbox WHERE timer = 'cancel_unpaid'")
            .await;
    assert_eq!(rows, 80, "one outbox row per order, the default timer's");
    for id in &ids {
        assert_eq!(env.release_calls(id).await, Some(1), "{id} released once");
    }
    let late = count(
        "SELECT MAX(TIMESTAMPDIFF(SECOND, \
                    expires_at - INTERVAL MICROSECOND(expires_at) MICROSECOND, cancelled_at)) \
           FROM orders",
    )
    .await;
    eprintln!(
        "upgrade on MariaDB: 80 orders, {by_old} cancelled by 0.1.0 after the migration, \
         max lateness {late} s (whole seconds)"
    );
    assert!(late <= 2, "on time through the upgrade: {late} s");
    pool.close().await;
    let _ = scratch::drop_database(&crate::store::mysql_base(), &name).await;
}
