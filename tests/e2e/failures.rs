//! When things go wrong: bad input, the inventory down, database
//! connections killed, the broker connection lost, orders nobody published
//! a timeout for. Against the real RabbitMQ and the shop's database on
//! PostgreSQL and on MariaDB (`postgres::…`, `mariadb::…`), each test in
//! its own vhost and databases.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::{Dialect, STOCK, TestEnv, http_get, on_both_dialects, on_rabbitmq4, ready};
use chrono::Utc;
use order_timeout::message::format_instant;
use order_timeout::testing::broker::{header_int, header_str};
use order_timeout::testing::metrics::Outcome;

/// Generous lateness bound for "on time" on a busy 2-core machine.
fn late_ok() -> chrono::Duration {
    chrono::Duration::seconds(3)
}

/// `(kind, error, attempts, body)` of every parked message, taken off the
/// parked queue.
async fn parked(env: &TestEnv) -> Vec<(String, String, i64, Vec<u8>)> {
    let mut out = Vec::new();
    for msg in env.drain_parked().await {
        let headers = msg.properties.headers().clone().unwrap_or_default();
        let h = headers.inner();
        assert_eq!(
            msg.properties.content_type().as_ref().map(|t| t.as_str()),
            Some("application/json"),
            "the sender's properties are kept"
        );
        assert!(h.get("x-death").is_none(), "no broker bookkeeping");
        for required in [
            "x-first-failure",
            "x-last-failure",
            "x-source-queue",
            "x-parked-at",
        ] {
            assert!(
                header_str(h.get(required)).is_some_and(|v| !v.is_empty()),
                "parked message lacks {required}: {h:?}"
            );
        }
        out.push((
            header_str(h.get("x-error-kind")).unwrap_or_default(),
            header_str(h.get("x-error")).unwrap_or_default(),
            h.get("x-attempts").and_then(header_int).unwrap_or(0),
            msg.body.clone(),
        ));
    }
    out
}

async fn every_kind_of_bad_input_is_parked_and_valid_orders_stay_on_time(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(2).await;
    let service = env.service().await;

    let too_large = format!(
        r#"{{"order_id":"big","cancel_at":"2030-01-01T00:00:00Z","pad":"{}"}}"#,
        "x".repeat(70 * 1024)
    );
    let now = format_instant(Utc::now());
    let bad: Vec<(Vec<u8>, &str)> = vec![
        (b"this is not json".to_vec(), "not_json"),
        (b"{\"order_id\": \"a\", ".to_vec(), "not_json"),
        (b"\xff\xfe\xfd".to_vec(), "not_utf8"),
        (Vec::new(), "empty"),
        (b"[1,2,3]".to_vec(), "not_object"),
        (
            br#"{"cancel_at":"2030-01-01T00:00:00Z"}"#.to_vec(),
            "missing_order_id",
        ),
        (br#"{"order_id":""}"#.to_vec(), "invalid_order_id"),
        (br#"{"order_id":{"id":1}}"#.to_vec(), "invalid_order_id"),
        (br#"{"order_id":[1]}"#.to_vec(), "invalid_order_id"),
        (
            br#"{"order_id":"w1","cancel_at":12345}"#.to_vec(),
            "invalid_field",
        ),
        (
            br#"{"order_id":"w2","created_at":"2026-01-01T00:00:00Z","timeout_ms":"soon"}"#
                .to_vec(),
            "invalid_field",
        ),
        (
            br#"{"order_id":"t1","cancel_at":"tomorrow"}"#.to_vec(),
            "invalid_field",
        ),
        (
            br#"{"order_id":"t2","cancel_at":"1999-12-31T23:59:59Z"}"#.to_vec(),
            "invalid_field",
        ),
        (
            br#"{"order_id":"t3","cancel_at":"2100-01-01T00:00:00Z"}"#.to_vec(),
            "invalid_field",
        ),
        (
            format!(r#"{{"order_id":"n1","created_at":"{now}","timeout_ms":-5}}"#).into_bytes(),
            "invalid_field",
        ),
        (
            br#"{"order_id":"amb","cancel_at":"2030-01-01T00:00:00Z","timeout_ms":5}"#.to_vec(),
            "ambiguous",
        ),
        (too_large.into_bytes(), "too_large"),
        (
            format!(r#"{{"order_id":"no-such-order","cancel_at":"{now}"}}"#).into_bytes(),
            "unknown_order",
        ),
    ];

    // Valid orders interleaved with the bad messages.
    let mut valid = Vec::new();
    for (i, (body, _)) in bad.iter().enumerate() {
        let order = env
            .create_order(
                &format!("ok-{i:02}"),
                Duration::from_millis(800 + 150 * i as u64),
                &[(i % 2, 1)],
            )
            .await;
        env.publish_timeout(&order).await;
        env.publish_raw(body).await;
        valid.push(order);
    }

    for order in &valid {
        let (status, expires_at, cancelled_at) =
            env.wait_settled(&order.id, Duration::from_secs(20)).await;
        assert_eq!(status, "CANCELLED", "{}", order.id);
        let cancelled_at = cancelled_at.unwrap();
        assert!(cancelled_at >= expires_at, "{} cancelled early", order.id);
        assert!(
            cancelled_at - expires_at < late_ok(),
            "{} cancelled {:?} late: bad input held it up",
            order.id,
            cancelled_at - expires_at
        );
    }
    env.eventually(
        Duration::from_secs(10),
        "every bad message parked",
        || async { service.metrics.count(Outcome::Parked) == bad.len() as u64 },
    )
    .await;

    let got = parked(&env).await;
    assert_eq!(got.len(), bad.len());
    let mut expected: BTreeMap<Vec<u8>, &str> = BTreeMap::new();
    for (body, kind) in &bad {
        expected.insert(body.clone(), kind);
    }
    for (kind, error, attempts, body) in &got {
        let want = expected.get(body).unwrap_or_else(|| {
            panic!("unexpected parked body {:?}", String::from_utf8_lossy(body))
        });
        assert_eq!(
            kind,
            want,
            "reason of {:?}: {error}",
            String::from_utf8_lossy(&body[..body.len().min(80)])
        );
        assert!(!error.is_empty(), "x-error is set");
        assert_eq!(*attempts, 1, "bad input is parked on its first attempt");
    }
    env.acked_exactly(&service, Outcome::Cancelled, valid.len() as u64)
        .await;
    env.assert_stock_exact(2).await;
    service.stop().await.unwrap();
}

/// Settings for the retry tests: quick retries, short backoff.
fn fast_retries(env: &TestEnv, max_attempts: u32) -> order_timeout::settings::Settings {
    let mut settings = env.settings.clone();
    settings.retry.max_attempts = max_attempts;
    settings.retry.base_delay = Duration::from_secs(1);
    settings.retry.max_delay = Duration::from_secs(2);
    settings.retry.quick_retries = 1;
    settings.inventory_timeout = Duration::from_secs(1);
    settings
}

async fn inventory_down_orders_are_retried_then_released_once_it_is_back(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(3).await;
    let service = env.service_with(fast_retries(&env, 20)).await;
    let mut orders = Vec::new();
    for i in 0..30 {
        orders.push(
            env.create_order(
                &format!("inv-{i:02}"),
                Duration::from_millis(1000 + 20 * i),
                &[(i as usize % 3, 2)],
            )
            .await,
        );
    }
    env.stop_inventory();
    for order in &orders {
        env.publish_timeout(order).await;
    }
    env.eventually(
        Duration::from_secs(20),
        "releases failing and being retried",
        || async { service.metrics.count(Outcome::Retried) >= 30 },
    )
    .await;
    // Nothing released while the inventory is down (its ledger, in
    // PostgreSQL on either dialect).
    let released: i64 = sqlx::query_scalar("SELECT count(*) FROM inventory.releases")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(released, 0);

    env.start_inventory().await;
    for order in &orders {
        let (status, _, _) = env.wait_settled(&order.id, Duration::from_secs(30)).await;
        assert_eq!(status, "CANCELLED");
    }
    env.wait_outbox_done(Duration::from_secs(30)).await;
    for order in &orders {
        assert_eq!(
            env.release_calls(&order.id).await,
            Some(1),
            "{} released once",
            order.id
        );
    }
    assert_eq!(env.cancelled_early().await, 0);
    env.assert_stock_exact(3).await;
    for n in 0..3 {
        assert_eq!(env.stock(n).await, STOCK);
    }
    assert_eq!(service.metrics.count(Outcome::Parked), 0);
    service.stop().await.unwrap();
}

async fn a_hanging_inventory_times_out_and_is_retried_until_it_answers(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service_with(fast_retries(&env, 20)).await;
    let mut orders = Vec::new();
    for i in 0..5 {
        orders.push(
            env.create_order(&format!("hang-{i}"), Duration::from_millis(800), &[(0, 1)])
                .await,
        );
    }
    // In the inventory's place: a server that accepts connections and never
    // answers (a hung process, a black-holed proxy).
    env.stop_inventory();
    let addr: std::net::SocketAddr = env
        .settings
        .inventory_url
        .expose()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let hung = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let hold = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = hung.accept().await {
            open.push(socket);
        }
    });
    for order in &orders {
        env.publish_timeout(order).await;
    }
    env.eventually(
        Duration::from_secs(30),
        "timed-out releases retried",
        || async { service.metrics.count(Outcome::Retried) >= 5 },
    )
    .await;
    assert_eq!(service.metrics.count(Outcome::Cancelled), 0);
    hold.abort();
    let _ = hold.await;
    env.start_inventory().await;
    env.wait_outbox_done(Duration::from_secs(30)).await;
    for order in &orders {
        assert_eq!(env.order_state(&order.id).await.0, "CANCELLED");
        assert_eq!(env.release_calls(&order.id).await, Some(1));
    }
    assert_eq!(env.stock(0).await, STOCK);
    service.stop().await.unwrap();
}

/// Creates order `id` (3 of SKU 0, due in `timeout`), stops the inventory,
/// publishes the timeout and waits until the service (started with
/// `settings`, sweeper off) has parked it. Returns the service and the one
/// parked message.
async fn park_with_inventory_down(
    env: &TestEnv,
    mut settings: order_timeout::settings::Settings,
    id: &str,
    timeout: Duration,
) -> (
    order_timeout::RunningService,
    (String, String, i64, Vec<u8>),
) {
    env.stock_skus(1).await;
    // Keep the safety net out of these tests: it would finish the release
    // once the inventory is back, which is another test's business.
    settings.sweeper.enabled = false;
    let service = env.service_with(settings).await;
    let order = env.create_order(id, timeout, &[(0, 3)]).await;
    env.stop_inventory();
    env.publish_timeout(&order).await;

    env.eventually(Duration::from_secs(30), "the order parked", || async {
        service.metrics.count(Outcome::Parked) == 1
    })
    .await;
    let mut got = parked(env).await;
    assert_eq!(got.len(), 1);
    (service, got.remove(0))
}

async fn inventory_kept_down_parks_after_the_last_attempt_with_the_error(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    let settings = fast_retries(&env, 3);
    let (service, got) =
        park_with_inventory_down(&env, settings, "down-1", Duration::from_millis(500)).await;
    let (kind, error, attempts, body) = &got;
    assert_eq!(kind, "retries_exhausted");
    assert_eq!(*attempts, 3);
    assert!(
        error.contains("inventory"),
        "the last error is kept: {error}"
    );
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(body["order_id"], "down-1", "the original body is kept");
    assert_eq!(service.metrics.count(Outcome::Retried), 2);
    // The order is cancelled; its stock is still held, waiting for an
    // operator (replay) or the sweeper.
    assert_eq!(env.order_state("down-1").await.0, "CANCELLED");
    let stock: i64 = sqlx::query_scalar("SELECT available FROM inventory.stock WHERE sku = $1")
        .bind(env.sku(0))
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(stock, STOCK - 3);
    service.stop().await.unwrap();
}

/// With a sub-second backoff a retry is held in-process instead of going
/// through the delay store; it must still count its attempts and park.
async fn sub_second_retries_held_in_process_still_count_attempts_and_park(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    let mut settings = fast_retries(&env, 3);
    settings.retry.base_delay = Duration::from_millis(200);
    settings.retry.max_delay = Duration::from_millis(400);
    let (service, got) =
        park_with_inventory_down(&env, settings, "held-retry-1", Duration::from_millis(300)).await;
    let (kind, _, attempts, _) = &got;
    assert_eq!(kind, "retries_exhausted");
    assert_eq!(*attempts, 3, "every held retry counted");
    assert_eq!(env.order_state("held-retry-1").await.0, "CANCELLED");
    service.stop().await.unwrap();
}

async fn the_sweeper_finishes_releases_that_ran_out_of_attempts(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let mut settings = fast_retries(&env, 2);
    settings.sweeper.interval = Duration::from_secs(1);
    settings.sweeper.grace = Duration::from_secs(1);
    let service = env.service_with(settings).await;
    let order = env
        .create_order("net-1", Duration::from_millis(500), &[(0, 4)])
        .await;
    env.stop_inventory();
    env.publish_timeout(&order).await;
    env.eventually(Duration::from_secs(30), "the order parked", || async {
        service.metrics.count(Outcome::Parked) == 1
    })
    .await;
    env.start_inventory().await;
    env.wait_outbox_done(Duration::from_secs(30)).await;
    assert_eq!(env.release_calls("net-1").await, Some(1));
    assert_eq!(env.stock(0).await, STOCK);
    service.stop().await.unwrap();
}

async fn database_connections_killed_mid_run_every_order_still_ends_right(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(4).await;
    let service = env.service_with(fast_retries(&env, 20)).await;
    let n = 150usize;
    let mut orders = Vec::new();
    for i in 0..n {
        let order = env
            .create_order(
                &format!("db-{i:03}"),
                Duration::from_millis(1500 + 25 * i as u64),
                &[(i % 4, 1)],
            )
            .await;
        if i % 5 == 0 {
            assert!(env.pay(&order.id).await);
        }
        orders.push(order);
    }
    for order in &orders {
        env.publish_timeout(order).await;
    }
    // For 6 s, kill every connection to this test's databases (the
    // service's, the inventory server's and the harness's) every 300 ms.
    let mut killed = 0i64;
    let end = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < end {
        killed += env.kill_database_connections().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(killed > 0, "the orders database's connections were killed");

    env.eventually(Duration::from_secs(60), "every order settled", || async {
        env.count("db-", "UNPAID").await == 0
    })
    .await;
    assert_eq!(env.count("db-", "PAID").await, (n / 5) as i64);
    assert_eq!(env.count("db-", "CANCELLED").await, (n - n / 5) as i64);
    env.wait_outbox_done(Duration::from_secs(60)).await;
    assert_eq!(env.cancelled_early().await, 0);
    env.assert_stock_exact(4).await;
    let over: i64 = sqlx::query_scalar("SELECT count(*) FROM inventory.releases WHERE calls > 1")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    // A repeated call is allowed (the inventory absorbs it by order id);
    // assert_stock_exact already proved the stock moved once per order.
    println!("{killed} connections killed; {over} releases repeated and absorbed");
    service.stop().await.unwrap();
}

/// Erlang pids of the service's own broker connections in the test's
/// vhost (not the harness's), for `rabbitmqctl close_connection`.
fn service_connections(env: &TestEnv) -> Vec<String> {
    let vhost = env.name.as_str();
    let out = env.rabbitmqctl(&[
        "list_connections",
        "--no-table-headers",
        "pid",
        "vhost",
        "client_properties",
    ]);
    out.lines()
        .filter_map(|line| {
            let mut cols = line.split('\t');
            let name = cols.next()?;
            let v = cols.next()?;
            let props = cols.next()?;
            (v == vhost && props.contains("\"order-timeout\"")).then(|| name.to_owned())
        })
        .collect()
}

async fn a_lost_broker_connection_is_reestablished_and_readiness_follows(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    let addr = service.http_addr;
    env.eventually(Duration::from_secs(10), "ready", || ready(addr))
        .await;
    let before: Vec<_> = (0..20).map(|i| format!("conn-a-{i:02}")).collect();
    for (i, id) in before.iter().enumerate() {
        let order = env
            .create_order(id, Duration::from_millis(1500 + 100 * i as u64), &[(0, 1)])
            .await;
        env.publish_timeout(&order).await;
    }
    let names = service_connections(&env);
    assert_eq!(names.len(), 1, "one service connection: {names:?}");
    // Lose the connection, and keep the broker refusing the service for a
    // while (its user loses its permissions on the vhost; the harness's
    // open channel keeps working).
    let user = url::Url::parse(env.settings.amqp_url.expose())
        .unwrap()
        .username()
        .to_owned();
    let rabbitmqctl = |args: &[&str]| {
        env.rabbitmqctl(args);
    };
    rabbitmqctl(&["clear_permissions", "-p", &env.name, &user]);
    rabbitmqctl(&["close_connection", &names[0], "test: connection lost"]);
    env.eventually(
        Duration::from_secs(10),
        "not ready, broker down",
        || async {
            let (status, body) = http_get(addr, "/readyz").await;
            status == 503 && body.contains("\"broker\":false")
        },
    )
    .await;
    env.eventually(Duration::from_secs(10), "reconnects attempted", || async {
        service.metrics.reconnects() >= 2
    })
    .await;
    rabbitmqctl(&["set_permissions", "-p", &env.name, &user, ".*", ".*", ".*"]);
    env.eventually(Duration::from_secs(40), "ready again", || async {
        ready(addr).await && service_connections(&env).len() == 1
    })
    .await;
    for i in 0..10 {
        let order = env
            .create_order(
                &format!("conn-b-{i:02}"),
                Duration::from_millis(800),
                &[(0, 1)],
            )
            .await;
        env.publish_timeout(&order).await;
    }
    env.eventually(Duration::from_secs(20), "every order cancelled", || async {
        env.count("conn-", "CANCELLED").await == 30
    })
    .await;
    assert_eq!(env.cancelled_early().await, 0);
    env.assert_stock_exact(1).await;
    assert_eq!(env.stock(0).await, STOCK);
    service.stop().await.unwrap();
}

async fn orders_without_any_message_are_swept_once_even_by_two_replicas(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(2).await;
    let mut settings = env.settings.clone();
    settings.sweeper.interval = Duration::from_secs(1);
    settings.sweeper.grace = Duration::from_secs(1);
    settings.sweeper.batch = 7; // several batches per sweep
    let a = env.service_with(settings.clone()).await;
    let b = env.service_with(settings).await;
    // The order service "died" between insert and publish: no messages.
    for i in 0..40 {
        env.create_order(
            &format!("gap-{i:02}"),
            Duration::from_millis(300),
            &[(i % 2, 1)],
        )
        .await;
    }
    let paid = env
        .create_order("gap-paid", Duration::from_millis(300), &[(0, 5)])
        .await;
    assert!(env.pay(&paid.id).await);
    env.create_order("gap-future", Duration::from_secs(3600), &[(1, 5)])
        .await;

    env.eventually(
        Duration::from_secs(20),
        "every overdue order swept",
        || async { env.count("gap-", "CANCELLED").await == 40 },
    )
    .await;
    env.wait_outbox_done(Duration::from_secs(20)).await;
    assert_eq!(env.order_state("gap-paid").await.0, "PAID");
    assert_eq!(env.order_state("gap-future").await.0, "UNPAID");
    for i in 0..40 {
        assert_eq!(env.release_calls(&format!("gap-{i:02}")).await, Some(1));
    }
    env.assert_stock_exact(2).await;
    let swept = a.metrics.swept_total() + b.metrics.swept_total();
    assert_eq!(swept, 40, "each order swept by exactly one replica");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

async fn metrics_health_and_readiness_are_served(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    let addr = service.http_addr;
    let order = env
        .create_order("m-1", Duration::from_millis(600), &[(0, 1)])
        .await;
    env.publish_timeout(&order).await;
    env.publish_raw(b"nope").await;
    env.wait_settled("m-1", Duration::from_secs(10)).await;
    env.wait_outbox_done(Duration::from_secs(10)).await;
    env.eventually(Duration::from_secs(10), "parked", || async {
        service.metrics.count(Outcome::Parked) == 1
    })
    .await;

    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    env.eventually(Duration::from_secs(10), "ready", || ready(addr))
        .await;
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    for expected in [
        "order_timeout_messages_total{result=\"cancelled\",timer=\"cancel_unpaid\"} 1",
        // Unparseable: no timer known.
        "order_timeout_messages_total{result=\"parked\",timer=\"\"} 1",
        "order_timeout_parked_total{reason=\"not_json\"} 1",
        "order_timeout_cancel_lateness_seconds_count{timer=\"cancel_unpaid\"} 1",
        "order_timeout_cancel_lateness_seconds_bucket{le=\"+Inf\",timer=\"cancel_unpaid\"} 1",
        "order_timeout_sweeper_orders_total{timer=\"cancel_unpaid\"} 0",
        "order_timeout_watch_scheduled_total{timer=\"cancel_unpaid\"} 0",
        "order_timeout_stage_duration_seconds_count{stage=\"db\"}",
        "order_timeout_stage_duration_seconds_count{stage=\"inventory\"}",
        "order_timeout_in_flight_messages",
        "order_timeout_held_messages",
        "order_timeout_reconnects_total",
        "order_timeout_ready 1",
        "# EOF",
    ] {
        assert!(
            body.contains(expected),
            "/metrics lacks {expected:?}:\n{body}"
        );
    }

    // The inventory goes away: not ready, and /readyz says which part.
    env.stop_inventory();
    env.eventually(Duration::from_secs(10), "not ready", || async {
        let (status, body) = http_get(addr, "/readyz").await;
        status == 503 && body.contains("\"inventory\":false")
    })
    .await;
    assert_eq!(http_get(addr, "/healthz").await.0, 200, "still alive");
    env.start_inventory().await;
    env.eventually(Duration::from_secs(10), "ready again", || ready(addr))
        .await;
    service.stop().await.unwrap();
}

on_both_dialects!(
    every_kind_of_bad_input_is_parked_and_valid_orders_stay_on_time,
    inventory_down_orders_are_retried_then_released_once_it_is_back,
    a_hanging_inventory_times_out_and_is_retried_until_it_answers,
    inventory_kept_down_parks_after_the_last_attempt_with_the_error,
    sub_second_retries_held_in_process_still_count_attempts_and_park,
    the_sweeper_finishes_releases_that_ran_out_of_attempts,
    database_connections_killed_mid_run_every_order_still_ends_right,
    a_lost_broker_connection_is_reestablished_and_readiness_follows,
    orders_without_any_message_are_swept_once_even_by_two_replicas,
    metrics_health_and_readiness_are_served,
);

// The same on RabbitMQ 4.x: every kind of bad input (17), retries held
// in process that park, and a lost connection with the broker refusing
// the service for a while.
on_rabbitmq4!(
    every_kind_of_bad_input_is_parked_and_valid_orders_stay_on_time,
    sub_second_retries_held_in_process_still_count_attempts_and_park,
    a_lost_broker_connection_is_reestablished_and_readiness_follows,
);
