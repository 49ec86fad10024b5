//! The web console against a running service: in headless Chromium
//! ([`crate::browser`]) a parked message shows up, is replayed from the
//! page and its order is then cancelled; without `ADMIN_TOKEN` the pages
//! have no write controls and a forged POST changes nothing; with it, a
//! write needs a login session and that session's CSRF token.

use std::net::SocketAddr;
use std::time::Duration;

use chrono::Utc;
use order_timeout::message::format_instant;
use order_timeout::settings::AdminToken;
use order_timeout::testing::metrics::Outcome;

use crate::browser::Browser;
use crate::common::{TestEnv, csrf_of};
use order_timeout::RunningService;

const WAIT: Duration = Duration::from_secs(20);
const TOKEN: &str = "console-test-token-0123456789";

async fn publish_for_unknown(env: &TestEnv, id: &str) {
    env.publish_raw(
        format!(
            r#"{{"order_id":"{id}","cancel_at":"{}"}}"#,
            format_instant(Utc::now())
        )
        .as_bytes(),
    )
    .await;
}

async fn wait_parked(env: &TestEnv, service: &RunningService, n: u64) {
    env.eventually(WAIT, &format!("{n} messages parked"), || async {
        // In the parked store, where the console and the commands read.
        service.metrics.count(Outcome::Parked) >= n && env.parked_kept().await == n
    })
    .await;
}

async fn with_token(env: &TestEnv) -> RunningService {
    let mut settings = env.settings.clone();
    settings.admin_token = Some(AdminToken::parse(TOKEN).unwrap());
    env.service_with(settings).await
}

/// The id the console names the only parked message by.
async fn only_parked_key(env: &TestEnv) -> String {
    let listing = env.parked_listing().await;
    assert_eq!(listing.messages.len(), 1);
    listing.messages[0].id.unwrap().to_string()
}

/// One HTTP/1.1 request: `(status, head, body)`.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    crate::common::http_send(addr, &addr.to_string(), method, path, headers, body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_message_is_replayed_from_the_console_and_its_order_cancelled() {
    let env = TestEnv::new().await;
    env.stock_skus(1).await;
    let service = with_token(&env).await;
    // Three timeouts an hour away, so the pending page has something.
    for i in 0..3 {
        let order = env
            .create_order(&format!("later-{i}"), Duration::from_secs(3600), &[(0, 1)])
            .await;
        env.publish_timeout(&order).await;
    }
    publish_for_unknown(&env, "console-1").await;
    wait_parked(&env, &service, 1).await;
    let base = format!("http://{}", service.http_addr);
    // The order page explains it: no row, one parked message naming it.
    let (status, page) =
        crate::common::http_get(service.http_addr, "/console/order?id=console-1").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("no row with this id in orders"), "{page}");
    assert!(page.contains("1 parked message(s) name it"), "{page}");
    let (_, later) = crate::common::http_get(service.http_addr, "/console/order?id=later-0").await;
    assert!(later.contains("due in "), "{later}");
    let mut browser = Browser::launch().await;

    browser.goto(&format!("{base}/console/parked")).await;
    let text = browser.text().await;
    assert!(text.contains("console-1"), "{text}");
    assert!(text.contains("unknown_order"), "{text}");
    assert_eq!(browser.count("button[formaction]").await, 0, "logged out");

    browser.goto(&format!("{base}/console/login")).await;
    browser.fill("input[name=token]", TOKEN).await;
    browser.click("button[type=submit]").await;
    browser.wait_loaded(&format!("{base}/console/parked")).await;
    assert!(
        browser.count("button[name=only]").await >= 2,
        "replay and purge"
    );

    browser.goto(&format!("{base}/console/pending")).await;
    env.eventually(WAIT, "the pending page shows the three", || async {
        crate::common::http_get(service.http_addr, "/console/pending")
            .await
            .1
            .contains("3 timeouts wait")
    })
    .await;
    browser.goto(&format!("{base}/console/pending")).await;
    assert!(browser.text().await.contains("3 timeouts wait"));
    screenshots(&mut browser, &base, &["parked"]).await;

    // The order service's row shows up late; replay the message.
    env.create_order("console-1", Duration::from_millis(10), &[(0, 2)])
        .await;
    browser.goto(&format!("{base}/console/parked")).await;
    browser
        .click("button[name=only][formaction='/console/parked/replay']")
        .await;
    browser
        .wait_loaded(&format!("{base}/console/parked/replay"))
        .await;
    let text = browser.text().await;
    assert!(text.contains("Replayed 1 parked message"), "{text}");
    let (status, expires_at, cancelled_at) = env.wait_settled("console-1", WAIT).await;
    assert_eq!(status, "CANCELLED");
    assert!(cancelled_at.unwrap() >= expires_at);
    assert_eq!(env.parked_count().await, 0);
    env.assert_stock_exact(1).await;
    drop(browser);
    service.stop().await.unwrap();
}

/// With `CONSOLE_SCREENSHOTS=DIR`, PNGs of `pages` (`overview`, `pending`,
/// `parked`) go to `DIR` as `console-<page>.png`, each as tall as the page
/// (how the screenshots in docs/ are made: `CONSOLE_SCREENSHOTS=docs
/// cargo test --test e2e console::`).
async fn screenshots(browser: &mut Browser, base: &str, pages: &[&str]) {
    let Ok(dir) = std::env::var("CONSOLE_SCREENSHOTS") else {
        return;
    };
    for page in pages {
        let path = if *page == "overview" {
            "/console".to_owned()
        } else {
            format!("/console/{page}")
        };
        browser.goto(&format!("{base}{path}")).await;
        let height = browser
            .eval("document.documentElement.scrollHeight")
            .await
            .as_u64()
            .unwrap_or(800)
            .clamp(800, 3000) as u32;
        let png = browser.screenshot(1280, height).await;
        std::fs::write(format!("{dir}/console-{page}.png"), png).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_admin_token_the_console_cannot_write() {
    let env = TestEnv::new().await;
    let service = env.service().await;
    publish_for_unknown(&env, "read-only-1").await;
    wait_parked(&env, &service, 1).await;
    let key = only_parked_key(&env).await;
    let base = format!("http://{}", service.http_addr);

    let mut browser = Browser::launch().await;
    for page in ["/console", "/console/pending", "/console/parked"] {
        browser.goto(&format!("{base}{page}")).await;
        assert_eq!(
            browser.count("form[method=post]").await,
            0,
            "{page}: no forms that write"
        );
        assert_eq!(
            browser
                .count("form[method=post] button, button[formaction]")
                .await,
            0,
            "{page}: no buttons that write"
        );
        assert!(browser.text().await.contains("read-only"), "{page}");
    }
    assert!(browser.text().await.contains("read-only-1"));
    drop(browser);

    // Forged writes: refused, nothing replayed or deleted.
    let addr = service.http_addr;
    for (path, body) in [
        ("/console/parked/replay", format!("only={key}&csrf=x")),
        (
            "/console/parked/purge",
            format!("only={key}&csrf=x&confirm=yes"),
        ),
        ("/console/login", format!("token={TOKEN}")),
    ] {
        let (status, _, page) = request(addr, "POST", path, &[], &body).await;
        assert_eq!(status, 403, "{path}: {page}");
        assert!(page.contains("ADMIN_TOKEN is not set"), "{page}");
    }
    assert_eq!(request(addr, "GET", "/console/login", &[], "").await.0, 403);
    // A replay or a purge removes the parked copy before the page answers
    // (a replayed one comes back parked anew, with another key): the very
    // message parked before is still there, alone.
    assert_eq!(
        only_parked_key(&env).await,
        key,
        "never replayed nor purged"
    );
    assert_eq!(service.metrics.count(Outcome::Parked), 1, "never replayed");
    service.stop().await.unwrap();
}

/// Logs in with the right token; the session cookie (`name=value`).
async fn log_in(addr: SocketAddr) -> String {
    let (status, head, _) = request(
        addr,
        "POST",
        "/console/login",
        &[],
        &format!("token={TOKEN}"),
    )
    .await;
    assert_eq!(status, 303, "{head}");
    assert!(head.contains("HttpOnly") && head.contains("SameSite=Strict"));
    head.lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .map(|l| l["set-cookie:".len()..].trim())
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no session cookie: {head}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_needs_a_session_and_its_csrf_token() {
    let env = TestEnv::new().await;
    let service = with_token(&env).await;
    publish_for_unknown(&env, "csrf-1").await;
    wait_parked(&env, &service, 1).await;
    let key = only_parked_key(&env).await;
    let addr = service.http_addr;
    let replay = format!("only={key}");

    // No session.
    let (status, _, _) = request(addr, "POST", "/console/parked/replay", &[], &replay).await;
    assert_eq!(status, 403);
    // A wrong token does not log in.
    let (status, head, _) = request(
        addr,
        "POST",
        "/console/login",
        &[],
        "token=not-the-token-at-all",
    )
    .await;
    assert_eq!(status, 403);
    assert!(!head.to_ascii_lowercase().contains("set-cookie"));
    let cookie = log_in(addr).await;
    let session = [("Cookie", cookie.as_str())];
    let (_, _, page) = request(addr, "GET", "/console/parked", &session, "").await;
    let csrf = csrf_of(&page);

    // A session without its CSRF token, with another, or from another site.
    for (headers, body) in [
        (vec![("Cookie", cookie.as_str())], replay.clone()),
        (
            vec![("Cookie", cookie.as_str())],
            format!("{replay}&csrf=forged"),
        ),
        (
            vec![
                ("Cookie", cookie.as_str()),
                ("Origin", "http://evil.example"),
            ],
            format!("{replay}&csrf={csrf}"),
        ),
    ] {
        let (status, _, page) =
            request(addr, "POST", "/console/parked/replay", &headers, &body).await;
        assert_eq!(status, 403, "{body}: {page}");
    }
    // A replay removes the parked copy before the page answers (and the
    // copy comes back parked anew, with another id, the order being still
    // unknown): the very message parked before is still there, alone.
    assert_eq!(only_parked_key(&env).await, key, "nothing replayed");
    assert_eq!(
        service.metrics.count(Outcome::Parked),
        1,
        "nothing replayed"
    );
    // The page's listing pass returned it; the quorum queue's count follows
    // within moments.
    env.eventually(WAIT, "still parked", || async {
        env.parked_count().await == 1
    })
    .await;

    purge_asks_then_deletes(&env, addr, &cookie, &key, &csrf).await;
    service.stop().await.unwrap();
}

/// With a session and its CSRF token, purge asks first, then deletes
/// exactly the message chosen.
async fn purge_asks_then_deletes(
    env: &TestEnv,
    addr: SocketAddr,
    cookie: &str,
    key: &str,
    csrf: &str,
) {
    let session = [("Cookie", cookie)];
    let purge = format!("only={key}&csrf={csrf}");
    let (status, _, page) = request(addr, "POST", "/console/parked/purge", &session, &purge).await;
    assert_eq!(status, 200);
    assert!(page.contains("Delete 1 parked message"), "{page}");
    assert_eq!(env.parked_count().await, 1);
    let confirmed = format!("id={key}&csrf={csrf}&confirm=yes");
    let (status, _, page) =
        request(addr, "POST", "/console/parked/purge", &session, &confirmed).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Deleted 1 parked message (0 kept)"), "{page}");
    assert_eq!(env.parked_count().await, 0);
}

/// The Content-Security-Policy every console page has always sent: the
/// pictures need nothing more.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Collects the page's Content-Security-Policy violations in
/// `window.cspViolations`, from before its content loads.
const CSP_WATCH: &str = "window.cspViolations = []; document.addEventListener('securitypolicyviolation', (e) => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));";

/// What the page's pictures look like in the browser, as JSON: each
/// `svg.chart` with its role, the texts its `aria-labelledby` names, its
/// box, and each of its texts' box and font size.
const CHARTS: &str = r#"JSON.stringify([...document.querySelectorAll('svg.chart')].map((svg) => {
  const box = (e) => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  return {
    id: svg.id,
    role: svg.getAttribute('role'),
    labels: (svg.getAttribute('aria-labelledby') || '').split(' ').map((id) => (document.getElementById(id) || {}).textContent || ''),
    box: box(svg),
    viewport: window.innerWidth,
    texts: [...svg.querySelectorAll('text')].map((t) => ({text: t.textContent, size: parseFloat(getComputedStyle(t).fontSize), box: box(t)})),
    points: svg.querySelectorAll('circle').length,
    bars: [...svg.querySelectorAll('rect > title')].map((t) => t.textContent),
  };
}))"#;

/// One picture as [`CHARTS`] describes it.
#[derive(Debug, serde::Deserialize)]
struct Chart {
    id: String,
    role: Option<String>,
    labels: Vec<String>,
    #[serde(rename = "box")]
    bounds: Bounds,
    viewport: f64,
    texts: Vec<ChartText>,
    points: usize,
    bars: Vec<String>,
}

#[derive(Debug, serde::Deserialize)]
struct ChartText {
    text: String,
    size: f64,
    #[serde(rename = "box")]
    bounds: Bounds,
}

#[derive(Clone, Copy, Debug, serde::Deserialize)]
struct Bounds {
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
}

impl Bounds {
    fn inside(&self, outer: &Bounds) -> bool {
        self.left >= outer.left - 1.0
            && self.right <= outer.right + 1.0
            && self.top >= outer.top - 1.0
            && self.bottom <= outer.bottom + 1.0
    }

    fn overlaps(&self, other: &Bounds) -> bool {
        self.left < other.right - 0.5
            && other.left < self.right - 0.5
            && self.top < other.bottom - 0.5
            && other.top < self.bottom - 0.5
    }
}

/// The page's pictures, after checking that each is an image labelled by a
/// title and a description, shown at its full size within the window, with
/// every text at least 11 px, inside the picture, and clear of the others;
/// and that the page broke no rule of its Content-Security-Policy.
async fn readable_charts(browser: &mut Browser, page: &str) -> Vec<Chart> {
    let charts: Vec<Chart> =
        serde_json::from_str(browser.eval(CHARTS).await.as_str().unwrap()).unwrap();
    for chart in &charts {
        let what = format!("{page} #{}", chart.id);
        assert_eq!(chart.role.as_deref(), Some("img"), "{what}");
        assert_eq!(chart.labels.len(), 2, "{what}: a title and a description");
        assert!(
            chart.labels.iter().all(|l| l.len() > 20),
            "{what}: {:?}",
            chart.labels
        );
        let width = chart.bounds.right - chart.bounds.left;
        assert!(
            (700.0..=740.0).contains(&width) && chart.bounds.right <= chart.viewport,
            "{what}: {width} px wide, right edge {} in a {} px window",
            chart.bounds.right,
            chart.viewport
        );
        for (i, t) in chart.texts.iter().enumerate() {
            assert!(t.size >= 11.0, "{what}: {:?} at {} px", t.text, t.size);
            assert!(
                t.bounds.inside(&chart.bounds),
                "{what}: {:?} outside the picture",
                t.text
            );
            for other in &chart.texts[i + 1..] {
                assert!(
                    !t.bounds.overlaps(&other.bounds),
                    "{what}: {:?} and {:?} overlap",
                    t.text,
                    other.text
                );
            }
        }
    }
    let violations = browser.eval("JSON.stringify(window.cspViolations)").await;
    assert_eq!(
        violations.as_str(),
        Some("[]"),
        "{page}: Content-Security-Policy violations (or the watch did not run)"
    );
    charts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_draws_the_last_hour_and_what_falls_due_when() {
    use order_timeout::settings::Lane;
    use order_timeout::testing::topology::lane_entry_key;

    let mut env = TestEnv::new().await;
    let lane = Lane::try_from("20m".to_string()).unwrap();
    env.settings.lanes = vec![lane];
    env.stock_skus(1).await;
    let service = env.service().await;
    env.eventually(WAIT, "the service ready", || {
        crate::common::ready(service.http_addr)
    })
    .await;
    let addr = service.http_addr;

    // Six orders cancelled and two messages parked, this minute.
    for i in 0..6 {
        let order = env
            .create_order(
                &format!("soon-{i}"),
                Duration::from_millis(800 + 100 * i),
                &[(0, 1)],
            )
            .await;
        env.publish_timeout(&order).await;
    }
    publish_for_unknown(&env, "picture-1").await;
    publish_for_unknown(&env, "picture-2").await;
    env.acked_exactly(&service, Outcome::Cancelled, 6).await;
    wait_parked(&env, &service, 2).await;

    // Then one timeout waiting in each due window but "1 hour", which gets
    // two: one through the cascade, one in the 20 min lane.
    for (id, secs) in [
        ("minute", 31),
        ("ten-minutes", 300),
        ("hour", 1800),
        ("day", 5 * 3600),
        ("week", 3 * 86_400),
        ("later", 30 * 86_400),
    ] {
        let order = env
            .create_order(id, Duration::from_secs(secs), &[(0, 1)])
            .await;
        env.publish_timeout(&order).await;
    }
    let in_lane = env.create_order("lane", lane.duration(), &[(0, 1)]).await;
    env.publish_raw_as(
        &lane_entry_key(lane),
        format!("{:?}", in_lane.id).as_bytes(),
    )
    .await;

    // `pending` says the same, as a bound.
    let expected = [1u64, 1, 2, 1, 1, 1];
    env.eventually(WAIT, "seven timeouts by due window", || async {
        let out = env.cli(&["pending", "--json"]).await;
        serde_json::from_str::<serde_json::Value>(&out.stdout).is_ok_and(|v| {
            v["due_windows"].as_array().is_some_and(|w| {
                w.iter()
                    .map(|w| w["messages"].as_u64())
                    .eq(expected.map(Some))
            })
        })
    })
    .await;
    let out = env.cli(&["pending", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let windows = json["due_windows"].as_array().unwrap();
    let names: Vec<&str> = windows
        .iter()
        .map(|w| w["window"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["1m", "10m", "1h", "1d", "7d", "later"]);
    assert_eq!(windows[2]["at_most_secs"], 3600);
    assert_eq!(windows[2]["cumulative"], 4);
    assert_eq!(windows[5]["at_most_secs"], serde_json::Value::Null);
    let text = env.cli(&["pending"]).await;
    assert!(
        text.stdout.contains("What falls due when") && text.stdout.contains("At the latest"),
        "{}",
        text.stdout
    );

    // The console shows it once the service has measured it (every 5 s).
    env.eventually(WAIT, "the pending page's picture", || async {
        crate::common::http_get(addr, "/console/pending")
            .await
            .1
            .contains("7 timeouts wait: 1 within 1 minute, 1 within 10 minutes, 2 within 1 hour, 1 within 1 day, 1 within 7 days, 1 later.")
    })
    .await;
    let (_, head, _) = request(addr, "GET", "/console/pending", &[], "").await;
    assert!(
        head.lines()
            .any(|l| l.eq_ignore_ascii_case(&format!("content-security-policy: {CSP}"))),
        "the CSP is unchanged: {head}"
    );

    let base = format!("http://{addr}");
    let mut browser = Browser::launch().await;
    browser.before_each_page(CSP_WATCH).await;

    browser.goto(&format!("{base}/console/pending")).await;
    let charts = readable_charts(&mut browser, "pending").await;
    assert_eq!(charts.len(), 1, "{charts:?}");
    let due = &charts[0];
    assert!(due.labels[0].starts_with("What falls due when"), "{due:?}");
    assert!(due.labels[1].contains("not exact times"), "{due:?}");
    let labels: Vec<&str> = due.texts.iter().map(|t| t.text.as_str()).collect();
    for label in [
        "≤ 1 minute",
        "≤ 10 minutes",
        "≤ 1 hour",
        "≤ 1 day",
        "≤ 7 days",
        "later",
    ] {
        assert!(labels.contains(&label), "{label} in {labels:?}");
    }
    assert_eq!(
        due.bars,
        [
            "1 due within 1 minute",
            "1 due within 10 minutes",
            "2 due within 1 hour",
            "1 due within 1 day",
            "1 due within 7 days",
            "1 due later"
        ]
    );
    assert!(browser.text().await.contains("At the latest"));

    browser.goto(&format!("{base}/console")).await;
    let charts = readable_charts(&mut browser, "overview").await;
    let ids: Vec<&str> = charts.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["lateness-0", "flips"]);
    let lateness = &charts[0];
    assert!(
        lateness.labels[0].contains("Lateness of cancel_unpaid, p50 and p99 per minute"),
        "{lateness:?}"
    );
    assert!(
        lateness.labels[1].starts_with("6 rows flipped in the last hour."),
        "{lateness:?}"
    );
    assert!(
        lateness.points >= 2,
        "p50 and p99 of this minute: {lateness:?}"
    );
    let flips = &charts[1];
    assert!(
        flips.labels[1].starts_with("6 cancelled and 2 parked in the last hour"),
        "{flips:?}"
    );
    assert!(
        flips.bars.iter().any(|b| b.ends_with(" cancelled")),
        "{flips:?}"
    );
    assert!(
        flips.bars.iter().any(|b| b.ends_with(" parked")),
        "{flips:?}"
    );

    screenshots(&mut browser, &base, &["overview", "pending"]).await;
    drop(browser);
    service.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_rebinding_page_reads_nothing_in_a_browser() {
    let env = TestEnv::new().await;
    let service = with_token(&env).await;
    publish_for_unknown(&env, "rebind-1").await;
    wait_parked(&env, &service, 1).await;
    let port = service.http_addr.port();
    // The attacker's name, resolved to the console's address, as a
    // rebinding DNS server would after the page loaded.
    let mut browser =
        Browser::launch_with(&["--host-resolver-rules=MAP rebind.evil.example 127.0.0.1"]).await;
    browser
        .goto(&format!("http://rebind.evil.example:{port}/console/parked"))
        .await;
    let text = browser.text().await;
    assert!(text.contains("not one the console answers to"), "{text}");
    assert!(!text.contains("rebind-1"), "{text}");
    // A script of that page reads the console the same way: refused.
    let fetched = browser
        .call(
            "Runtime.evaluate",
            serde_json::json!({
                "expression": "fetch('/console/parked').then(async r => [r.status, await r.text()])",
                "awaitPromise": true,
                "returnByValue": true,
            }),
        )
        .await;
    let answer = &fetched["result"]["value"];
    assert_eq!(answer[0], 421, "{fetched}");
    assert!(!answer[1].as_str().unwrap_or_default().contains("rebind-1"));
    // The console's own name still works.
    browser
        .goto(&format!("http://localhost:{port}/console/parked"))
        .await;
    assert!(browser.text().await.contains("rebind-1"));
    drop(browser);
    service.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_kept_from_before_logout_no_longer_logs_in() {
    let env = TestEnv::new().await;
    let service = with_token(&env).await;
    let base = format!("http://{}", service.http_addr);
    let mut browser = Browser::launch().await;
    browser.goto(&format!("{base}/console/login")).await;
    browser.fill("input[name=token]", TOKEN).await;
    browser.click("button[type=submit]").await;
    browser.wait_loaded(&format!("{base}/console/parked")).await;
    assert_eq!(browser.count("header form").await, 1, "the Log out button");
    // What a thief (or a shared machine's next user) would keep.
    let cookies = browser
        .call("Network.getCookies", serde_json::json!({}))
        .await;
    let kept = cookies["cookies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "ot_console")
        .cloned()
        .unwrap_or_else(|| panic!("no session cookie: {cookies}"));
    browser.click("header form button").await;
    // The logout leads from /console/parked to /console: the old page's
    // address matches too, so wait for what the new page says.
    browser.wait_text("Log in").await;
    browser
        .call(
            "Network.setCookie",
            serde_json::json!({
                "name": "ot_console",
                "value": kept["value"],
                "url": format!("{base}/console"),
                "path": "/console",
                "httpOnly": true,
                "sameSite": "Strict",
            }),
        )
        .await;
    browser.goto(&format!("{base}/console/parked")).await;
    let text = browser.text().await;
    assert!(
        text.contains("Log in"),
        "the old session still works: {text}"
    );
    assert_eq!(browser.count("header form").await, 0, "{text}");
    assert_eq!(browser.count("input[name=csrf]").await, 0, "{text}");
    drop(browser);
    service.stop().await.unwrap();
}
