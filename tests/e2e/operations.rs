//! The operator commands, run as the real binary against a real broker and
//! database: `parked list|replay|purge` and `topology check`. Every test
//! runs with the shop's orders on PostgreSQL and on MariaDB
//! (`postgres::…`, `mariadb::…`).

use std::time::Duration;

use crate::common::{Dialect, TestEnv, declare_durable_queue, on_both_dialects, on_rabbitmq4};
use chrono::Utc;
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};
use order_timeout::app::RunningService;
use order_timeout::broker::cascade::level_name;
use order_timeout::broker::topology;
use order_timeout::message::format_instant;
use order_timeout::observe::metrics::Outcome;
use order_timeout::ops::parked::ParkedJson;

const WAIT: Duration = Duration::from_secs(15);

/// Publishes a timeout for an order that has no row yet, due now.
async fn publish_for_unknown(env: &TestEnv, id: &str) {
    env.publish_raw(
        format!(
            r#"{{"order_id":"{id}","cancel_at":"{}"}}"#,
            format_instant(Utc::now())
        )
        .as_bytes(),
    )
    .await;
}

async fn wait_parked(env: &TestEnv, service: &RunningService, n: u64) {
    env.eventually(WAIT, &format!("{n} messages parked"), || async {
        // In the parked store, where the console and the commands read.
        service.metrics.count(Outcome::Parked) >= n && env.parked_kept().await == n
    })
    .await;
}

/// The messages of a successful `parked list --json`.
fn json_lines(out: &crate::common::CliOutput) -> Vec<ParkedJson> {
    assert_success(out);
    out.stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

fn assert_success(out: &crate::common::CliOutput) {
    assert_eq!(
        out.code,
        Some(0),
        "stdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
}

async fn list_shows_reasons_and_leaves_the_queue_as_it_was(dialect: Dialect) {
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
    assert_eq!(ghost.source_queue.as_deref(), Some(topology::DUE_QUEUE));
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
        env.queue_depth(topology::PARKED_QUEUE).await,
        0,
        "moved out of the queue"
    );
}

async fn replay_by_order_id_succeeds_once_the_cause_is_fixed(dialect: Dialect) {
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

async fn replay_all_republishes_everything_parked(dialect: Dialect) {
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

async fn purge_deletes_what_was_asked_and_nothing_else(dialect: Dialect) {
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

async fn delete_queue(channel: &Channel, name: &str) {
    channel
        .queue_delete(name.into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}

/// Level 3 re-created as a classic queue with another TTL, level 5 and
/// shard 1's level 2 deleted, the ready exchange re-created as direct.
/// Returns shard 1's level 2 queue name.
async fn break_the_topology(env: &TestEnv) -> String {
    let channel = env.amqp.create_channel().await.unwrap();
    delete_queue(&channel, &level_name(3)).await;
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(1234));
    declare_durable_queue(&channel, &level_name(3), "classic", args).await;
    delete_queue(&channel, &level_name(5)).await;
    let shard_queue = order_timeout::broker::cascade::shard_level_name(1, 2);
    delete_queue(&channel, &shard_queue).await;
    channel
        .exchange_delete(topology::READY_EXCHANGE.into(), Default::default())
        .await
        .unwrap();
    channel
        .exchange_declare(
            topology::READY_EXCHANGE.into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    shard_queue
}

async fn topology_check_reports_ok_and_then_every_difference(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    let layout = order_timeout::broker::topology::Layout::of(&env.settings);
    assert!(
        layout.shards.get() > 1,
        "the default layout has cascade shards"
    );
    let expected = topology::exchange_specs(&layout).len() + topology::queue_specs(&layout).len();
    let out = env.cli(&["topology", "check"]).await;
    assert_success(&out);
    assert!(
        out.stdout.contains(&format!("{expected} of {expected}")),
        "{}",
        out.stdout
    );
    assert!(out.stdout.trim_end().ends_with("OK"), "{}", out.stdout);

    let shard_queue = break_the_topology(&env).await;

    let out = env.cli(&["topology", "check"]).await;
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    let line = |prefix: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{}", out.stdout))
            .to_owned()
    };
    let level3 = line(&format!("DIFFERS  queue {}", level_name(3)));
    assert!(
        level3.contains("PRECONDITION_FAILED") && level3.contains("inequivalent arg"),
        "{level3}"
    );
    line(&format!("MISSING  queue {}", level_name(5)));
    line(&format!("MISSING  queue {shard_queue}"));
    let ready = line(&format!("DIFFERS  exchange {}", topology::READY_EXCHANGE));
    assert!(ready.contains("'type'"), "{ready}");
    assert!(
        out.stdout
            .contains(&format!("{} of {expected}", expected - 4)),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("MISMATCH"), "{}", out.stdout);

    // The check created nothing: level 5 is still missing.
    let probe = env.amqp.create_channel().await.unwrap();
    let missing = probe
        .queue_declare(
            level_name(5).as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    assert!(missing.is_err(), "topology check must not create queues");
}

async fn a_parked_queue_from_before_the_delivery_limit_is_used_and_the_check_names_the_fix(
    dialect: Dialect,
) {
    let env = TestEnv::on(dialect).await;
    // As a version without the delivery limit declared it.
    let channel = env.amqp.create_channel().await.unwrap();
    delete_queue(&channel, topology::PARKED_QUEUE).await;
    declare_durable_queue(
        &channel,
        topology::PARKED_QUEUE,
        "quorum",
        FieldTable::default(),
    )
    .await;

    // The service starts on it (a warning, not a refusal) and parks into it.
    let service = env.service().await;
    publish_for_unknown(&env, "no-such-order").await;
    wait_parked(&env, &service, 1).await;
    service.stop().await.unwrap();

    let out = env.cli(&["topology", "check"]).await;
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    let parked = out
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with(&format!("DIFFERS  queue {}", topology::PARKED_QUEUE)))
        .take(2)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        parked.contains("'x-delivery-limit'") && parked.contains("current is none"),
        "{}",
        out.stdout
    );
    assert!(
        parked.contains("rabbitmqctl set_policy -p ")
            && parked.contains(r#""delivery-limit": 1000000"#),
        "the check names the fix: {parked}"
    );
    // Every other queue, the due queue included, has the limit.
    assert!(
        !out.stdout
            .contains(&format!("queue {}:", topology::DUE_QUEUE)),
        "{}",
        out.stdout
    );
}

async fn pending_shows_what_waits_by_due_window(dialect: Dialect) {
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
        env.queue_depth(topology::PARKED_QUEUE).await == 0
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

/// `topology check` says what the layout needs of the broker's file handles
/// and what the broker allows: its limit read from the broker process on
/// this host (cross-checked with `rabbitmqctl status`, whose limit is the
/// one RabbitMQ enforces), a warning with the numbers and the fix when the
/// limit is too low for the layout or for a layout change (given with
/// `--broker-fd-limit`), and the exit code stays the topology's.
async fn topology_check_warns_when_the_brokers_file_limit_is_too_low(dialect: Dialect) {
    use order_timeout::ops::topology_fds::{self, Allowance};
    let env = TestEnv::on(dialect).await;
    let layout = topology::Layout::of(&env.settings);
    let need = topology_fds::need(&layout, 1);
    let queues = topology::queue_specs(&layout).len() as u64;
    assert_eq!(need.for_queues, 3 * queues, "quorum queues, 3 handles each");

    let out = env.cli(&["topology", "check"]).await;
    assert_success(&out);
    assert!(
        out.stdout.contains(&format!(
            "file descriptors: this layout's {queues} queues take ~{} of the broker's file handles",
            3 * queues
        )),
        "{}",
        out.stdout
    );
    // The broker's own figure: `Total: N, limit: L` under File Descriptors.
    let status = env.rabbitmqctl(&["status"]);
    let usable: u64 = status
        .lines()
        .find_map(|l| l.trim().strip_prefix("Total: ")?.split("limit: ").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("a file descriptor limit in:\n{status}"));
    let limit = usable + topology_fds::BROKER_RESERVE;
    assert!(
        out.stdout.contains(&format!(
            "broker open-file limit {limit} ({usable} usable by RabbitMQ; read from /proc/"
        )),
        "the limit as the broker counts it ({usable} in rabbitmqctl status):\n{}",
        out.stdout
    );
    let here = Allowance {
        limit,
        source: String::new(),
    };
    assert_eq!(
        out.stdout.contains("WARNING"),
        topology_fds::warning(&need, &here).is_some(),
        "{}",
        out.stdout
    );

    // Too low for the layout, and for a change of it: each says its numbers.
    let usable_for = |limit: u64| limit - topology_fds::BROKER_RESERVE;
    let too_low = need.total + topology_fds::BROKER_RESERVE - 1;
    let for_a_change = need.during_a_change + topology_fds::BROKER_RESERVE - 1;
    for (limit, says) in [
        (
            too_low,
            format!("needs ~{} file handles on the broker,", need.total),
        ),
        (
            for_a_change,
            format!(
                "needs ~{} file handles on the broker while a layout change keeps its old queues",
                need.during_a_change
            ),
        ),
    ] {
        let out = env
            .cli(&["topology", "check", "--broker-fd-limit", &limit.to_string()])
            .await;
        assert_success(&out);
        let warning = out
            .stdout
            .lines()
            .find(|l| l.starts_with("WARNING"))
            .unwrap_or_else(|| panic!("--broker-fd-limit {limit}: no warning in\n{}", out.stdout));
        assert!(warning.contains(&says), "{warning}");
        assert!(
            warning.contains(&format!(
                "allows {} ({limit} open-file limit",
                usable_for(limit)
            )),
            "{warning}"
        );
        assert!(warning.contains("LimitNOFILE=65536"), "{warning}");
    }
    let enough = need.during_a_change + topology_fds::BROKER_RESERVE;
    let out = env
        .cli(&[
            "topology",
            "check",
            "--broker-fd-limit",
            &enough.to_string(),
        ])
        .await;
    assert!(!out.stdout.contains("WARNING"), "{}", out.stdout);
}

/// `schedule --in` far in the future is an error that says so, and nothing
/// is published: past what the clock can carry (a million years), and past
/// the years a timeout message may name (the consumer would park it).
async fn schedule_far_in_the_future_is_an_error_and_publishes_nothing(dialect: Dialect) {
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
    let pending: serde_json::Value = serde_json::from_str(pending.stdout.trim()).unwrap();
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
async fn explain_says_what_happened_and_what_comes_next(dialect: Dialect) {
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

on_both_dialects!(
    explain_says_what_happened_and_what_comes_next,
    list_shows_reasons_and_leaves_the_queue_as_it_was,
    replay_by_order_id_succeeds_once_the_cause_is_fixed,
    replay_all_republishes_everything_parked,
    purge_deletes_what_was_asked_and_nothing_else,
    topology_check_reports_ok_and_then_every_difference,
    topology_check_warns_when_the_brokers_file_limit_is_too_low,
    a_parked_queue_from_before_the_delivery_limit_is_used_and_the_check_names_the_fix,
    pending_shows_what_waits_by_due_window,
    schedule_far_in_the_future_is_an_error_and_publishes_nothing,
);

// On RabbitMQ 4.x: parked messages listed hundreds of times (the store
// delivers none of them), `topology check`, and a parked queue declared
// without the delivery limit (4.x would give it its default of 20).
on_rabbitmq4!(
    list_shows_reasons_and_leaves_the_queue_as_it_was,
    topology_check_reports_ok_and_then_every_difference,
    a_parked_queue_from_before_the_delivery_limit_is_used_and_the_check_names_the_fix,
);
