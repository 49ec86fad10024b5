//! A timer other than `cancel_unpaid` keeps the cancel's guarantees: the
//! store of a `[[timers]]` table (built from the mapping as the service
//! builds it, [`Settings::timers`]) flips exactly the rows still in *its*
//! `from` status, due and passing *its* guard, with its `set` columns, its
//! `also` statements and an outbox row under its own name exactly once per
//! flip, and nothing for any other row.
//!
//! The timer here is mall's auto-receive on the reference orders table:
//! `SHIPPED → RECEIVED` fifteen days after `shipped_at` (an expression, not a
//! column), `received_at` set, each flip logged by an `also` statement. What
//! is proven, on both dialects, with real second sessions where other
//! clients would race it:
//!
//! - it flips only due rows in its `from` status (never early: a row due in
//!   a moment is flipped once it is due, not before), and leaves unpaid,
//!   paid, cancelled and not-yet-shipped rows alone, as the default timer on
//!   the same table leaves shipped rows alone;
//! - a row another session holds (`SELECT … FOR UPDATE`) delays only itself:
//!   the others flip at once with their effects exactly once, the held one is
//!   reported [`OrderState::Locked`] without effects and flips once after the
//!   release (timed after it); if the holder moved it out of `SHIPPED`
//!   instead (the customer confirmed receipt, or returned it), it is never
//!   flipped by the timer and no effects run;
//! - while another session keeps moving rows out of `SHIPPED` and back, or
//!   flipping the guard column, two stores (two replicas) flip 1,200 rows in
//!   concurrent batches: a row's `also` log row, its outbox row, its `set`
//!   column and a "flipped just now" report exist if and only if it is in
//!   `RECEIVED`, and a final run once the other session stops flips every
//!   row left, each exactly once;
//! - ids are compared exactly in the timer's table: ids that cannot be a
//!   value of its id column, or that a collation, a truncation or a double
//!   would take for another row's, never flip another row.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use order_timeout::settings::{Settings, Timer};
use order_timeout::store::PoolSettings;
use sqlx::Connection;

use super::*;

/// The timer's name.
const TIMER: &str = "auto_receive";

/// How long a batch may take while one of its rows is held: generous (the
/// statement itself takes milliseconds), far below the minutes a lock can
/// be held.
const PROMPT: Duration = Duration::from_secs(5);

/// Rows in the race cases, and ids per batch.
const ROWS: usize = 1_200;
const BATCH: usize = 25;

/// The timer of the `[[timers]]` table `toml`, as the service builds it from
/// a validated config file.
pub(super) fn timer_of(toml: &str) -> Timer {
    let settings: Settings = toml::from_str(toml).unwrap_or_else(|e| panic!("{toml}: {e}"));
    settings.validate().unwrap();
    let mut timers = settings.timers().unwrap();
    assert_eq!(timers.len(), 2, "{timers:?}");
    let timer = timers.pop().unwrap();
    assert!(!timer.is_default());
    assert_eq!(timer.paid, None, "only the default timer knows `paid`");
    timer
}

/// A store of `timer` on the fixture's database, on a pool of its own,
/// checked against the schema.
async fn store_of(f: &Fixture, timer: &Timer) -> Store {
    let store = store::connect_timer(f.url(), PoolSettings::new(5), timer).unwrap();
    store.prepare().await.unwrap();
    assert_eq!(store.timer(), timer);
    store
}

/// `$1` or `?`: the placeholder an `also` statement binds the id to.
fn mark(f: &Fixture) -> &'static str {
    match f.dialect() {
        Dialect::MySql => "?",
        Dialect::Postgres => "$1",
    }
}

/// The auto-receive timer: `SHIPPED → RECEIVED` fifteen days after
/// `shipped_at`, `received_at` set, each flip logged into `receive_log`;
/// stock released over gRPC (`release = "grpc"`) or not at all (`"none"`),
/// and an optional guard.
fn auto_receive(f: &Fixture, release: &str, guard: &str) -> Timer {
    let (deadline, now) = match f.dialect() {
        Dialect::MySql => ("shipped_at + INTERVAL 15 DAY", "NOW(6)"),
        Dialect::Postgres => ("shipped_at + interval '15 days'", "now()"),
    };
    let timer = timer_of(&format!(
        r#"
        [[timers]]
        name = "{TIMER}"
        from = "SHIPPED"
        to = "RECEIVED"
        deadline = "{deadline}"
        guard = "{guard}"
        release = "{release}"
        set = {{ received_at = "{now}" }}
        also = ["INSERT INTO receive_log (order_id) VALUES ({mark})"]
        "#,
        mark = mark(f),
    ));
    assert_eq!(
        (
            timer.table.as_str(),
            timer.id.as_str(),
            timer.status.as_str()
        ),
        ("orders", "id", "status"),
        "table, id and status from [orders]"
    );
    assert_eq!(timer.event, "order.auto_receive");
    timer
}

/// The reference orders table made to ship: statuses beyond the payment's
/// (PostgreSQL's reference table checks them), `shipped_at` and
/// `received_at`, a per-row `frozen` flag for a guard, and the log the
/// `also` statement writes (no key: a second run shows as a second row).
async fn shipping_schema(f: &Fixture) {
    f.exec(match f.dialect() {
        Dialect::Postgres => {
            "ALTER TABLE orders DROP CONSTRAINT orders_status_check; \
             ALTER TABLE orders ADD COLUMN shipped_at timestamptz, \
                                ADD COLUMN received_at timestamptz, \
                                ADD COLUMN frozen int NOT NULL DEFAULT 0; \
             CREATE TABLE receive_log (order_id VARCHAR(128) NOT NULL)"
        }
        Dialect::MySql => {
            "ALTER TABLE orders ADD COLUMN shipped_at DATETIME(6) NULL, \
                                ADD COLUMN received_at DATETIME(6) NULL, \
                                ADD COLUMN frozen INT NOT NULL DEFAULT 0; \
             CREATE TABLE receive_log (order_id VARCHAR(128) NOT NULL)"
        }
    })
    .await;
}

/// One order row: `status`, its payment deadline an hour ago, and shipped
/// so that the timer's deadline is `due_in` from now (`None`: not shipped,
/// `shipped_at` NULL).
fn order_row(f: &Fixture, id: &str, status: &str, due_in: Option<chrono::Duration>) -> String {
    let (hour_ago, shipped) = match f.dialect() {
        Dialect::MySql => (
            "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR".to_owned(),
            due_in.map(|d| {
                format!(
                    "UTC_TIMESTAMP(6) - INTERVAL 15 DAY + INTERVAL {} MICROSECOND",
                    d.num_microseconds().unwrap()
                )
            }),
        ),
        Dialect::Postgres => (
            "now() - interval '1 hour'".to_owned(),
            due_in.map(|d| {
                format!(
                    "now() - interval '15 days' + {} * interval '1 microsecond'",
                    d.num_microseconds().unwrap()
                )
            }),
        ),
    };
    let shipped = shipped.unwrap_or_else(|| "NULL".into());
    format!("('{id}', '{status}', {hour_ago}, {shipped})")
}

/// Inserts `rows` ([`order_row`]).
async fn insert_rows(f: &Fixture, rows: &[String]) {
    for chunk in rows.chunks(500) {
        f.exec(&format!(
            "INSERT INTO orders (id, status, expires_at, shipped_at) VALUES {}",
            chunk.join(", ")
        ))
        .await;
    }
}

/// The outbox's order id as text.
pub(super) fn outbox_id(f: &Fixture) -> &'static str {
    match f.dialect() {
        Dialect::MySql => "CAST(order_id AS CHAR)",
        Dialect::Postgres => "order_id",
    }
}

/// The order's status, its `also` log rows, and its outbox rows under this
/// timer and under the default one.
async fn effects(f: &Fixture, order: &str) -> (String, usize, usize, usize) {
    let status = f
        .texts(&format!("SELECT status FROM orders WHERE id = '{order}'"))
        .await;
    assert_eq!(status.len(), 1, "{order}: {status:?}");
    let log = f
        .texts(&format!(
            "SELECT order_id FROM receive_log WHERE order_id = '{order}'"
        ))
        .await
        .len();
    let outbox = async |timer: &str| {
        f.texts(&format!(
            "SELECT {} FROM order_timeout_cancel_outbox \
              WHERE timer = '{timer}' AND order_id = '{order}'",
            outbox_id(f)
        ))
        .await
        .len()
    };
    (
        status[0].clone(),
        log,
        outbox(TIMER).await,
        outbox(settings::DEFAULT_TIMER).await,
    )
}

/// `(received_at set, cancelled_at set, cancel_reason set)` of the order.
async fn set_columns(f: &Fixture, order: &str) -> (bool, bool, bool) {
    let got = f
        .texts(&format!(
            "SELECT CONCAT(CASE WHEN received_at IS NULL THEN 'n' ELSE 'y' END, \
                           CASE WHEN cancelled_at IS NULL THEN 'n' ELSE 'y' END, \
                           CASE WHEN cancel_reason IS NULL THEN 'n' ELSE 'y' END) \
               FROM orders WHERE id = '{order}'"
        ))
        .await;
    let b = got[0].as_bytes();
    (b[0] == b'y', b[1] == b'y', b[2] == b'y')
}

/// Whether the timer's outbox row for `order` has its stock release done.
async fn release_done(f: &Fixture, order: &str) -> bool {
    let got = f
        .texts(&format!(
            "SELECT CASE WHEN stock_released_at IS NULL THEN 'pending' ELSE 'done' END \
               FROM order_timeout_cancel_outbox WHERE timer = '{TIMER}' AND order_id = '{order}'"
        ))
        .await;
    assert_eq!(got.len(), 1, "{order}: {got:?}");
    got[0] == "done"
}

/// The states of a batch, by id.
async fn batch(store: &Store, ids: &[OrderId]) -> BTreeMap<String, OrderState> {
    let states = store.cancel_due(ids, LEASE).await.unwrap();
    assert_eq!(states.len(), ids.len(), "{states:?}");
    states
        .into_iter()
        .map(|(id, s)| (id.as_str().to_owned(), s))
        .collect()
}

fn ids(names: &[&str]) -> Vec<OrderId> {
    names.iter().map(|n| id(n)).collect()
}

/// A flip made just now, with what is left to do for it.
fn flipped_just_now(order: &str, state: &OrderState) -> Cancellation {
    match state {
        OrderState::Cancelled(c) if c.just_now && c.leased => {
            assert!(
                c.cancelled_at >= c.expires_at,
                "{order}: flipped before its deadline: {c:?}"
            );
            c.clone()
        }
        other => panic!("{order}: expected flipped just now, got {other:?}"),
    }
}

/// A flip made earlier, asked about again: not flipped again (its outbox
/// lease, taken by the first call, may still be live).
fn assert_not_again(order: &str, state: &OrderState) {
    assert!(
        matches!(state, OrderState::Cancelled(c) if !c.just_now)
            || matches!(state, OrderState::LeasedElsewhere { .. }),
        "{order}: {state:?}"
    );
}

/// Runs `sql` (one row) in a transaction of a session of its own, holds it
/// open (with the row's lock) while `during` runs, then commits: the shop
/// moving a row on while a batch runs.
async fn commit_during(f: &Fixture, sql: &str, during: impl Future<Output = ()>) {
    macro_rules! on {
        ($conn:ty, $options:expr) => {{
            let mut conn = <$conn>::connect_with(&$options(f.url()).unwrap())
                .await
                .unwrap();
            let mut tx = conn.begin().await.unwrap();
            let done = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .execute(&mut *tx)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            assert_eq!(done.rows_affected(), 1, "{sql}");
            during.await;
            tx.commit().await.unwrap();
        }};
    }
    match f.dialect() {
        Dialect::Postgres => on!(sqlx::PgConnection, store::pg_options),
        Dialect::MySql => on!(sqlx::MySqlConnection, store::mysql_options),
    }
}

pub(super) async fn a_timer_flips_only_due_rows_in_its_from_status(f: &Fixture) {
    shipping_schema(f).await;
    let minute = secs(60);
    insert_rows(
        f,
        &[
            order_row(f, "m-unpaid", "UNPAID", None),
            order_row(f, "m-paid", "PAID", None),
            order_row(f, "m-cancelled", "CANCELLED", None),
            order_row(f, "m-due-1", "SHIPPED", Some(-minute * 2)),
            order_row(f, "m-due-2", "SHIPPED", Some(-minute)),
            order_row(f, "m-later", "SHIPPED", Some(secs(3600))),
            order_row(f, "m-soon", "SHIPPED", Some(secs(3))),
            // Shipped, no ship date: no deadline, never flipped.
            order_row(f, "m-undated", "SHIPPED", None),
            // Received by the customer's own click: not this service's flip.
            order_row(f, "m-confirmed", "RECEIVED", Some(-minute)),
        ],
    )
    .await;
    // The UNPAID and PAID rows shipped long ago, as far as the deadline
    // expression goes: only the status keeps them out.
    f.exec(&format!(
        "UPDATE orders SET shipped_at = {} WHERE id IN ('m-unpaid', 'm-paid')",
        match f.dialect() {
            Dialect::MySql => "UTC_TIMESTAMP(6) - INTERVAL 20 DAY",
            Dialect::Postgres => "now() - interval '20 days'",
        }
    ))
    .await;
    let store = store_of(f, &auto_receive(f, "none", "")).await;
    let all = ids(&[
        "m-unpaid",
        "m-paid",
        "m-cancelled",
        "m-due-1",
        "m-due-2",
        "m-later",
        "m-soon",
        "m-undated",
        "m-confirmed",
        "m-ghost",
    ]);

    // What the sweeper would take for this timer: the due shipped rows,
    // oldest first.
    let overdue = store.overdue(Duration::ZERO, None, 100).await.unwrap();
    let overdue: Vec<OrderId> = overdue.rows.into_iter().map(|(id, _)| id).collect();
    assert_eq!(overdue, ids(&["m-due-1", "m-due-2"]));

    let states = batch(&store, &all).await;
    for order in ["m-due-1", "m-due-2"] {
        let c = flipped_just_now(order, &states[order]);
        // release = "none": nothing to release; the event is to publish.
        assert!(!c.release_pending && c.event_pending, "{order}: {c:?}");
    }
    for order in ["m-unpaid", "m-paid", "m-cancelled", "m-undated"] {
        assert_eq!(states[order], OrderState::LeftAlone, "{order}");
    }
    assert_eq!(states["m-confirmed"], OrderState::CancelledElsewhere);
    assert_eq!(states["m-ghost"], OrderState::Unknown);
    match &states["m-later"] {
        OrderState::NotYetDue { expires_at, db_now } => {
            let left = *expires_at - *db_now;
            assert!(left > secs(3500) && left <= secs(3600), "{left}");
        }
        other => panic!("m-later: expected NotYetDue, got {other:?}"),
    }
    // Never early: due in three seconds, it waits, then flips once due.
    let wait = match &states["m-soon"] {
        OrderState::NotYetDue { expires_at, db_now } => *expires_at - *db_now,
        other => panic!("m-soon: expected NotYetDue, got {other:?}"),
    };
    assert!(wait > secs(1) && wait <= secs(3), "{wait}");
    assert_eq!(effects(f, "m-soon").await, ("SHIPPED".into(), 0, 0, 0));
    tokio::time::sleep(
        (wait + chrono::Duration::milliseconds(500))
            .to_std()
            .unwrap(),
    )
    .await;
    let soon = state_of(store.as_ref(), "m-soon", LEASE).await;
    flipped_just_now("m-soon", &soon);

    // The default timer on the same table: cancels its unpaid row, and
    // leaves every shipped or received row alone.
    let mut default = batch(f.store(), &all).await;
    flipped_just_now("m-unpaid", &default.remove("m-unpaid").unwrap());
    assert_eq!(default.remove("m-paid"), Some(OrderState::Paid));
    assert_eq!(
        default.remove("m-cancelled"),
        Some(OrderState::CancelledElsewhere)
    );
    assert_eq!(default.remove("m-ghost"), Some(OrderState::Unknown));
    for (order, state) in default {
        assert_eq!(state, OrderState::LeftAlone, "{order}");
    }

    // Asked again: not flipped again, and the row the default timer
    // cancelled meanwhile is not this timer's.
    let again = batch(&store, &all).await;
    for order in ["m-due-1", "m-due-2", "m-soon"] {
        assert_not_again(order, &again[order]);
    }
    assert_eq!(again["m-unpaid"], OrderState::LeftAlone);

    // Effects: [status, also log rows, this timer's outbox rows, the
    // default timer's outbox rows].
    for order in ["m-due-1", "m-due-2", "m-soon"] {
        assert_eq!(
            effects(f, order).await,
            ("RECEIVED".into(), 1, 1, 0),
            "{order}"
        );
        // Its own `set`, not the default timer's.
        assert_eq!(set_columns(f, order).await, (true, false, false), "{order}");
        assert!(release_done(f, order).await, "{order}: release = none");
    }
    let untouched = [
        ("m-paid", "PAID"),
        ("m-cancelled", "CANCELLED"),
        ("m-later", "SHIPPED"),
        ("m-undated", "SHIPPED"),
        ("m-confirmed", "RECEIVED"),
    ];
    for (order, status) in untouched {
        assert_eq!(effects(f, order).await, (status.into(), 0, 0, 0), "{order}");
        assert!(!set_columns(f, order).await.0, "{order}: received_at");
    }
    assert_eq!(effects(f, "m-unpaid").await, ("CANCELLED".into(), 0, 0, 1));
    assert_eq!(set_columns(f, "m-unpaid").await, (false, true, true));
    // `set`'s clock: at or after the deadline it flipped for.
    let early = f
        .texts(&format!(
            "SELECT id FROM orders WHERE status = 'RECEIVED' AND id <> 'm-confirmed' \
                AND NOT (received_at >= {})",
            match f.dialect() {
                Dialect::MySql => "shipped_at + INTERVAL 15 DAY",
                Dialect::Postgres => "shipped_at + interval '15 days'",
            }
        ))
        .await;
    assert!(early.is_empty(), "received before the deadline: {early:?}");
}

/// `n` due shipped orders `{prefix}-NN` and a held one `{prefix}-held`.
async fn held_setup(f: &Fixture, prefix: &str, n: usize) -> Vec<OrderId> {
    shipping_schema(f).await;
    let names: Vec<String> = (0..n)
        .map(|i| format!("{prefix}-{i:02}"))
        .chain([format!("{prefix}-held")])
        .collect();
    let rows: Vec<String> = names
        .iter()
        .map(|name| order_row(f, name, "SHIPPED", Some(secs(-60))))
        .collect();
    insert_rows(f, &rows).await;
    names.iter().map(|name| id(name)).collect()
}

/// Runs the timer's batch for `ids` while `held` is held: checks that it
/// answers promptly, flips every other row just now (stock release pending:
/// `release = "grpc"`), and reports the held one locked.
async fn flip_around(store: &Store, ids: &[OrderId], held: &str) {
    let started = Instant::now();
    let states = batch(store, ids).await;
    let took = started.elapsed();
    assert!(
        took < PROMPT,
        "the batch took {took:?} while one row was held"
    );
    for (order, state) in states {
        if order == held {
            assert!(
                matches!(state, OrderState::Locked { .. }),
                "held row: {state:?}"
            );
        } else {
            let c = flipped_just_now(&order, &state);
            assert!(c.release_pending && c.event_pending, "{order}: {c:?}");
        }
    }
}

pub(super) async fn a_held_row_delays_only_itself_for_a_timer(f: &Fixture) {
    let ids = held_setup(f, "th", 20).await;
    let store = store_of(f, &auto_receive(f, "grpc", "")).await;
    let released = f
        .lock_row_during("th-held", async {
            flip_around(&store, &ids, "th-held").await;
            // Still held, asked again a moment later: still locked, still no
            // effects; the others are not flipped twice.
            tokio::time::sleep(Duration::from_millis(500)).await;
            for (order, state) in batch(&store, &ids).await {
                match order.as_str() {
                    "th-held" => assert!(matches!(state, OrderState::Locked { .. }), "{state:?}"),
                    _ => assert_not_again(&order, &state),
                }
            }
            assert_eq!(effects(f, "th-held").await, ("SHIPPED".into(), 0, 0, 0));
        })
        .await;
    // Let go: flipped now, timed after the release, its effects once.
    for (order, state) in batch(&store, &ids).await {
        match order.as_str() {
            "th-held" => {
                let c = flipped_just_now(&order, &state);
                assert!(
                    c.cancelled_at >= released,
                    "flipped at {} before the shop let go of the row at {released}",
                    c.cancelled_at
                );
                assert!(c.release_pending, "release = grpc: {c:?}");
            }
            _ => assert_not_again(&order, &state),
        }
    }
    let again = state_of(store.as_ref(), "th-held", LEASE).await;
    assert_not_again("th-held", &again);
    for id in &ids {
        assert_eq!(
            effects(f, id.as_str()).await,
            ("RECEIVED".into(), 1, 1, 0),
            "{id}: [status, also runs, outbox rows, default timer's outbox rows]"
        );
        assert!(!release_done(f, id.as_str()).await, "{id}: release = grpc");
    }
}

pub(super) async fn a_held_row_the_holder_moves_on_is_never_flipped_by_the_timer(f: &Fixture) {
    let mut ids = held_setup(f, "tm", 20).await;
    // A second held row: one the customer confirms (to the timer's own
    // `to`, by the shop), one returned (out of its `from`).
    insert_rows(
        f,
        &[order_row(f, "tm-returned", "SHIPPED", Some(secs(-60)))],
    )
    .await;
    ids.push(id("tm-returned"));
    let store = store_of(f, &auto_receive(f, "grpc", "")).await;
    let confirm = match f.dialect() {
        Dialect::MySql => "UTC_TIMESTAMP(6)",
        Dialect::Postgres => "now()",
    };
    commit_during(
        f,
        &format!(
            "UPDATE orders SET status = 'RECEIVED', received_at = {confirm} \
              WHERE id = 'tm-held' AND status = 'SHIPPED'"
        ),
        commit_during(
            f,
            "UPDATE orders SET status = 'RETURNED' WHERE id = 'tm-returned' AND status = 'SHIPPED'",
            async {
                let started = Instant::now();
                let states = batch(&store, &ids).await;
                let took = started.elapsed();
                assert!(
                    took < PROMPT,
                    "the batch took {took:?} while two rows were held"
                );
                for (order, state) in states {
                    match order.as_str() {
                        "tm-held" | "tm-returned" => assert!(
                            matches!(state, OrderState::Locked { .. }),
                            "{order}: {state:?}"
                        ),
                        _ => {
                            let c = flipped_just_now(&order, &state);
                            assert!(c.release_pending, "{order}: {c:?}");
                        }
                    }
                }
            },
        ),
    )
    .await;
    // Committed: the confirmed one is the shop's flip, the returned one no
    // longer the timer's; asked again and again, neither is flipped.
    for _ in 0..2 {
        let states = batch(&store, &ids).await;
        assert_eq!(states["tm-held"], OrderState::CancelledElsewhere);
        assert_eq!(states["tm-returned"], OrderState::LeftAlone);
    }
    assert_eq!(effects(f, "tm-held").await, ("RECEIVED".into(), 0, 0, 0));
    assert_eq!(
        effects(f, "tm-returned").await,
        ("RETURNED".into(), 0, 0, 0)
    );
    for id in ids
        .iter()
        .filter(|id| !["tm-held", "tm-returned"].contains(&id.as_str()))
    {
        assert_eq!(
            effects(f, id.as_str()).await,
            ("RECEIVED".into(), 1, 1, 0),
            "{id}: [status, also runs, outbox rows, default timer's outbox rows]"
        );
    }
}

pub(super) async fn effects_follow_a_timers_flip_while_another_session_moves_rows_out_of_its_from_status(
    f: &Fixture,
) {
    // The first half of the rows go back and forth between SHIPPED and
    // HELD (a support agent's hold, say); the second half are left alone.
    race(
        f,
        "",
        "UPDATE orders SET status = CASE WHEN status = 'SHIPPED' THEN 'HELD' ELSE 'SHIPPED' END \
          WHERE id >= 'tr-00000' AND id < 'tr-00600' AND status IN ('SHIPPED', 'HELD')",
        "UPDATE orders SET status = 'SHIPPED' WHERE status = 'HELD'",
    )
    .await;
}

pub(super) async fn effects_follow_a_timers_flip_while_another_session_flips_the_guard_column(
    f: &Fixture,
) {
    race(
        f,
        "frozen = 0",
        "UPDATE orders SET frozen = 1 - frozen WHERE id >= 'tr-00000' AND id < 'tr-00600'",
        "UPDATE orders SET frozen = 0",
    )
    .await;
}

/// 1,200 due shipped rows; `toggle` repeated by another session while two
/// stores of the timer (with `guard`) flip them in concurrent batches,
/// twice over; the invariant, row by row; then `settle` (the other session
/// done), one more run, and every row flipped exactly once.
async fn race(f: &Fixture, guard: &str, toggle: &str, settle: &str) {
    shipping_schema(f).await;
    let names: Vec<String> = (0..ROWS).map(|n| format!("tr-{n:05}")).collect();
    let rows: Vec<String> = names
        .iter()
        .map(|name| order_row(f, name, "SHIPPED", Some(secs(-60))))
        .collect();
    insert_rows(f, &rows).await;
    let ids: Vec<OrderId> = names.iter().map(|n| id(n)).collect();
    let timer = auto_receive(f, "none", guard);
    let stores = [store_of(f, &timer).await, store_of(f, &timer).await];
    let mut reported: BTreeMap<String, usize> = BTreeMap::new();

    let toggler = f.repeat(toggle.to_owned());
    for _ in 0..2 {
        run_batches(&stores, &ids, &mut reported).await;
    }
    let toggles = toggler.stop().await;
    assert!(toggles > 10, "the other session ran {toggles} times");
    let flipped = check(f, &ids, &reported).await;
    eprintln!("{flipped} of {ROWS} rows flipped while the other session ran {toggles} times");
    // The rows the other session never touched have all flipped.
    let untouched_flipped = check_untouched(f).await;
    assert_eq!(untouched_flipped, ROWS / 2, "the rows left alone all flip");
    // The race happened: of the rows the other session touched, some
    // flipped and some were held back (else the invariant above was never
    // put to the test).
    assert!(
        flipped > untouched_flipped,
        "none of the touched rows flipped during the race"
    );
    assert!(flipped < ROWS, "every touched row flipped: no race");

    f.exec(settle).await;
    run_batches(&stores, &ids, &mut reported).await;
    let flipped = check(f, &ids, &reported).await;
    assert_eq!(flipped, ROWS, "every row flips once nothing holds it back");
}

/// One run of concurrent batches over `ids`, alternating between the
/// stores; counts each row reported flipped just now.
async fn run_batches(stores: &[Store; 2], ids: &[OrderId], reported: &mut BTreeMap<String, usize>) {
    let mut tasks = tokio::task::JoinSet::new();
    for (n, chunk) in ids.chunks(BATCH).enumerate() {
        let store = stores[n % 2].clone();
        let chunk = chunk.to_vec();
        tasks.spawn(async move { store.cancel_due(&chunk, LEASE).await.unwrap() });
    }
    while let Some(states) = tasks.join_next().await {
        for (id, state) in states.unwrap() {
            if matches!(state, OrderState::Cancelled(c) if c.just_now) {
                *reported.entry(id.as_str().to_owned()).or_default() += 1;
            }
        }
    }
}

/// For every row: in `RECEIVED` ⇔ one `also` log row ⇔ one outbox row of
/// this timer ⇔ `received_at` set ⇔ reported flipped just now once; and no
/// outbox row of the default timer. Returns how many rows are received.
async fn check(f: &Fixture, ids: &[OrderId], reported: &BTreeMap<String, usize>) -> usize {
    let count = |rows: Vec<String>| {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for row in rows {
            *counts.entry(row).or_default() += 1;
        }
        counts
    };
    let received = count(
        f.texts("SELECT id FROM orders WHERE status = 'RECEIVED'")
            .await,
    );
    let set = count(
        f.texts("SELECT id FROM orders WHERE received_at IS NOT NULL")
            .await,
    );
    let log = count(f.texts("SELECT order_id FROM receive_log").await);
    let outbox = count(
        f.texts(&format!(
            "SELECT {} FROM order_timeout_cancel_outbox WHERE timer = '{TIMER}'",
            outbox_id(f)
        ))
        .await,
    );
    let other = f
        .texts(&format!(
            "SELECT {} FROM order_timeout_cancel_outbox WHERE timer <> '{TIMER}'",
            outbox_id(f)
        ))
        .await;
    assert!(other.is_empty(), "outbox rows of another timer: {other:?}");
    let asked: BTreeSet<&str> = ids.iter().map(OrderId::as_str).collect();
    for table in [&received, &set, &log, &outbox] {
        let strays: Vec<&String> = table
            .keys()
            .filter(|k| !asked.contains(k.as_str()))
            .collect();
        assert!(strays.is_empty(), "rows never asked about: {strays:?}");
    }
    let mut wrong = BTreeMap::new();
    for id in &asked {
        let at = |t: &BTreeMap<String, usize>| t.get(*id).copied().unwrap_or(0);
        let facts = [at(&received), at(&set), at(&log), at(&outbox), at(reported)];
        if facts.iter().any(|n| *n != facts[0] || *n > 1) {
            wrong.insert(*id, facts);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} rows with [received, received_at, also, outbox, reported] out of step \
         ({} received): {wrong:?}",
        wrong.len(),
        ids.len(),
        received.len()
    );
    assert!(!received.is_empty(), "some rows were flipped");
    received.len()
}

/// How many of the rows the other session never touched (`tr-00600` on)
/// are received.
async fn check_untouched(f: &Fixture) -> usize {
    f.texts("SELECT id FROM orders WHERE status = 'RECEIVED' AND id >= 'tr-00600'")
        .await
        .len()
}

/// Ids are compared exactly in a timer's table: the id-column cases of
/// [`super::id_columns`], each through a `[[timers]]` table of its own.
pub(super) async fn a_timers_batch_never_flips_a_row_it_was_not_asked_about(f: &Fixture) {
    super::id_columns::every_id_column_type(f, super::id_columns::Flip::Timer).await;
}

/// A row that comes back into a timer's `from` status after the timer
/// flipped it (the shop reopens it) is not flipped again while the timer's
/// outbox row is kept: its effects never run twice, on either dialect, and
/// it is reported left alone (not contended, which would retry the message
/// until it is parked). The same holds for the default timer and an order
/// the shop sets back to unpaid after it was cancelled.
pub(super) async fn a_row_back_in_its_from_status_is_not_flipped_again(f: &Fixture) {
    shipping_schema(f).await;
    insert_rows(f, &[order_row(f, "b-shipped", "SHIPPED", Some(secs(-60)))]).await;
    f.insert("b-unpaid", "UNPAID", secs(-60)).await;
    let store = store_of(f, &auto_receive(f, "none", "")).await;
    let flipped = batch(&store, &ids(&["b-shipped"])).await;
    flipped_just_now("b-shipped", &flipped["b-shipped"]);
    let cancelled = batch(f.store(), &ids(&["b-unpaid"])).await;
    flipped_just_now("b-unpaid", &cancelled["b-unpaid"]);

    // The shop reopens both, in a session of its own, while nothing else
    // runs; then both timers are asked again, twice.
    commit_during(
        f,
        "UPDATE orders SET status = 'SHIPPED', received_at = NULL WHERE id = 'b-shipped'",
        async {},
    )
    .await;
    commit_during(
        f,
        "UPDATE orders SET status = 'UNPAID' WHERE id = 'b-unpaid'",
        async {},
    )
    .await;
    for _ in 0..2 {
        let again = batch(&store, &ids(&["b-shipped"])).await;
        assert_eq!(again["b-shipped"], OrderState::LeftAlone);
        let again = batch(f.store(), &ids(&["b-unpaid"])).await;
        assert_eq!(again["b-unpaid"], OrderState::LeftAlone);
    }
    assert_eq!(
        effects(f, "b-shipped").await,
        ("SHIPPED".into(), 1, 1, 0),
        "one flip's effects, the row as the shop left it"
    );
    assert!(
        !set_columns(f, "b-shipped").await.0,
        "received_at cleared by the shop"
    );
    assert_eq!(f.row("b-unpaid").await.0, "UNPAID");
    assert_eq!(f.outbox_rows("b-unpaid").await, 1);
}
