//! `pending`: what waits, by due window, the same figures the service
//! shows on `/metrics` and the console, and a missing queue named.

use super::*;
use order_timeout::testing::topology::PARKED_QUEUE;

pub(super) async fn pending_shows_what_waits_by_due_window(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    // Three orders an hour away (first cascade level 11: due within
    // 4096 s), two 5 minutes away (level 8: within 512 s), one bad message
    // parked.
    for (id, timeout) in [
        ("hour-0", 3600),
        ("hour-1", 3600),
        ("hour-2", 3600),
        ("soon-0", 300),
        ("soon-1", 300),
    ] {
        let order = env
            .create_order(id, Duration::from_secs(timeout), &[(0, 1)])
            .await;
        env.publish_timeout(&order).await;
    }
    env.publish_raw(b"definitely not json").await;
    wait_parked(&env, &service, 1).await;
    env.eventually(WAIT, "the parked message moved into the store", || async {
        env.queue_depth(PARKED_QUEUE).await == 0
    })
    .await;
    env.eventually(WAIT, "five timeouts in the cascade", || async {
        let out = env.cli(&["pending", "--json"]).await;
        serde_json::from_str::<serde_json::Value>(&out.stdout)
            .is_ok_and(|v| v["total"]["messages"] == 5)
    })
    .await;

    let out = env.cli(&["pending", "--json"]).await;
    assert_success(&out);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["total"]["latest_due_secs"], 4096, "{report}");
    let windows = report["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 28);
    assert_eq!(windows[11]["messages"], 3, "{report}");
    assert_eq!(windows[11]["due_within_secs"], 4096);
    let soon: u64 = windows[..=8]
        .iter()
        .map(|w| w["messages"].as_u64().unwrap())
        .sum();
    assert_eq!(soon, 2, "{report}");
    assert_eq!(report["shards"].as_array().unwrap().len(), 2);
    assert_eq!(report["due"]["consumers"], 1, "the service consumes");
    assert_eq!(report["parked"]["messages"], 1);
    assert_eq!(report["parked"]["by_reason"]["not_json"], 1, "{report}");
    assert_eq!(report["missing_queues"], serde_json::json!([]));
    // What falls due when, by bound: the hour-away ones within a day (their
    // level's bound, 4,096 s, is past the hour), the 5-minute ones within
    // 10 minutes.
    let due: Vec<(String, u64, u64)> = report["due_windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["window"].as_str().unwrap().to_owned(),
                w["messages"].as_u64().unwrap(),
                w["cumulative"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, u64, u64)> = [
        ("1m", 0, 0),
        ("10m", 2, 2),
        ("1h", 0, 2),
        ("1d", 3, 5),
        ("7d", 0, 5),
        ("later", 0, 5),
    ]
    .into_iter()
    .map(|(w, n, c)| (w.to_owned(), n, c))
    .collect();
    assert_eq!(due, expected, "{report}");

    let text = env.cli(&["pending"]).await;
    assert_success(&text);
    for needle in [
        "5 timeouts wait in the delay cascade (2 shards); all due within 1h 8m 16s",
        "What falls due when, of the 5 timeouts in the delay store",
        "At the latest",
        "ALL DUE WITHIN",
        "order-timeout.due: 0 ready, 1 consumer",
        "order-timeout.parked: 1 message (not_json 1)",
    ] {
        assert!(
            text.stdout.contains(needle),
            "{needle:?} in\n{}",
            text.stdout
        );
    }
    let never = env.cli(&["pending", "--parked-scan-limit", "0"]).await;
    assert!(
        never.stdout.contains("by reason: not counted"),
        "{}",
        never.stdout
    );

    the_service_shows_the_same(&env, &service).await;
    service.stop().await.unwrap();
    a_missing_queue_is_named(&env).await;
}

/// The figures of `pending_shows_what_waits_by_due_window` on `/metrics`
/// and the console, from the service's own polling.
async fn the_service_shows_the_same(env: &TestEnv, service: &RunningService) {
    // The service measures every 5 s: wait for a measurement taken after
    // all five arrived.
    let waiting = |metrics: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("order_timeout_pending_messages{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    env.eventually(WAIT, "the gauges", || async {
        let (_, metrics) = crate::common::http_get(service.http_addr, "/metrics").await;
        waiting(&metrics) == 5.0
            && metrics.contains("order_timeout_pending_latest_due_seconds 4096")
            && metrics.contains(r#"order_timeout_queue_consumers{queue="order-timeout.due"} 1"#)
            && metrics.contains(r#"order_timeout_queue_messages{queue="order-timeout.parked"} 0"#)
            && metrics.contains("order_timeout_parked_messages 1")
    })
    .await;
    let (status, page) = crate::common::http_get(service.http_addr, "/console/pending").await;
    assert_eq!(status, 200);
    assert!(
        page.contains("5 timeouts wait in the delay cascade"),
        "{page}"
    );
    assert!(
        page.contains("5 timeouts wait: 0 within 1 minute, 2 within 10 minutes, 0 within 1 hour, 3 within 1 day, 0 within 7 days, 0 later."),
        "{page}"
    );
}

/// `pending` names a missing queue, exits 1, and measures the rest.
async fn a_missing_queue_is_named(env: &TestEnv) {
    let channel = env.amqp.create_channel().await.unwrap();
    delete_queue(&channel, &level_name(20)).await;
    let out = env.cli(&["pending", "--json"]).await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        report["missing_queues"],
        serde_json::json!([level_name(20)])
    );
    assert_eq!(report["total"]["messages"], 5, "the rest still measured");
}
