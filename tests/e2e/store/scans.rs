//! The scans over a timer's rows read every row of their range, whatever
//! some rows are: the sweeper's (`overdue`), a watch's (`due_between`) and
//! `backfill`'s (`waiting_page`) go on from the last row *read*, so a page
//! whose rows are all no orders (an id that is no valid order id: a
//! control character, over 128 bytes) does not end the scan, and the rows
//! behind it are found. And the sweeper's scan leaves out the rows the
//! timer flipped before (re-opened orders) and the rows set aside while
//! they are unchanged, so that any number of them never fills its pages.

use order_timeout::testing::store::{
    HistoryCursor, Page, PoolSettings, RowCursor, connect_timer, history_statement_for_explain,
};

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
    let store = &connect_timer(f.url(), PoolSettings::new(2), &timer).unwrap();
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

/// The history (the console's) pages through a timer's outbox rows newest
/// first, by flip time then order id, whatever rows share a time (a batch's
/// rows do), each page one backward range of the history index: 10,000 rows
/// of another timer and 2,000 of this one, and the plan of the statement
/// the console runs reads the index, not the table.
pub(super) async fn the_history_pages_a_range_of_its_index(f: &Fixture) {
    let my = f.dialect() == Dialect::MySql;
    let (t0, t1, t2) = if my {
        (
            "UTC_TIMESTAMP(6) - INTERVAL 3 HOUR",
            "UTC_TIMESTAMP(6) - INTERVAL 2 HOUR",
            "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR",
        )
    } else {
        (
            "now() - interval '3 hours'",
            "now() - interval '2 hours'",
            "now() - interval '1 hour'",
        )
    };
    let digit = (0..10)
        .map(|n| format!("SELECT {n} AS n"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let n4 = "a.n * 1000 + b.n * 100 + c.n * 10 + d.n";
    // This timer: 2,000 rows at t0, then 5 sharing t1 (one batch), then 1
    // at t2 whose id sorts first; another timer: 10,000 rows, newest of all.
    f.exec(&format!(
        "INSERT INTO order_timeout_cancel_outbox (timer, order_id, created_at) \
         SELECT 'other', CONCAT('o-', {n4}), {t2} FROM ({digit}) a, ({digit}) b, ({digit}) c, ({digit}) d; \
         INSERT INTO order_timeout_cancel_outbox (order_id, created_at) \
         SELECT CONCAT('old-', {n4}), {t0} FROM ({digit}) a, ({digit}) b, ({digit}) c, ({digit}) d \
          WHERE {n4} < 2000; \
         INSERT INTO order_timeout_cancel_outbox (order_id, created_at) \
         SELECT CONCAT('batch-', n), {t1} FROM ({digit}) t WHERE n < 5; \
         INSERT INTO order_timeout_cancel_outbox (order_id, created_at) VALUES ('a-newest', {t2}); \
         {analyze} order_timeout_cancel_outbox",
        analyze = if my { "ANALYZE TABLE" } else { "ANALYZE" },
    ))
    .await;
    let store = f.store();
    let mut seen = Vec::new();
    let mut cursor = None;
    while seen.len() < 12 {
        let page = store.history(cursor.as_ref(), 3).await.unwrap();
        assert_eq!(page.len(), 3);
        let last = page.last().unwrap();
        cursor = Some(HistoryCursor {
            at: last.outbox.created_at,
            timer: "cancel_unpaid".into(),
            order_id: last.order_id.clone(),
        });
        seen.extend(page.into_iter().map(|r| r.order_id));
    }
    assert_eq!(
        seen,
        [
            "a-newest", "batch-4", "batch-3", "batch-2", "batch-1", "batch-0", "old-999",
            "old-998", "old-997", "old-996", "old-995", "old-994"
        ],
        "newest first, then by id descending (byte order: old-999 after old-1999's page)"
    );
    let cursor = cursor.unwrap();
    let statement = history_statement_for_explain(f.dialect(), "cancel_unpaid", &cursor, 50);
    let plan = if my {
        f.texts(&format!("EXPLAIN FORMAT=JSON {statement}")).await
    } else {
        f.texts(&format!("EXPLAIN {statement}")).await
    }
    .join("\n");
    assert!(
        plan.contains("order_timeout_cancel_outbox_history"),
        "{plan}"
    );
    for full_scan in [
        "Seq Scan",
        "filesort",
        "\"access_type\": \"ALL\"",
        "Sort Key",
    ] {
        assert!(!plan.contains(full_scan), "{plan}");
    }
    // The page's start is where the index range begins, not a filter over
    // the newer rows.
    if my {
        assert!(plan.contains("\"access_type\": \"range\""), "{plan}");
    } else {
        assert!(!plan.contains("Filter"), "{plan}");
    }
}

/// Pruning the marks of rows set aside looks at one page of them per
/// sweep (a thousand), going on after it at the next: however many rows
/// are set aside, a sweep's work is bounded, and a page whose rows all
/// still wait never hides the marks behind it, which a later call prunes.
pub(super) async fn pruning_goes_through_the_marks_a_page_at_a_time(f: &Fixture) {
    let store = f.store();
    store.prepare().await.unwrap();
    // A thousand rows still waiting, each set aside, first by id; then the
    // mark of a row that is gone.
    f.insert("pm-0000", "UNPAID", secs(3600)).await;
    assert_eq!(
        store.set_aside(&id("pm-0000"), "it fails").await.unwrap(),
        Some(1)
    );
    let (text, at) = match f.dialect() {
        Dialect::Postgres => ("{}::text", "now() + interval '1 hour'"),
        Dialect::MySql => ("CAST({} AS CHAR)", "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR"),
    };
    let text = |expr: &str| text.replace("{}", expr);
    let timer = f
        .texts(&format!(
            "SELECT {} FROM order_timeout_set_aside",
            text("timer")
        ))
        .await;
    let ids: Vec<String> = (1..1_000).map(|n| format!("pm-{n:04}")).collect();
    let rows: Vec<String> = ids
        .iter()
        .map(|id| format!("('{id}', 'UNPAID', {at})"))
        .collect();
    f.exec(&format!(
        "INSERT INTO orders (id, status, expires_at) VALUES {}",
        rows.join(", ")
    ))
    .await;
    let marks: Vec<String> = ids
        .iter()
        .map(String::as_str)
        .chain(["pz-gone"])
        .map(|id| format!("('{}', '{id}', 'd', 'it fails', {at}, 1, {at})", timer[0]))
        .collect();
    f.exec(&format!(
        "INSERT INTO order_timeout_set_aside \
         (timer, order_id, row_digest, reason, set_aside_at, attempts, retry_at) VALUES {}",
        marks.join(", ")
    ))
    .await;
    let count = &format!("SELECT {} FROM order_timeout_set_aside", text("count(*)"));
    // The first page: a thousand marks whose rows all wait.
    assert_eq!(store.prune_set_aside().await.unwrap(), 0, "the first page");
    assert_eq!(f.texts(count).await, ["1001"]);
    // The next call goes on after it: the gone row's mark is pruned.
    assert_eq!(store.prune_set_aside().await.unwrap(), 1, "the next page");
    assert_eq!(f.texts(count).await, ["1000"]);
    // Then it starts over, and finds a row that left its status.
    f.exec("UPDATE orders SET status = 'PAID' WHERE id = 'pm-0500'")
        .await;
    assert_eq!(store.prune_set_aside().await.unwrap(), 1, "starting over");
    assert_eq!(f.texts(count).await, ["999"]);
}
