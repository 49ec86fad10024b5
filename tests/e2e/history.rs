//! The console's history of cancellations (`/console/history`), on both
//! dialects, in headless Chromium: two timers on the shop's orders table
//! (`cancel_unpaid`, and `close_paid` flipping paid orders, no release)
//! flip six orders, one of whose stock releases the inventory refuses.
//! The page lists them newest first (as the outbox's times say), filters
//! by timer, pages on by keyset without losing or repeating a row, shows
//! each order's lateness (its flip time minus its deadline) and the
//! release's state (released, pending with its failed attempts, none), and
//! links each order to its explanation; it is reached from the console's
//! navigation, with no write control for an anonymous visitor.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use order_timeout::settings::TimerMapping;

use crate::browser::Browser;
use crate::common::{Dialect, TestEnv, on_both_dialects};

const WAIT: Duration = Duration::from_secs(30);

/// One row of the page as the browser reads it.
#[derive(Clone, Debug, PartialEq)]
struct Row {
    at: DateTime<Utc>,
    order: String,
    timer: String,
    lateness_ms: Option<i64>,
    release: String,
    event: String,
}

/// The rows of the history table on the browser's page, and the address
/// of its Next link (if any).
async fn rows(browser: &mut Browser) -> (Vec<Row>, Option<String>) {
    let read = browser
        .eval(
            "[...document.querySelectorAll('#history tr')].slice(1).map(tr => {
               const td = tr.querySelectorAll('td');
               return [td[0].querySelector('time').getAttribute('datetime'),
                       td[1].innerText, td[1].querySelector('a').getAttribute('href'),
                       td[2].innerText, td[4].innerText, td[5].innerText, td[6].innerText];
             })",
        )
        .await;
    let rows = read
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| {
            let s = |i: usize| r[i].as_str().unwrap().to_owned();
            let order = s(1);
            assert_eq!(
                s(2),
                format!("/console/order?id={order}"),
                "the id links to its explanation"
            );
            Row {
                at: DateTime::parse_from_rfc3339(&s(0))
                    .unwrap()
                    .with_timezone(&Utc),
                order,
                timer: s(3),
                lateness_ms: s(4).strip_suffix(" ms").map(|n| n.parse().unwrap()),
                release: s(5),
                event: s(6),
            }
        })
        .collect();
    let next = browser
        .eval("(document.querySelector('a#next') || {}).href || null")
        .await;
    (rows, next.as_str().map(str::to_owned))
}

/// `rows` with the count of failed attempts left out of a pending
/// release's state (it grows while the test reads the pages).
fn settled(rows: &[Row]) -> Vec<Row> {
    rows.iter()
        .cloned()
        .map(|mut r| {
            if r.release.starts_with("pending, ") {
                r.release = r
                    .release
                    .split_once(": ")
                    .map_or(r.release.clone(), |(_, why)| format!("pending: {why}"));
            }
            r
        })
        .collect()
}

/// The second timer: paid orders closed at their deadline, no release.
fn close_paid() -> TimerMapping {
    toml::from_str(
        r#"
        name = "close_paid"
        from = "PAID"
        to = "CANCELLED"
        deadline = "expires_at"
        "#,
    )
    .unwrap()
}

async fn the_history_lists_cancellations_newest_first_by_timer_with_lateness_and_release(
    dialect: Dialect,
) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    // h-u-3's release is refused for as long as the test runs.
    let (_inventory, _stop) = env
        .inventory_refusing(|id, _| {
            (id == "h-u-3").then(|| tonic::Status::unavailable("the stock shard is down"))
        })
        .await;
    let mut settings = env.settings.clone();
    settings.timers.push(close_paid());
    let service = env.service_with(settings).await;

    // Deadlines 250 ms apart, alternating timers: h-u-0 (unpaid) first,
    // then h-p-0 (paid), h-u-1, h-p-1, h-u-2, h-u-3.
    let plan = [
        ("h-u-0", 400),
        ("h-p-0", 650),
        ("h-u-1", 900),
        ("h-p-1", 1_150),
        ("h-u-2", 1_400),
        ("h-u-3", 1_650),
    ];
    let mut deadlines = HashMap::new();
    for (id, ms) in plan {
        let order = env
            .create_order(id, Duration::from_millis(ms), &[(0, 1)])
            .await;
        deadlines.insert(id.to_owned(), order.expires_at);
        if id.starts_with("h-p-") {
            assert!(env.pay(id).await);
            env.publish_raw(format!(r#"{{"order_id":"{id}","timer":"close_paid"}}"#).as_bytes())
                .await;
        } else {
            env.publish_timeout(&order).await;
        }
    }
    env.eventually(WAIT, "six orders flipped", || async {
        env.count("h-", "CANCELLED").await == 6
    })
    .await;
    env.eventually(WAIT, "five finished, h-u-3's release failing", || async {
        let failed: Vec<(i64,)> = env
            .shop_rows(
                "SELECT COUNT(*) FROM order_timeout_cancel_outbox \
                  WHERE order_id = 'h-u-3' AND attempts >= 1",
            )
            .await;
        env.outbox_unreleased().await == 1 && failed[0].0 == 1
    })
    .await;
    let base = format!("http://{}", service.http_addr);
    let mut browser = Browser::launch().await;

    // From the navigation, as an anonymous visitor: nothing that writes.
    browser.goto(&format!("{base}/console")).await;
    browser.click("nav a[href='/console/history']").await;
    browser
        .wait_loaded(&format!("{base}/console/history"))
        .await;
    assert_eq!(browser.count("form[method=post]").await, 0);
    let text = browser.text().await;
    assert!(text.contains("outbox_retention"), "{text}");
    assert!(text.contains("7days"), "the retention in force: {text}");
    let (all, next) = rows(&mut browser).await;
    assert_eq!(next, None, "six rows fit one page");
    assert_eq!(all.len(), 6, "{all:?}");

    // Newest first, as the outbox's times say (ties: timer, then id,
    // descending); and the flips followed the deadlines.
    let mut sorted = all.clone();
    sorted.sort_by(|a, b| (b.at, &b.timer, &b.order).cmp(&(a.at, &a.timer, &a.order)));
    assert_eq!(all, sorted, "newest first");
    let mut by_deadline: Vec<&str> = plan.iter().map(|(id, _)| *id).collect();
    by_deadline.reverse();
    let shown: Vec<&str> = all.iter().map(|r| r.order.as_str()).collect();
    assert_eq!(shown, by_deadline, "{all:?}");

    for row in &all {
        // Lateness: the flip's time minus the row's deadline, never early.
        let late = row.lateness_ms.unwrap_or_else(|| panic!("{row:?}"));
        let expected = (row.at - deadlines[&row.order]).num_milliseconds();
        assert!((late - expected).abs() <= 1, "{row:?}: {expected} ms");
        assert!((0..5_000).contains(&late), "{row:?}");
        let (timer, release) = match row.order.as_str() {
            "h-u-3" => ("cancel_unpaid", "pending, "),
            id if id.starts_with("h-u-") => ("cancel_unpaid", "released "),
            _ => ("close_paid", "none (release = \"none\")"),
        };
        assert_eq!(row.timer, timer, "{row:?}");
        assert!(row.release.starts_with(release), "{row:?}");
        if row.order != "h-u-3" {
            assert_eq!(row.event, "published", "{row:?}");
        }
    }
    let held = all.iter().find(|r| r.order == "h-u-3").unwrap();
    assert!(
        held.release.contains("failed attempt") && held.release.contains("the stock shard is down"),
        "the attempts and the inventory's error: {held:?}"
    );

    // Filtered by timer, from the page's own links.
    browser
        .click("a[href='/console/history?timer=close_paid']")
        .await;
    browser
        .wait_loaded(&format!("{base}/console/history?timer=close_paid"))
        .await;
    let (paid, _) = rows(&mut browser).await;
    let want: Vec<Row> = all
        .iter()
        .filter(|r| r.timer == "close_paid")
        .cloned()
        .collect();
    assert_eq!(paid, want);
    let (status, _) =
        crate::common::http_get(service.http_addr, "/console/history?timer=nope").await;
    assert_eq!(status, 404, "an unknown timer");

    // Two at a time: the Next links walk every row once, in order, with
    // and without the filter.
    for (start, want) in [
        ("/console/history?limit=2", all.clone()),
        (
            "/console/history?timer=cancel_unpaid&limit=2",
            all.iter()
                .filter(|r| r.timer == "cancel_unpaid")
                .cloned()
                .collect(),
        ),
    ] {
        let mut walked = Vec::new();
        let mut at = Some(format!("{base}{start}"));
        let mut pages = 0;
        while let Some(url) = at {
            browser.goto(&url).await;
            let (page, next) = rows(&mut browser).await;
            assert!(page.len() <= 2, "{url}: {page:?}");
            walked.extend(page);
            at = next;
            pages += 1;
            assert!(pages <= 6, "{start}: the pages end");
        }
        // h-u-3's release keeps failing meanwhile: its count of failed
        // attempts may have grown since `all` was read.
        assert_eq!(settled(&walked), settled(&want), "{start}");
    }

    // An order's link explains it.
    browser.goto(&format!("{base}/console/history")).await;
    browser
        .click("#history a[href='/console/order?id=h-u-0']")
        .await;
    browser
        .wait_loaded(&format!("{base}/console/order?id=h-u-0"))
        .await;
    assert!(browser.text().await.contains("Order h-u-0"));
    drop(browser);
    service.stop().await.unwrap();
}

on_both_dialects!(the_history_lists_cancellations_newest_first_by_timer_with_lateness_and_release);
