//! The commands about one order: `schedule --in` far in the future is an
//! error that publishes nothing, and `explain ID` says what happened and
//! what comes next, changing nothing.

use super::*;

/// `schedule --in` far in the future is an error that says so, and nothing
/// is published: past what the clock can carry (a million years), and past
/// the years a timeout message may name (the consumer would park it).
pub(super) async fn schedule_far_in_the_future_is_an_error_and_publishes_nothing(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    for (when, says) in [
        ("1000000years", "--in 1000000years: too far in the future"),
        ("200years", "outside"),
    ] {
        let out = env
            .cli(&["schedule", "--order-id", "far-1", "--in", when])
            .await;
        assert_ne!(out.code, Some(0), "{when}: {out:?}");
        assert!(out.stderr.contains(says), "{when}: {}", out.stderr);
    }
    // A near one goes through: the far ones were refused for being far.
    let near = env
        .cli(&["schedule", "--order-id", "far-2", "--in", "1h"])
        .await;
    assert_eq!(near.code, Some(0), "{near:?}");
    assert!(
        !near.stderr.contains("ERROR"),
        "a normal end: {}",
        near.stderr
    );
    // With no service running, what was published waits in the due queue.
    let pending = env.cli(&["pending", "--json"]).await;
    let pending: serde_json::Value = serde_json::from_str(pending.stdout.trim())
        .unwrap_or_else(|e| panic!("pending --json: {e}: {pending:?}"));
    assert_eq!(
        pending["due"]["messages"], 1,
        "only the near one: {pending}"
    );
    assert_eq!(pending["total"]["messages"], 0, "{pending}");
}

/// `explain ID` tells, for each kind of order, what happened and what comes
/// next, from the row, the outbox, the set-aside marks and the parked store,
/// and changes nothing: an order waiting is due in about an hour (and the
/// sweeper covers it), a paid one is left alone, a cancelled one was flipped
/// by the service with its stock released, an unknown one has its parked
/// message named.
pub(super) async fn explain_says_what_happened_and_what_comes_next(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let later = env
        .create_order("explain-later", Duration::from_secs(3600), &[(0, 1)])
        .await;
    let paid = env
        .create_order("explain-paid", Duration::from_secs(3600), &[(0, 1)])
        .await;
    assert!(env.pay(&paid.id).await);
    let done = env
        .create_order("explain-done", Duration::from_millis(200), &[(0, 2)])
        .await;
    let service = env.service().await;
    env.publish_timeout(&done).await;
    env.publish_timeout(&later).await;
    publish_for_unknown(&env, "explain-ghost").await;
    env.wait_settled("explain-done", WAIT).await;
    wait_parked(&env, &service, 1).await;
    env.eventually(WAIT, "the stock given back", || async {
        let out = env.cli(&["explain", "explain-done", "--json"]).await;
        out.stdout.contains("\"release\":\"done\"")
    })
    .await;
    service.stop().await.unwrap();

    let json = |id: &str| {
        let env = &env;
        let id = id.to_owned();
        async move {
            let out = env.cli(&["explain", &id, "--json"]).await;
            assert_success(&out);
            serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()
        }
    };
    let waiting = json("explain-later").await;
    let verdict = &waiting["timers"][0]["verdict"];
    assert_eq!(verdict["state"], "not_yet_due", "{waiting}");
    let in_secs = verdict["in_secs"].as_i64().unwrap();
    assert!((3000..=3600).contains(&in_secs), "{waiting}");
    assert!(verdict["swept_by"].is_string(), "{waiting}");
    assert_eq!(waiting["timers"][0]["effects"]["release"], "none");

    let paid = json("explain-paid").await;
    assert_eq!(paid["timers"][0]["verdict"]["state"], "paid", "{paid}");

    let done = json("explain-done").await;
    let verdict = &done["timers"][0]["verdict"];
    assert_eq!(verdict["state"], "flipped", "{done}");
    assert!(
        verdict["late_ms"].as_i64().unwrap() >= 0,
        "never early: {done}"
    );
    assert_eq!(done["timers"][0]["effects"]["release"], "done", "{done}");

    let ghost = json("explain-ghost").await;
    assert_eq!(ghost["timers"][0]["verdict"]["state"], "unknown", "{ghost}");
    assert_eq!(ghost["parked_ids"].as_array().unwrap().len(), 1, "{ghost}");

    let text = env.cli(&["explain", "explain-later"]).await;
    assert_success(&text);
    assert!(text.stdout.contains("due in "), "{}", text.stdout);
    assert!(
        text.stdout.contains("the sweeper covers it by"),
        "{}",
        text.stdout
    );
    // Read-only: the waiting order is still waiting, the parked message
    // still parked.
    assert_eq!(env.order_state("explain-later").await.0, "UNPAID");
    assert_eq!(env.parked_kept().await, 1);
}
