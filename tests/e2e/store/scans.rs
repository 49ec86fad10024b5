//! The scans over a timer's rows read every row of their range, whatever
//! some rows are: the sweeper's (`overdue`), a watch's (`due_between`) and
//! `backfill`'s (`waiting_page`) go on from the last row *read*, so a page
//! whose rows are all no orders (an id that is no valid order id: a
//! control character, over 128 bytes) does not end the scan, and the rows
//! behind it are found. And the sweeper's scan leaves out the rows the
//! timer flipped before (re-opened orders) and the rows set aside while
//! they are unchanged, so that any number of them never fills its pages.

use order_timeout::store::{Page, PoolSettings, RowCursor};

use super::*;

/// Rows that are no orders, due before the orders: more than a page.
const NOT_ORDERS: usize = 7;

/// The page size of the scans here.
const PAGE: u32 = 5;

/// Inserts `NOT_ORDERS` unpaid rows whose ids hold a tab (no valid order
/// id), due `due_in` from now minus a minute, so that they come first by
/// deadline and by id; and `orders`, due `due_in` from now.
async fn rows(f: &Fixture, orders: &[&str], due_in: chrono::Duration) {
    let (tab, at) = match f.dialect() {
        Dialect::Postgres => ("E'\\t", "now() + make_interval(secs => {s})"),
        Dialect::MySql => ("'\\t", "UTC_TIMESTAMP(6) + INTERVAL {s} SECOND"),
    };
    let secs = due_in.num_seconds();
    let values: Vec<String> = (0..NOT_ORDERS)
        .map(|n| {
            let at = at.replace("{s}", &(secs - 60).to_string());
            format!("({tab}bad-{n:02}', 'UNPAID', {at})")
        })
        .collect();
    f.exec(&format!(
        "INSERT INTO orders (id, status, expires_at) VALUES {}",
        values.join(", ")
    ))
    .await;
    for order in orders {
        f.insert(order, "UNPAID", due_in).await;
    }
}

/// Every order of a scan, page after page from `first`.
async fn scan<C, F, Fut>(mut page: F) -> Vec<String>
where
    F: FnMut(Option<C>) -> Fut,
    Fut: Future<Output = Page<C>>,
{
    let mut found = Vec::new();
    let mut after = None;
    for _ in 0..100 {
        let got = page(after.take()).await;
        found.extend(got.rows.into_iter().map(|(id, _)| id.as_str().to_owned()));
        match got.next {
            Some(next) => after = Some(next),
            None => return found,
        }
    }
    panic!("the scan never ended: {found:?}")
}

pub(super) async fn scans_read_past_rows_that_are_no_orders(f: &Fixture) {
    let store = f.store();
    store.prepare().await.unwrap();
    // Overdue: the sweeper's scan.
    rows(f, &["sc-o1", "sc-o2", "sc-o3"], secs(-300)).await;
    let first = store.overdue(Duration::ZERO, None, PAGE).await.unwrap();
    assert!(
        first.rows.is_empty(),
        "the first page holds no orders: {first:?}"
    );
    assert!(first.next.is_some(), "and is full: the scan goes on");
    let overdue = scan(|after: Option<RowCursor>| async move {
        store
            .overdue(Duration::ZERO, after.as_ref(), PAGE)
            .await
            .unwrap()
    })
    .await;
    assert_eq!(overdue, ["sc-o1", "sc-o2", "sc-o3"]);
    // Backfill's scan, in id order: the tab sorts first.
    let waiting = scan(|after: Option<String>| async move {
        store.waiting_page(after.as_deref(), PAGE).await.unwrap()
    })
    .await;
    assert_eq!(waiting, ["sc-o1", "sc-o2", "sc-o3"]);
    // A watch's scan over the next hour, rows due in 10 minutes, by the
    // store of the same timer with a watch.
    f.exec("DELETE FROM orders").await;
    rows(f, &["sc-w1", "sc-w2"], secs(600)).await;
    let mut timer = ShopSchema::default().timer();
    timer.watch = Some(Duration::from_secs(60));
    let store = &store::connect_timer(f.url(), PoolSettings::new(2), &timer).unwrap();
    store.prepare().await.unwrap();
    let now = Utc::now();
    let until = now + chrono::Duration::hours(1);
    let watched = scan(|after: Option<RowCursor>| async move {
        let after = after.unwrap_or(RowCursor {
            deadline: now,
            id: None,
        });
        store.due_between(&after, until, PAGE).await.unwrap()
    })
    .await;
    assert_eq!(watched, ["sc-w1", "sc-w2"]);
}

pub(super) async fn the_sweepers_scan_leaves_out_reopened_and_set_aside_rows(f: &Fixture) {
    let store = f.store();
    store.prepare().await.unwrap();
    // Flipped earlier, then re-opened by the shop: unpaid, overdue, with an
    // outbox row. More of them than a page.
    let reopened: Vec<String> = (0..7).map(|n| format!("sa-re-{n}")).collect();
    for order in &reopened {
        f.insert(order, "UNPAID", secs(-600)).await;
        assert!(cancellation(state_of(store.as_ref(), order, LEASE).await).just_now);
        f.exec(&format!(
            "UPDATE orders SET status = 'UNPAID' WHERE id = '{order}'"
        ))
        .await;
    }
    f.insert("sa-poison", "UNPAID", secs(-500)).await;
    f.insert("sa-order", "UNPAID", secs(-400)).await;
    let found = |store: Store| async move {
        scan(|after: Option<RowCursor>| {
            let store = store.clone();
            async move {
                store
                    .overdue(Duration::ZERO, after.as_ref(), PAGE)
                    .await
                    .unwrap()
            }
        })
        .await
    };
    assert_eq!(found(store.clone()).await, ["sa-poison", "sa-order"]);
    assert_eq!(
        store.set_aside(&id("sa-poison"), "it fails").await.unwrap(),
        Some(1)
    );
    assert_eq!(
        store.set_aside(&id("sa-ghost"), "no row").await.unwrap(),
        None
    );
    assert_eq!(
        found(store.clone()).await,
        ["sa-order"],
        "set aside: skipped"
    );
    // Set aside again (a second failure): still one mark, still skipped.
    assert_eq!(
        store
            .set_aside(&id("sa-poison"), "it fails again")
            .await
            .unwrap(),
        Some(2)
    );
    assert_eq!(found(store.clone()).await, ["sa-order"]);
    assert_eq!(
        f.texts("SELECT reason FROM order_timeout_set_aside").await,
        ["it fails again"]
    );
    // The row changes: swept again.
    f.exec("UPDATE orders SET cancel_reason = 'touched' WHERE id = 'sa-poison'")
        .await;
    assert_eq!(found(store.clone()).await, ["sa-poison", "sa-order"]);
    assert_eq!(store.prune_set_aside().await.unwrap(), 0, "still unpaid");
    // Flipped (a replayed message): the mark is pruned.
    assert!(cancellation(state_of(store.as_ref(), "sa-poison", LEASE).await).just_now);
    assert_eq!(store.prune_set_aside().await.unwrap(), 1);
    assert!(
        f.texts("SELECT reason FROM order_timeout_set_aside")
            .await
            .is_empty()
    );
}
