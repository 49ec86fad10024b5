//! The web console against a running service: in headless Chromium
//! ([`crate::browser`]) a parked message shows up, is replayed from the
//! page and its order is then cancelled; without `ADMIN_TOKEN` the pages
//! have no write controls and a forged POST changes nothing; with it, a
//! write needs a login session and that session's CSRF token.

use std::net::SocketAddr;
use std::time::Duration;

use chrono::Utc;
use order_timeout::message::format_instant;
use order_timeout::observe::metrics::Outcome;
use order_timeout::settings::AdminToken;

use crate::browser::Browser;
use crate::common::TestEnv;
use order_timeout::app::RunningService;

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
        service.metrics.count(Outcome::Parked) >= n && env.parked_count().await as u64 == n
    })
    .await;
}

async fn with_token(env: &TestEnv) -> RunningService {
    let mut settings = env.settings.clone();
    settings.admin_token = Some(AdminToken::parse(TOKEN).unwrap());
    env.service_with(settings).await
}

/// The key the console names the only parked message by.
async fn only_parked_key(env: &TestEnv) -> String {
    let listing = order_timeout::ops::parked::list(&env.amqp, None)
        .await
        .unwrap();
    assert_eq!(listing.messages.len(), 1);
    listing.messages[0].key()
}

/// One HTTP/1.1 request: `(status, head, body)`.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut text = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if method == "POST" {
        text.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    for (k, v) in headers {
        text.push_str(&format!("{k}: {v}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    stream.write_all(text.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
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
    screenshots(&mut browser, &base).await;

    // The order service's row shows up late; replay the message.
    env.create_order("console-1", Duration::from_millis(10), &[(0, 2)])
        .await;
    browser.goto(&format!("{base}/console/parked")).await;
    browser
        .click("button[name=only][formaction='/console/parked/replay']")
        .await;
    browser
        .wait_loaded(&format!("{base}/console/parked?replayed="))
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

/// With `CONSOLE_SCREENSHOTS=DIR`, PNGs of the three pages go to `DIR`
/// (how the screenshots in docs/ are made).
async fn screenshots(browser: &mut Browser, base: &str) {
    let Ok(dir) = std::env::var("CONSOLE_SCREENSHOTS") else {
        return;
    };
    for page in ["overview", "pending", "parked"] {
        let path = if page == "overview" {
            "/console".to_owned()
        } else {
            format!("/console/{page}")
        };
        browser.goto(&format!("{base}{path}")).await;
        let png = browser.screenshot(1280, 800).await;
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
        assert_eq!(browser.count("form").await, 0, "{page}: no forms");
        assert_eq!(browser.count("button").await, 0, "{page}: no buttons");
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
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(service.metrics.count(Outcome::Parked), 1, "never replayed");
    env.eventually(WAIT, "still parked, not purged", || async {
        env.parked_count().await == 1
    })
    .await;
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

/// The `csrf` value in a page's forms.
fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no csrf field in {page}"));
    let rest = &page[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_owned()
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
    // A replay would have parked it again (the order is still unknown).
    tokio::time::sleep(Duration::from_millis(500)).await;
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
    let confirmed = format!("key={key}&csrf={csrf}&confirm=yes");
    let (status, head, _) =
        request(addr, "POST", "/console/parked/purge", &session, &confirmed).await;
    assert_eq!(status, 303, "{head}");
    assert!(head.contains("deleted=1&kept=0"), "{head}");
    assert_eq!(env.parked_count().await, 0);
}
