//! The store's operations around the cancel: the sweeper's scans (overdue
//! orders oldest first, stale outbox work), the outbox's backoff and
//! retention, the index its scan reads, `prepare`'s and the report's
//! findings, `ping`, and `migrate` leaving the shop's tables alone.

use super::*;
use order_timeout::testing::store::{
    NextAttempt, OutboxFailure, StoreError, migrate, stale_statement_for_explain,
};

pub(super) async fn the_sweeper_finds_overdue_orders_oldest_first(f: &Fixture) {
    f.insert("s-old", "UNPAID", secs(-300)).await;
    f.insert("s-older", "UNPAID", secs(-600)).await;
    f.insert("s-young", "UNPAID", secs(-5)).await;
    f.insert("s-later", "UNPAID", secs(300)).await;
    f.insert("s-paid", "PAID", secs(-900)).await;
    f.insert("s-theirs", "CANCELLED", secs(-900)).await;
    let store = f.store();
    let grace = Duration::from_secs(60);
    let found = store.overdue(grace, None, 10).await.unwrap();
    assert_eq!(found.next, None, "a short page is the last");
    let found: Vec<&str> = found.rows.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(found, ["s-older", "s-old"]);
    // Page by page, each after the last row read.
    let first = store.overdue(grace, None, 1).await.unwrap();
    assert_eq!(first.rows.len(), 1);
    assert_eq!(first.rows[0].0, id("s-older"));
    let next = first.next.expect("a full page has a next one");
    let second = store.overdue(grace, Some(&next), 1).await.unwrap();
    assert_eq!(second.rows.len(), 1);
    assert_eq!(second.rows[0].0, id("s-old"));
    let last = store.overdue(grace, second.next.as_ref(), 1).await.unwrap();
    assert!(last.rows.is_empty() && last.next.is_none(), "{last:?}");
}

pub(super) async fn the_sweeper_finds_stale_outbox_work_without_a_live_lease(f: &Fixture) {
    for order in ["o-stale", "o-leased", "o-done", "o-fresh"] {
        f.insert(order, "UNPAID", secs(-1)).await;
    }
    let store = f.store();
    let ids: Vec<OrderId> = ["o-stale", "o-leased", "o-done", "o-fresh"]
        .into_iter()
        .map(id)
        .collect();
    store.cancel_due(&ids, LEASE).await.unwrap();
    store.mark_done(&["o-done"], &["o-done"]).await.unwrap();
    store
        .release_leases(&["o-stale", "o-done", "o-fresh"])
        .await
        .unwrap();
    for order in ["o-stale", "o-leased", "o-done"] {
        f.age_outbox(order, secs(-600)).await;
    }
    let found = store
        .stale_outbox(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!(found, [id("o-stale")]);
}

/// Cancels `orders` (overdue), gives their leases back and ages their
/// outbox rows by ten minutes: stale work for the sweeper.
async fn stale_rows(f: &Fixture, orders: &[&str]) {
    for order in orders {
        f.insert(order, "UNPAID", secs(-1)).await;
    }
    let ids: Vec<OrderId> = orders.iter().map(|o| id(o)).collect();
    f.store().cancel_due(&ids, LEASE).await.unwrap();
    f.store().release_leases(orders).await.unwrap();
    for order in orders {
        f.age_outbox(order, secs(-600)).await;
    }
}

fn failure<'a>(id: &'a str, permanent: bool) -> OutboxFailure<'a> {
    OutboxFailure {
        id,
        error: "inventory: Unavailable",
        release: true,
        permanent,
    }
}

pub(super) async fn failing_outbox_rows_wait_their_backoff_and_given_up_ones_are_left(f: &Fixture) {
    stale_rows(f, &["b-old", "b-older", "b-new", "b-refused"]).await;
    f.age_outbox("b-older", secs(-60)).await;
    f.age_outbox("b-refused", secs(30)).await;
    f.age_outbox("b-new", secs(300)).await;
    let store = f.store();
    let grace = Duration::from_secs(60);
    let all = store.stale_outbox(grace, 10).await.unwrap();
    assert_eq!(
        all,
        [id("b-older"), id("b-old"), id("b-refused"), id("b-new")]
    );

    // The two oldest fail: put off by an hour, they come after the
    // newer rows; the refused one is given up and never comes back.
    let plan = |f: &OutboxFailure<'_>, attempts: u32| {
        assert_eq!(attempts, 1);
        if f.permanent {
            NextAttempt::GiveUp("refused".into())
        } else {
            NextAttempt::After(Duration::from_secs(3600))
        }
    };
    let planned = store
        .record_failures(
            &[
                failure("b-older", false),
                failure("b-old", false),
                failure("b-refused", true),
                failure("b-gone", false),
            ],
            &plan,
        )
        .await
        .unwrap();
    assert_eq!(planned.len(), 3, "no row for b-gone: {planned:?}");
    assert_eq!(store.stale_outbox(grace, 10).await.unwrap(), [id("b-new")]);

    // Due again (the hour has passed): back in the scan, after rows that
    // were due before them.
    let due_now = |_: &OutboxFailure<'_>, _: u32| NextAttempt::After(Duration::ZERO);
    let planned = store
        .record_failures(&[failure("b-old", false)], &due_now)
        .await
        .unwrap();
    assert_eq!(planned[0].1, 2, "the second failed attempt");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store.stale_outbox(grace, 10).await.unwrap(),
        [id("b-new"), id("b-old")]
    );
    let error = f
        .texts("SELECT last_error FROM order_timeout_cancel_outbox WHERE order_id = 'b-old'")
        .await;
    assert_eq!(error, ["inventory: Unavailable"]);

    // A replay finishes the given-up row: it is given up no more.
    store
        .mark_done(&["b-refused"], &["b-refused"])
        .await
        .unwrap();
    let gave_up = f
        .texts(
            "SELECT CASE WHEN gave_up_at IS NULL THEN 'no' ELSE 'yes' END \
               FROM order_timeout_cancel_outbox WHERE order_id = 'b-refused'",
        )
        .await;
    assert_eq!(gave_up, ["no"]);
}

pub(super) async fn retention_deletes_only_finished_rows_past_it(f: &Fixture) {
    let finished_old: Vec<String> = (0..7).map(|n| format!("r-done-old-{n}")).collect();
    let mut orders: Vec<&str> = finished_old.iter().map(String::as_str).collect();
    orders.extend(["r-done-new", "r-pending-old", "r-half-old", "r-gave-up-old"]);
    stale_rows(f, &orders).await;
    let store = f.store();
    let done: Vec<&str> = finished_old
        .iter()
        .map(String::as_str)
        .chain(["r-done-new"])
        .collect();
    store.mark_done(&done, &done).await.unwrap();
    store.mark_done(&["r-half-old"], &[]).await.unwrap();
    let give_up = |_: &OutboxFailure<'_>, _: u32| NextAttempt::GiveUp("refused".into());
    store
        .record_failures(&[failure("r-gave-up-old", true)], &give_up)
        .await
        .unwrap();
    for order in orders.iter().filter(|o| **o != "r-done-new") {
        f.age_outbox(order, chrono::Duration::days(-8)).await;
    }
    let week = Duration::from_secs(7 * 24 * 3600);
    // Three at a time: three statements until one comes back short.
    assert_eq!(store.delete_finished(week, 3).await.unwrap(), 3);
    assert_eq!(store.delete_finished(week, 3).await.unwrap(), 3);
    assert_eq!(store.delete_finished(week, 3).await.unwrap(), 1);
    assert_eq!(store.delete_finished(week, 3).await.unwrap(), 0);
    for order in &orders {
        let kept = !order.starts_with("r-done-old");
        assert_eq!(f.outbox_rows(order).await, i64::from(kept), "{order}");
    }
}

pub(super) async fn the_stale_outbox_scan_reads_an_index_of_the_pending_rows(f: &Fixture) {
    // 10,000 finished rows, older than the few pending ones.
    let my = f.dialect() == Dialect::MySql;
    let (hour_ago, minutes_ago, now) = if my {
        (
            "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR",
            "UTC_TIMESTAMP(6) - INTERVAL 10 MINUTE",
            "UTC_TIMESTAMP(6)",
        )
    } else {
        (
            "now() - interval '1 hour'",
            "now() - interval '10 minutes'",
            "now()",
        )
    };
    let digit = (0..10)
        .map(|n| format!("SELECT {n} AS n"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    f.exec(&format!(
        "INSERT INTO order_timeout_cancel_outbox \
                (order_id, created_at, stock_released_at, event_published_at) \
         SELECT CONCAT('done-', a.n * 1000 + b.n * 100 + c.n * 10 + d.n), {hour_ago}, {now}, {now} \
           FROM ({digit}) a, ({digit}) b, ({digit}) c, ({digit}) d; \
         INSERT INTO order_timeout_cancel_outbox (order_id, created_at, stock_released_at) \
         SELECT CONCAT('todo-', n), {minutes_ago}, {now} FROM ({digit}) t; \
         {analyze} order_timeout_cancel_outbox",
        analyze = if my { "ANALYZE TABLE" } else { "ANALYZE" },
    ))
    .await;
    let found = f
        .store()
        .stale_outbox(Duration::from_secs(60), 100)
        .await
        .unwrap();
    assert_eq!(found.len(), 10, "{found:?}");
    assert!(found.iter().all(|id| id.as_str().starts_with("todo-")));
    // The sweeper's own statement (store/outbox.rs), its values written in.
    let statement =
        stale_statement_for_explain(f.dialect(), "cancel_unpaid", Duration::from_secs(60), 100);
    let plan = if my {
        f.texts(&format!("EXPLAIN FORMAT=JSON {statement}")).await
    } else {
        f.texts(&format!("EXPLAIN {statement}")).await
    }
    .join("\n");
    let index = if my {
        "order_timeout_cancel_outbox_sweep"
    } else {
        "order_timeout_cancel_outbox_due"
    };
    assert!(plan.contains(index), "{plan}");
    for full_scan in ["Seq Scan", "filesort", "\"access_type\": \"ALL\""] {
        assert!(!plan.contains(full_scan), "{plan}");
    }
}

pub(super) async fn prepare_says_to_run_migrate_without_the_services_tables(f: &Fixture) {
    let store = f.store_with(&ShopSchema::default());
    let says_migrate = |err: StoreError, what: &str| {
        let message = err.to_string();
        assert!(err.is_config(), "{message}");
        assert!(
            message.contains(what) && message.contains("run `order-timeout migrate`"),
            "{message}"
        );
        assert!(!message.contains("SELECT"), "no SQL text: {message}");
    };
    if f.dialect() == Dialect::MySql {
        // The table of a version before the last migration.
        f.exec(
            "ALTER TABLE order_timeout_cancel_outbox \
               DROP KEY order_timeout_cancel_outbox_pending, DROP COLUMN pending",
        )
        .await;
        says_migrate(store.prepare().await.unwrap_err(), "no column pending");
    }
    f.exec(
        "DROP TABLE order_timeout_cancel_outbox; DROP TABLE order_timeout_set_aside; \
         DROP TABLE order_timeout_migrations",
    )
    .await;
    says_migrate(
        store.prepare().await.unwrap_err(),
        "no table order_timeout_cancel_outbox",
    );
    migrate(f.url()).await.unwrap();
    store.prepare().await.unwrap();
}

pub(super) async fn the_report_names_the_tables_nothing_vacuums(f: &Fixture) {
    let report = f
        .store_with(&ShopSchema::default())
        .prepare()
        .await
        .unwrap();
    if f.dialect() == Dialect::MySql {
        // InnoDB purges old row versions itself.
        assert!(report.unvacuumed.is_empty(), "{:?}", report.unvacuumed);
        return;
    }
    let table = report.table.clone();
    let outbox = "order_timeout_cancel_outbox".to_owned();
    let server_off = f.texts("SHOW autovacuum").await == ["off"];
    let expected = |orders_off: bool| -> Vec<String> {
        match (server_off, orders_off) {
            (true, _) => vec![table.clone(), outbox.clone()],
            (false, true) => vec![table.clone()],
            (false, false) => vec![],
        }
    };
    assert_eq!(report.unvacuumed, expected(false));
    // Autovacuum switched off for the orders table alone.
    f.exec(&format!(
        "ALTER TABLE {table} SET (autovacuum_enabled = false)"
    ))
    .await;
    let report = f
        .store_with(&ShopSchema::default())
        .prepare()
        .await
        .unwrap();
    assert_eq!(report.unvacuumed, expected(true));
    assert!(report.to_string().contains("vacuum:"), "{report}");
}

pub(super) async fn ping_answers(f: &Fixture) {
    f.store().ping().await.unwrap();
}

pub(super) async fn migrate_creates_only_the_services_tables_and_leaves_the_shops_alone(
    f: &Fixture,
) {
    let before = f.shop_ddl().await;
    assert!(!before.is_empty());
    migrate(f.url()).await.unwrap();
    migrate(f.url()).await.unwrap();
    assert_eq!(
        f.shop_ddl().await,
        before,
        "the shop's tables are unchanged"
    );
    let mut other = f.other_tables().await;
    other.sort();
    assert_eq!(
        other,
        [
            "order_timeout_also_locks",
            "order_timeout_cancel_outbox",
            "order_timeout_logouts",
            "order_timeout_migrations",
            "order_timeout_parked",
            "order_timeout_replicas",
            "order_timeout_set_aside",
            "order_timeout_watch"
        ]
    );
}
