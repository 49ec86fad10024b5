//! The store suite: every state the cancel transaction can report, and the
//! outbox, sweeper and migration operations, written once against the
//! [`OrderStore`] interface and run for every SQL dialect
//! (`store_suite!(module, Dialect)` below; one line per dialect).
//!
//! A [`Fixture`] is a fresh database of its dialect with the service's
//! migrations and the reference shop schema, plus the few statements the
//! cases need to put an order row into a state (as the shop would), each
//! written once, with the SQL of both dialects side by side where they
//! differ.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use order_timeout::message::OrderId;
use order_timeout::settings::{self, SecretUrl};
use order_timeout::store::{
    self, Cancellation, Dialect, OrderState, OrderStore, ShopSchema, Store,
};
use order_timeout_tools::scratch;
use order_timeout_tools::shop::ShopDb;
use sqlx::MySqlPool;

use crate::common::{ShopTx, on_shop};

mod abandon;
mod bindings;
mod effects;
mod failures;
mod id_columns;
mod locks;
mod scans;
mod timers;

const REASON: &str = "payment timeout";
const LEASE: Duration = Duration::from_secs(15);

/// A concurrent session running one statement in a loop.
struct Repeater {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl Repeater {
    fn spawn<F, Fut>(mut run: F) -> Self
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut runs = 0;
            while !stopped.load(Ordering::Relaxed) {
                run().await;
                runs += 1;
                tokio::task::yield_now().await;
            }
            runs
        });
        Self { stop, task }
    }

    /// Stops it; how many times the statement ran.
    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

fn id(s: &str) -> OrderId {
    OrderId::parse(s).unwrap()
}

fn secs(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

/// `cancel_due` for one order.
async fn state_of(store: &dyn OrderStore, order: &str, lease: Duration) -> OrderState {
    let states = store.cancel_due(&[id(order)], lease).await.unwrap();
    assert_eq!(states.len(), 1, "{states:?}");
    assert_eq!(states[0].0.as_str(), order);
    states[0].1.clone()
}

fn cancellation(state: OrderState) -> Cancellation {
    match state {
        OrderState::Cancelled(c) => c,
        other => panic!("expected Cancelled, got {other:?}"),
    }
}

mod cases {
    use super::*;

    pub(super) async fn unknown_order_is_reported_unknown(f: &Fixture) {
        assert_eq!(
            state_of(f.store().as_ref(), "nobody", LEASE).await,
            OrderState::Unknown
        );
        assert_eq!(f.outbox_rows("nobody").await, 0);
    }

    pub(super) async fn paid_order_is_left_alone(f: &Fixture) {
        f.insert("paid", "PAID", secs(-5)).await;
        assert_eq!(
            state_of(f.store().as_ref(), "paid", LEASE).await,
            OrderState::Paid
        );
        assert_eq!(f.row("paid").await, ("PAID".into(), None, None));
        assert_eq!(f.outbox_rows("paid").await, 0);
    }

    pub(super) async fn order_not_yet_due_is_not_cancelled(f: &Fixture) {
        f.insert("later", "UNPAID", secs(3600)).await;
        match state_of(f.store().as_ref(), "later", LEASE).await {
            OrderState::NotYetDue { expires_at, db_now } => {
                assert!(expires_at > db_now);
                let left = expires_at - db_now;
                assert!(left > secs(3590) && left <= secs(3600), "{left}");
            }
            other => panic!("expected NotYetDue, got {other:?}"),
        }
        assert_eq!(f.row("later").await.0, "UNPAID");
        assert_eq!(f.outbox_rows("later").await, 0);
    }

    pub(super) async fn overdue_order_is_cancelled_just_now_with_the_lease(f: &Fixture) {
        f.insert("due", "UNPAID", secs(-2)).await;
        let c = cancellation(state_of(f.store().as_ref(), "due", LEASE).await);
        assert!(c.just_now && c.leased && c.release_pending && c.event_pending);
        assert!(c.cancelled_at >= c.expires_at, "never early");
        let (status, cancelled_at, reason) = f.row("due").await;
        assert_eq!(status, "CANCELLED");
        // `set`'s `now()`: the same instant (PostgreSQL), or that second
        // (MySQL's `now()` has whole seconds).
        let set_at = cancelled_at.expect("cancelled_at set");
        assert!(
            (set_at - c.cancelled_at).abs() < secs(1),
            "{set_at} vs {}",
            c.cancelled_at
        );
        assert_eq!(reason.as_deref(), Some(REASON));
        assert_eq!(f.outbox_rows("due").await, 1);
    }

    pub(super) async fn a_live_lease_is_reported_as_leased_elsewhere(f: &Fixture) {
        f.insert("busy", "UNPAID", secs(-1)).await;
        let store = f.store().as_ref();
        cancellation(state_of(store, "busy", LEASE).await);
        match state_of(store, "busy", LEASE).await {
            OrderState::LeasedElsewhere { until, db_now } => {
                assert!(
                    until > db_now && until - db_now <= secs(15),
                    "{until} {db_now}"
                );
            }
            other => panic!("expected LeasedElsewhere, got {other:?}"),
        }
    }

    pub(super) async fn an_earlier_cancellation_with_work_pending_is_taken_over(f: &Fixture) {
        f.insert("crashed", "UNPAID", secs(-1)).await;
        let store = f.store().as_ref();
        // A worker that crashed: its lease ran out at once.
        let first = cancellation(state_of(store, "crashed", Duration::ZERO).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let c = cancellation(state_of(store, "crashed", LEASE).await);
        assert!(!c.just_now && c.leased && c.release_pending && c.event_pending);
        assert_eq!(c.cancelled_at, first.cancelled_at);
        // Given back after a failure: the next delivery takes it at once.
        store.release_leases(&["crashed"]).await.unwrap();
        let c = cancellation(state_of(store, "crashed", LEASE).await);
        assert!(!c.just_now && c.leased);
    }

    pub(super) async fn finished_work_is_reported_done_and_marks_are_idempotent(f: &Fixture) {
        f.insert("done", "UNPAID", secs(-1)).await;
        let store = f.store().as_ref();
        cancellation(state_of(store, "done", LEASE).await);
        store.mark_done(&["done"], &[]).await.unwrap();
        store.release_leases(&["done"]).await.unwrap();
        let c = cancellation(state_of(store, "done", LEASE).await);
        assert!(!c.release_pending && c.event_pending, "{c:?}");
        store.mark_done(&["done"], &["done"]).await.unwrap();
        store.mark_done(&[], &["done"]).await.unwrap();
        let c = cancellation(state_of(store, "done", LEASE).await);
        assert!(!c.just_now && !c.leased && !c.release_pending && !c.event_pending);
        store.mark_done(&[], &[]).await.unwrap();
        store.release_leases(&[]).await.unwrap();
    }

    pub(super) async fn an_order_cancelled_by_someone_else_is_not_ours(f: &Fixture) {
        f.insert("theirs", "CANCELLED", secs(-5)).await;
        assert_eq!(
            state_of(f.store().as_ref(), "theirs", LEASE).await,
            OrderState::CancelledElsewhere
        );
        assert_eq!(f.outbox_rows("theirs").await, 0);
    }

    /// The payment's transaction has updated the row to paid and not yet
    /// committed while the cancel transaction runs (awaited inside it, so
    /// the race happens every time): the cancel skips the row it holds and
    /// says so (`Locked`, never `Cancelled`), the payment commits, and the
    /// order is paid, with no effect of a cancellation.
    pub(super) async fn a_payment_committing_during_the_cancel_wins(f: &Fixture) {
        f.insert("race", "UNPAID", secs(-1)).await;
        let store = f.store().clone();
        let mut during = None;
        f.pay_concurrently("race", async {
            during = Some(state_of(store.as_ref(), "race", LEASE).await);
        })
        .await;
        let state = during.expect("the cancel ran inside the payment's transaction");
        assert!(matches!(state, OrderState::Locked { .. }), "{state:?}");
        assert_eq!(f.row("race").await.0, "PAID");
        assert_eq!(f.outbox_rows("race").await, 0);
        // Asked again (what the pipeline does with a held order): paid.
        assert_eq!(
            state_of(f.store().as_ref(), "race", LEASE).await,
            OrderState::Paid
        );
    }

    pub(super) async fn the_cancellation_is_timed_after_the_row_lock(f: &Fixture) {
        f.insert("held", "UNPAID", secs(-1)).await;
        let store = f.store().clone();
        let released = f
            .lock_row_during("held", async {
                // Skipped while the shop holds the row, never waited for.
                let state = state_of(store.as_ref(), "held", LEASE).await;
                assert!(matches!(state, OrderState::Locked { .. }), "{state:?}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            })
            .await;
        let c = cancellation(state_of(store.as_ref(), "held", LEASE).await);
        assert!(c.just_now, "{c:?}");
        assert!(
            c.cancelled_at >= released,
            "cancelled at {} before the shop let go of the row at {released}",
            c.cancelled_at
        );
        assert!(c.cancelled_at >= c.expires_at, "never early: {c:?}");
        // The outbox keeps that time.
        store_release_and_check(f, "held", c.cancelled_at).await;
    }

    /// After the lease is given back, the next cancel reports the
    /// cancellation time the outbox kept.
    async fn store_release_and_check(f: &Fixture, order: &str, at: DateTime<Utc>) {
        let store = f.store().as_ref();
        store.release_leases(&[order]).await.unwrap();
        let again = cancellation(state_of(store, order, LEASE).await);
        assert_eq!(again.cancelled_at, at);
    }

    pub(super) async fn a_batch_reports_every_order_once(f: &Fixture) {
        f.insert("b-due", "UNPAID", secs(-1)).await;
        f.insert("b-paid", "PAID", secs(-1)).await;
        f.insert("b-later", "UNPAID", secs(60)).await;
        f.insert("b-theirs", "CANCELLED", secs(-1)).await;
        let ids: Vec<OrderId> = ["b-due", "b-paid", "b-later", "b-theirs", "b-ghost"]
            .into_iter()
            .map(id)
            .collect();
        let mut states = f.store().cancel_due(&ids, LEASE).await.unwrap();
        states.sort_by(|a, b| a.0.cmp(&b.0));
        let got: Vec<(&str, &str)> = states
            .iter()
            .map(|(id, s)| {
                let kind = match s {
                    OrderState::Cancelled(c) if c.just_now => "cancelled",
                    OrderState::Paid => "paid",
                    OrderState::NotYetDue { .. } => "not yet due",
                    OrderState::CancelledElsewhere => "cancelled elsewhere",
                    OrderState::Unknown => "unknown",
                    _ => "other",
                };
                (id.as_str(), kind)
            })
            .collect();
        assert_eq!(
            got,
            [
                ("b-due", "cancelled"),
                ("b-ghost", "unknown"),
                ("b-later", "not yet due"),
                ("b-paid", "paid"),
                ("b-theirs", "cancelled elsewhere"),
            ]
        );
    }

    pub(super) async fn items_are_read_per_order(f: &Fixture) {
        f.insert("i-1", "UNPAID", secs(-1)).await;
        f.insert("i-2", "UNPAID", secs(-1)).await;
        f.insert("i-3", "UNPAID", secs(-1)).await;
        f.add_item("i-1", "apple", 2).await;
        f.add_item("i-1", "pear", 1).await;
        f.add_item("i-2", "plum", 5).await;
        f.add_item("i-3", "fig", 7).await;
        let (a, b, none) = (id("i-1"), id("i-2"), id("i-none"));
        let items = f.store().items(&[&a, &b, &none]).await.unwrap();
        assert_eq!(items.len(), 2, "{items:?}");
        let i1: Vec<(&str, i64)> = items["i-1"]
            .iter()
            .map(|i| (i.sku.as_str(), i.quantity))
            .collect();
        assert_eq!(i1, [("apple", 2), ("pear", 1)]);
        assert_eq!(items["i-2"][0].quantity, 5);
    }

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

    fn failure<'a>(id: &'a str, permanent: bool) -> store::OutboxFailure<'a> {
        store::OutboxFailure {
            id,
            error: "inventory: Unavailable",
            release: true,
            permanent,
        }
    }

    pub(super) async fn failing_outbox_rows_wait_their_backoff_and_given_up_ones_are_left(
        f: &Fixture,
    ) {
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
        let plan = |f: &store::OutboxFailure<'_>, attempts: u32| {
            assert_eq!(attempts, 1);
            if f.permanent {
                store::NextAttempt::GiveUp("refused".into())
            } else {
                store::NextAttempt::After(Duration::from_secs(3600))
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
        let due_now =
            |_: &store::OutboxFailure<'_>, _: u32| store::NextAttempt::After(Duration::ZERO);
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
        let give_up =
            |_: &store::OutboxFailure<'_>, _: u32| store::NextAttempt::GiveUp("refused".into());
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
        let statement = store::stale_statement_for_explain(
            f.dialect(),
            "cancel_unpaid",
            Duration::from_secs(60),
            100,
        );
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
        let says_migrate = |err: store::StoreError, what: &str| {
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
        store::migrate(f.url()).await.unwrap();
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

    pub(super) async fn one_cancel_transaction_carries_the_most_ids_its_dialect_allows(
        f: &Fixture,
    ) {
        // MySQL: one more than the limit, every order due: a transaction
        // with the limit itself (the outbox insert binding the most
        // placeholders per order, 65,532), then one with the last order (a
        // statement over the limit never answers). PostgreSQL binds one
        // array: more than MySQL's limit, in one statement.
        let n = match f.dialect() {
            Dialect::MySql => store::max_batch_ids(Dialect::MySql) + 1,
            Dialect::Postgres => 20_000,
        };
        assert_eq!(store::max_batch_ids(Dialect::MySql), 65_535 / 4);
        assert!(store::max_batch_ids(Dialect::Postgres) > n);
        let ago = match f.dialect() {
            Dialect::MySql => "UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE",
            Dialect::Postgres => "now() - interval '1 minute'",
        };
        let digit = (0..10)
            .map(|n| format!("SELECT {n} AS n"))
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        f.exec(&format!(
            "INSERT INTO orders (id, status, expires_at) \
             SELECT CONCAT('mb-', k), 'UNPAID', {ago} \
               FROM (SELECT a.n * 10000 + b.n * 1000 + c.n * 100 + d.n * 10 + e.n AS k \
                       FROM ({digit}) a, ({digit}) b, ({digit}) c, ({digit}) d, ({digit}) e) x \
              WHERE k < {n}"
        ))
        .await;
        let ids: Vec<OrderId> = (0..n).map(|k| id(&format!("mb-{k}"))).collect();
        // A statement over MySQL's limit never answers: a bound, not a hang.
        let states =
            tokio::time::timeout(Duration::from_secs(180), f.store().cancel_due(&ids, LEASE))
                .await
                .expect("the cancel transactions answer")
                .unwrap();
        assert_eq!(states.len(), n);
        let cancelled = states
            .iter()
            .filter(|(_, s)| matches!(s, OrderState::Cancelled(c) if c.just_now))
            .count();
        assert_eq!(cancelled, n);
        // How many transactions wrote the outbox rows, and how many rows
        // each: PostgreSQL's rows of one transaction share their `xmin`;
        // MySQL's outbox row is timed by its transaction's clock, read once.
        let per_transaction = match f.dialect() {
            Dialect::Postgres => {
                "SELECT count(*)::text FROM order_timeout_cancel_outbox \
                  WHERE order_id LIKE 'mb-%' GROUP BY xmin::text ORDER BY count(*) DESC"
            }
            Dialect::MySql => {
                "SELECT CAST(count(*) AS CHAR) FROM order_timeout_cancel_outbox \
                  WHERE CAST(order_id AS CHAR) LIKE 'mb-%' GROUP BY created_at \
                  ORDER BY count(*) DESC"
            }
        };
        let expected: Vec<String> = match f.dialect() {
            Dialect::Postgres => vec![n.to_string()],
            Dialect::MySql => vec![(n - 1).to_string(), "1".into()],
        };
        assert_eq!(
            f.texts(per_transaction).await,
            expected,
            "rows per transaction"
        );
    }

    pub(super) async fn ping_answers(f: &Fixture) {
        f.store().ping().await.unwrap();
    }

    pub(super) async fn migrate_creates_only_the_services_tables_and_leaves_the_shops_alone(
        f: &Fixture,
    ) {
        let before = f.shop_ddl().await;
        assert!(!before.is_empty());
        store::migrate(f.url()).await.unwrap();
        store::migrate(f.url()).await.unwrap();
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
}

/// Instantiates every case of [`cases`] as a test against a [`Fixture`]
/// of `$dialect`.
macro_rules! store_suite {
    ($module:ident, $dialect:expr) => {
        mod $module {
            use super::*;
            store_suite!(@cases $dialect;
                unknown_order_is_reported_unknown,
                paid_order_is_left_alone,
                order_not_yet_due_is_not_cancelled,
                overdue_order_is_cancelled_just_now_with_the_lease,
                a_live_lease_is_reported_as_leased_elsewhere,
                an_earlier_cancellation_with_work_pending_is_taken_over,
                finished_work_is_reported_done_and_marks_are_idempotent,
                an_order_cancelled_by_someone_else_is_not_ours,
                a_payment_committing_during_the_cancel_wins,
                the_cancellation_is_timed_after_the_row_lock,
                a_batch_reports_every_order_once,
                items_are_read_per_order,
                the_sweeper_finds_overdue_orders_oldest_first,
                the_sweeper_finds_stale_outbox_work_without_a_live_lease,
                the_stale_outbox_scan_reads_an_index_of_the_pending_rows,
                failing_outbox_rows_wait_their_backoff_and_given_up_ones_are_left,
                retention_deletes_only_finished_rows_past_it,
                prepare_says_to_run_migrate_without_the_services_tables,
                the_report_names_the_tables_nothing_vacuums,
                one_cancel_transaction_carries_the_most_ids_its_dialect_allows,
                ping_answers,
                migrate_creates_only_the_services_tables_and_leaves_the_shops_alone,
            );
            store_suite!(@in id_columns $dialect;
                ids_are_compared_exactly_in_every_id_column_type,
            );
            store_suite!(@in failures $dialect;
                a_flip_failing_for_one_row_fails_only_that_order,
            );
            store_suite!(@in abandon $dialect;
                a_missing_table_is_no_rows_fault,
                a_lone_order_failing_for_its_row_fails_alone,
                a_failure_meeting_every_order_is_no_rows_fault,
                deadlines_that_are_no_time_are_never_due_and_never_panic,
                rows_set_aside_are_tried_again_later_and_when_asked,
                integer_deadlines_are_refused_as_times_and_work_with_their_unit,
                a_widened_id_column_is_read_again_without_a_restart,
                an_unknown_time_zone_is_refused_naming_the_key,
            );
            store_suite!(@in scans $dialect;
                scans_read_past_rows_that_are_no_orders,
                the_sweepers_scan_leaves_out_reopened_and_set_aside_rows,
                the_history_pages_a_range_of_its_index,
            );
            store_suite!(@in bindings $dialect;
                parameters_bind_in_every_form_on_every_connection,
                a_misplaced_or_unbindable_parameter_is_refused_at_the_check,
                codes_one_in_the_status_columns_comparison_are_refused,
            );
            store_suite!(@in locks $dialect;
                a_held_row_delays_only_its_own_order,
                a_held_row_that_the_holder_pays_is_never_cancelled,
                a_lock_the_cancel_cannot_skip_reports_the_order_held,
                a_held_row_an_also_statement_writes_delays_only_its_own_order,
                a_slow_guard_times_out_as_a_transient_error,
                a_cancel_committed_meanwhile_is_never_reported_left_alone,
            );
            store_suite!(@in effects $dialect;
                effects_follow_the_flip_while_another_session_flips_the_guard,
                effects_follow_the_flip_while_another_session_moves_the_deadline,
            );
            store_suite!(@in timers $dialect;
                a_timer_flips_only_due_rows_in_its_from_status,
                a_held_row_delays_only_itself_for_a_timer,
                a_held_row_the_holder_moves_on_is_never_flipped_by_the_timer,
                effects_follow_a_timers_flip_while_another_session_moves_rows_out_of_its_from_status,
                effects_follow_a_timers_flip_while_another_session_flips_the_guard_column,
                a_timers_batch_never_flips_a_row_it_was_not_asked_about,
                a_row_back_in_its_from_status_is_not_flipped_again,
            );
        }
    };
    (@in $module:ident $dialect:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = Fixture::new($dialect).await;
                $module::$case(&fixture).await;
            }
        )*
    };
    (@cases $dialect:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let fixture = Fixture::new($dialect).await;
                cases::$case(&fixture).await;
            }
        )*
    };
}

store_suite!(postgres, Dialect::Postgres);
store_suite!(mysql, Dialect::MySql);

/// The MySQL/MariaDB server the tests use: `MYSQL_URL` (default: the local
/// MariaDB's root).
pub(crate) fn mysql_base() -> SecretUrl {
    SecretUrl::new(
        std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/mysql".into()),
    )
}

/// A pool on the MySQL/MariaDB database `url` whose sessions read and
/// write zone-less times in `zone` (as the shop's programs do), with
/// statement logging off.
pub(crate) async fn mysql_pool(url: &SecretUrl, zone: &str, max_connections: u32) -> MySqlPool {
    let options: sqlx::mysql::MySqlConnectOptions = url.expose().parse().unwrap();
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(sqlx::ConnectOptions::disable_statement_logging(
            options.timezone(Some(zone.into())),
        ))
        .await
        .unwrap()
}

/// A fresh database of one dialect (PostgreSQL on `DATABASE_URL`'s server,
/// MySQL/MariaDB on `MYSQL_URL`'s), migrated, with the reference shop
/// schema, dropped afterwards; and the shop's side of it.
pub(super) struct Fixture {
    dialect: Dialect,
    name: String,
    base: SecretUrl,
    url: SecretUrl,
    /// The shop's pool (`on_shop!` runs one statement on it).
    shop: ShopDb,
    store: Store,
    /// Ends the run, naming the test, if it hangs.
    _watchdog: crate::bounds::Watchdog,
}

impl Fixture {
    /// A fresh database of `dialect`: migrated, with the reference shop
    /// schema.
    async fn new(dialect: Dialect) -> Self {
        let watchdog = crate::bounds::Watchdog::start();
        let base = match dialect {
            Dialect::Postgres => scratch::test_pg_server(),
            Dialect::MySql => mysql_base(),
        };
        crate::common::sweep_abandoned().await;
        let name = scratch::owned_name("ot_store");
        let url = scratch::with_path(&base, &name).unwrap();
        let shop = ShopDb::prepare(&url, 5)
            .await
            .expect("prepare the store test database");
        let store = store::connect_lazy(&url, 5, &ShopSchema::default()).unwrap();
        Self {
            dialect,
            name,
            base,
            url,
            shop,
            store,
            _watchdog: watchdog,
        }
    }

    /// The store under test.
    fn store(&self) -> &Store {
        &self.store
    }

    /// Its URL (for the migration cases).
    fn url(&self) -> &SecretUrl {
        &self.url
    }

    /// The dialect.
    fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Inserts an order row with `status` (`UNPAID`, `PAID`, `CANCELLED`)
    /// whose deadline is `due_in` from now (negative: overdue).
    async fn insert(&self, id: &str, status: &str, due_in: chrono::Duration) {
        on_shop!(
            self,
            execute,
            query(
                "INSERT INTO orders (id, status, expires_at) VALUES ($1, $2, $3)",
                "INSERT INTO orders (id, status, expires_at) VALUES (?, ?, ?)"
            ),
            id,
            status,
            Utc::now() + due_in
        )
        .unwrap();
    }

    /// Adds an item to an order.
    async fn add_item(&self, id: &str, sku: &str, quantity: i64) {
        on_shop!(
            self,
            execute,
            query(
                "INSERT INTO order_items (order_id, sku, quantity) VALUES ($1, $2, $3)",
                "INSERT INTO order_items (order_id, sku, quantity) VALUES (?, ?, ?)"
            ),
            id,
            sku,
            quantity
        )
        .unwrap();
    }

    /// The order row's `(status, cancelled_at, cancel_reason)`.
    async fn row(&self, id: &str) -> (String, Option<DateTime<Utc>>, Option<String>) {
        on_shop!(
            self,
            fetch_one,
            query_as(
                "SELECT status, cancelled_at, cancel_reason FROM orders WHERE id = $1",
                "SELECT status, cancelled_at, cancel_reason FROM orders WHERE id = ?"
            ),
            id
        )
        .unwrap()
    }

    /// Outbox rows for the order (0 or 1).
    async fn outbox_rows(&self, id: &str) -> i64 {
        on_shop!(
            self,
            fetch_one,
            query_scalar(
                "SELECT count(*) FROM order_timeout_cancel_outbox WHERE order_id = $1",
                "SELECT COUNT(*) FROM order_timeout_cancel_outbox WHERE order_id = ?"
            ),
            id
        )
        .unwrap()
    }

    /// Pays the order in a transaction that holds the row while `during`
    /// runs, then commits: what a concurrent payment looks like to a cancel
    /// statement that runs meanwhile.
    async fn pay_concurrently(&self, id: &str, during: impl Future<Output = ()>) {
        let mut tx = ShopTx::begin(&self.shop).await;
        tx.execute(
            "UPDATE orders SET status = 'PAID' WHERE id = $1 AND status = 'UNPAID'",
            "UPDATE orders SET status = 'PAID' WHERE id = ? AND status = 'UNPAID'",
            id,
        )
        .await;
        during.await;
        tx.commit().await;
    }

    /// Holds the order row's lock (`SELECT … FOR UPDATE`, as a slow
    /// payment callback would) while `during` runs, then commits; returns
    /// the database's clock read just before the commit.
    async fn lock_row_during(&self, id: &str, during: impl Future<Output = ()>) -> DateTime<Utc> {
        let mut tx = ShopTx::begin(&self.shop).await;
        tx.execute(
            "SELECT 1 FROM orders WHERE id = $1 FOR UPDATE",
            "SELECT 1 FROM orders WHERE id = ? FOR UPDATE",
            id,
        )
        .await;
        during.await;
        let now = tx
            .now("SELECT clock_timestamp()", "SELECT UTC_TIMESTAMP(6)")
            .await;
        tx.commit().await;
        now
    }

    /// Runs `sql` in a transaction of another session, holds that
    /// transaction open (with its locks) while `during` runs, then rolls it
    /// back.
    async fn in_open_transaction(&self, sql: &str, during: impl Future<Output = ()>) {
        let mut tx = ShopTx::begin(&self.shop).await;
        tx.raw(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        during.await;
        tx.rollback().await;
    }

    /// Ages an outbox row (its `created_at`) by `by`.
    async fn age_outbox(&self, id: &str, by: chrono::Duration) {
        let micros = by.num_microseconds().unwrap();
        on_shop!(
            self,
            execute,
            query(
                "UPDATE order_timeout_cancel_outbox \
                SET created_at = created_at + make_interval(secs => $1::float8 / 1e6) \
              WHERE order_id = $2",
                "UPDATE order_timeout_cancel_outbox \
                SET created_at = created_at + INTERVAL ? MICROSECOND WHERE order_id = ?"
            ),
            micros,
            id
        )
        .unwrap();
    }

    /// The column definitions of the shop's tables, to compare before and
    /// after a migration.
    async fn shop_ddl(&self) -> Vec<String> {
        on_shop!(
            self,
            fetch_all,
            query_scalar(
                "SELECT concat_ws(' ', table_schema, table_name, column_name, data_type, \
                              is_nullable, column_default) \
               FROM information_schema.columns \
              WHERE (table_schema = 'public' AND table_name IN ('orders', 'order_items')) \
                 OR table_schema = 'inventory' \
              ORDER BY table_schema, table_name, ordinal_position",
                "SELECT CAST(CONCAT_WS(' ', TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, \
                                   COALESCE(COLUMN_DEFAULT, '-'), COLUMN_KEY) AS CHAR) \
               FROM information_schema.COLUMNS \
              WHERE TABLE_SCHEMA = DATABASE() \
                AND TABLE_NAME IN ('orders', 'order_items', 'shop_stock') \
              ORDER BY TABLE_NAME, ORDINAL_POSITION"
            )
        )
        .unwrap()
    }

    /// The tables of the database that are not the shop's reference ones.
    async fn other_tables(&self) -> Vec<String> {
        on_shop!(
            self,
            fetch_all,
            query_scalar(
                "SELECT table_name::text FROM information_schema.tables \
              WHERE table_schema = 'public' AND table_name NOT IN ('orders', 'order_items')",
                "SELECT CAST(TABLE_NAME AS CHAR) FROM information_schema.TABLES \
              WHERE TABLE_SCHEMA = DATABASE() \
                AND TABLE_NAME NOT IN ('orders', 'order_items', 'shop_stock')"
            )
        )
        .unwrap()
    }

    /// Runs `sql` (one or more statements) as the shop would.
    async fn exec(&self, sql: &str) {
        let text = sqlx::AssertSqlSafe(sql.to_owned());
        match &self.shop {
            ShopDb::Postgres(pool) => sqlx::raw_sql(text).execute(pool).await.map(drop),
            ShopDb::MySql(pool) => sqlx::raw_sql(text).execute(pool).await.map(drop),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The first column of `sql`'s rows, as text.
    async fn texts(&self, sql: &str) -> Vec<String> {
        let text = || sqlx::AssertSqlSafe(sql.to_owned());
        on_shop!(self, fetch_all, query_scalar(text(), text()))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Another store on this database, with `schema`'s mapping.
    fn store_with(&self, schema: &ShopSchema) -> Store {
        store::connect_lazy(&self.url, 5, schema).unwrap()
    }

    /// Runs `sql` again and again on a session of its own, as another
    /// client would, until the repeater is stopped.
    fn repeat(&self, sql: String) -> Repeater {
        let shop = self.shop.clone();
        Repeater::spawn(move || {
            let (shop, sql) = (shop.clone(), sql.clone());
            async move {
                let text = || sqlx::AssertSqlSafe(sql.clone());
                match &shop {
                    ShopDb::Postgres(pool) => sqlx::query(text()).execute(pool).await.map(drop),
                    ShopDb::MySql(pool) => sqlx::query(text()).execute(pool).await.map(drop),
                }
                .unwrap();
            }
        })
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = scratch::drop_database_blocking(&self.base, &self.name);
    }
}
