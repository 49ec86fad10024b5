//! No order abandoned, through the running service: a failure of the
//! environment (the table an `also` statement writes gone for a while)
//! parks and sets aside nothing, says so in readiness, and every order
//! goes through once it is back, past `retry.max_attempts`; a lone row
//! that fails for its own values is parked once and set aside by the
//! sweeper, whose sweeps go on; deadlines that are no time (PostgreSQL's
//! `infinity`, MariaDB's zero date) kill no task, and the orders around
//! them are cancelled.

use std::time::Duration;

use order_timeout::settings::{DEFAULT_TIMER, Release, Settings};
use order_timeout::testing::metrics::{Outcome, SweepResult};

use crate::common::{Dialect, TestEnv, http_get, on_both_dialects, ready, refusing_trigger};

/// The service's settings for these tests: stock given back by an `also`
/// statement writing `aside_stock`, a sweeper every second.
fn settings(env: &TestEnv) -> Settings {
    let mut settings = env.settings.clone();
    settings.orders.also = vec![
        env.sql(
            "INSERT INTO aside_stock (order_id) VALUES ($1)",
            "INSERT INTO aside_stock (order_id) VALUES (?)",
        )
        .into(),
    ];
    settings.inventory.release = Release::None;
    settings.sweeper.interval = Duration::from_secs(1);
    settings.sweeper.grace = Duration::from_secs(3);
    settings.sweeper.catch_up_window = Duration::ZERO;
    settings
}

const STOCK_TABLE: &str = "CREATE TABLE aside_stock (order_id VARCHAR(128) NOT NULL PRIMARY KEY)";

/// Rows of the table of rows set aside.
async fn set_aside_rows(env: &TestEnv) -> i64 {
    env.shop_rows::<(i64,)>("SELECT COUNT(*) FROM order_timeout_set_aside")
        .await[0]
        .0
}

async fn an_environment_failure_parks_nothing_and_every_order_goes_through_once_fixed(
    dialect: Dialect,
) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    env.shop_exec(STOCK_TABLE).await;
    let mut settings = settings(&env);
    settings.retry.max_attempts = 2;
    let service = env.service_with(settings).await;
    env.eventually(Duration::from_secs(20), "the service ready", || {
        ready(service.http_addr)
    })
    .await;
    // The shop's migration drops the table (and recreates it later).
    env.shop_exec("DROP TABLE aside_stock").await;
    let ids: Vec<String> = (0..5).map(|i| format!("env-{i}")).collect();
    for id in &ids {
        let order = env
            .create_order(id, Duration::from_millis(500), &[(0, 1)])
            .await;
        env.publish_timeout(&order).await;
    }
    env.eventually(Duration::from_secs(15), "the timer failing", || async {
        service.metrics.failing_timers() == [DEFAULT_TIMER]
    })
    .await;
    env.eventually(Duration::from_secs(10), "readiness saying so", || async {
        !ready(service.http_addr).await
    })
    .await;
    // Long enough for more failed attempts than `max_attempts`.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(env.parked_count().await, 0, "nothing parked");
    assert_eq!(set_aside_rows(&env).await, 0, "nothing set aside");
    assert_eq!(env.count("env-", "UNPAID").await, 5);
    assert!(service.metrics.count(Outcome::Retried) >= 5);

    env.shop_exec(STOCK_TABLE).await;
    env.eventually(
        Duration::from_secs(60),
        "every order cancelled once the table is back",
        || async { env.count("env-", "CANCELLED").await == 5 },
    )
    .await;
    env.eventually(
        Duration::from_secs(10),
        "the timer running again",
        || async { service.metrics.failing_timers().is_empty() },
    )
    .await;
    env.eventually(Duration::from_secs(10), "ready again", || {
        ready(service.http_addr)
    })
    .await;
    let stock: Vec<(i64,)> = env.shop_rows("SELECT COUNT(*) FROM aside_stock").await;
    assert_eq!(stock[0].0, 5, "each order's effect once");
    assert_eq!(env.parked_count().await, 0);
    assert_eq!(set_aside_rows(&env).await, 0);
    assert_eq!(env.cancelled_early().await, 0);
    service.stop().await.unwrap();
}

async fn a_sweep_that_fails_for_the_environment_says_so_until_it_runs_again(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    env.shop_exec(STOCK_TABLE).await;
    let service = env.service_with(settings(&env)).await;
    env.eventually(Duration::from_secs(20), "the service ready", || {
        ready(service.http_addr)
    })
    .await;
    // A shop migration renames the deadline column for a while: every
    // sweep's scan fails, with no order anywhere.
    env.shop_exec("ALTER TABLE orders RENAME COLUMN expires_at TO expires_at_old")
        .await;
    env.eventually(Duration::from_secs(15), "the timer failing", || async {
        service.metrics.failing_timers() == [DEFAULT_TIMER]
    })
    .await;
    env.shop_exec("ALTER TABLE orders RENAME COLUMN expires_at_old TO expires_at")
        .await;
    // Nothing to cancel: the sweeps running again is what says so.
    env.eventually(Duration::from_secs(15), "running again", || async {
        service.metrics.failing_timers().is_empty()
    })
    .await;
    env.eventually(Duration::from_secs(10), "ready again", || {
        ready(service.http_addr)
    })
    .await;
    service.stop().await.unwrap();
}

async fn a_lone_row_failing_for_itself_is_parked_once_and_set_aside_by_the_sweeper(
    dialect: Dialect,
) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    env.shop_exec(STOCK_TABLE).await;
    let (postgres, mysql) = refusing_trigger("refuse_one", Some("lone-p1"));
    env.shop_exec(env.sql(&postgres, &mysql)).await;
    // Overdue and never published: the sweeper meets it alone.
    env.create_order("lone-p1", Duration::from_millis(1), &[(0, 1)])
        .await;
    env.shop_exec(env.sql(
        "UPDATE orders SET expires_at = now() - interval '1 minute' WHERE id = 'lone-p1'",
        "UPDATE orders SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE WHERE id = 'lone-p1'",
    ))
    .await;
    // No `also` statement: the batch path (a timer with `also` statements
    // runs every order on its own anyway).
    let mut settings = settings(&env);
    settings.orders.also.clear();
    let service = env.service_with(settings).await;
    env.eventually(Duration::from_secs(20), "the row parked", || async {
        env.parked_count().await == 1
    })
    .await;
    env.more_sweeps(&service, 3).await;
    assert_eq!(env.parked_count().await, 1, "parked once");
    assert_eq!(set_aside_rows(&env).await, 1, "set aside");
    assert_eq!(
        service.metrics.set_aside_rows_of(DEFAULT_TIMER),
        1,
        "the gauge"
    );
    assert_eq!(
        service
            .metrics
            .sweeps_of(DEFAULT_TIMER, SweepResult::Failed),
        0,
        "no sweep failed"
    );
    assert!(
        service.metrics.failing_timers().is_empty(),
        "the row's fault only"
    );
    let listed = env.cli(&["set-aside", "list", "--json"]).await;
    assert_eq!(listed.code, Some(0), "{listed:?}");
    let row: serde_json::Value = serde_json::from_str(listed.stdout.trim()).unwrap();
    assert_eq!(row["order_id"], "lone-p1");
    assert_eq!(row["timer"], DEFAULT_TIMER);
    assert_eq!(row["attempts"], 1);
    assert!(
        row["reason"]
            .as_str()
            .unwrap()
            .contains("may not be cancelled"),
        "{row}"
    );

    // `release = "none"`: the overview says the inventory is not used,
    // rather than "up".
    let (status, page) = http_get(service.http_addr, "/console").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("not used"), "{page}");
    let (status, page) = http_get(service.http_addr, "/console/set-aside").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("<td>lone-p1</td>") && page.contains("may not be cancelled"),
        "the console lists the row with its reason: {page}"
    );

    // Fixed, and retried on the operator's word: cancelled by the next
    // sweep, without a replay.
    env.shop_exec(env.sql(
        "DROP TRIGGER refuse_one ON orders",
        "DROP TRIGGER refuse_one",
    ))
    .await;
    let retried = env.cli(&["set-aside", "retry", "--all"]).await;
    assert_eq!(retried.code, Some(0), "{retried:?}");
    assert!(retried.stdout.contains("1 row(s)"), "{retried:?}");
    env.eventually(Duration::from_secs(20), "the row cancelled", || async {
        env.count("lone-p1", "CANCELLED").await == 1
    })
    .await;
    env.eventually(Duration::from_secs(10), "the mark forgotten", || async {
        set_aside_rows(&env).await == 0
    })
    .await;
    service.stop().await.unwrap();
}

async fn deadlines_that_are_no_time_kill_no_task(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    env.shop_exec(STOCK_TABLE).await;
    // Rows whose deadline is no time, published and not, sorting first.
    let (values, mode) = match dialect {
        Dialect::Postgres => (vec!["'-infinity'", "'infinity'"], ""),
        Dialect::MySql => (
            vec!["'0000-00-00 00:00:00'"],
            "SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION'; ",
        ),
    };
    let strange: Vec<String> = (0..30).map(|i| format!("never-{i:02}")).collect();
    let rows: Vec<String> = strange
        .iter()
        .enumerate()
        .map(|(i, id)| format!("('{id}', 'UNPAID', {})", values[i % values.len()]))
        .collect();
    env.shop_exec(&format!(
        "{mode}INSERT INTO orders (id, status, expires_at) VALUES {}",
        rows.join(", ")
    ))
    .await;
    let mut settings = settings(&env);
    settings.sweeper.batch = 10;
    let service = env.service_with(settings).await;
    for id in strange.iter().take(3) {
        env.publish_raw(serde_json::json!({ "order_id": id }).to_string().as_bytes())
            .await;
    }
    // Ten published orders, and five never published and overdue.
    for i in 0..10 {
        let order = env
            .create_order(&format!("ok-{i}"), Duration::from_millis(300), &[(0, 1)])
            .await;
        env.publish_timeout(&order).await;
    }
    for i in 0..5 {
        env.create_order(&format!("lost-{i}"), Duration::from_millis(1), &[(0, 1)])
            .await;
    }
    env.shop_exec(env.sql(
        "UPDATE orders SET expires_at = now() - interval '1 minute' WHERE id LIKE 'lost-%'",
        "UPDATE orders SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE WHERE id LIKE 'lost-%'",
    ))
    .await;
    env.eventually(Duration::from_secs(30), "the ten cancelled", || async {
        env.count("ok-", "CANCELLED").await == 10
    })
    .await;
    env.eventually(
        Duration::from_secs(30),
        "the five never published swept",
        || async { env.count("lost-", "CANCELLED").await == 5 },
    )
    .await;
    assert_eq!(env.count("never-", "UNPAID").await, 30, "never due");
    for task in ["batch", "sweeper", "watch"] {
        assert_eq!(service.metrics.task_panics_of(task), 0, "{task}");
    }
    assert_eq!(
        service
            .metrics
            .sweeps_of(DEFAULT_TIMER, SweepResult::Failed),
        0
    );
    env.acked_exactly(&service, Outcome::LeftAlone, 3).await;
    assert_eq!(env.parked_count().await, 0);
    service.stop().await.unwrap();
}

/// Creates `orders` (one item each) due together 3 s from now, each
/// published as a bare id: they come due in one batch.
async fn due_together(env: &TestEnv, orders: &[String]) {
    for id in orders {
        env.create_order(id, Duration::from_secs(60), &[(0, 1)])
            .await;
    }
    let due = chrono::Utc::now() + chrono::Duration::seconds(3);
    for id in orders {
        env.set_deadline(id, due).await;
        env.publish_raw(serde_json::json!({ "order_id": id }).to_string().as_bytes())
            .await;
    }
}

async fn held_stock_rows_delay_only_their_own_orders(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    env.shop_exec(
        "CREATE TABLE hot_stock (k VARCHAR(128) NOT NULL PRIMARY KEY, n INT NOT NULL); \
         INSERT INTO hot_stock (k, n) VALUES ('hot', 0)",
    )
    .await;
    let mut settings = settings(&env);
    // Every order takes a stock row of its own, but the `held-` ones all
    // take the one row the shop will hold.
    settings.orders.also = vec![
        env.sql(
            "INSERT INTO hot_stock (k, n) VALUES (CASE WHEN $1 LIKE 'held-%' THEN 'hot' ELSE $1 END, 1) \
             ON CONFLICT (k) DO UPDATE SET n = hot_stock.n + 1",
            "INSERT INTO hot_stock (k, n) VALUES (IF(? LIKE 'held-%', 'hot', ?), 1) \
             ON DUPLICATE KEY UPDATE n = n + 1",
        )
        .into(),
    ];
    let service = env.service_with(settings).await;
    env.eventually(Duration::from_secs(20), "the service ready", || {
        ready(service.http_addr)
    })
    .await;
    // A checkout holds the hot stock row for longer than db_lock_timeout
    // (5 s): every `held-` order's statement waits for it.
    let mut hold = crate::common::ShopTx::begin(&env.shop).await;
    hold.raw("UPDATE hot_stock SET n = n WHERE k = 'hot'")
        .await
        .unwrap();
    let mut orders = Vec::new();
    for i in 0..3 {
        orders.push(format!("held-{i}"));
    }
    for i in 0..40 {
        orders.push(format!("ok-{i:02}"));
    }
    // One deadline for all: they come due together, in one batch, the
    // held ones first (ids in order).
    due_together(&env, &orders).await;
    env.eventually(
        Duration::from_secs(15),
        "the forty other orders cancelled",
        || async { env.count("ok-", "CANCELLED").await == 40 },
    )
    .await;
    let mut worst = chrono::Duration::zero();
    for id in orders.iter().filter(|id| id.starts_with("ok-")) {
        let (_, expires_at, cancelled_at) = env.order_state(id).await;
        worst = worst.max(cancelled_at.unwrap() - expires_at);
    }
    assert!(
        worst < chrono::Duration::milliseconds(2_500),
        "the other orders waited for the held row: {worst}"
    );
    // The service's own work goes on meanwhile: their events published
    // and marked, readiness up.
    env.eventually(Duration::from_secs(10), "the events marked", || async {
        let marked: Vec<(i64,)> = env
            .shop_rows(
                "SELECT COUNT(*) FROM order_timeout_cancel_outbox \
                  WHERE order_id LIKE 'ok-%' AND event_published_at IS NOT NULL",
            )
            .await;
        marked[0].0 == 40
    })
    .await;
    assert!(
        ready(service.http_addr).await,
        "ready while the row is held"
    );
    assert_eq!(env.count("held-", "UNPAID").await, 3, "held: not yet");
    assert_eq!(env.parked_count().await, 0);

    hold.rollback().await;
    env.eventually(
        Duration::from_secs(20),
        "the held orders cancelled once the row is free",
        || async { env.count("held-", "CANCELLED").await == 3 },
    )
    .await;
    let hot: Vec<(i32,)> = env
        .shop_rows("SELECT n FROM hot_stock WHERE k = 'hot'")
        .await;
    assert_eq!(hot[0].0, 3, "each held order's effect once");
    assert_eq!(env.cancelled_early().await, 0);
    service.stop().await.unwrap();
}

/// Two `also` statements that take two shop rows in opposite orders for
/// alternate orders (`even-*` A then B, `odd-*` B then A), the orders'
/// transactions run side by side: the worst case of lock order, where two
/// orders' transactions can each hold the row the other needs. The
/// database breaks each such deadlock (or a lock wait times out), the
/// victim's transaction is rolled back whole and run again: every order is
/// cancelled once, each effect counted once, none parked or set aside,
/// none more than a few seconds late.
async fn also_statements_taking_rows_in_opposite_orders_lose_nothing(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    env.shop_exec(
        "CREATE TABLE pair_stock (k VARCHAR(8) NOT NULL PRIMARY KEY, n INT NOT NULL); \
         INSERT INTO pair_stock (k, n) VALUES ('A', 0); \
         INSERT INTO pair_stock (k, n) VALUES ('B', 0)",
    )
    .await;
    let first = env.sql(
        "UPDATE pair_stock SET n = n + 1 WHERE k = CASE WHEN $1 LIKE 'even-%' THEN 'A' ELSE 'B' END",
        "UPDATE pair_stock SET n = n + 1 WHERE k = IF(? LIKE 'even-%', 'A', 'B')",
    );
    let second = env.sql(
        "UPDATE pair_stock SET n = n + 1 WHERE k = CASE WHEN $1 LIKE 'even-%' THEN 'B' ELSE 'A' END",
        "UPDATE pair_stock SET n = n + 1 WHERE k = IF(? LIKE 'even-%', 'B', 'A')",
    );
    let mut settings = settings(&env);
    settings.orders.also = vec![first.into(), second.into()];
    settings.db_max_connections = 16;
    let service = env.service_with(settings).await;
    env.eventually(Duration::from_secs(20), "the service ready", || {
        ready(service.http_addr)
    })
    .await;
    let orders: Vec<String> = (0..60)
        .map(|i| format!("{}-{i:02}", if i % 2 == 0 { "even" } else { "odd" }))
        .collect();
    due_together(&env, &orders).await;
    env.eventually(Duration::from_secs(30), "every order cancelled", || async {
        env.count("even-", "CANCELLED").await + env.count("odd-", "CANCELLED").await == 60
    })
    .await;
    let mut worst = chrono::Duration::zero();
    for id in &orders {
        let (_, expires_at, cancelled_at) = env.order_state(id).await;
        worst = worst.max(cancelled_at.unwrap() - expires_at);
    }
    let n: Vec<(i32,)> = env.shop_rows("SELECT n FROM pair_stock ORDER BY k").await;
    assert_eq!(n, [(60,), (60,)], "each order's two effects once");
    assert_eq!(env.parked_count().await, 0);
    assert_eq!(env.cancelled_early().await, 0);
    println!("{dialect:?}: 60 orders taking two rows in opposite orders, worst {worst}");
    // Measured: 0.16 s on PostgreSQL, 0.23 s on MariaDB (1.5 s on
    // PostgreSQL before a lock wait timing out was tried again at once).
    assert!(
        worst < chrono::Duration::seconds(3),
        "worst lateness {worst}"
    );
    service.stop().await.unwrap();
}

on_both_dialects!(
    also_statements_taking_rows_in_opposite_orders_lose_nothing,
    held_stock_rows_delay_only_their_own_orders,
    a_sweep_that_fails_for_the_environment_says_so_until_it_runs_again,
    an_environment_failure_parks_nothing_and_every_order_goes_through_once_fixed,
    a_lone_row_failing_for_itself_is_parked_once_and_set_aside_by_the_sweeper,
    deadlines_that_are_no_time_kill_no_task,
);
