//! The sweeper's side of the outbox, run by the real service against the
//! real RabbitMQ, an inventory server wrapping the reference one, and both
//! PostgreSQL and MariaDB: releases that keep failing wait their backoff
//! and do not starve newer ones; a release the inventory refuses for good
//! is given up, counted and parked (`release_failed`) and not called again
//! until the parked message is replayed; finished rows past the retention
//! are deleted, pending and recent ones kept.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use order_timeout::settings::{SecretUrl, Settings};
use order_timeout::shutdown::Shutdown;
use order_timeout::testing::broker::header_str;
use order_timeout_tools::scratch;
use tonic::Status;

use crate::common::{RuleInventory, TestEnv};
use crate::store::mysql_base;

/// The inventory of the outbox tests: the reference inventory, except for
/// releases of orders named `stuck-*` (always `UNAVAILABLE`), `later-*`
/// (`UNAVAILABLE` on the first call only) and `frozen-*`
/// (`FAILED_PRECONDITION` while the returned switch is set, as it is at
/// first).
async fn picky_inventory(env: &TestEnv) -> (RuleInventory, Arc<AtomicBool>, Shutdown) {
    let frozen = Arc::new(AtomicBool::new(true));
    let still_frozen = frozen.clone();
    let (inventory, stop) = env
        .inventory_refusing(move |id, call| {
            if id.starts_with("stuck-") || (id.starts_with("later-") && call == 1) {
                Some(Status::unavailable("the stock shard is down"))
            } else if id.starts_with("frozen-") && still_frozen.load(Ordering::SeqCst) {
                Some(Status::failed_precondition(
                    "the order is frozen by an audit",
                ))
            } else {
                None
            }
        })
        .await;
    (inventory, frozen, stop)
}

/// The shop's database of a test: the test's own PostgreSQL database, or
/// a MariaDB database of its own (dropped afterwards), both with the
/// reference schema and the service's migrations.
enum Shop {
    Pg(sqlx::PgPool),
    My {
        pool: sqlx::MySqlPool,
        url: SecretUrl,
        name: String,
    },
}

impl Shop {
    async fn new(env: &TestEnv, mariadb: bool) -> Self {
        if !mariadb {
            return Self::Pg(env.pool.clone());
        }
        let name = scratch::owned_name("ot_outbox");
        let url = scratch::with_path(&mysql_base(), &name).unwrap();
        let pool = order_timeout_tools::shop::prepare_mysql_database(&url, 5)
            .await
            .expect("prepare the MariaDB shop database");
        Self::My { pool, url, name }
    }

    /// The settings of a service on this database, sweeping every 200 ms
    /// with a short grace, `batch` rows per scan.
    fn settings(&self, env: &TestEnv, batch: u32) -> Settings {
        let mut settings = env.settings.clone();
        if let Self::My { url, .. } = self {
            settings.database_url = url.clone();
        }
        settings.sweeper.enabled = true;
        settings.sweeper.interval = Duration::from_millis(200);
        settings.sweeper.grace = Duration::from_millis(200);
        settings.sweeper.catch_up_window = Duration::ZERO;
        settings.sweeper.batch = batch;
        settings.retry.base_delay = Duration::from_millis(500);
        settings.retry.quick_retries = 0;
        settings.retry.max_attempts = 50;
        settings
    }

    /// An unpaid order overdue by a few seconds, with one item, and no
    /// timeout message: the sweeper's to cancel.
    async fn overdue_order(&self, id: &str) {
        let due = Utc::now() - chrono::Duration::seconds(5);
        match self {
            Self::Pg(pool) => {
                sqlx::query(
                    "INSERT INTO orders (id, status, expires_at) VALUES ($1, 'UNPAID', $2)",
                )
                .bind(id)
                .bind(due)
                .execute(pool)
                .await
                .unwrap();
                sqlx::query(
                    "INSERT INTO order_items (order_id, sku, quantity) VALUES ($1, 'sku-o', 1)",
                )
                .bind(id)
                .execute(pool)
                .await
                .unwrap();
            }
            Self::My { pool, .. } => {
                sqlx::query("INSERT INTO orders (id, status, expires_at) VALUES (?, 'UNPAID', ?)")
                    .bind(id)
                    .bind(due)
                    .execute(pool)
                    .await
                    .unwrap();
                sqlx::query(
                    "INSERT INTO order_items (order_id, sku, quantity) VALUES (?, 'sku-o', 1)",
                )
                .bind(id)
                .execute(pool)
                .await
                .unwrap();
            }
        }
    }

    /// `(attempts, released, given up)` of the order's outbox row, if any.
    async fn outbox(&self, id: &str) -> Option<(i64, bool, bool)> {
        let row: Option<(i64, i64, i64)> = match self {
            Self::Pg(pool) => sqlx::query_as(
                "SELECT attempts::bigint, \
                        (stock_released_at IS NOT NULL)::int::bigint, \
                        (gave_up_at IS NOT NULL)::int::bigint \
                   FROM order_timeout_cancel_outbox WHERE order_id = $1",
            )
            .bind(id)
            .fetch_optional(pool)
            .await
            .unwrap(),
            Self::My { pool, .. } => sqlx::query_as(
                "SELECT CAST(attempts AS SIGNED), \
                        CAST(stock_released_at IS NOT NULL AS SIGNED), \
                        CAST(gave_up_at IS NOT NULL AS SIGNED) \
                   FROM order_timeout_cancel_outbox WHERE order_id = ?",
            )
            .bind(id)
            .fetch_optional(pool)
            .await
            .unwrap(),
        };
        row.map(|(a, r, g)| (a, r == 1, g == 1))
    }

    /// Moves the order's outbox row `days` into the past.
    async fn age_outbox(&self, id: &str, days: i64) {
        match self {
            Self::Pg(pool) => {
                sqlx::query(
                    "UPDATE order_timeout_cancel_outbox \
                        SET created_at = created_at - make_interval(days => $2) WHERE order_id = $1",
                )
                .bind(id)
                .bind(days as i32)
                .execute(pool)
                .await
                .unwrap();
            }
            Self::My { pool, .. } => {
                sqlx::query(
                    "UPDATE order_timeout_cancel_outbox \
                        SET created_at = created_at - INTERVAL ? DAY WHERE order_id = ?",
                )
                .bind(days)
                .bind(id)
                .execute(pool)
                .await
                .unwrap();
            }
        }
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        if let Self::My { name, .. } = self {
            let _ = scratch::drop_database_blocking(&mysql_base(), name);
        }
    }
}

/// `(kind, order id, body)` of every parked message, taken off the queue.
async fn parked(env: &TestEnv) -> Vec<(String, String, Vec<u8>)> {
    env.drain_parked()
        .await
        .into_iter()
        .map(|msg| {
            let headers = msg.properties.headers().clone().unwrap_or_default();
            let h = headers.inner();
            (
                header_str(h.get("x-error-kind")).unwrap_or_default(),
                header_str(h.get("x-order-id")).unwrap_or_default(),
                msg.body.clone(),
            )
        })
        .collect()
}

/// More rows whose release keeps failing than three scans of the sweeper
/// take, all older than one whose release fails once and then succeeds:
/// the failing rows wait longer and longer, and the newer one is finished
/// within a few sweeps instead of never.
async fn releases_that_keep_failing_do_not_starve_newer_ones(mariadb: bool) {
    let env = TestEnv::new().await;
    let (inventory, _frozen, stop_inventory) = picky_inventory(&env).await;
    let shop = Shop::new(&env, mariadb).await;
    let batch = 4;
    let stuck: Vec<String> = (0..3 * batch).map(|n| format!("stuck-{n:02}")).collect();
    for id in &stuck {
        shop.overdue_order(id).await;
    }
    let service = env.service_with(shop.settings(&env, batch)).await;
    env.eventually(
        Duration::from_secs(30),
        "every stuck order cancelled and its release tried",
        || async {
            let mut all = true;
            for id in &stuck {
                all &= shop.outbox(id).await.is_some_and(|(a, _, _)| a >= 1);
            }
            all
        },
    )
    .await;

    // Newer than every stuck row; its first release fails like theirs.
    shop.overdue_order("later-1").await;
    let started = std::time::Instant::now();
    env.eventually(
        Duration::from_secs(30),
        "the newer order's stock released",
        || async {
            shop.outbox("later-1")
                .await
                .is_some_and(|(_, released, _)| released)
        },
    )
    .await;
    let took = started.elapsed();
    // Its second try is due 0.5-1 s after its first; the scan takes it
    // within a few sweeps of that. Taking the oldest rows first, it would
    // wait until every stuck row was given up (30 attempts each, 4 rows
    // per 200 ms sweep: about 20 s).
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert_eq!(inventory.calls("later-1"), 2, "failed once, then released");
    assert_eq!(env.release_calls("later-1").await, Some(1));
    // The stuck rows were retried, each with its own backoff, and none
    // was given up (the attempts are far from the 30 that give one up).
    let mut attempts = Vec::new();
    for id in &stuck {
        let (n, released, gave_up) = shop.outbox(id).await.unwrap();
        assert!(!released && !gave_up, "{id}");
        attempts.push(n);
    }
    assert!(
        service.metrics.release_failures() >= stuck.len() as u64,
        "{}",
        service.metrics.release_failures()
    );
    println!(
        "{}: later-1 released {took:?} after it was created; stuck rows' attempts {attempts:?}",
        if mariadb { "mariadb" } else { "postgres" }
    );
    service.stop().await.unwrap();
    stop_inventory.trigger();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_that_keep_failing_do_not_starve_newer_ones_on_postgres() {
    releases_that_keep_failing_do_not_starve_newer_ones(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_that_keep_failing_do_not_starve_newer_ones_on_mariadb() {
    releases_that_keep_failing_do_not_starve_newer_ones(true).await;
}

/// A release slower than the outbox lease (the inventory answers after
/// 3 s; the lease is 1 s), with two replicas sweeping: the worker that
/// cancelled an order keeps its lease while the release runs, so the other
/// never takes the same work over: one release call per order. (Before
/// the leases were renewed, the other replica's sweeper took each over
/// after a second and called the inventory again.)
async fn a_release_slower_than_the_lease_is_not_taken_over(mariadb: bool) {
    let env = TestEnv::new().await;
    let slow = |id: &str| id.starts_with("slow-").then_some(Duration::from_secs(3));
    let (inventory, stop_inventory) = env.inventory_pausing(|_, _| None, slow).await;
    let shop = Shop::new(&env, mariadb).await;
    let ids: Vec<String> = (0..3).map(|n| format!("slow-{n}")).collect();
    for id in &ids {
        shop.overdue_order(id).await;
    }
    let mut settings = shop.settings(&env, 10);
    settings.outbox_lease = Duration::from_secs(1);
    settings.inventory_timeout = Duration::from_secs(10);
    settings.retry.quick_retries = 0;
    let one = env.service_with(settings.clone()).await;
    let other = env.service_with(settings).await;
    env.eventually(
        Duration::from_secs(30),
        "every slow release done",
        || async {
            let mut all = true;
            for id in &ids {
                all &= shop
                    .outbox(id)
                    .await
                    .is_some_and(|(_, released, _)| released);
            }
            all
        },
    )
    .await;
    // Sweeps of both replicas go on meanwhile and after: two more of each.
    env.more_sweeps(&one, 2).await;
    env.more_sweeps(&other, 2).await;
    for id in &ids {
        assert_eq!(inventory.calls(id), 1, "{id}: released by one worker, once");
        assert_eq!(env.release_calls(id).await, Some(1), "{id}");
    }
    one.stop().await.unwrap();
    other.stop().await.unwrap();
    stop_inventory.trigger();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_slower_than_the_lease_is_not_taken_over_on_postgres() {
    a_release_slower_than_the_lease_is_not_taken_over(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_slower_than_the_lease_is_not_taken_over_on_mariadb() {
    a_release_slower_than_the_lease_is_not_taken_over(true).await;
}

/// A release the inventory refuses for good: the sweeper gives the row up
/// after one call, counts it, parks the order as `release_failed` and does
/// not call the inventory for it again; replaying the parked message once
/// the inventory accepts releases the stock.
async fn a_refused_release_is_given_up_parked_and_replayable(mariadb: bool) {
    let env = TestEnv::new().await;
    let (inventory, frozen, stop_inventory) = picky_inventory(&env).await;
    let shop = Shop::new(&env, mariadb).await;
    shop.overdue_order("frozen-1").await;
    shop.overdue_order("fine-1").await;
    let service = env.service_with(shop.settings(&env, 10)).await;

    env.eventually(
        Duration::from_secs(30),
        "the refused release given up",
        || async { service.metrics.outbox_given_up_total() == 1 },
    )
    .await;
    let (attempts, released, gave_up) = shop.outbox("frozen-1").await.unwrap();
    assert!(!released && gave_up, "attempts {attempts}");
    assert_eq!(attempts, 1);
    assert!(service.metrics.release_failures() >= 1);
    env.eventually(Duration::from_secs(10), "fine-1 released", || async {
        env.release_calls("fine-1").await == Some(1)
    })
    .await;
    // Many sweeps later: still one call.
    env.more_sweeps(&service, 3).await;
    assert_eq!(inventory.calls("frozen-1"), 1, "the sweeper calls no more");
    let got = parked(&env).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let (kind, order, body) = &got[0];
    assert_eq!(kind, "release_failed");
    assert_eq!(order, "frozen-1");
    let json: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(json["order_id"], "frozen-1");

    // The audit is over; the operator replays the message.
    frozen.store(false, Ordering::SeqCst);
    env.publish_raw(body).await;
    env.eventually(
        Duration::from_secs(20),
        "the replay released the stock",
        || async { env.release_calls("frozen-1").await == Some(1) },
    )
    .await;
    env.eventually(
        Duration::from_secs(10),
        "the row finished and no longer given up",
        || async { shop.outbox("frozen-1").await == Some((1, true, false)) },
    )
    .await;
    assert_eq!(inventory.calls("frozen-1"), 2);
    service.stop().await.unwrap();
    stop_inventory.trigger();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_release_is_given_up_parked_and_replayable_on_postgres() {
    a_refused_release_is_given_up_parked_and_replayable(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_release_is_given_up_parked_and_replayable_on_mariadb() {
    a_refused_release_is_given_up_parked_and_replayable(true).await;
}

/// Finished rows older than `outbox_retention` are deleted by the sweeper;
/// a finished recent one, an old pending one and an old given-up one are
/// kept.
async fn retention_deletes_old_finished_rows_only(mariadb: bool) {
    let env = TestEnv::new().await;
    let (_inventory, _frozen, stop_inventory) = picky_inventory(&env).await;
    let shop = Shop::new(&env, mariadb).await;
    let old: Vec<String> = (0..5).map(|n| format!("done-{n}")).collect();
    let all: Vec<&str> = old
        .iter()
        .map(String::as_str)
        .chain(["recent-1", "stuck-1", "frozen-1"])
        .collect();
    for id in &all {
        shop.overdue_order(id).await;
    }
    // First without retention work to do: every row settles as it will.
    let mut settings = shop.settings(&env, 10);
    settings.sweeper.outbox_retention = Duration::from_secs(24 * 3600);
    let service = env.service_with(settings).await;
    env.eventually(Duration::from_secs(30), "every row settled", || async {
        let mut settled = true;
        for id in old.iter().map(String::as_str).chain(["recent-1"]) {
            settled &= shop.outbox(id).await.is_some_and(|(_, r, _)| r);
        }
        settled &= shop.outbox("frozen-1").await.is_some_and(|(_, _, g)| g);
        settled &= shop.outbox("stuck-1").await.is_some_and(|(a, _, _)| a >= 1);
        settled
    })
    .await;
    // Aged: a finished row (released, its event published) goes with the
    // next sweep; one whose event is still on its way, with a later one.
    for id in old
        .iter()
        .map(String::as_str)
        .chain(["stuck-1", "frozen-1"])
    {
        shop.age_outbox(id, 2).await;
    }
    env.eventually(
        Duration::from_secs(20),
        "the old finished rows deleted",
        || async { service.metrics.outbox_deleted_total() == old.len() as u64 },
    )
    .await;
    env.more_sweeps(&service, 2).await;
    assert_eq!(service.metrics.outbox_deleted_total(), old.len() as u64);
    for id in &old {
        assert_eq!(shop.outbox(id).await, None, "{id}");
    }
    assert!(shop.outbox("recent-1").await.is_some());
    assert!(shop.outbox("stuck-1").await.is_some());
    assert!(shop.outbox("frozen-1").await.is_some());
    service.stop().await.unwrap();
    stop_inventory.trigger();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_old_finished_rows_only_on_postgres() {
    retention_deletes_old_finished_rows_only(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_old_finished_rows_only_on_mariadb() {
    retention_deletes_old_finished_rows_only(true).await;
}
