//! A row the shop holds delays only its own order.
//!
//! A second real session holds one due order's row (`SELECT … FOR
//! UPDATE`, as a slow payment callback would) in an open transaction while
//! the cancel transaction runs for a batch that contains it: the other
//! orders are cancelled at once, with their effects (an `also` statement's
//! log row and the outbox row) exactly once; the held order is reported
//! [`OrderState::Locked`] and left unpaid, without effects. Once the
//! holder lets go, the held order is cancelled with its effects exactly
//! once; if the holder paid it instead, it is never cancelled and no
//! effects run for it.
//!
//! And what the skipping cannot avoid (here: an `also` statement waiting
//! for a row the shop's open transaction inserted) is bounded by
//! `db_lock_timeout`, and a slow guard by `db_statement_timeout`: a
//! transient error, not a hang, and nothing done.

use std::time::Instant;

use order_timeout::settings::{OrdersMapping, Release};
use order_timeout::testing::store::{PoolSettings, connect_timer};

use super::*;

/// The other due orders in the batch.
const OTHERS: usize = 20;

/// How long a batch may take while one of its rows is held: generous (the
/// statement itself takes milliseconds), far below the minutes a lock can
/// be held.
const PROMPT: Duration = Duration::from_secs(5);

/// The `also` statement's log (one row per order: its key) and `n` due
/// orders `{prefix}-NN`.
async fn setup(f: &Fixture, prefix: &str, n: usize) -> Vec<OrderId> {
    f.exec("CREATE TABLE also_log (order_id VARCHAR(128) NOT NULL PRIMARY KEY)")
        .await;
    let ids: Vec<OrderId> = (0..n).map(|i| id(&format!("{prefix}-{i:02}"))).collect();
    for id in &ids {
        f.insert(id.as_str(), "UNPAID", secs(-1)).await;
    }
    ids
}

/// The mapping under test: an `also` statement logging each cancelled
/// order, stock released by it (no gRPC).
fn schema(f: &Fixture) -> ShopSchema {
    let mark = match f.dialect() {
        Dialect::MySql => "?",
        Dialect::Postgres => "$1",
    };
    ShopSchema {
        orders: OrdersMapping {
            also: vec![format!("INSERT INTO also_log (order_id) VALUES ({mark})")],
            ..OrdersMapping::default()
        },
        release: Release::None,
        ..ShopSchema::default()
    }
}

/// How many times the `also` statement ran for `order`.
async fn also_runs(f: &Fixture, order: &str) -> usize {
    f.texts(&format!(
        "SELECT order_id FROM also_log WHERE order_id = '{order}'"
    ))
    .await
    .len()
}

/// The order's status, its `also` runs and its outbox rows.
async fn effects(f: &Fixture, order: &str) -> (String, usize, i64) {
    (
        f.row(order).await.0,
        also_runs(f, order).await,
        f.outbox_rows(order).await,
    )
}

/// Runs the cancel transaction for `ids` while `held` is held: checks that
/// it answers promptly, cancels every other order just now, and reports the
/// held one locked.
async fn cancel_around(store: &Store, ids: &[OrderId], held: &str) {
    let started = Instant::now();
    let states = store.cancel_due(ids, LEASE).await.unwrap();
    let took = started.elapsed();
    assert!(
        took < PROMPT,
        "the batch took {took:?} while one row was held"
    );
    assert_eq!(states.len(), ids.len(), "{states:?}");
    for (id, state) in states {
        if id.as_str() == held {
            assert!(
                matches!(state, OrderState::Locked { .. }),
                "held order: {state:?}"
            );
        } else {
            assert!(
                matches!(&state, OrderState::Cancelled(c) if c.just_now),
                "{id}: {state:?}"
            );
        }
    }
}

/// An order cancelled earlier, asked about again: not cancelled again (its
/// outbox lease, taken by the first call, may still be live).
fn assert_not_again(id: &OrderId, state: &OrderState) {
    assert!(
        matches!(state, OrderState::Cancelled(c) if !c.just_now)
            || matches!(state, OrderState::LeasedElsewhere { .. }),
        "{id}: {state:?}"
    );
}

pub(super) async fn a_held_row_delays_only_its_own_order(f: &Fixture) {
    let mut ids = setup(f, "lk", OTHERS).await;
    f.insert("lk-held", "UNPAID", secs(-1)).await;
    ids.push(id("lk-held"));
    let store = f.store_with(&schema(f));
    store.prepare().await.unwrap();
    f.lock_row_during("lk-held", async {
        cancel_around(&store, &ids, "lk-held").await;
        // Still held, asked again (what the pipeline does a second later):
        // still locked, still no effects; the others are not cancelled twice.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let again = store.cancel_due(&ids, LEASE).await.unwrap();
        for (id, state) in again {
            match id.as_str() {
                "lk-held" => assert!(matches!(state, OrderState::Locked { .. }), "{state:?}"),
                _ => assert_not_again(&id, &state),
            }
        }
        assert_eq!(effects(f, "lk-held").await, ("UNPAID".into(), 0, 0));
    })
    .await;
    // Let go: cancelled now, its effects once.
    let states = store.cancel_due(&ids, LEASE).await.unwrap();
    for (id, state) in states {
        match id.as_str() {
            "lk-held" => {
                let c = cancellation(state);
                assert!(c.just_now, "{c:?}");
            }
            _ => assert_not_again(&id, &state),
        }
    }
    let again = state_of(store.as_ref(), "lk-held", LEASE).await;
    assert_not_again(&id("lk-held"), &again);
    for id in &ids {
        assert_eq!(
            effects(f, id.as_str()).await,
            ("CANCELLED".into(), 1, 1),
            "{id}: [status, also runs, outbox rows]"
        );
    }
}

pub(super) async fn a_held_row_that_the_holder_pays_is_never_cancelled(f: &Fixture) {
    let mut ids = setup(f, "lp", OTHERS).await;
    f.insert("lp-held", "UNPAID", secs(-1)).await;
    ids.push(id("lp-held"));
    let store = f.store_with(&schema(f));
    store.prepare().await.unwrap();
    f.pay_concurrently("lp-held", async {
        cancel_around(&store, &ids, "lp-held").await;
    })
    .await;
    assert_eq!(
        state_of(store.as_ref(), "lp-held", LEASE).await,
        OrderState::Paid
    );
    assert_eq!(effects(f, "lp-held").await, ("PAID".into(), 0, 0));
    for id in ids.iter().filter(|id| id.as_str() != "lp-held") {
        assert_eq!(
            effects(f, id.as_str()).await,
            ("CANCELLED".into(), 1, 1),
            "{id}: [status, also runs, outbox rows]"
        );
    }
}

pub(super) async fn a_lock_the_cancel_cannot_skip_reports_the_order_held(f: &Fixture) {
    setup(f, "lt", 0).await;
    f.insert("lt-1", "UNPAID", secs(-1)).await;
    let pool = PoolSettings {
        lock_timeout: Duration::from_secs(1),
        ..PoolSettings::new(2)
    };
    let store = connect_timer(f.url(), pool, &schema(f).timer()).unwrap();
    store.prepare().await.unwrap();
    // The shop's open transaction holds the log row the `also` statement
    // would insert: the cancel's insert waits for it, briefly (the `also`
    // statements' own lock wait, shorter than `db_lock_timeout`: 200 ms on
    // PostgreSQL, MariaDB's whole second), so that the order holds a
    // connection no longer than that.
    let wait = match f.dialect() {
        Dialect::Postgres => Duration::from_millis(200),
        Dialect::MySql => Duration::from_secs(1),
    };
    f.in_open_transaction("INSERT INTO also_log (order_id) VALUES ('lt-1')", async {
        let started = Instant::now();
        let state = state_of(store.as_ref(), "lt-1", LEASE).await;
        let took = started.elapsed();
        // Held, not failed: asked about again shortly, no attempt spent.
        assert!(matches!(state, OrderState::Locked { .. }), "{state:?}");
        assert!(
            took >= wait * 3 / 4 && took < wait + Duration::from_millis(800),
            "answered after {took:?}"
        );
        // Nothing done: the transaction rolled back.
        assert_eq!(f.row("lt-1").await.0, "UNPAID");
        assert_eq!(f.outbox_rows("lt-1").await, 0);
    })
    .await;
    // The shop's transaction rolled back: the retry cancels it.
    assert!(cancellation(state_of(store.as_ref(), "lt-1", LEASE).await).just_now);
    assert_eq!(effects(f, "lt-1").await, ("CANCELLED".into(), 1, 1));
}

/// A row an `also` statement must write that the shop holds delays only
/// its own order: the other orders of its batch are cancelled, with their
/// effects, while it waits (committed before the holder lets go), and
/// another batch run meanwhile is not held up by its wait either. Then
/// it is reported held, without effects, and cancelled once the holder
/// lets go.
pub(super) async fn a_held_row_an_also_statement_writes_delays_only_its_own_order(f: &Fixture) {
    let mut ids = setup(f, "la", OTHERS).await;
    f.insert("la-held", "UNPAID", secs(-1)).await;
    f.insert("la-other-batch", "UNPAID", secs(-1)).await;
    ids.push(id("la-held"));
    let pool = PoolSettings {
        lock_timeout: Duration::from_secs(3),
        ..PoolSettings::new(8)
    };
    let store = connect_timer(f.url(), pool, &schema(f).timer()).unwrap();
    store.prepare().await.unwrap();
    f.in_open_transaction(
        "INSERT INTO also_log (order_id) VALUES ('la-held')",
        async {
            let batch = tokio::spawn({
                let (store, ids) = (store.clone(), ids.clone());
                async move { store.cancel_due(&ids, LEASE).await.unwrap() }
            });
            // While the held order waits for its lock (3 s): the batch's
            // other orders are committed with their effects...
            let started = Instant::now();
            loop {
                let mut done = 0;
                for id in ids.iter().filter(|id| id.as_str() != "la-held") {
                    done +=
                        usize::from(effects(f, id.as_str()).await == ("CANCELLED".into(), 1, 1));
                }
                if done == OTHERS {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_millis(2_500),
                    "only {done} of {OTHERS} other orders cancelled while one waited for its lock"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // ...and another batch is not held up by that wait.
            let other = Instant::now();
            let state = state_of(store.as_ref(), "la-other-batch", LEASE).await;
            assert!(
                matches!(&state, OrderState::Cancelled(c) if c.just_now),
                "{state:?}"
            );
            assert!(
                other.elapsed() < Duration::from_millis(1_500),
                "another batch waited {:?} for the held one",
                other.elapsed()
            );
            assert!(
                !batch.is_finished(),
                "the held order did not wait for its lock"
            );
            let states = batch.await.unwrap();
            for (id, state) in states {
                match id.as_str() {
                    "la-held" => assert!(matches!(state, OrderState::Locked { .. }), "{state:?}"),
                    _ => assert!(
                        matches!(&state, OrderState::Cancelled(c) if c.just_now),
                        "{id}: {state:?}"
                    ),
                }
            }
            assert_eq!(effects(f, "la-held").await, ("UNPAID".into(), 0, 0));
        },
    )
    .await;
    assert!(cancellation(state_of(store.as_ref(), "la-held", LEASE).await).just_now);
    for id in ids.iter().chain([&id("la-other-batch")]) {
        assert_eq!(
            effects(f, id.as_str()).await,
            ("CANCELLED".into(), 1, 1),
            "{id}: [status, also runs, outbox rows]"
        );
    }
}

pub(super) async fn a_slow_guard_times_out_as_a_transient_error(f: &Fixture) {
    // Slow for one order only, so that the schema check's count of unpaid
    // orders (before that order exists) is quick.
    let sleep = match f.dialect() {
        Dialect::MySql => "SLEEP(3) = 0",
        Dialect::Postgres => "pg_sleep(3) IS NOT NULL",
    };
    let schema = ShopSchema {
        orders: OrdersMapping {
            guard: format!("(id <> 'st-1' OR {sleep})"),
            ..OrdersMapping::default()
        },
        ..ShopSchema::default()
    };
    let pool = PoolSettings {
        statement_timeout: Duration::from_secs(1),
        ..PoolSettings::new(2)
    };
    let store = connect_timer(f.url(), pool, &schema.timer()).unwrap();
    store.prepare().await.unwrap();
    f.insert("st-1", "UNPAID", secs(-1)).await;
    let started = Instant::now();
    let err = store.cancel_due(&[id("st-1")], LEASE).await.unwrap_err();
    let took = started.elapsed();
    assert!(!err.is_permanent(), "transient: {err}");
    assert!(
        took < Duration::from_millis(2900),
        "failed after {took:?}: {err}"
    );
    assert_eq!(f.row("st-1").await.0, "UNPAID");
    assert_eq!(f.outbox_rows("st-1").await, 0);
}

/// Another worker's cancel of the order commits while this cancel
/// transaction runs: this one finds the order row held (skipped, read as
/// last committed: unpaid) and the other's outbox row (on MySQL, once its
/// locking read has waited for the other's commit). What it reports must
/// never be "left alone" — acked with nothing done, as a row the shop
/// re-opened after an earlier flip — but the order locked (asked about
/// again shortly) or cancelled by this service (its work taken over or
/// leased elsewhere). On MySQL it failed (`LeftAlone`) until the cancel
/// transaction read such rows again, locking, after the outbox wait.
pub(super) async fn a_cancel_committed_meanwhile_is_never_reported_left_alone(f: &Fixture) {
    f.insert("raced", "UNPAID", secs(-1)).await;
    // The other worker's cancel transaction, open: the row flipped and its
    // outbox row written, as the service writes them.
    let mut other = ShopTx::begin(&f.shop).await;
    other
        .raw(match f.dialect() {
            Dialect::Postgres => {
                "UPDATE orders SET status = 'CANCELLED', cancelled_at = now() WHERE id = 'raced'; \
                 INSERT INTO order_timeout_cancel_outbox (order_id) VALUES ('raced')"
            }
            Dialect::MySql => {
                "UPDATE orders SET status = 'CANCELLED', cancelled_at = UTC_TIMESTAMP(6) \
                  WHERE id = 'raced'; \
                 INSERT INTO order_timeout_cancel_outbox (order_id, created_at) \
                 VALUES ('raced', UTC_TIMESTAMP(6))"
            }
        })
        .await
        .unwrap();
    let store = f.store().clone();
    let mut ours = tokio::spawn(async move { state_of(store.as_ref(), "raced", LEASE).await });
    // Ours either waits for a lock of the other's (its outbox row), and the
    // other commits while it waits, or ends without waiting (the order row
    // held: skipped) before the other commits.
    let ended = tokio::select! {
        () = f.a_session_waits_for_a_lock() => None,
        state = &mut ours => Some(state.unwrap()),
    };
    other.commit().await;
    let state = match ended {
        Some(state) => state,
        None => ours.await.unwrap(),
    };
    assert!(
        matches!(
            state,
            OrderState::Locked { .. }
                | OrderState::Cancelled(_)
                | OrderState::LeasedElsewhere { .. }
        ),
        "an order another worker cancelled, reported {state:?}"
    );
    assert_eq!(f.row("raced").await.0, "CANCELLED");
    assert_eq!(f.outbox_rows("raced").await, 1);
}

/// Two orders whose `also` statements write the same two rows in opposite
/// orders (`…-ab` row A, a pause, then row B; `…-ba` B, then A), cancelled
/// side by side, as a batch does: with `also_keys` naming the rows, the
/// second waits for the first's keys before its `also` statements run,
/// so each order's statements run exactly once — no attempt rolled back
/// as a deadlock's victim or a lock wait given up (the tries table counts
/// attempts: an identity or `AUTO_INCREMENT` value is never given back by
/// a rollback). Without the keys the pair deadlocks every time: on MariaDB
/// the victim runs again (three tries), on PostgreSQL both lock waits time
/// out before its deadlock check, again at every try.
pub(super) async fn also_statements_writing_the_same_rows_take_them_in_one_order(f: &Fixture) {
    let (pg, mark) = match f.dialect() {
        Dialect::Postgres => (true, "$1"),
        Dialect::MySql => (false, "?"),
    };
    f.exec(if pg {
        "CREATE TABLE pair_rows (k VARCHAR(8) PRIMARY KEY, n INT NOT NULL); \
         CREATE TABLE also_tries (try BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
                                  order_id VARCHAR(64) NOT NULL)"
    } else {
        "CREATE TABLE pair_rows (k VARCHAR(8) PRIMARY KEY, n INT NOT NULL); \
         CREATE TABLE also_tries (try BIGINT AUTO_INCREMENT PRIMARY KEY, \
                                  order_id VARCHAR(64) NOT NULL)"
    })
    .await;
    f.exec("INSERT INTO pair_rows (k, n) VALUES ('A', 0), ('B', 0)")
        .await;
    let row = |first: bool| {
        let (ab, ba) = if first { ("A", "B") } else { ("B", "A") };
        format!(
            "UPDATE pair_rows SET n = n + 1 \
              WHERE k = CASE WHEN {mark} LIKE '%-ab' THEN '{ab}' ELSE '{ba}' END"
        )
    };
    let pause = if pg {
        "SELECT pg_sleep(0.15)"
    } else {
        "SELECT SLEEP(0.15)"
    };
    let schema = ShopSchema {
        orders: OrdersMapping {
            also: vec![
                format!("INSERT INTO also_tries (order_id) VALUES ({mark})"),
                row(true),
                pause.to_owned(),
                row(false),
            ],
            also_keys: format!("SELECT k FROM pair_rows WHERE {mark} <> ''")
                .replace("$1 <>", "$1::text <>"),
            ..OrdersMapping::default()
        },
        release: Release::None,
        ..ShopSchema::default()
    };
    // Room for the two orders' transactions side by side (a batch runs a
    // quarter of the pool at once).
    let store = connect_timer(f.url(), PoolSettings::new(8), &schema.timer()).unwrap();
    store.prepare().await.unwrap();
    let mut waiting = vec![id("pair-ab"), id("pair-ba")];
    for order in &waiting {
        f.insert(order.as_str(), "UNPAID", secs(-1)).await;
    }
    let started = Instant::now();
    while !waiting.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{waiting:?} still not cancelled"
        );
        let states = store.cancel_due(&waiting, LEASE).await.unwrap();
        for (order, state) in states {
            match state {
                OrderState::Cancelled(c) if c.just_now => waiting.retain(|w| *w != order),
                // The other order held the keys longer than the lock wait:
                // asked about again, as the service does.
                OrderState::Locked { .. } => {}
                other => panic!("{order}: {other:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tries = f
        .texts(if pg {
            "SELECT CAST(MAX(try) AS TEXT) FROM also_tries"
        } else {
            "SELECT CAST(MAX(try) AS CHAR) FROM also_tries"
        })
        .await;
    assert_eq!(
        tries,
        ["2"],
        "attempts at the two orders' `also` statements"
    );
    let n = f
        .texts("SELECT CAST(n AS CHAR(4)) FROM pair_rows ORDER BY k")
        .await;
    let n: Vec<&str> = n.iter().map(|n| n.trim()).collect();
    assert_eq!(n, ["2", "2"], "each order's two writes once");
}
