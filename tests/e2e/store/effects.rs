//! Effects follow the status flip, exactly: the `also` statements and the
//! outbox row (hence the stock release and the event) for an order if and
//! only if this service's UPDATE changed its status from unpaid to
//! cancelled, whatever the guard and deadline expressions read and
//! whatever other sessions commit meanwhile.
//!
//! A second session flips what the guard (a cancel switch) or the deadline
//! (mall's settings row) reads, again and again, while two stores (two
//! replicas) cancel 1,200 due orders in concurrent batches. Afterwards, for
//! every order: `also` effect present ⇔ outbox row present ⇔ status
//! cancelled ⇔ reported cancelled just now.

use std::collections::{BTreeMap, BTreeSet};

use order_timeout::settings::{OrdersMapping, Release};

use super::*;

const ORDERS: usize = 1_200;
const BATCH: usize = 25;

pub(super) async fn effects_follow_the_flip_while_another_session_flips_the_guard(f: &Fixture) {
    f.exec(
        "CREATE TABLE cancel_switch (id INT PRIMARY KEY, open INT NOT NULL); \
         INSERT INTO cancel_switch VALUES (1, 1)",
    )
    .await;
    let orders = OrdersMapping {
        guard: "(SELECT open FROM cancel_switch WHERE id = 1) = 1".into(),
        ..OrdersMapping::default()
    };
    race(
        f,
        orders,
        "UPDATE cancel_switch SET open = 1 - open WHERE id = 1",
    )
    .await;
}

pub(super) async fn effects_follow_the_flip_while_another_session_moves_the_deadline(f: &Fixture) {
    f.exec(
        "CREATE TABLE order_setting (id INT PRIMARY KEY, minutes INT NOT NULL); \
         INSERT INTO order_setting VALUES (1, 0)",
    )
    .await;
    let deadline = match f.dialect() {
        Dialect::MySql => {
            "expires_at + INTERVAL (SELECT minutes FROM order_setting WHERE id = 1) MINUTE"
        }
        Dialect::Postgres => {
            "expires_at + (SELECT minutes FROM order_setting WHERE id = 1) * interval '1 minute'"
        }
    };
    let orders = OrdersMapping {
        deadline: deadline.into(),
        ..OrdersMapping::default()
    };
    // 0 minutes: due; 600: due in ten hours.
    race(
        f,
        orders,
        "UPDATE order_setting SET minutes = 600 - minutes WHERE id = 1",
    )
    .await;
}

/// 1,200 due orders, an `also` statement logging each (once: the log's
/// key), `flip` repeated by another session while two stores cancel them
/// in concurrent batches of 25 (with `also` statements, each order in a
/// transaction of its own); then the invariant, order by order, and that
/// the flips decided orders both ways.
async fn race(f: &Fixture, orders: OrdersMapping, flip: &str) {
    let ids = setup(f).await;
    let mark = if f.dialect() == Dialect::MySql {
        "?"
    } else {
        "$1"
    };
    let schema = ShopSchema {
        orders: OrdersMapping {
            also: vec![format!("INSERT INTO also_log (order_id) VALUES ({mark})")],
            ..orders
        },
        release: Release::None,
        ..ShopSchema::default()
    };
    let stores = [f.store_with(&schema), f.store_with(&schema)];
    for store in &stores {
        store.prepare().await.unwrap();
    }
    let flipper = f.repeat(flip.to_owned());
    let batches: Vec<Vec<OrderId>> = ids.chunks(BATCH).map(<[OrderId]>::to_vec).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (n, batch) in batches.into_iter().enumerate() {
        let store = stores[n % 2].clone();
        tasks.spawn(async move { store.cancel_due(&batch, LEASE).await.unwrap() });
    }
    let mut reported = BTreeSet::new();
    while let Some(states) = tasks.join_next().await {
        for (id, state) in states.unwrap() {
            if matches!(state, OrderState::Cancelled(c) if c.just_now) {
                reported.insert(id.as_str().to_owned());
            }
        }
    }
    let flips = flipper.stop().await;
    assert!(flips > 10, "the other session flipped {flips} times");
    check(f, &ids, &reported).await;
}

/// The log the `also` statement writes, and the due orders.
async fn setup(f: &Fixture) -> Vec<OrderId> {
    let ids: Vec<OrderId> = (0..ORDERS).map(|n| id(&format!("fx-{n:05}"))).collect();
    let ago = match f.dialect() {
        Dialect::MySql => "UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE",
        Dialect::Postgres => "now() - interval '1 minute'",
    };
    let values: Vec<String> = ids
        .iter()
        .map(|id| format!("('{id}', 'UNPAID', {ago})"))
        .collect();
    f.exec(&format!(
        "CREATE TABLE also_log (order_id VARCHAR(128) NOT NULL PRIMARY KEY); \
         INSERT INTO orders (id, status, expires_at) VALUES {}",
        values.join(", ")
    ))
    .await;
    ids
}

/// For every order: `also` effect ⇔ outbox row ⇔ status cancelled ⇔
/// reported cancelled just now.
async fn check(f: &Fixture, ids: &[OrderId], reported: &BTreeSet<String>) {
    let outbox_id = match f.dialect() {
        Dialect::MySql => "CAST(order_id AS CHAR)",
        Dialect::Postgres => "order_id",
    };
    let set = |rows: Vec<String>| rows.into_iter().collect::<BTreeSet<String>>();
    let cancelled = set(f
        .texts("SELECT id FROM orders WHERE status = 'CANCELLED'")
        .await);
    let also = set(f.texts("SELECT order_id FROM also_log").await);
    let outbox = set(f
        .texts(&format!(
            "SELECT {outbox_id} FROM order_timeout_cancel_outbox"
        ))
        .await);
    let mut wrong = BTreeMap::new();
    for id in ids.iter().map(OrderId::as_str) {
        let facts = [
            cancelled.contains(id),
            also.contains(id),
            outbox.contains(id),
            reported.contains(id),
        ];
        if facts.iter().any(|f| *f != facts[0]) {
            wrong.insert(id, facts);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} orders with [cancelled, also, outbox, reported] out of step \
         ({} cancelled): {wrong:?}",
        wrong.len(),
        ids.len(),
        cancelled.len()
    );
    // The race happened: the other session's flips decided some orders
    // each way (else the invariant above was never put to the test).
    assert!(!cancelled.is_empty(), "some orders were cancelled");
    assert!(
        cancelled.len() < ids.len(),
        "some orders stayed unpaid: every one was cancelled, so no flip of the other \
         session came between a batch's statements"
    );
    eprintln!(
        "{} of {} orders cancelled while the other session flipped",
        cancelled.len(),
        ids.len()
    );
}
