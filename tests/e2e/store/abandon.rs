//! No order abandoned, at the store: a failure is the row's only when it
//! is about the row's own values, and then it is the row's whether the
//! batch held one order or many; a failure of the environment (a table the
//! `also` statement writes gone, a trigger refusing every cancellation) is
//! nobody's row; a deadline that is no time (PostgreSQL's `infinity`,
//! MariaDB's zero date) is never due and never kills the reader; and a row
//! set aside is tried again on a schedule, and whenever the operator asks.

use order_timeout::settings::{OrdersMapping, Release};
use order_timeout::testing::store::{Page, RowCursor, StoreError};

use super::failures::refuse;
use super::*;

/// A mapping whose `also` statement writes `aside_stock`, one row per
/// cancelled order.
fn also_schema(f: &Fixture) -> ShopSchema {
    let mark = match f.dialect() {
        Dialect::MySql => "?",
        Dialect::Postgres => "$1",
    };
    ShopSchema {
        orders: OrdersMapping {
            also: vec![format!(
                "INSERT INTO aside_stock (order_id) VALUES ({mark})"
            )],
            ..OrdersMapping::default()
        },
        release: Release::None,
        ..ShopSchema::default()
    }
}

const STOCK_TABLE: &str = "CREATE TABLE aside_stock (order_id VARCHAR(128) NOT NULL PRIMARY KEY)";

fn failed(state: &OrderState) -> &StoreError {
    match state {
        OrderState::Failed(failure) => &failure.0,
        other => panic!("expected a failed order, got {other:?}"),
    }
}

/// The table an `also` statement writes disappears (a shop migration
/// recreating it): every order fails, none of them for its row; once the
/// table is back, every one is cancelled.
pub(super) async fn a_missing_table_is_no_rows_fault(f: &Fixture) {
    f.exec(STOCK_TABLE).await;
    let orders = ["mt-1", "mt-2", "mt-3"];
    for order in orders {
        f.insert(order, "UNPAID", secs(-1)).await;
    }
    let store = f.store_with(&also_schema(f));
    store.prepare().await.unwrap();
    f.exec("DROP TABLE aside_stock").await;
    for asked in [&orders[..], &orders[..1]] {
        let ids: Vec<OrderId> = asked.iter().map(|o| id(o)).collect();
        let states = store.cancel_due(&ids, LEASE).await.unwrap();
        assert_eq!(states.len(), asked.len(), "{states:?}");
        for (order, state) in &states {
            let error = failed(state);
            assert!(!error.is_row_fault(), "{order}: {error} is the world's");
        }
    }
    for order in orders {
        assert_eq!(f.row(order).await.0, "UNPAID", "{order}");
        assert_eq!(f.outbox_rows(order).await, 0, "{order}");
    }
    f.exec(STOCK_TABLE).await;
    let ids: Vec<OrderId> = orders.iter().map(|o| id(o)).collect();
    for (order, state) in store.cancel_due(&ids, LEASE).await.unwrap() {
        assert!(
            matches!(&state, OrderState::Cancelled(c) if c.just_now),
            "{order}: {state:?}"
        );
    }
}

/// One order alone whose row the shop refuses fails as it would among
/// many: reported failed for its row, not as an error of the batch.
pub(super) async fn a_lone_order_failing_for_its_row_fails_alone(f: &Fixture) {
    refuse(f, Some("lone-refused")).await;
    f.insert("lone-refused", "UNPAID", secs(-1)).await;
    let states = f
        .store()
        .cancel_due(&[id("lone-refused")], LEASE)
        .await
        .expect("one order's failure is the order's, not the batch's");
    assert_eq!(states.len(), 1, "{states:?}");
    let error = failed(&states[0].1);
    assert!(error.is_row_fault(), "{error}");
    assert!(
        error.to_string().contains("may not be cancelled"),
        "{error}"
    );
    assert_eq!(f.row("lone-refused").await.0, "UNPAID");
}

/// A failure that meets every order of a batch the same way (a trigger
/// refusing every cancellation) is no one row's: not a row fault, so
/// nothing is set aside for it.
pub(super) async fn a_failure_meeting_every_order_is_no_rows_fault(f: &Fixture) {
    refuse(f, None).await;
    let orders = ["all-1", "all-2", "all-3"];
    for order in orders {
        f.insert(order, "UNPAID", secs(-1)).await;
    }
    let ids: Vec<OrderId> = orders.iter().map(|o| id(o)).collect();
    let states = f.store().cancel_due(&ids, LEASE).await.unwrap();
    assert_eq!(states.len(), 3, "{states:?}");
    for (order, state) in &states {
        let error = failed(state);
        assert!(!error.is_row_fault(), "{order}: {error}");
        assert!(
            error.to_string().contains("every one of the 3 orders"),
            "{order}: {error}"
        );
    }
}

/// Inserts unpaid rows whose deadlines are no time the service can use:
/// PostgreSQL's `infinity` and `-infinity` and a year past what the driver
/// represents; MariaDB's zero date. More of them than a page, all sorting
/// before the real orders.
async fn no_time_rows(f: &Fixture) -> Vec<String> {
    let (values, prefix): (Vec<&str>, &str) = match f.dialect() {
        Dialect::Postgres => (
            vec!["'-infinity'", "'infinity'", "'200000-01-01 00:00:00+00'"],
            "",
        ),
        // Accepted under MariaDB's default sql_mode without NO_ZERO_DATE;
        // made sure of here.
        Dialect::MySql => (
            vec!["'0000-00-00 00:00:00'"],
            "SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION'; ",
        ),
    };
    let mut ids = Vec::new();
    let mut rows = Vec::new();
    for n in 0..7 {
        let value = values[n % values.len()];
        let order = format!("nt-{n:02}");
        rows.push(format!("('{order}', 'UNPAID', {value})"));
        ids.push(order);
    }
    f.exec(&format!(
        "{prefix}INSERT INTO orders (id, status, expires_at) VALUES {}",
        rows.join(", ")
    ))
    .await;
    ids
}

/// Rows whose deadline is no time are never due, never swept, never read
/// as a time (the driver panicked on them), and never hide the overdue
/// orders behind them from a sweep: every scan reads past them.
pub(super) async fn deadlines_that_are_no_time_are_never_due_and_never_panic(f: &Fixture) {
    let strange = no_time_rows(f).await;
    let orders = ["nt-real-1", "nt-real-2", "nt-real-3"];
    for order in orders {
        f.insert(order, "UNPAID", secs(-120)).await;
    }
    let store = f.store();
    let mut found = Vec::new();
    let mut cursor: Option<RowCursor> = None;
    for _ in 0..10 {
        let page: Page<RowCursor> = store
            .overdue(Duration::from_secs(1), cursor.as_ref(), 2)
            .await
            .unwrap();
        found.extend(page.rows.iter().map(|(id, _)| id.to_string()));
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    found.sort();
    assert_eq!(
        found, orders,
        "the sweeper's scan finds the real orders only"
    );

    let mut ids: Vec<OrderId> = strange.iter().map(|o| id(o)).collect();
    ids.push(id("nt-real-1"));
    let states = store.cancel_due(&ids, LEASE).await.unwrap();
    assert_eq!(states.len(), ids.len(), "{states:?}");
    for (order, state) in states {
        if order.as_str() == "nt-real-1" {
            assert!(matches!(state, OrderState::Cancelled(_)), "{state:?}");
        } else {
            assert_eq!(state, OrderState::LeftAlone, "{order}");
        }
    }
    for order in &strange {
        assert_eq!(f.row(order).await.0, "UNPAID", "{order}");
    }
    // `backfill`'s scan reads them too, and leaves them out.
    let page = store.waiting_page(None, 100).await.unwrap();
    let waiting: Vec<String> = page.rows.iter().map(|(id, _)| id.to_string()).collect();
    assert_eq!(waiting, ["nt-real-2", "nt-real-3"]);
}

/// A row set aside is skipped by the sweeper until its next try (an hour
/// later at first), counted, listed with its failures, and tried again at
/// once when the operator asks; a mark forgotten is gone.
pub(super) async fn rows_set_aside_are_tried_again_later_and_when_asked(f: &Fixture) {
    f.insert("sa-1", "UNPAID", secs(-120)).await;
    let store = f.store();
    store.prepare().await.unwrap();
    assert_eq!(store.set_aside(&id("sa-1"), "why").await.unwrap(), Some(1));
    assert_eq!(store.set_aside(&id("sa-1"), "why").await.unwrap(), Some(2));
    assert_eq!(
        store.set_aside(&id("sa-none"), "no row").await.unwrap(),
        None
    );
    assert_eq!(store.set_aside_count().await.unwrap(), 1);
    let rows = store.set_aside_rows(10).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].order_id.as_str(), rows[0].attempts), ("sa-1", 2));
    assert_eq!(rows[0].reason, "why");
    let next_try = rows[0].retry_at - Utc::now();
    assert!(
        next_try > secs(3_000) && next_try <= secs(3_600),
        "tried again in an hour: {next_try}"
    );
    let swept = |store: &Store| {
        let store = store.clone();
        async move {
            let page = store
                .overdue(Duration::from_secs(1), None, 10)
                .await
                .unwrap();
            page.rows
                .iter()
                .map(|(id, _)| id.to_string())
                .collect::<Vec<_>>()
        }
    };
    assert!(swept(store).await.is_empty(), "skipped until its next try");
    assert_eq!(store.retry_set_aside(Some(&["sa-other"])).await.unwrap(), 0);
    assert_eq!(store.retry_set_aside(None).await.unwrap(), 1);
    assert_eq!(swept(store).await, ["sa-1"], "tried again when asked");
    // A row that changed since starts over: its first failure again.
    f.exec("UPDATE orders SET cancel_reason = 'looked at' WHERE id = 'sa-1'")
        .await;
    assert_eq!(store.set_aside(&id("sa-1"), "why").await.unwrap(), Some(1));
    store.forget_set_aside(&id("sa-1")).await.unwrap();
    assert_eq!(store.set_aside_count().await.unwrap(), 0);
}

/// A deadline kept as Unix seconds in an integer column (CRMEB's
/// `add_time`) is refused as a time, naming the key and the type found;
/// declared with `deadline_unit = "s"` (or `"ms"`), it is a deadline like
/// any other: due when it passes, never before.
pub(super) async fn integer_deadlines_are_refused_as_times_and_work_with_their_unit(f: &Fixture) {
    f.exec("ALTER TABLE orders ADD COLUMN add_time BIGINT NULL")
        .await;
    f.insert("unix-due", "UNPAID", secs(-10)).await;
    f.insert("unix-later", "UNPAID", secs(3_600)).await;
    f.exec(match f.dialect() {
        Dialect::Postgres => {
            "UPDATE orders SET add_time = floor(extract(epoch FROM expires_at))::bigint - 1800"
        }
        Dialect::MySql => "UPDATE orders SET add_time = FLOOR(UNIX_TIMESTAMP(expires_at)) - 1800",
    })
    .await;
    let mut schema = ShopSchema::default();
    schema.orders.deadline = "add_time + 1800".into();
    let err = f.store_with(&schema).prepare().await.unwrap_err();
    let text = err.to_string();
    assert!(err.is_config(), "{text}");
    assert!(
        text.starts_with("config [orders].deadline: ")
            && text.contains("a number")
            && text.contains("[orders].deadline_unit = \"s\""),
        "{text}"
    );
    schema.orders.deadline = "created_at".into();
    schema.orders.deadline_unit = settings::DeadlineUnit::Seconds;
    let err = f
        .store_with(&schema)
        .prepare()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("remove [orders].deadline_unit"), "{err}");

    schema.orders.deadline = "add_time + 1800".into();
    let store = f.store_with(&schema);
    store.prepare().await.unwrap();
    let states = store
        .cancel_due(&[id("unix-due"), id("unix-later")], LEASE)
        .await
        .unwrap();
    for (order, state) in states {
        match order.as_str() {
            "unix-due" => assert!(
                matches!(&state, OrderState::Cancelled(c) if c.just_now),
                "{state:?}"
            ),
            _ => match state {
                OrderState::NotYetDue { expires_at, .. } => {
                    let wait = expires_at - Utc::now();
                    assert!(wait > secs(3_500) && wait <= secs(3_600), "{wait}");
                }
                other => panic!("{order}: {other:?}"),
            },
        }
    }
    schema.orders.deadline = "add_time * 1000 + 1800000".into();
    schema.orders.deadline_unit = settings::DeadlineUnit::Milliseconds;
    let store = f.store_with(&schema);
    store.prepare().await.unwrap();
    let page = store.waiting_page(None, 10).await.unwrap();
    let (order, at) = &page.rows[0];
    assert_eq!(order.as_str(), "unix-later");
    let wait = *at - Utc::now();
    assert!(wait > secs(3_500) && wait <= secs(3_600), "{wait}");
}

/// Negative and zero epochs (before or at 1970-01-01 00:00:00 UTC) are
/// instants like any other, due long ago: cancelled, on both dialects and
/// with either unit (MariaDB's `FROM_UNIXTIME` of a negative number is
/// NULL, so such a row used to be never due there while PostgreSQL
/// cancelled it).
pub(super) async fn negative_and_zero_epochs_are_instants_due_long_ago(f: &Fixture) {
    f.exec("ALTER TABLE orders ADD COLUMN add_time BIGINT NULL")
        .await;
    for (order, epoch) in [("epoch-neg", -100), ("epoch-zero", 0), ("epoch-later", 0)] {
        f.insert(order, "UNPAID", secs(3_600)).await;
        let at = if order == "epoch-later" {
            // An hour from now, as an epoch: the control that stays.
            (Utc::now().timestamp() + 3_600).to_string()
        } else {
            epoch.to_string()
        };
        f.exec(&format!(
            "UPDATE orders SET add_time = {at} WHERE id = '{order}'"
        ))
        .await;
    }
    for (deadline, unit) in [
        ("add_time", settings::DeadlineUnit::Seconds),
        ("add_time * 1000", settings::DeadlineUnit::Milliseconds),
    ] {
        let mut schema = ShopSchema::default();
        schema.orders.deadline = deadline.into();
        schema.orders.deadline_unit = unit;
        let store = f.store_with(&schema);
        store.prepare().await.unwrap();
        // The sweeper's view: both old rows are overdue, oldest first, at
        // their instants; the control is not.
        let page = store.overdue(Duration::ZERO, None, 10).await.unwrap();
        let due: Vec<(&str, i64)> = (page.rows.iter())
            .map(|(o, at)| (o.as_str(), at.timestamp()))
            .collect();
        assert_eq!(due, [("epoch-neg", -100), ("epoch-zero", 0)], "{unit:?}");
        // Backfill's view: every row, with its instant.
        let page = store.waiting_page(None, 10).await.unwrap();
        let all: Vec<(&str, i64)> = (page.rows.iter())
            .map(|(o, at)| (o.as_str(), at.timestamp()))
            .filter(|(o, _)| *o != "epoch-later")
            .collect();
        assert_eq!(all, [("epoch-neg", -100), ("epoch-zero", 0)], "{unit:?}");
        if unit == settings::DeadlineUnit::Milliseconds {
            let states = store
                .cancel_due(
                    &[id("epoch-neg"), id("epoch-zero"), id("epoch-later")],
                    LEASE,
                )
                .await
                .unwrap();
            for (order, state) in states {
                match order.as_str() {
                    "epoch-later" => assert!(
                        matches!(state, OrderState::NotYetDue { .. }),
                        "{order}: {state:?}"
                    ),
                    _ => assert!(
                        matches!(&state, OrderState::Cancelled(c) if c.just_now),
                        "{order}: {state:?}"
                    ),
                }
            }
        }
    }
}

/// The shop widens the id columns while the service runs (`varchar(16)`
/// to `varchar(32)`): an id that fits only the new type is asked about and
/// cancelled, never called unknown, and its items are read, never dropped
/// (a release with no items would be marked done).
pub(super) async fn a_widened_id_column_is_read_again_without_a_restart(f: &Fixture) {
    let alter = |width: u32| match f.dialect() {
        Dialect::Postgres => format!(
            "ALTER TABLE orders ALTER COLUMN id TYPE VARCHAR({width}); \
             ALTER TABLE order_items ALTER COLUMN order_id TYPE VARCHAR({width})"
        ),
        Dialect::MySql => format!(
            "ALTER TABLE orders MODIFY id VARCHAR({width}) NOT NULL; \
             ALTER TABLE order_items MODIFY order_id VARCHAR({width}) NOT NULL"
        ),
    };
    f.exec(&alter(16)).await;
    let store = f.store();
    store.prepare().await.unwrap();
    let long = "widened-order-0001";
    assert!(
        store.canonical(&id(long)).is_err(),
        "18 characters do not fit varchar(16)"
    );
    f.exec(&alter(32)).await;
    f.insert(long, "UNPAID", secs(-1)).await;
    f.add_item(long, "sku-w", 2).await;
    // Past the least time between two looks at the shape.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let states = store.cancel_due(&[id(long)], LEASE).await.unwrap();
    assert_eq!(states.len(), 1, "{states:?}");
    assert!(
        matches!(&states[0].1, OrderState::Cancelled(c) if c.just_now),
        "{states:?}"
    );
    let items = store.items(&[&id(long)]).await.unwrap();
    let lines: Vec<(String, i64)> = items[long]
        .iter()
        .map(|i| (i.sku.clone(), i.quantity))
        .collect();
    assert_eq!(lines, [("sku-w".to_owned(), 2)]);
}

/// A time zone the server does not know (MariaDB without its time zone
/// tables knows no names at all) is refused at the check, naming the key
/// and the way out, instead of a bare server error retried for ever.
pub(super) async fn an_unknown_time_zone_is_refused_naming_the_key(f: &Fixture) {
    let mut schema = ShopSchema::default();
    schema.orders.time_zone = Some("Mars/Olympus".into());
    let err = f.store_with(&schema).prepare().await.unwrap_err();
    let text = err.to_string();
    assert!(err.is_config(), "{text}");
    assert!(
        text.starts_with("config [orders].time_zone: ")
            && text.contains("Mars/Olympus")
            && text.contains("\"+08:00\""),
        "{text}"
    );
}
