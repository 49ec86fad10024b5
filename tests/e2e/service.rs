//! End-to-end behaviour of the service against the real RabbitMQ and
//! the shop's database, PostgreSQL and MariaDB (every test runs on both,
//! `postgres::…` and `mariadb::…`, and a set on RabbitMQ 4.x too,
//! `rabbitmq4::…`): schedule → delay cascade → cancel exactly once →
//! release.
//!
//! Timing assertions are one-sided where it matters ("never early" is
//! exact, from the database's own timestamps) and generous where it does
//! not ("not late" allows seconds), so a loaded CI machine does not flake.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::{Dialect, STOCK, TestEnv, on_both_dialects, on_rabbitmq4};
use chrono::Utc;
use order_timeout::message::format_instant;
use order_timeout::testing::metrics::Outcome;

/// Generous bound on lateness for behaviour tests (the benchmark measures
/// the real figure; see docs/BENCHMARKS.md).
const LATE_OK: Duration = Duration::from_millis(3000);

fn late_ok() -> chrono::Duration {
    chrono::Duration::from_std(LATE_OK).unwrap()
}

async fn an_unpaid_order_is_cancelled_after_never_before_its_deadline(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(2).await;
    let mut events = env.subscribe_events().await;
    let service = env.service().await;

    let a = env
        .create_order("late-1", Duration::from_millis(1500), &[(0, 3), (1, 2)])
        .await;
    let b = env
        .create_order("late-2", Duration::from_millis(2500), &[(0, 1)])
        .await;
    // The deadlines on the database's clock, not this host's, and the
    // messages bare ids (the deadline is read from the row): every time
    // this test compares is the database's own.
    for (order, ms) in [(&a, 1500), (&b, 2500)] {
        env.set_deadline_on_db_clock(&order.id, Duration::from_millis(ms))
            .await;
        env.publish_raw(format!("{:?}", order.id).as_bytes()).await;
    }
    assert_eq!(env.stock(0).await, STOCK - 4);

    // Shortly before each deadline the order is still unpaid.
    tokio::time::sleep_until(tokio::time::Instant::now() + Duration::from_millis(1100)).await;
    assert_eq!(env.order_state("late-1").await.0, "UNPAID");

    for order in [&a, &b] {
        let (status, expires_at, cancelled_at) =
            env.wait_settled(&order.id, Duration::from_secs(10)).await;
        assert_eq!(status, "CANCELLED");
        let cancelled_at = cancelled_at.expect("cancelled_at set");
        assert!(
            cancelled_at >= expires_at,
            "cancelled early: {cancelled_at} < {expires_at}"
        );
        assert!(
            cancelled_at - expires_at < late_ok(),
            "too late: {}",
            cancelled_at - expires_at
        );
    }
    env.assert_stock_exact(2).await;
    for order in [&a, &b] {
        assert_eq!(env.release_calls(&order.id).await, Some(1));
    }
    assert_eq!(env.stock(0).await, STOCK);

    let got = TestEnv::read_events(&mut events, 2, Duration::from_secs(5)).await;
    let ids: HashSet<&str> = got.iter().map(|e| e.order_id.as_str()).collect();
    assert_eq!(ids, HashSet::from(["late-1", "late-2"]));
    for e in &got {
        assert!(e.lateness_ms >= 0);
        assert_eq!(
            e.lateness_ms,
            (e.cancelled_at - e.expires_at).num_milliseconds()
        );
    }
    assert_eq!(service.metrics.count(Outcome::Cancelled), 2);
    service.stop().await.unwrap();
}

async fn a_paid_order_is_left_alone(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    let order = env
        .create_order("paid-1", Duration::from_millis(1200), &[(0, 5)])
        .await;
    env.publish_timeout(&order).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(env.pay("paid-1").await);

    env.eventually(
        Duration::from_secs(10),
        "the timeout was processed",
        || async { service.metrics.count(Outcome::AlreadyPaid) == 1 },
    )
    .await;
    let (status, _, cancelled_at) = env.order_state("paid-1").await;
    assert_eq!((status.as_str(), cancelled_at), ("PAID", None));
    assert_eq!(env.release_calls("paid-1").await, None);
    assert_eq!(
        env.stock(0).await,
        STOCK - 5,
        "a paid order keeps its stock"
    );
    service.stop().await.unwrap();
}

async fn an_extended_deadline_is_respected(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    let order = env
        .create_order("ext-1", Duration::from_millis(1000), &[(0, 1)])
        .await;
    // The order service extends the payment window by more than the hold
    // window (2 s) plus a loaded machine's delay, before the first deadline
    // comes: the row says the new deadline before the message for the old
    // one is published, so however slowly this runs, the message finds it
    // (one published first and read after a slow extension would find the
    // old deadline due and rightly cancel). Found not yet due, the message
    // goes back through the delay store (counted `rescheduled`) rather than
    // being held in-process (counted only when it is finally processed).
    let new_deadline = order.expires_at + chrono::Duration::milliseconds(3500);
    env.set_deadline("ext-1", new_deadline).await;
    env.publish_timeout(&order).await;

    env.eventually(
        Duration::from_secs(30),
        "the message for the old deadline re-scheduled",
        || async { service.metrics.count(Outcome::Rescheduled) >= 1 },
    )
    .await;
    let (status, expires_at, cancelled_at) =
        env.wait_settled("ext-1", Duration::from_secs(30)).await;
    assert_eq!(status, "CANCELLED");
    // Both keep microseconds (timestamptz, DATETIME(6)).
    assert!((expires_at - new_deadline).abs() < chrono::Duration::milliseconds(1));
    let cancelled_at = cancelled_at.unwrap();
    assert!(
        cancelled_at >= expires_at,
        "cancelled at {cancelled_at}, before the extended deadline {expires_at}"
    );
    assert!(cancelled_at - expires_at < late_ok());
    env.assert_stock_exact(1).await;
    service.stop().await.unwrap();
}

/// A message whose deadline is later than the row's (an application's
/// `cancel_at` from another clock or field) is obeyed: never early for the
/// message, late for the row by the difference, which is logged and
/// counted (`order_timeout_late_message_deadlines_total`). One within a
/// second of the row's is not counted (a `DATETIME(0)` column's rounding).
async fn a_message_deadline_later_than_the_rows_is_obeyed_and_counted(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    // The sweeper (its catch-up sweeps every second) would cancel the row
    // first: this is about the message.
    let mut settings = env.settings.clone();
    settings.sweeper.enabled = false;
    let service = env.service_with(settings).await;
    let late = env
        .create_order("late-msg", Duration::from_millis(500), &[(0, 1)])
        .await;
    let on_time = env
        .create_order("close-msg", Duration::from_millis(500), &[(0, 1)])
        .await;
    for (order, by) in [(&late, 3_000), (&on_time, 400)] {
        let cancel_at = order.expires_at + chrono::Duration::milliseconds(by);
        let body = serde_json::json!({
            "order_id": order.id,
            "cancel_at": format_instant(cancel_at),
        });
        env.publish_raw(body.to_string().as_bytes()).await;
    }
    for id in ["late-msg", "close-msg"] {
        let (status, _, _) = env.wait_settled(id, Duration::from_secs(15)).await;
        assert_eq!(status, "CANCELLED", "{id}");
    }
    let (_, expires_at, cancelled_at) = env.order_state("late-msg").await;
    assert!(
        cancelled_at.unwrap() - expires_at >= chrono::Duration::milliseconds(2_900),
        "the message's deadline obeyed"
    );
    env.eventually(Duration::from_secs(5), "counted once", || async {
        service
            .metrics
            .late_message_deadlines_of(order_timeout::settings::DEFAULT_TIMER)
            == 1
    })
    .await;
    service.stop().await.unwrap();
}

async fn duplicated_messages_release_stock_once(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let mut events = env.subscribe_events().await;
    let service = env.service().await;
    let order = env
        .create_order("dup-1", Duration::from_millis(1000), &[(0, 7)])
        .await;
    for _ in 0..4 {
        env.publish_timeout(&order).await;
    }
    env.publish_raw(br#"{"order_id":"dup-1"}"#).await;
    env.wait_settled("dup-1", Duration::from_secs(10)).await;
    env.eventually(
        Duration::from_secs(10),
        "all 5 copies processed",
        || async {
            service.metrics.total() >= 5 + service.metrics.count(Outcome::Rescheduled)
                && service.metrics.count(Outcome::Cancelled)
                    + service.metrics.count(Outcome::AlreadyCancelled)
                    == 5
        },
    )
    .await;
    assert_eq!(service.metrics.count(Outcome::Cancelled), 1);
    env.assert_stock_exact(1).await;
    assert_eq!(env.release_calls("dup-1").await, Some(1));
    assert_eq!(env.stock(0).await, STOCK);
    let got = TestEnv::read_events(&mut events, 5, Duration::from_secs(2)).await;
    assert_eq!(got.len(), 1, "one event per cancellation: {got:?}");
    service.stop().await.unwrap();
}

async fn a_redelivery_after_a_crash_finishes_the_pending_release_once(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    // State left by a crash right after the cancel transaction committed:
    // order CANCELLED, outbox row pending, stock not released.
    let a = env
        .create_order("crash-a", Duration::from_millis(10), &[(0, 4)])
        .await;
    // State left by a crash after the release but before marking the outbox.
    let b = env
        .create_order("crash-b", Duration::from_millis(10), &[(0, 6)])
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    for id in ["crash-a", "crash-b"] {
        env.cancel_without_effects(id).await;
    }
    // The release of order b went through before the crash (the service's
    // own client, as the crashed instance would have called it).
    let client = order_timeout::testing::InventoryClient::connect_lazy(
        &env.settings.inventory_url,
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(client.release(&b.id, &b.items).await.unwrap());
    assert_eq!(env.stock(0).await, STOCK - 4);

    let service = env.service().await;
    env.publish_timeout(&a).await;
    env.publish_timeout(&b).await;
    env.eventually(
        Duration::from_secs(10),
        "both redeliveries processed",
        || async { service.metrics.count(Outcome::AlreadyCancelled) == 2 },
    )
    .await;
    assert_eq!(env.release_calls("crash-a").await, Some(1));
    assert_eq!(
        env.release_calls("crash-b").await,
        Some(2),
        "the second call was a no-op"
    );
    env.assert_stock_exact(1).await;
    assert_eq!(env.stock(0).await, STOCK);
    service.stop().await.unwrap();
}

async fn a_killed_service_loses_nothing_and_releases_once(dialect: Dialect) {
    let _turn = crate::common::restart_turn().await;
    let env = TestEnv::on(dialect).await;
    env.stock_skus(5).await;
    let spawn = || {
        let child = env
            .command()
            .arg("serve")
            .env("HTTP_ADDR", "127.0.0.1:0")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start order-timeout serve");
        crate::bounds::KillOnDrop(child)
    };
    let mut first = spawn();
    // 300 orders due over 1.5–4.5 s: the kill lands mid-stream.
    let n: i64 = 300;
    for i in 0..n {
        let timeout = Duration::from_millis(1500 + (i as u64 * 10));
        let order = env
            .create_order(
                &format!("kill-{i:03}"),
                timeout,
                &[(i as usize % 5, 1 + (i % 3))],
            )
            .await;
        env.publish_timeout(&order).await;
    }
    env.eventually(Duration::from_secs(20), "some orders cancelled", || async {
        env.count("kill-", "CANCELLED").await >= 60
    })
    .await;
    first.kill();
    let at_kill = env.count("kill-", "CANCELLED").await;
    // Orders cancelled with their release not yet marked done: the only
    // ones whose ReleaseStock the next process may call again (the
    // inventory's idempotency key absorbs it).
    let unmarked_at_kill = env.outbox_unreleased().await;
    assert!(
        at_kill < n,
        "the kill should land mid-stream ({at_kill}/{n} done)"
    );

    let mut second = spawn();
    env.eventually(Duration::from_secs(30), "every order cancelled", || async {
        env.count("kill-", "CANCELLED").await == n
    })
    .await;
    // Let the outbox settle: releases the killed process had leased are
    // taken over once their lease (15 s) runs out.
    env.wait_outbox_done(Duration::from_secs(45)).await;
    second.kill();
    assert_eq!(env.cancelled_early().await, 0);
    env.assert_stock_exact(5).await;
    for n in 0..5 {
        assert_eq!(env.stock(n).await, STOCK);
    }
    // Released once in effect: one release per order; a repeated call only
    // for an order whose release was in flight at the kill. (The
    // inventory's own ledger, in PostgreSQL on either dialect.)
    let (orders, calls): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(calls), 0)::int8 FROM inventory.releases \
          WHERE order_id LIKE 'kill-%'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(orders, n, "one release per cancelled order");
    assert!(
        calls - orders <= unmarked_at_kill,
        "{} repeated release calls, but only {unmarked_at_kill} releases were in flight at the kill",
        calls - orders
    );
}

async fn two_consumers_on_one_queue_cancel_each_order_once(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(3).await;
    let one = env.service().await;
    let two = env.service().await;
    let n = 200;
    for i in 0..n {
        let order = env
            .create_order(
                &format!("two-{i:03}"),
                Duration::from_millis(1000 + i * 10),
                &[((i % 3) as usize, 2)],
            )
            .await;
        env.publish_timeout(&order).await;
        env.publish_timeout(&order).await; // every message twice
    }
    env.eventually(Duration::from_secs(30), "every order cancelled", || async {
        env.count("two-", "CANCELLED").await == n as i64
    })
    .await;
    env.eventually(Duration::from_secs(10), "every copy processed", || async {
        let done = |s: &order_timeout::RunningService| {
            s.metrics.count(Outcome::Cancelled) + s.metrics.count(Outcome::AlreadyCancelled)
        };
        done(&one) + done(&two) == 2 * n
    })
    .await;
    assert_eq!(
        one.metrics.count(Outcome::Cancelled) + two.metrics.count(Outcome::Cancelled),
        n
    );
    assert!(
        one.metrics.total() > 0 && two.metrics.total() > 0,
        "both consumers got work"
    );
    env.assert_stock_exact(3).await;
    // Every copy of every order settled by two live consumers: one release
    // per order, and one call each (the outbox lease keeps the second
    // copy's worker from calling while the first finishes).
    let (orders, max_calls): (i64, Option<i64>) = sqlx::query_as(
        "SELECT count(*), max(calls) FROM inventory.releases WHERE order_id LIKE 'two-%'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(orders, n as i64, "one release per order");
    assert_eq!(max_calls, Some(1), "no release called twice");
    one.stop().await.unwrap();
    two.stop().await.unwrap();
}

async fn mixed_timeouts_do_not_block_each_other(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    // Longest first: with one per-message-TTL queue the short ones would
    // wait behind the 8 s ones.
    let timeouts_ms = [8000u64, 5000, 3000, 2000, 1300, 800, 500, 300];
    let mut orders = Vec::new();
    for round in 0..3 {
        for t in timeouts_ms {
            let order = env
                .create_order(
                    &format!("mix-{t}-{round}"),
                    Duration::from_millis(t),
                    &[(0, 1)],
                )
                .await;
            env.publish_timeout(&order).await;
            orders.push(order);
        }
    }
    for order in &orders {
        let (status, expires_at, cancelled_at) =
            env.wait_settled(&order.id, Duration::from_secs(20)).await;
        assert_eq!(status, "CANCELLED", "{}", order.id);
        let cancelled_at = cancelled_at.unwrap();
        assert!(cancelled_at >= expires_at, "{} early", order.id);
        assert!(
            cancelled_at - expires_at < late_ok(),
            "{} was {} ms late: blocked behind a longer timeout?",
            order.id,
            (cancelled_at - expires_at).num_milliseconds()
        );
    }
    env.assert_stock_exact(1).await;
    service.stop().await.unwrap();
}

async fn raw_json_in_every_accepted_form_is_handled(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    let t = |ms| Duration::from_millis(ms);
    let a = env.create_order("raw-z", t(1200), &[(0, 1)]).await;
    let b = env.create_order("raw-offset", t(1400), &[(0, 1)]).await;
    let c = env.create_order("raw-created", t(1600), &[(0, 1)]).await;
    let d = env.create_order("raw-bare", t(1800), &[(0, 1)]).await;
    let e = env.create_order("4200042", t(2000), &[(0, 1)]).await;

    // cancel_at in UTC, string id.
    env.publish_raw(
        format!(
            r#"{{"order_id":"raw-z","cancel_at":"{}"}}"#,
            format_instant(a.expires_at)
        )
        .as_bytes(),
    )
    .await;
    // cancel_at with a +08:00 offset.
    let offset = chrono::FixedOffset::east_opt(8 * 3600).unwrap();
    let b_at = b
        .expires_at
        .with_timezone(&offset)
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, false);
    assert!(b_at.ends_with("+08:00"));
    env.publish_raw(
        format!(r#"{{"order_id":"raw-offset","cancel_at":"{b_at}","note":"ignored"}}"#).as_bytes(),
    )
    .await;
    // created_at + timeout_ms.
    let created = c.expires_at - chrono::Duration::milliseconds(1600);
    env.publish_raw(
        format!(
            r#"{{"order_id":"raw-created","created_at":"{}","timeout_ms":1600}}"#,
            format_instant(created)
        )
        .as_bytes(),
    )
    .await;
    // Bare id: the deadline comes from the order row.
    env.publish_raw(br#"{"order_id":"raw-bare"}"#).await;
    // Integer id.
    env.publish_raw(
        format!(
            r#"{{"order_id":4200042,"cancel_at":"{}"}}"#,
            format_instant(e.expires_at)
        )
        .as_bytes(),
    )
    .await;

    for order in [&a, &b, &c, &d, &e] {
        let (status, expires_at, cancelled_at) =
            env.wait_settled(&order.id, Duration::from_secs(10)).await;
        assert_eq!(status, "CANCELLED", "{}", order.id);
        let cancelled_at = cancelled_at.unwrap();
        assert!(cancelled_at >= expires_at, "{} early", order.id);
        assert!(cancelled_at - expires_at < late_ok(), "{} late", order.id);
    }
    assert_eq!(service.metrics.count(Outcome::Parked), 0);
    env.assert_stock_exact(1).await;
    service.stop().await.unwrap();
}

async fn bad_messages_are_parked_with_their_reason_and_do_not_block(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    let good = env
        .create_order("good-1", Duration::from_millis(1000), &[(0, 1)])
        .await;
    env.publish_raw(b"definitely not json").await;
    env.publish_raw(
        format!(
            r#"{{"order_id":"ghost","cancel_at":"{}"}}"#,
            format_instant(Utc::now())
        )
        .as_bytes(),
    )
    .await;
    env.publish_timeout(&good).await;

    let (status, _, _) = env.wait_settled("good-1", Duration::from_secs(10)).await;
    assert_eq!(status, "CANCELLED");
    env.eventually(Duration::from_secs(10), "two messages parked", || async {
        service.metrics.count(Outcome::Parked) == 2
    })
    .await;
    let parked = env.drain_parked().await;
    assert_eq!(parked.len(), 2);
    let mut reasons = Vec::new();
    for msg in &parked {
        let headers = msg.properties.headers().clone().unwrap_or_default();
        let kind = order_timeout::testing::broker::header_str(headers.inner().get("x-error-kind"))
            .unwrap();
        let error =
            order_timeout::testing::broker::header_str(headers.inner().get("x-error")).unwrap();
        assert!(!error.is_empty());
        reasons.push((kind, String::from_utf8_lossy(&msg.body).into_owned()));
    }
    reasons.sort();
    assert_eq!(reasons[0].0, "not_json");
    assert_eq!(
        reasons[0].1, "definitely not json",
        "the original body is kept"
    );
    assert_eq!(reasons[1].0, "unknown_order");
    service.stop().await.unwrap();
}

/// A row the shop holds (a slow payment callback's `SELECT … FOR UPDATE`)
/// delays only its own order, through the running service: the other
/// orders of its batch are cancelled on time while it is held; it is sent
/// back to wait (outcome `locked`) without spending an attempt, and
/// cancelled, its stock released once, soon after the lock goes away.
async fn a_row_the_shop_holds_delays_only_its_own_order(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    let timeout = Duration::from_millis(1500);
    let mut orders = Vec::new();
    for n in 0..20 {
        orders.push(
            env.create_order(&format!("free-{n:02}"), timeout, &[(0, 1)])
                .await,
        );
    }
    let held = env.create_order("held", timeout, &[(0, 5)]).await;
    let holder = env.hold_row("held").await;
    for order in orders.iter().chain([&held]) {
        env.publish_timeout(order).await;
    }
    // The others, on time while the row is held.
    for order in &orders {
        let (status, expires_at, cancelled_at) =
            env.wait_settled(&order.id, Duration::from_secs(10)).await;
        assert_eq!(status, "CANCELLED");
        let late = cancelled_at.unwrap() - expires_at;
        assert!(late < chrono::Duration::seconds(5), "{}: {late}", order.id);
    }
    env.eventually(
        Duration::from_secs(10),
        "the held order counted locked",
        || async { service.metrics.count(Outcome::Locked) >= 1 },
    )
    .await;
    // Held for a while longer: asked about again and again, never failed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.order_state("held").await.0, "UNPAID");
    assert_eq!(env.release_calls("held").await, None);
    holder.commit().await;
    let let_go = Utc::now();
    let (status, _, cancelled_at) = env.wait_settled("held", Duration::from_secs(15)).await;
    assert_eq!(status, "CANCELLED");
    let after = cancelled_at.unwrap() - let_go;
    assert!(
        after < chrono::Duration::seconds(6),
        "cancelled {after} after the lock went"
    );
    env.assert_stock_exact(1).await;
    for order in orders.iter().chain([&held]) {
        assert_eq!(env.release_calls(&order.id).await, Some(1), "{}", order.id);
    }
    // Each order cancelled once: by its message, or (the held one, when it
    // comes due while the start-up catch-up sweeps run) by the sweeper.
    assert_eq!(
        service.metrics.count(Outcome::Cancelled) + service.metrics.swept_total(),
        21
    );
    assert_eq!(service.metrics.count(Outcome::Retried), 0);
    assert_eq!(service.metrics.count(Outcome::Parked), 0);
    service.stop().await.unwrap();
}

on_both_dialects!(
    an_unpaid_order_is_cancelled_after_never_before_its_deadline,
    a_paid_order_is_left_alone,
    an_extended_deadline_is_respected,
    a_message_deadline_later_than_the_rows_is_obeyed_and_counted,
    duplicated_messages_release_stock_once,
    a_redelivery_after_a_crash_finishes_the_pending_release_once,
    a_killed_service_loses_nothing_and_releases_once,
    two_consumers_on_one_queue_cancel_each_order_once,
    mixed_timeouts_do_not_block_each_other,
    raw_json_in_every_accepted_form_is_handled,
    bad_messages_are_parked_with_their_reason_and_do_not_block,
    a_row_the_shop_holds_delays_only_its_own_order,
);

// The same on RabbitMQ 4.x (the orders on PostgreSQL): the happy path with
// bare-id bodies, every accepted form, bad messages parked, duplicates,
// a killed service's redeliveries, and the cascade under mixed timeouts.
on_rabbitmq4!(
    an_unpaid_order_is_cancelled_after_never_before_its_deadline,
    an_extended_deadline_is_respected,
    duplicated_messages_release_stock_once,
    a_killed_service_loses_nothing_and_releases_once,
    mixed_timeouts_do_not_block_each_other,
    raw_json_in_every_accepted_form_is_handled,
    bad_messages_are_parked_with_their_reason_and_do_not_block,
);
