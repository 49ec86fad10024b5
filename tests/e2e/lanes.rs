//! Lanes against the real broker: orders that share the configured payment
//! window wait in the lane's queues (one hop) and are cancelled on time,
//! never early; other windows still take the cascade; `topology check`
//! and `pending` know the lanes; a lane entry (`schedule.<W>s`) puts an
//! order straight into its lane. With the shop's orders on PostgreSQL and
//! on MariaDB (`postgres::…`, `mariadb::…`).

use std::time::Duration;

use crate::common::{Dialect, TestEnv, on_both_dialects, ready};
use order_timeout::settings::{Lane, Shards};
use order_timeout::testing::metrics::Outcome;
use order_timeout::testing::topology::{DUE_QUEUE, lane_entry_key, lane_name};

/// Generous bound on lateness for behaviour tests (the benchmark measures
/// the real figure).
const LATE_OK: chrono::Duration = chrono::Duration::milliseconds(3000);

/// A test's world on `dialect` whose service runs one lane of `window` in
/// 3 shards, with one SKU in stock.
async fn with_lane(dialect: Dialect, window: &str) -> (TestEnv, Lane) {
    let mut env = TestEnv::on(dialect).await;
    let lane = Lane::try_from(window.to_string()).unwrap();
    env.settings.lanes = vec![lane];
    env.settings.lane_shards = Shards::try_from(3).unwrap();
    env.stock_skus(1).await;
    (env, lane)
}

async fn orders_sharing_the_lane_window_wait_in_the_lane_and_are_cancelled_on_time(
    dialect: Dialect,
) {
    // A 10 s window: its queues hold each order 8 s, longer than a loaded
    // machine takes to create and publish the 40 (a shorter one let the
    // first orders leave the lane before the last arrived).
    let (env, lane) = with_lane(dialect, "10s").await;
    let service = env.service().await;
    // The lane's queues exist once the service has declared its topology
    // (the suite once probed them before, under load: NOT_FOUND).
    env.eventually(Duration::from_secs(10), "the service ready", || {
        ready(service.http_addr)
    })
    .await;

    // Each published as soon as it is created, as an order service does.
    let mut orders = Vec::new();
    for i in 0..40 {
        let order = env
            .create_order(&format!("lane-{i}"), Duration::from_secs(10), &[(0, 1)])
            .await;
        env.publish_timeout(&order).await;
        orders.push(order);
    }
    // Another window beside the lane's: the cascade, as before.
    let other = env
        .create_order("cascade-1", Duration::from_secs(5), &[(0, 1)])
        .await;
    env.publish_timeout(&other).await;

    // The lane holds them (10 s less the 2 s hold: 8 s), spread over its shards.
    let in_lane = || async {
        let mut by_shard = Vec::new();
        for shard in 0..3 {
            by_shard.push(env.queue_depth(&lane_name(lane, shard)).await);
        }
        by_shard
    };
    env.eventually(Duration::from_secs(8), "40 orders in the lane", || async {
        in_lane().await.iter().sum::<u32>() == 40
    })
    .await;
    let by_shard = in_lane().await;
    assert!(by_shard.iter().all(|&n| n > 0), "{by_shard:?}");

    let pending = env.cli(&["pending", "--json"]).await;
    assert_eq!(pending.code, Some(0), "{}", pending.stderr);
    let json: serde_json::Value = serde_json::from_str(&pending.stdout).unwrap();
    assert_eq!(json["lanes"][0]["lane"], "10s", "{json}");
    assert_eq!(json["lanes"][0]["due_within_secs"], 10);
    assert!(
        json["missing_queues"].as_array().unwrap().is_empty(),
        "{json}"
    );
    let check = env.cli(&["topology", "check"]).await;
    assert_eq!(check.code, Some(0), "{}{}", check.stdout, check.stderr);

    env.cancelled_on_time(
        orders.iter().chain([&other]),
        Duration::from_secs(20),
        LATE_OK,
    )
    .await;
    env.acked_exactly(&service, Outcome::Cancelled, 41).await;
    for shard in 0..3 {
        assert_eq!(env.queue_depth(&lane_name(lane, shard)).await, 0);
    }
    service.stop().await.unwrap();
}

async fn a_lane_entry_goes_straight_into_the_lane_and_is_never_early(dialect: Dialect) {
    // A 10 s window (8 s in the lane): longer than a loaded machine takes
    // to create and publish the 26 orders, so that all are seen in it.
    let (env, lane) = with_lane(dialect, "10s").await;
    let service = env.service().await;
    // The service binds the lane entry when it declares its topology, before
    // it consumes; until then the broker drops what is published with the
    // key (the README says so: start the service with the lane first).
    env.eventually(Duration::from_secs(10), "the service ready", || {
        ready(service.http_addr)
    })
    .await;
    let key = lane_entry_key(lane);
    assert_eq!(key, "schedule.10s");

    // Orders of the lane's window, with their deadline and as bare ids
    // (the deadline then comes from the row), and one whose deadline is
    // later than the window (a publisher's mistake): it must wait for it.
    let mut orders = Vec::new();
    for i in 0..20 {
        let order = env
            .create_order(&format!("entry-{i}"), Duration::from_secs(10), &[(0, 1)])
            .await;
        env.publish_timeout_as(&key, &order).await;
        orders.push(order);
    }
    for i in 0..5 {
        let order = env
            .create_order(&format!("bare-{i}"), Duration::from_secs(10), &[(0, 1)])
            .await;
        env.publish_raw_as(&key, serde_json::json!(order.id).to_string().as_bytes())
            .await;
        orders.push(order);
    }
    let later = env
        .create_order("later-1", Duration::from_secs(18), &[(0, 1)])
        .await;
    env.publish_timeout_as(&key, &later).await;
    env.eventually(Duration::from_secs(8), "26 orders in shard 0", || async {
        env.queue_depth(&lane_name(lane, 0)).await == 26
    })
    .await;
    assert_eq!(env.queue_depth(&lane_name(lane, 1)).await, 0);
    assert_eq!(env.queue_depth(&lane_name(lane, 2)).await, 0);
    assert_eq!(env.queue_depth(DUE_QUEUE).await, 0);
    assert_eq!(service.metrics.count(Outcome::Rescheduled), 0);
    let check = env.cli(&["topology", "check"]).await;
    assert_eq!(check.code, Some(0), "{}{}", check.stdout, check.stderr);

    env.cancelled_on_time(
        orders.iter().chain([&later]),
        Duration::from_secs(30),
        LATE_OK,
    )
    .await;
    env.acked_exactly(&service, Outcome::Cancelled, 26).await;
    assert!(
        service.metrics.count(Outcome::Rescheduled) >= 1,
        "the later order was sent on toward its deadline"
    );
    service.stop().await.unwrap();
}

on_both_dialects!(
    orders_sharing_the_lane_window_wait_in_the_lane_and_are_cancelled_on_time,
    a_lane_entry_goes_straight_into_the_lane_and_is_never_early,
);
