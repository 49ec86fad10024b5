//! Failures that waiting cannot fix, and a broker that refuses work:
//! parked at once with the reason (and only the order they belong to),
//! publishes that back off instead of spinning, deliveries near the
//! queue's delivery limit, and header values at the edges. Against the
//! real RabbitMQ, PostgreSQL and MariaDB: the service-level tests run with
//! the shop's orders on either (`postgres::…`, `mariadb::…`).

use std::time::Duration;

use crate::common::{
    Dialect, RuleInventory, STOCK, TestEnv, on_both_dialects, on_rabbitmq4, ready,
};
use crate::store::mysql_base;
use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable};
use order_timeout::broker::cascade::{cascade_route, shard_level_name};
use order_timeout::broker::headers::{header_int, header_str};
use order_timeout::broker::topology::{self, BindingDestination, DELIVERY_LIMIT};
use order_timeout::observe::metrics::Outcome;
use order_timeout::settings::SecretUrl;
use order_timeout::shutdown::Shutdown;
use order_timeout::store::StoreError;
use order_timeout_tools::scratch;
use tonic::Status;

/// Generous lateness bound for "on time" on a busy 2-core machine.
fn late_ok() -> chrono::Duration {
    chrono::Duration::seconds(3)
}

/// `(kind, error, attempts, body)` of every parked message, taken off the
/// parked queue.
async fn parked(env: &TestEnv) -> Vec<(String, String, i64, Vec<u8>)> {
    env.drain_parked()
        .await
        .into_iter()
        .map(|msg| {
            let headers = msg.properties.headers().clone().unwrap_or_default();
            let h = headers.inner();
            (
                header_str(h.get("x-error-kind")).unwrap_or_default(),
                header_str(h.get("x-error")).unwrap_or_default(),
                h.get("x-attempts").and_then(header_int).unwrap_or(0),
                msg.body.clone(),
            )
        })
        .collect()
}

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

async fn an_inventory_refusing_one_order_parks_it_after_one_attempt_and_releases_the_others(
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
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        refused.calls("frozen-1"),
        1,
        "the sweeper does not release a given-up order again"
    );
    assert_eq!(parked(&env).await.len(), 0, "parked once, by its delivery");
    service.stop().await.unwrap();
    stop_inventory.trigger();
}

async fn an_also_statement_failing_for_one_order_parks_only_that_order(dialect: Dialect) {
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

/// Publishes `body` on the test's confirm channel to `exchange` with
/// `routing_key` and `headers`; panics unless the broker confirms it.
async fn publish_with(
    env: &TestEnv,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    headers: FieldTable,
) {
    let confirm = env
        .channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into())
                .with_headers(headers),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack(), "{exchange} {routing_key}");
}

/// Limits the parked queue and the cascade's level 4 (16 s) to `max`
/// messages, refusing publishes beyond (`reject-publish`).
fn set_limit(env: &TestEnv, max: u32) {
    env.rabbitmqctl(&[
        "-q",
        "set_policy",
        "-p",
        &env.name,
        "--apply-to",
        "queues",
        "limit",
        r"^order-timeout\.delay\.04(\.s[0-9]+)?$",
        &format!(r#"{{"max-length":{max},"overflow":"reject-publish"}}"#),
    ]);
}

/// The paid order `filler`, whose messages fill queues (acked as paid
/// when they reach the consumer).
async fn paid_filler(env: &TestEnv) {
    let paid = env
        .create_order("filler", Duration::from_secs(3600), &[(0, 1)])
        .await;
    assert!(env.pay(&paid.id).await);
}

/// Fills cascade level `level` of every shard with one message of the
/// paid order `filler`, so that a limit of 0 refuses more.
async fn fill_level(env: &TestEnv, level: u32) {
    let delay = 1u64 << level;
    let route = cascade_route(delay, 0);
    for shard in 0..env.settings.cascade_shards.get() {
        let exchange = cascade_route(delay, shard).exchange;
        assert_eq!(exchange, shard_level_name(shard, level));
        publish_with(
            env,
            &exchange,
            &route.routing_key,
            br#"{"order_id":"filler"}"#,
            FieldTable::default(),
        )
        .await;
    }
}

async fn publishes_the_broker_refuses_back_off_instead_of_spinning(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    // The first cascade level of a 16 s delay is full and refuses
    // publishes (a quorum queue over `max-length` with `reject-publish`):
    // one message in it, a limit of 0. (The parked queue no longer fills:
    // the service moves what is parked into the parked store at once.)
    paid_filler(&env).await;
    fill_level(&env, 4).await;
    set_limit(&env, 0);

    let service = env.service().await;
    // A timeout 17.5 s away: the service sends it 16 s down the cascade
    // (one hop, into a full level) and holds the rest.
    let order = env
        .create_order("refused-1", Duration::from_millis(17_500), &[(0, 2)])
        .await;
    env.publish_timeout(&order).await;

    // At least 10 s of refusals, and up to 15 s for the second refusal (a
    // loaded 4.x node can take seconds to refuse): well before the order's
    // deadline, which must still be met once the level takes messages.
    let started = std::time::Instant::now();
    let _ = tokio::time::timeout(Duration::from_secs(15), async {
        while service.metrics.publish_failures() < 2 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let window = started.elapsed().max(Duration::from_secs(10));
    tokio::time::sleep(window.saturating_sub(started.elapsed())).await;
    let failures = service.metrics.publish_failures();
    let requeued = service.metrics.requeued_total();
    println!(
        "in {window:?} of refused publishes: {failures} failed publishes, {requeued} requeues"
    );
    assert!(
        failures >= 2,
        "the publish was refused, and tried again: {failures}"
    );
    // Returned to the queue at once, each message came straight back: one
    // round trip of a few milliseconds, thousands of times in the window.
    assert!(
        failures <= 60,
        "publishes tried again with backoff: {failures}"
    );
    assert!(
        requeued <= 6,
        "deliveries returned at most every few seconds: {requeued}"
    );
    assert_eq!(service.metrics.count(Outcome::Parked), 0);

    // The limit is raised; a quorum queue that has told publishers it is
    // full lets them in again once it is below its limit (emptied here).
    // (RabbitMQ 3.10 never lets them in if the limit is removed instead:
    // the publishers' channels stay refused until they are reopened.)
    set_limit(&env, 100_000);
    let purge = env.amqp.create_channel().await.unwrap();
    for shard in 0..env.settings.cascade_shards.get() {
        purge
            .queue_purge(
                shard_level_name(shard, 4).as_str().into(),
                lapin::options::QueuePurgeOptions::default(),
            )
            .await
            .unwrap();
    }
    let (status, expires_at, cancelled_at) =
        env.wait_settled("refused-1", Duration::from_secs(20)).await;
    assert_eq!(status, "CANCELLED");
    let late = cancelled_at.unwrap() - expires_at;
    assert!(
        late >= chrono::Duration::zero() && late < late_ok(),
        "on time once the broker took the re-schedule: {late}"
    );
    assert!(parked(&env).await.is_empty(), "nothing parked");
    service.stop().await.unwrap();
}

/// A re-schedule the broker refuses is routed again at each try by the
/// time left then, so it goes around a full cascade level within a second
/// or two instead of waiting out the publish patience (8 s) and going back
/// to the queue.
async fn a_refused_re_schedule_takes_another_route_by_the_time_left(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    // Level 4 (16 s) of every shard holds a message and refuses more.
    paid_filler(&env).await;
    fill_level(&env, 4).await;
    set_limit(&env, 0);

    let service = env.service().await;
    // 17.8 s away: 16 s (one hop, refused) while more than 16.5 s are
    // left, then 15 s (levels 3 to 0), which the broker takes.
    let order = env
        .create_order("rerouted-1", Duration::from_millis(17_800), &[(0, 2)])
        .await;
    env.publish_timeout(&order).await;
    let (status, expires_at, cancelled_at) = env
        .wait_settled("rerouted-1", Duration::from_secs(30))
        .await;
    assert_eq!(status, "CANCELLED");
    let late = cancelled_at.unwrap() - expires_at;
    assert!(
        late >= chrono::Duration::zero() && late < late_ok(),
        "on time: {late}"
    );
    let failures = service.metrics.publish_failures();
    assert!(
        (1..=8).contains(&failures),
        "refused into level 4, then taken by another route: {failures} failed publishes"
    );
    assert_eq!(
        service.metrics.requeued_total(),
        0,
        "the delivery was not returned to the queue after the publish patience"
    );
    service.stop().await.unwrap();
}

/// A re-schedule the broker refuses on every route until its deadline is
/// within the hold window is held in-process then, not returned to the
/// queue seconds later.
async fn a_re_schedule_refused_until_the_hold_window_is_held(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    let addr = service.http_addr;
    env.eventually(Duration::from_secs(10), "ready (topology declared)", || {
        ready(addr)
    })
    .await;
    // Levels 0 (1 s) and 1 (2 s) lose their queues' bindings: a delay of
    // 1 or 2 s is unroutable (the publish is mandatory), so refused.
    let levels: Vec<String> = (0..env.settings.cascade_shards.get())
        .flat_map(|shard| [0, 1].map(|level| shard_level_name(shard, level)))
        .collect();
    let channel = env.amqp.create_channel().await.unwrap();
    let specs = topology::binding_specs(&topology::Layout::of(&env.settings));
    for spec in specs {
        let BindingDestination::Queue(queue) = &spec.destination else {
            continue;
        };
        if !levels.contains(queue) {
            continue;
        }
        channel
            .queue_unbind(
                queue.as_str().into(),
                spec.source.as_str().into(),
                spec.routing_key.as_str().into(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    // 3.4 s away: 2 s, then 1 s, both refused, then held at under 2 s.
    let order = env
        .create_order("held-1", Duration::from_millis(3_400), &[(0, 2)])
        .await;
    env.publish_timeout(&order).await;
    let (status, expires_at, cancelled_at) =
        env.wait_settled("held-1", Duration::from_secs(20)).await;
    assert_eq!(status, "CANCELLED");
    let late = cancelled_at.unwrap() - expires_at;
    assert!(
        late >= chrono::Duration::zero() && late < chrono::Duration::seconds(1),
        "held until its deadline, not returned after the publish patience (8 s): {late}"
    );
    assert!(service.metrics.publish_failures() >= 1);
    assert_eq!(service.metrics.requeued_total(), 0);
    service.stop().await.unwrap();
}

/// One string header.
fn header(name: &str, value: AMQPValue) -> FieldTable {
    let mut table = FieldTable::default();
    table.insert(name.into(), value);
    table
}

/// Publishes `body` with `headers` the way the order service publishes a
/// timeout (the entry exchange, `schedule`).
async fn publish_timeout_with(env: &TestEnv, body: String, headers: FieldTable) {
    publish_with(
        env,
        topology::ENTRY_EXCHANGE,
        topology::SCHEDULE_ROUTING_KEY,
        body.as_bytes(),
        headers,
    )
    .await;
}

/// The timeout body for an order.
fn timeout_body(order: &order_timeout_tools::shop::NewOrder) -> String {
    serde_json::json!({
        "order_id": order.id,
        "cancel_at": order_timeout::message::format_instant(order.expires_at),
    })
    .to_string()
}

async fn a_delivery_near_the_delivery_limit_is_parked_before_the_broker_drops_it(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let mut settings = env.settings.clone();
    settings.sweeper.enabled = false;
    let service = env.service_with(settings).await;

    // Returned to the queue almost as often as the queue allows (the
    // count a quorum queue would have written): parked, not handled; the
    // order stays unpaid until an operator replays it.
    let worn = env
        .create_order("worn-1", Duration::from_millis(800), &[(0, 1)])
        .await;
    let count = AMQPValue::LongLongInt(DELIVERY_LIMIT - 1);
    publish_timeout_with(&env, timeout_body(&worn), header("x-delivery-count", count)).await;
    // Returned a few times: handled as usual.
    let fine = env
        .create_order("fine-1", Duration::from_millis(800), &[(0, 1)])
        .await;
    let count = AMQPValue::LongLongInt(5);
    publish_timeout_with(&env, timeout_body(&fine), header("x-delivery-count", count)).await;

    let (status, expires_at, cancelled_at) =
        env.wait_settled("fine-1", Duration::from_secs(10)).await;
    assert_eq!(status, "CANCELLED");
    assert!(cancelled_at.unwrap() >= expires_at);
    env.eventually(Duration::from_secs(10), "one parked", || async {
        service.metrics.count(Outcome::Parked) == 1
    })
    .await;
    let got = parked(&env).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let (kind, error, attempts, body) = &got[0];
    assert_eq!(kind, "delivery_limit");
    assert!(error.contains("delivery limit"), "{error}");
    assert_eq!(*attempts, 1);
    assert_eq!(body, timeout_body(&worn).as_bytes(), "the original body");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.order_state("worn-1").await.0, "UNPAID");
    service.stop().await.unwrap();
}

async fn header_values_at_the_edges_neither_panic_nor_reset_the_attempts(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let mut settings = env.settings.clone();
    settings.retry.max_attempts = 3;
    settings.sweeper.enabled = false;
    let service = env.service_with(settings).await;

    // Deadline headers out of any calendar: the body's deadline counts
    // (or the row's), never an early cancel.
    for (i, ms) in [i64::MAX, i64::MIN, -1, 0].into_iter().enumerate() {
        let order = env
            .create_order(&format!("edge-{i}"), Duration::from_millis(900), &[(0, 1)])
            .await;
        let deadline = AMQPValue::LongLongInt(ms);
        publish_timeout_with(
            &env,
            timeout_body(&order),
            header("x-deadline-ms", deadline),
        )
        .await;
    }
    // An attempt count at the top of u32, and past it, on a message the
    // service re-scheduled (it leaves the cascade), that fails once more
    // (no such order): it stays at the top, it does not start over.
    for (id, attempts) in [
        ("ghost-1", AMQPValue::LongLongInt(4_294_967_295)),
        ("ghost-2", AMQPValue::LongLongInt(i64::MAX)),
        ("ghost-3", AMQPValue::LongString("99999999999".into())),
    ] {
        let body = serde_json::json!({ "order_id": id }).to_string();
        let headers = header("x-attempts", attempts);
        publish_with(&env, topology::READY_EXCHANGE, "", body.as_bytes(), headers).await;
    }

    for i in 0..4 {
        let id = format!("edge-{i}");
        let (status, expires_at, cancelled_at) =
            env.wait_settled(&id, Duration::from_secs(10)).await;
        assert_eq!(status, "CANCELLED", "{id}");
        assert!(cancelled_at.unwrap() >= expires_at, "{id} never early");
    }
    env.eventually(Duration::from_secs(10), "three parked", || async {
        service.metrics.count(Outcome::Parked) == 3
    })
    .await;
    for (kind, _, attempts, _) in parked(&env).await {
        assert_eq!(kind, "unknown_order");
        assert_eq!(attempts, 4_294_967_295, "saturated, not wrapped");
    }
    service.stop().await.unwrap();
}

/// A failure history the order service sent along (`x-attempts: 999`, an
/// old `x-first-failure`: headers copied from a consumed message, say) is
/// not the service's own: its history starts with the service's first
/// failure (here an unknown order, parked at once), through the entry
/// exchange and through a lane entry (which reaches the due queue
/// dead-lettered, on both RabbitMQ versions). Believed, the 999 would have
/// used up `max_attempts` before the first try of a retryable failure.
async fn a_senders_failure_history_is_not_believed(dialect: Dialect) {
    let mut env = TestEnv::on(dialect).await;
    env.settings.lanes = vec![order_timeout::settings::Lane::try_from("4s".to_string()).unwrap()];
    let mut settings = env.settings.clone();
    settings.sweeper.enabled = false;
    let service = env.service_with(settings).await;
    // The lane entry is bound when the service has declared its topology.
    env.eventually(Duration::from_secs(10), "the service ready", || {
        ready(service.http_addr)
    })
    .await;
    let started = chrono::Utc::now();

    let claimed = || {
        let mut h = header("x-attempts", AMQPValue::LongLongInt(999));
        h.insert(
            "x-first-failure".into(),
            AMQPValue::LongString("2000-01-01T00:00:00Z".into()),
        );
        h
    };
    // No such orders: each try fails (`unknown_order`) until the budget
    // is spent.
    let body = |id: &str| serde_json::json!({ "order_id": id }).to_string();
    publish_timeout_with(&env, body("claims-1"), claimed()).await;
    let lane_key = topology::lane_entry_key(env.settings.lanes[0]);
    let lane_body = body("claims-2");
    publish_with(
        &env,
        topology::ENTRY_EXCHANGE,
        &lane_key,
        lane_body.as_bytes(),
        claimed(),
    )
    .await;

    env.eventually(Duration::from_secs(30), "both parked", || async {
        service.metrics.count(Outcome::Parked) == 2
    })
    .await;
    let mut got = env.drain_parked().await;
    got.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    let ids: Vec<_> = got.iter().map(|m| m.order_id.clone()).collect();
    assert_eq!(ids, [Some("claims-1".into()), Some("claims-2".into())]);
    for m in &got {
        assert_eq!(m.error_kind.as_deref(), Some("unknown_order"), "{m:?}");
        assert_eq!(
            m.attempts,
            Some(1),
            "its own first failure, not 999 + 1: {m:?}"
        );
        let first = m.first_failure.expect("a first failure");
        assert!(
            first >= started,
            "its own first failure, not the sender's: {m:?}"
        );
    }
    service.stop().await.unwrap();
}

/// How a real database error must be filed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Filed {
    /// About the row's values: permanent, and the row's fault (its order
    /// is parked and set aside).
    Row,
    /// About the statement or the schema, whatever the row: permanent
    /// (a mapping mistake at `schema check`), but the world's (retried,
    /// never parked).
    World,
    /// Waiting fixes it.
    Transient,
}

/// Asserts how [`StoreError::is_permanent`] and
/// [`StoreError::is_row_fault`] file a real database error.
fn assert_filed(result: Result<impl std::fmt::Debug, sqlx::Error>, expected: Filed, what: &str) {
    let error = StoreError::from(result.expect_err(what));
    let filed = match (error.is_permanent(), error.is_row_fault()) {
        (true, true) => Filed::Row,
        (true, false) => Filed::World,
        (false, false) => Filed::Transient,
        (false, true) => panic!("{what}: {error} is the row's but not permanent"),
    };
    assert_eq!(filed, expected, "{what}: {error}");
}

// PostgreSQL's errors; MariaDB's are `mysql_errors_are_filed_permanent_or_transient`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_errors_are_filed_permanent_or_transient() {
    let env = TestEnv::new().await;
    let pool = &env.pool;
    let run = |sql: &'static str| sqlx::query(sql).execute(pool);
    run("CREATE TABLE filed (id int PRIMARY KEY, n int NOT NULL)")
        .await
        .unwrap();
    run("INSERT INTO filed VALUES (1, 1)").await.unwrap();
    for (sql, what) in [
        ("SELEC 1", "syntax error"),
        ("SELECT * FROM no_such_table", "undefined table"),
        ("SELECT no_such_column FROM filed", "undefined column"),
        (
            "SELECT no_such_function(n) FROM filed",
            "undefined function",
        ),
    ] {
        assert_filed(run(sql).await, Filed::World, what);
    }
    for (sql, what) in [
        ("SELECT 1 / (n - 1) FROM filed", "division by zero"),
        ("SELECT '3000000000'::int4", "out of range"),
        ("SELECT 'abc'::int", "invalid text"),
        ("INSERT INTO filed VALUES (1, 2)", "unique violation"),
        ("INSERT INTO filed VALUES (2, NULL)", "not null violation"),
        (
            "SELECT (SELECT n FROM filed UNION ALL SELECT 2)",
            "more than one row",
        ),
    ] {
        assert_filed(run(sql).await, Filed::Row, what);
    }
    let decode: Result<i32, sqlx::Error> = sqlx::query_scalar("SELECT 'text'::text")
        .fetch_one(pool)
        .await;
    assert_filed(decode, Filed::Row, "a value that does not decode");

    // A statement that runs too long, and a lock held by another session.
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET statement_timeout = 100")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_filed(
        sqlx::query("SELECT pg_sleep(2)").execute(&mut *conn).await,
        Filed::Transient,
        "statement timeout",
    );
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT * FROM filed WHERE id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    sqlx::query("SET statement_timeout = 0")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SET lock_timeout = 100")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_filed(
        sqlx::query("UPDATE filed SET n = 3 WHERE id = 1")
            .execute(&mut *conn)
            .await,
        Filed::Transient,
        "lock wait",
    );
    holder.rollback().await.unwrap();

    // No server, and no free connection.
    let nowhere = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect("postgres://postgres@127.0.0.1:1/none")
        .await;
    assert_filed(nowhere.map(|_| ()), Filed::Transient, "connection refused");
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(200))
        .connect(env.settings.database_url.expose())
        .await
        .unwrap();
    let held = one.acquire().await.unwrap();
    assert_filed(
        sqlx::query("SELECT 1").execute(&one).await,
        Filed::Transient,
        "pool timed out",
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_errors_are_filed_permanent_or_transient() {
    let base = mysql_base();
    let name = scratch::owned_name("ot_filed");
    let url = scratch::with_path(&base, &name).unwrap();
    let pool = order_timeout_tools::shop::prepare_mysql_database(&url, 5)
        .await
        .expect("a MySQL test database");
    let result = mysql_cases(&pool, &url).await;
    pool.close().await;
    let _ = scratch::drop_database(&base, &name).await;
    result
}

async fn mysql_cases(pool: &sqlx::MySqlPool, url: &SecretUrl) {
    let run = |sql: &'static str| sqlx::query(sql).execute(pool);
    run("CREATE TABLE filed (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB")
        .await
        .unwrap();
    run("INSERT INTO filed VALUES (1, 1)").await.unwrap();
    for (sql, what) in [
        ("SELEC 1", "1064 syntax error"),
        ("SELECT * FROM no_such_table", "1146 no such table"),
        ("SELECT no_such_column FROM filed", "1054 unknown column"),
        (
            "SELECT no_such_function(n) FROM filed",
            "1305 no such function",
        ),
    ] {
        assert_filed(run(sql).await, Filed::World, what);
    }
    for (sql, what) in [
        (
            "INSERT INTO filed VALUES (2, 3000000000)",
            "1264 out of range",
        ),
        (
            "INSERT INTO filed VALUES (3, 'abc')",
            "1366 incorrect value",
        ),
        (
            "INSERT INTO filed VALUES (4, 1 / 0)",
            "1365 division by zero",
        ),
        ("INSERT INTO filed VALUES (1, 2)", "1062 duplicate entry"),
        ("INSERT INTO filed VALUES (5, NULL)", "1048 cannot be null"),
        (
            "SELECT (SELECT n FROM filed UNION ALL SELECT 2)",
            "1242 more than one row",
        ),
    ] {
        assert_filed(run(sql).await, Filed::Row, what);
    }

    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET max_statement_time = 0.2")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_filed(
        sqlx::query("SELECT SLEEP(2)").fetch_all(&mut *conn).await,
        Filed::Transient,
        "1969 statement time",
    );
    sqlx::query("SET max_statement_time = 0")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT * FROM filed WHERE id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    sqlx::query("SET innodb_lock_wait_timeout = 1")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_filed(
        sqlx::query("UPDATE filed SET n = 3 WHERE id = 1")
            .execute(&mut *conn)
            .await,
        Filed::Transient,
        "1205 lock wait",
    );
    holder.rollback().await.unwrap();

    let nowhere = sqlx::mysql::MySqlPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect("mysql://root@127.0.0.1:1/none")
        .await;
    assert_filed(nowhere.map(|_| ()), Filed::Transient, "connection refused");
    let one = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(200))
        .connect(url.expose())
        .await
        .unwrap();
    let held = one.acquire().await.unwrap();
    assert_filed(
        sqlx::query("SELECT 1").execute(&one).await,
        Filed::Transient,
        "pool timed out",
    );
    drop(held);
}

on_both_dialects!(
    an_inventory_refusing_one_order_parks_it_after_one_attempt_and_releases_the_others,
    an_also_statement_failing_for_one_order_parks_only_that_order,
    publishes_the_broker_refuses_back_off_instead_of_spinning,
    a_refused_re_schedule_takes_another_route_by_the_time_left,
    a_re_schedule_refused_until_the_hold_window_is_held,
    a_delivery_near_the_delivery_limit_is_parked_before_the_broker_drops_it,
    header_values_at_the_edges_neither_panic_nor_reset_the_attempts,
    a_senders_failure_history_is_not_believed,
);

// On RabbitMQ 4.x: the poison checks (a delivery near the delivery limit,
// an order the inventory refuses, header values at the edges) and
// publishes the broker refuses (`reject-publish`).
on_rabbitmq4!(
    a_delivery_near_the_delivery_limit_is_parked_before_the_broker_drops_it,
    an_inventory_refusing_one_order_parks_it_after_one_attempt_and_releases_the_others,
    header_values_at_the_edges_neither_panic_nor_reset_the_attempts,
    a_senders_failure_history_is_not_believed,
    publishes_the_broker_refuses_back_off_instead_of_spinning,
);
