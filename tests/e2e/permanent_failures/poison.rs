//! Deliveries that could loop forever: one near the queue's delivery limit
//! is parked before the broker drops it, header values at the edges
//! neither panic nor reset the attempts, and a failure history the sender
//! sent along is not believed.

use super::*;
use order_timeout::testing::topology::{
    ENTRY_EXCHANGE, READY_EXCHANGE, SCHEDULE_ROUTING_KEY, lane_entry_key,
};

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
        ENTRY_EXCHANGE,
        SCHEDULE_ROUTING_KEY,
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

pub(super) async fn a_delivery_near_the_delivery_limit_is_parked_before_the_broker_drops_it(
    dialect: Dialect,
) {
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
    // Parked instead of handled: the one message acked as cancelled is
    // fine-1's, due at the same moment.
    env.acked_exactly(&service, Outcome::Cancelled, 1).await;
    assert_eq!(env.order_state("worn-1").await.0, "UNPAID");
    service.stop().await.unwrap();
}

pub(super) async fn header_values_at_the_edges_neither_panic_nor_reset_the_attempts(
    dialect: Dialect,
) {
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
        publish_with(&env, READY_EXCHANGE, "", body.as_bytes(), headers).await;
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
pub(super) async fn a_senders_failure_history_is_not_believed(dialect: Dialect) {
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
    let lane_key = lane_entry_key(env.settings.lanes[0]);
    let lane_body = body("claims-2");
    publish_with(
        &env,
        ENTRY_EXCHANGE,
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
