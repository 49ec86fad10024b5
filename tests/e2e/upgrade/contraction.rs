//! From 0.1.0, whose outbox needed order ids unique on their own: other
//! timers wait for `migrate --contract`, and on MariaDB a 0.1.0 replica runs
//! against the outbox this release's `migrate` left.

use super::*;

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
    let _turn = restart_turn().await;
    let env = TestEnv::new().await;
    env.stock_skus(3).await;
    let name = scratch::owned_name("ot_upgrade");
    let url = scratch::with_path(&crate::store::mysql_base(), &name).unwrap();
    step("0.1.0's migrate on a new MariaDB database");
    let (ok, out) = cli_on(&previous, &env, &url, &["migrate"]);
    assert!(ok, "0.1.0 migrate: {out}");
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(3)
        .connect_with(order_timeout::testing::store::mysql_options(&url).unwrap())
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
