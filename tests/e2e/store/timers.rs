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
use order_timeout::testing::store::{PoolSettings, connect_timer, mysql_options, pg_options};
use sqlx::Connection;

use super::*;

pub(super) mod flips;
pub(super) mod held;
pub(super) mod races;

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
    let store = connect_timer(f.url(), PoolSettings::new(5), timer).unwrap();
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
        Dialect::Postgres => on!(sqlx::PgConnection, pg_options),
        Dialect::MySql => on!(sqlx::MySqlConnection, mysql_options),
    }
}
