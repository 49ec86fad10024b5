//! A failure that waiting cannot fix for one order (the inventory refusing
//! its release, an `also` statement failing for its row) parks that order
//! at once with the reason, after one attempt, and only that order: the
//! others in its batch are cancelled and released.

use super::*;

/// Replaces the test's inventory server by one that answers
/// `FAILED_PRECONDITION` to every release of `order` (an order the
/// inventory has frozen, say); returns it (its calls counted) and the
/// switch that stops it.
async fn refuse_releases_of(env: &TestEnv, order: &str) -> (RuleInventory, Shutdown) {
    let order = order.to_owned();
    env.inventory_refusing(move |id, _| {
        (id == order).then(|| Status::failed_precondition("the order is frozen by an audit"))
    })
    .await
}

pub(super) async fn an_inventory_refusing_one_order_parks_it_after_one_attempt_and_releases_the_others(
    dialect: Dialect,
) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(2).await;
    let (refused, stop_inventory) = refuse_releases_of(&env, "frozen-1").await;
    let mut settings = env.settings.clone();
    settings.retry.max_attempts = 5;
    settings.retry.base_delay = Duration::from_secs(1);
    settings.retry.quick_retries = 2;
    // The sweeper sweeps often: it must not call the release again for the
    // parked order (its outbox row is given up).
    settings.sweeper.interval = Duration::from_millis(200);
    settings.sweeper.grace = Duration::from_millis(200);
    settings.sweeper.catch_up_window = Duration::ZERO;
    let service = env.service_with(settings).await;

    let frozen = env
        .create_order("frozen-1", Duration::from_millis(1200), &[(0, 5)])
        .await;
    env.publish_timeout(&frozen).await;
    let mut others = Vec::new();
    for i in 0..6 {
        let order = env
            .create_order(
                &format!("thawed-{i}"),
                Duration::from_millis(1200),
                &[(i % 2, 2)],
            )
            .await;
        env.publish_timeout(&order).await;
        others.push(order);
    }

    env.eventually(
        Duration::from_secs(20),
        "the frozen order parked",
        || async { service.metrics.count(Outcome::Parked) == 1 },
    )
    .await;
    let got = parked(&env).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let (kind, error, attempts, body) = &got[0];
    assert_eq!(kind, "release_failed");
    assert_eq!(*attempts, 1, "parked after its first attempt");
    assert!(
        error.contains("FailedPrecondition") && error.contains("frozen"),
        "the inventory's answer is the reason: {error}"
    );
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(body["order_id"], "frozen-1");
    assert_eq!(
        refused.calls("frozen-1"),
        1,
        "no in-process retry of an answer waiting cannot fix"
    );
    assert_eq!(service.metrics.count(Outcome::Retried), 0);

    for order in &others {
        let (status, expires_at, cancelled_at) =
            env.wait_settled(&order.id, Duration::from_secs(10)).await;
        assert_eq!(status, "CANCELLED", "{}", order.id);
        let late = cancelled_at.unwrap() - expires_at;
        assert!(
            late >= chrono::Duration::zero() && late < late_ok(),
            "{} {late}",
            order.id
        );
    }
    env.eventually(
        Duration::from_secs(10),
        "the other orders released",
        || async {
            let mut all = true;
            for order in &others {
                all &= env.release_calls(&order.id).await == Some(1);
            }
            all
        },
    )
    .await;
    // The frozen order is cancelled (the cancel committed before the
    // release), its stock still held, its release waiting for an operator.
    assert_eq!(env.order_state("frozen-1").await.0, "CANCELLED");
    assert_eq!(env.release_calls("frozen-1").await, None);
    assert_eq!(env.stock(0).await, STOCK - 5);
    assert_eq!(env.stock(1).await, STOCK);
    env.eventually(
        Duration::from_secs(10),
        "six acked as cancelled",
        || async { service.metrics.count(Outcome::Cancelled) == 6 },
    )
    .await;
    assert_eq!(service.metrics.count(Outcome::Retried), 0);
    assert_eq!(service.metrics.outbox_given_up_total(), 1);
    env.more_sweeps(&service, 2).await;
    assert_eq!(
        refused.calls("frozen-1"),
        1,
        "the sweeper does not release a given-up order again"
    );
    assert_eq!(parked(&env).await.len(), 0, "parked once, by its delivery");
    service.stop().await.unwrap();
    stop_inventory.trigger();
}

pub(super) async fn an_also_statement_failing_for_one_order_parks_only_that_order(
    dialect: Dialect,
) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    env.shop_exec(env.sql(
        "CREATE TABLE given_back (order_id text PRIMARY KEY, n integer NOT NULL)",
        "CREATE TABLE given_back (order_id VARCHAR(64) PRIMARY KEY, n INT NOT NULL)",
    ))
    .await;
    let mut settings = env.settings.clone();
    // Every order gets a row in `given_back`, with the number in its id:
    // a data error for the one id without a number (PostgreSQL 22P02;
    // MariaDB 1366 in strict mode, its default).
    settings.orders.also = vec![
        env.sql(
            "INSERT INTO given_back (order_id, n) VALUES ($1, CAST(substr($1, 6) AS integer))",
            "INSERT INTO given_back (order_id, n) VALUES (?, SUBSTR(?, 6))",
        )
        .into(),
    ];
    settings.retry.max_attempts = 5;
    settings.sweeper.enabled = false;

    // Every message is in the queue (confirmed) before the service starts
    // and every row is overdue: they come due together. (A timer with
    // `also` statements cancels each order in a transaction of its own; a
    // batch failing for one row is the store's case
    // `a_flip_failing_for_one_row_fails_only_that_order`.)
    let mut ids: Vec<String> = (1..=9).map(|i| format!("also-{i}")).collect();
    ids.insert(4, "also-x".into());
    for id in &ids {
        env.create_order(id, Duration::from_millis(1), &[(0, 1)])
            .await;
        env.publish_raw(serde_json::json!({ "order_id": id }).to_string().as_bytes())
            .await;
    }
    let started = chrono::Utc::now();
    let service = env.service_with(settings).await;

    env.eventually(Duration::from_secs(20), "the bad order parked", || async {
        service.metrics.count(Outcome::Parked) == 1
    })
    .await;
    let got = parked(&env).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let (kind, error, attempts, body) = &got[0];
    assert_eq!(kind, "permanent_failure");
    assert_eq!(*attempts, 1);
    assert!(error.contains("integer"), "the database's error: {error}");
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(body["order_id"], "also-x");
    assert_eq!(
        env.order_state("also-x").await.0,
        "UNPAID",
        "its cancel was rolled back with the statement"
    );

    for id in ids.iter().filter(|id| *id != "also-x") {
        let (status, _, cancelled_at) = env.wait_settled(id, Duration::from_secs(10)).await;
        assert_eq!(status, "CANCELLED", "{id}");
        assert!(
            cancelled_at.unwrap() - started < late_ok() + chrono::Duration::seconds(2),
            "{id} waited for the bad order"
        );
    }
    let given_back: Vec<(String, i32)> = env
        .shop_rows("SELECT order_id, n FROM given_back ORDER BY n")
        .await;
    let expected: Vec<(String, i32)> = (1..=9).map(|i| (format!("also-{i}"), i)).collect();
    assert_eq!(
        given_back, expected,
        "the effects of every other order, once"
    );
    env.eventually(
        Duration::from_secs(10),
        "nine acked as cancelled",
        || async { service.metrics.count(Outcome::Cancelled) == 9 },
    )
    .await;
    assert_eq!(service.metrics.count(Outcome::Retried), 0);
    env.assert_stock_exact(1).await;
    service.stop().await.unwrap();
}
