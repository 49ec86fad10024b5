//! Every state the cancel transaction can report for an order (unknown,
//! paid, not yet due, cancelled just now, leased elsewhere, taken over,
//! done, cancelled by someone else, paid meanwhile), when its cancellation
//! is timed, what a batch reports, the items it reads, and how many ids one
//! cancel transaction carries on each dialect.

use super::*;
use order_timeout::testing::store::max_batch_ids;

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

pub(super) async fn one_cancel_transaction_carries_the_most_ids_its_dialect_allows(f: &Fixture) {
    // MySQL: one more than the limit, every order due: a transaction
    // with the limit itself (the outbox insert binding the most
    // placeholders per order, 65,532), then one with the last order (a
    // statement over the limit never answers). PostgreSQL binds arrays:
    // more than MySQL's limit, in one transaction.
    let n = match f.dialect() {
        Dialect::MySql => max_batch_ids(Dialect::MySql) + 1,
        Dialect::Postgres => 20_000,
    };
    assert_eq!(max_batch_ids(Dialect::MySql), 65_535 / 4);
    assert!(max_batch_ids(Dialect::Postgres) > n);
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
    let states = tokio::time::timeout(Duration::from_secs(180), f.store().cancel_due(&ids, LEASE))
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
