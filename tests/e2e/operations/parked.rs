//! `parked list|replay|purge`: listing shows the reasons and leaves the
//! queue as it was (reading delivers nothing), replay by order id succeeds
//! once the cause is fixed, replay all republishes everything, purge
//! deletes what was asked and nothing else.

use super::*;
use order_timeout::testing::topology::{DUE_QUEUE, PARKED_QUEUE};

pub(super) async fn list_shows_reasons_and_leaves_the_queue_as_it_was(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    let service = env.service().await;
    env.publish_raw(b"definitely not json").await;
    wait_parked(&env, &service, 1).await;
    publish_for_unknown(&env, "ghost-1").await;
    wait_parked(&env, &service, 2).await;
    env.publish_raw(b"\xff\xfe not utf-8").await;
    wait_parked(&env, &service, 3).await;
    service.stop().await.unwrap();

    let table = env.cli(&["parked", "list"]).await;
    assert_success(&table);
    let out = &table.stdout;
    assert!(out.contains("ORDER ID"), "{out}");
    assert!(out.contains("ghost-1"), "{out}");
    assert!(out.contains("unknown_order: unknown order"), "{out}");
    assert!(out.contains("not_json"), "{out}");
    assert!(out.contains("3 parked messages"), "{out}");
    assert_eq!(env.parked_count().await, 3, "listing removes nothing");

    // Listing again (and with a limit) shows the same, in the same order.
    let first = json_lines(&env.cli(&["parked", "list", "--json"]).await);
    let limited = env.cli(&["parked", "list", "--limit", "1"]).await;
    assert_success(&limited);
    assert!(
        limited.stdout.contains("1 of 3 parked messages shown"),
        "{}",
        limited.stdout
    );
    let second = json_lines(&env.cli(&["parked", "list", "--json"]).await);
    assert_eq!(first.len(), 3);
    assert_eq!(env.parked_count().await, 3);
    let bodies = |v: &[ParkedJson]| {
        v.iter()
            .map(|m| (m.body.clone(), m.body_base64.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        bodies(&first),
        bodies(&second),
        "order kept across listings"
    );

    let not_json = &first[0];
    assert_eq!(not_json.error_kind.as_deref(), Some("not_json"));
    assert_eq!(not_json.body.as_deref(), Some("definitely not json"));
    assert!(not_json.error.as_deref().is_some_and(|e| !e.is_empty()));
    assert_eq!(not_json.attempts, Some(1));
    assert!(not_json.parked_at.is_some() && not_json.first_failure.is_some());
    assert!(not_json.age_secs.is_some());
    let ghost = &first[1];
    assert_eq!(ghost.order_id.as_deref(), Some("ghost-1"));
    assert_eq!(ghost.error_kind.as_deref(), Some("unknown_order"));
    assert_eq!(ghost.source_queue.as_deref(), Some(DUE_QUEUE));
    let binary = &first[2];
    assert_eq!(binary.body, None);
    assert_eq!(
        binary.body_base64.as_deref(),
        Some("//4gbm90IHV0Zi04"),
        "non-UTF-8 bodies come as base64"
    );
    the_parked_store_reads_without_delivering(&env, &first).await;
}

/// Reading delivers nothing: the parked messages, listed hundreds of times
/// by eight readers at once, are all still there, in the order they were
/// parked, with no delivery counted, and none is left in the queue (the
/// store holds them). Before the parked store, each listing was one more
/// delivery of every message (a queue's delivery limit dropped them) and
/// reordered a quorum queue.
async fn the_parked_store_reads_without_delivering(env: &TestEnv, first: &[ParkedJson]) {
    use order_timeout::ops::parked::{self, Page, Selection};
    let ids: Vec<i64> = first.iter().map(|m| m.id.unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in parking order");
    assert!(
        first.iter().all(|m| m.redeliveries.is_none()),
        "no delivery counted"
    );
    let store = env.parked_store();
    let page = Page {
        selection: Selection::All,
        after: 0,
        limit: 100,
        excerpt: Some(8),
    };
    let reader = async || {
        for _ in 0..50 {
            let listing = parked::list(&store, &page).await.unwrap();
            assert_eq!(listing.total, 3);
            let seen: Vec<i64> = listing.messages.iter().filter_map(|m| m.id).collect();
            assert_eq!(seen, ids, "all there, in order");
        }
    };
    futures_util::future::join_all((0..8).map(|_| reader())).await;
    let again = json_lines(&env.cli(&["parked", "list", "--json"]).await);
    let strip = |v: &[ParkedJson]| {
        v.iter()
            .cloned()
            .map(|mut m| {
                m.age_secs = None;
                m
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&again), strip(first), "unchanged by 400 readings");
    assert_eq!(
        env.queue_depth(PARKED_QUEUE).await,
        0,
        "moved out of the queue"
    );
}

pub(super) async fn replay_by_order_id_succeeds_once_the_cause_is_fixed(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    publish_for_unknown(&env, "ghost-a").await;
    publish_for_unknown(&env, "ghost-b").await;
    wait_parked(&env, &service, 2).await;
    env.publish_raw(b"definitely not json").await;
    wait_parked(&env, &service, 3).await;

    // The order service's row for ghost-a shows up late.
    env.create_order("ghost-a", Duration::from_millis(10), &[(0, 2)])
        .await;
    let out = env
        .cli(&["parked", "replay", "--order-id", "ghost-a"])
        .await;
    assert_success(&out);
    // Its own close is no error: every channel it opened is closed before
    // the connection (a channel left to close itself when dropped raced the
    // connection's close: `ERROR lapin::channels: Connection error ...`).
    assert!(
        !out.stderr.contains("ERROR"),
        "replay logged an error:\n{}",
        out.stderr
    );
    assert!(
        out.stdout.contains("replayed 1 parked message"),
        "{}",
        out.stdout
    );
    let (status, expires_at, cancelled_at) = env.wait_settled("ghost-a", WAIT).await;
    assert_eq!(status, "CANCELLED");
    assert!(cancelled_at.unwrap() >= expires_at);
    env.assert_stock_exact(1).await;

    // The others stay parked, untouched.
    let left = json_lines(&env.cli(&["parked", "list", "--json"]).await);
    let ids: Vec<Option<&str>> = left.iter().map(|m| m.order_id.as_deref()).collect();
    assert_eq!(ids, vec![Some("ghost-b"), None]);

    // Replaying one whose cause is not fixed parks it again, with a fresh
    // attempt count (not the old history plus one).
    let out = env
        .cli(&["parked", "replay", "--order-id", "ghost-b"])
        .await;
    assert_success(&out);
    assert!(out.stdout.contains("replayed 1"), "{}", out.stdout);
    env.eventually(WAIT, "ghost-b parked again", || async {
        service.metrics.count(Outcome::Parked) == 4 && env.parked_count().await == 2
    })
    .await;
    let left = json_lines(&env.cli(&["parked", "list", "--json"]).await);
    let ghost_b = left
        .iter()
        .find(|m| m.order_id.as_deref() == Some("ghost-b"))
        .unwrap();
    assert_eq!(ghost_b.attempts, Some(1), "fresh attempt budget");

    // Nothing matches: nothing replayed.
    let out = env.cli(&["parked", "replay", "--order-id", "nobody"]).await;
    assert_success(&out);
    assert!(out.stdout.contains("replayed 0"), "{}", out.stdout);
    assert_eq!(env.parked_count().await, 2);
    service.stop().await.unwrap();
}

pub(super) async fn replay_all_republishes_everything_parked(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    for i in 0..3 {
        publish_for_unknown(&env, &format!("late-row-{i}")).await;
    }
    wait_parked(&env, &service, 3).await;
    for i in 0..3 {
        env.create_order(
            &format!("late-row-{i}"),
            Duration::from_millis(10),
            &[(0, 1)],
        )
        .await;
    }
    let out = env.cli(&["parked", "replay"]).await;
    assert_eq!(out.code, Some(2), "--all or --order-id is required");

    let out = env.cli(&["parked", "replay", "--all"]).await;
    assert_success(&out);
    assert!(out.stdout.contains("replayed 3"), "{}", out.stdout);
    env.eventually(WAIT, "every order cancelled", || async {
        env.count("late-row-", "CANCELLED").await == 3
    })
    .await;
    assert_eq!(env.parked_count().await, 0);
    env.assert_stock_exact(1).await;
    service.stop().await.unwrap();
}

pub(super) async fn purge_deletes_what_was_asked_and_nothing_else(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    let ago = |d: chrono::Duration| format_instant(Utc::now() - d);
    for (body, parked_at) in [
        ("old-1", ago(chrono::Duration::days(10))),
        ("new-1", ago(chrono::Duration::hours(1))),
        ("old-2", ago(chrono::Duration::days(8))),
    ] {
        env.park_raw(
            body.as_bytes(),
            &[
                ("x-parked-at", parked_at),
                ("x-error-kind", "unknown_order".into()),
            ],
        )
        .await;
    }

    // Answering no deletes nothing.
    let out = env
        .cli_stdin(&["parked", "purge", "--older-than", "7d"], "n\n")
        .await;
    assert_success(&out);
    assert!(
        out.stderr.contains("Delete 2 parked messages? [y/N]"),
        "{}",
        out.stderr
    );
    assert!(out.stdout.contains("deleted 0"), "{}", out.stdout);
    assert_eq!(env.parked_count().await, 3);

    let out = env
        .cli(&["parked", "purge", "--older-than", "7d", "--yes"])
        .await;
    assert_success(&out);
    assert!(
        out.stdout.contains("deleted 2 parked messages (1 kept)"),
        "{}",
        out.stdout
    );
    let left = json_lines(&env.cli(&["parked", "list", "--json"]).await);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].body.as_deref(), Some("new-1"));

    // Without --older-than: everything, after a "y".
    let out = env.cli_stdin(&["parked", "purge"], "y\n").await;
    assert_success(&out);
    assert!(
        out.stdout.contains("deleted 1 parked message"),
        "{}",
        out.stdout
    );
    assert_eq!(env.parked_count().await, 0);

    let out = env
        .cli(&["parked", "purge", "--older-than", "1 fortnight"])
        .await;
    assert_eq!(out.code, Some(2), "bad durations are refused by clap");
}
