//! The HTTP side under hostile traffic (issue 46): what a login costs the
//! guesser, what a weak `ADMIN_TOKEN` does at start-up, what a logout
//! ends, when the cookie is `Secure`, what a half-sent request, a flood of
//! slow connections or a flood of console requests get, which host names
//! are served, and that page views and probes do not turn into database
//! pings. Each against a running service over plain TCP, the way an
//! attacker's client talks.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use order_timeout::RunningService;
use order_timeout::settings::{AdminToken, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{TestEnv, csrf_of, http_get};

const TOKEN: &str = "hostile-test-token-0123456789";
const WAIT: Duration = Duration::from_secs(20);

async fn service(env: &TestEnv, change: impl FnOnce(&mut Settings)) -> RunningService {
    let mut settings = env.settings.clone();
    settings.admin_token = Some(AdminToken::parse(TOKEN).unwrap());
    change(&mut settings);
    let service = env.service_with(settings).await;
    env.eventually(WAIT, "the HTTP side answers", || async {
        http_get(service.http_addr, "/healthz").await.0 == 200
    })
    .await;
    service
}

use crate::common::http_send as send;

/// [`send`] with the address as the host.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    send(addr, &addr.to_string(), method, path, headers, body).await
}

/// The `Set-Cookie` line of a response head, if any.
fn set_cookie(head: &str) -> Option<&str> {
    head.lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .map(|l| l["set-cookie:".len()..].trim())
}

/// Logs in (the right token, with `headers`); the response head.
async fn log_in(addr: SocketAddr, headers: &[(&str, &str)]) -> String {
    let (status, head, _) = request(
        addr,
        "POST",
        "/console/login",
        headers,
        &format!("token={TOKEN}"),
    )
    .await;
    assert_eq!(status, 303, "{head}");
    head
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_wrong_logins_are_bounded_per_client_and_bodies_capped() {
    let env = TestEnv::new().await;
    let service = service(&env, |_| {}).await;
    let addr = service.http_addr;
    let started = Instant::now();
    let tries: Vec<_> = (0..60)
        .map(|i| {
            tokio::spawn(async move {
                request(
                    addr,
                    "POST",
                    "/console/login",
                    &[],
                    &format!("token=guess-{i:04}-0123456789abcdef"),
                )
                .await
                .0
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tries {
        statuses.push(t.await.unwrap());
    }
    let evaluated = statuses.iter().filter(|s| **s == 403).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    // Five a minute per client (`[http] login_per_minute`): 60 parallel
    // guesses within a few seconds get at most a few compared.
    assert!(
        evaluated <= 6,
        "{evaluated} of 60 guesses compared in {:?}: {statuses:?}",
        started.elapsed()
    );
    assert_eq!(evaluated + limited, 60, "{statuses:?}");
    // A login form of 2 MB is refused before it is read.
    let big = format!("token={}", "x".repeat(2 << 20));
    assert_eq!(
        request(addr, "POST", "/console/login", &[], &big).await.0,
        413
    );
    // Nor is any console form of 1 MB (below axum's own 2 MB default).
    let form = format!("only={}", "x".repeat(1 << 20));
    let (status, _, _) = request(addr, "POST", "/console/parked/replay", &[], &form).await;
    assert_eq!(status, 413);
    // Refused by the login limits, or by the console's own rate first.
    let refused =
        service.metrics.http_refused_of("login_limited") + service.metrics.http_refused_of("rate");
    assert!(refused >= 54, "{refused}");
    service.stop().await.unwrap();
}

/// Runs `serve` with `ADMIN_TOKEN=token` (and nothing reachable): exit
/// code and standard error, or `None` if it was still running after 15 s.
fn serve_with_token(env: &TestEnv, token: &str) -> Option<(Option<i32>, String)> {
    let mut child = env
        .command()
        .arg("serve")
        .env("ADMIN_TOKEN", token)
        .env("HTTP_ADDR", "127.0.0.1:0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(15) {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            return Some((status.code(), stderr));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weak_admin_token_stops_the_service_at_start_up() {
    let env = TestEnv::new().await;
    for weak in ["aaaaaaaaaaaaaaaa", "                ", "abababababababab"] {
        let (code, stderr) =
            serve_with_token(&env, weak).unwrap_or_else(|| panic!("{weak:?}: the service started"));
        assert_ne!(code, Some(0), "{weak:?}: {stderr}");
        assert!(stderr.contains("ADMIN_TOKEN"), "{weak:?}: {stderr}");
        assert!(
            !stderr.contains(weak.trim()) || weak.trim().is_empty(),
            "the token is not shown: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logout_revokes_the_session_and_its_csrf_token_on_every_replica() {
    let env = TestEnv::new().await;
    // Two replicas behind one address, on the same database.
    let replica = service(&env, |_| {}).await;
    let service = service(&env, |_| {}).await;
    let addr = service.http_addr;
    let head = log_in(addr, &[]).await;
    let cookie = set_cookie(&head)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let session = [("Cookie", cookie.as_str())];
    let (_, _, page) = request(addr, "GET", "/console", &session, "").await;
    let csrf = csrf_of(&page);
    let logout = format!("csrf={csrf}");
    let (_, _, page) = request(replica.http_addr, "GET", "/console", &session, "").await;
    assert!(
        page.contains("name=\"csrf\""),
        "the other replica takes the session: {page}"
    );
    let (status, _, _) = request(addr, "POST", "/console/logout", &session, &logout).await;
    assert_eq!(status, 303);
    // The old cookie and CSRF token, replayed: nothing.
    let (status, _, page) = request(addr, "POST", "/console/logout", &session, &logout).await;
    assert_eq!(status, 403, "the session still works after logout: {page}");
    assert!(page.contains("log in with ADMIN_TOKEN first"), "{page}");
    let (_, _, page) = request(addr, "GET", "/console", &session, "").await;
    assert!(!page.contains("name=\"csrf\""), "no write forms: {page}");
    assert!(page.contains("Log in"), "{page}");
    // Nor on the other replica, once it has read the logouts (every 2 s).
    let other = replica.http_addr;
    // (Read-only probes: a logout sent there would revoke it there.)
    env.eventually(
        Duration::from_secs(10),
        "the other replica refuses it",
        || async {
            let (_, _, page) = request(other, "GET", "/console", &session, "").await;
            !page.contains("name=\"csrf\"") && page.contains("Log in")
        },
    )
    .await;
    replica.stop().await.unwrap();
    // A new login works.
    let head = log_in(addr, &[]).await;
    let fresh = set_cookie(&head)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    assert_ne!(fresh, cookie);
    let (_, _, page) = request(addr, "GET", "/console", &[("Cookie", &fresh)], "").await;
    assert!(page.contains("name=\"csrf\""), "{page}");
    service.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cookie_is_secure_when_a_trusted_proxy_says_https() {
    let env = TestEnv::new().await;
    let proxied = service(&env, |s| {
        s.http.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    })
    .await;
    let https = [("X-Forwarded-Proto", "https")];
    let head = log_in(proxied.http_addr, &https).await;
    let cookie = set_cookie(&head).unwrap();
    assert!(cookie.contains("; Secure"), "{cookie}");
    let head = log_in(proxied.http_addr, &[]).await;
    assert!(!set_cookie(&head).unwrap().contains("Secure"), "plain HTTP");
    proxied.stop().await.unwrap();

    // The same header from a client nobody named a proxy: not believed.
    let direct = service(&env, |_| {}).await;
    let head = log_in(direct.http_addr, &https).await;
    assert!(!set_cookie(&head).unwrap().contains("Secure"), "{head}");
    direct.stop().await.unwrap();
}

/// Whether the server closed `stream` within `within` (EOF or a reset),
/// after perhaps an error response.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_request_and_an_idle_connection_are_closed_after_the_header_timeout() {
    let env = TestEnv::new().await;
    let service = service(&env, |s| {
        s.http.header_read_timeout = Duration::from_secs(1);
    })
    .await;
    let addr = service.http_addr;
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(format!("GET /console HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ").as_bytes())
        .await
        .unwrap();
    let started = Instant::now();
    assert!(
        closed_within(&mut half, Duration::from_secs(5)).await,
        "still open"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // Connected, nothing sent.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_within(&mut idle, Duration::from_secs(5)).await,
        "idle still open"
    );
    service.stop().await.unwrap();
}

/// `n` connections that send half a request and hold.
async fn slow_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /console HTTP/1.1\r\nX-Slow: ")
            .await
            .unwrap();
        held.push(s);
    }
    // Let the server accept them all.
    tokio::time::sleep(Duration::from_millis(500)).await;
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_slow_connections_hold_every_console_slot() {
    let env = TestEnv::new().await;
    let service = service(&env, |s| {
        s.http.max_connections = 20;
        s.http.header_read_timeout = Duration::from_secs(60);
    })
    .await;
    let addr = service.http_addr;
    let mut held = slow_connections(addr, 30).await;
    // 20 hold the slots, 10 hold health-only spares, once the server has
    // accepted them all (a loaded machine takes its time): until then a
    // console request takes a free slot and is answered.
    env.eventually(WAIT, "every slot held", || async {
        http_get(addr, "/console").await.0 == 503
    })
    .await;
    // Probes still answer.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let started = Instant::now();
        let (status, _) = http_get(addr, path).await;
        assert!(matches!(status, 200 | 503), "{path}: {status}");
        assert!(started.elapsed() < Duration::from_secs(2), "{path}");
    }
    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    let (status, body) = http_get(addr, "/console").await;
    assert_eq!(status, 503, "a spare connection serves probes only: {body}");
    // Past the spares, a connection is closed at once: the flood cannot
    // grow to the file limit.
    held.extend(slow_connections(addr, 40).await);
    let mut last = held.pop().unwrap();
    assert!(
        closed_within(&mut last, Duration::from_secs(2)).await,
        "over the cap, still open"
    );
    assert!(service.metrics.http_refused_of("connections") > 0);
    drop(held);
    env.eventually(WAIT, "the console answers again", || async {
        http_get(addr, "/console").await.0 == 200
    })
    .await;
    service.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_requests_past_the_concurrency_limit_are_refused_at_once() {
    let env = TestEnv::new().await;
    let service = service(&env, |s| {
        s.http.console_concurrency = 1;
        // Long enough for a loaded machine's polls to see the slot held
        // (with 2 s, all of them missed it while clusters booted beside).
        s.http.request_timeout = Duration::from_secs(8);
    })
    .await;
    let addr = service.http_addr;
    // A login whose body never comes holds the one console slot.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(
        format!(
            "POST /console/login HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken="
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    env.eventually(WAIT, "the slow login holding the slot", || async {
        http_get(addr, "/console").await.0 == 503
    })
    .await;
    let started = Instant::now();
    let (status, _) = http_get(addr, "/console").await;
    assert_eq!(status, 503, "busy");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(
        http_get(addr, "/healthz").await.0,
        200,
        "probes are not limited"
    );
    // The slow one is answered at the request timeout, and frees its slot.
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut raw)).await;
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 503"), "{raw}");
    assert_eq!(http_get(addr, "/console").await.0, 200);
    assert!(service.metrics.http_refused_of("busy") >= 1);
    assert!(service.metrics.http_refused_of("timeout") >= 1);
    service.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_loopback_ip_literals_and_configured_host_names_are_served() {
    let env = TestEnv::new().await;
    let service = service(&env, |s| s.http.hosts = vec!["console.internal".into()]).await;
    let addr = service.http_addr;
    let port = addr.port();
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("console.internal:{port}"),
    ] {
        let (status, _, _) = send(addr, &host, "GET", "/console", &[], "").await;
        assert_eq!(status, 200, "{host}");
    }
    // A DNS-rebinding page names its own host.
    let evil = format!("rebind.evil.example:{port}");
    for path in [
        "/console",
        "/console/parked",
        "/console/pending",
        "/console/login",
    ] {
        let (status, _, body) = send(addr, &evil, "GET", path, &[], "").await;
        assert_eq!(status, 421, "{path}: {body}");
    }
    let (status, _, _) = send(
        addr,
        &evil,
        "POST",
        "/console/login",
        &[],
        &format!("token={TOKEN}"),
    )
    .await;
    assert_eq!(status, 421);
    // Probes answer whatever the host (a kubelet names the pod's address).
    let (status, _, _) = send(addr, &evil, "GET", "/healthz", &[], "").await;
    assert_eq!(status, 200);
    // A form posted from another origin to an allowed host: refused.
    let (status, _, _) = request(
        addr,
        "POST",
        "/console/login",
        &[("Origin", &format!("http://rebind.evil.example:{port}"))],
        &format!("token={TOKEN}"),
    )
    .await;
    assert_eq!(status, 403);
    assert!(service.metrics.http_refused_of("host") >= 5);
    service.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_views_and_probes_do_not_ping_the_database_each() {
    let env = TestEnv::new().await;
    let service = service(&env, |_| {}).await;
    let addr = service.http_addr;
    env.eventually(WAIT, "ready", || async {
        http_get(addr, "/readyz").await.0 == 200
    })
    .await;
    let probes = service.metrics.readiness_probes_total();
    let overviews = service.metrics.console_overviews_total();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let path = if i % 2 == 0 { "/readyz" } else { "/console" };
        tasks.push(tokio::spawn(async move { http_get(addr, path).await.0 }));
    }
    for t in tasks {
        assert!(matches!(t.await.unwrap(), 200 | 429 | 503));
    }
    let secs = started.elapsed().as_secs_f64();
    let probed = service.metrics.readiness_probes_total() - probes;
    let computed = service.metrics.console_overviews_total() - overviews;
    // One probe per second at most, plus the refresher's every 5 s.
    assert!(
        (probed as f64) <= secs + 2.0,
        "{probed} probes for 100 /readyz and 100 overviews in {secs:.1} s"
    );
    assert!(
        (computed as f64) <= secs / 2.0 + 1.0,
        "{computed} overviews computed for 100 views in {secs:.1} s"
    );
    service.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_console_requests_from_one_address_is_cut_to_its_rate() {
    let env = TestEnv::new().await;
    let service = service(&env, |s| s.http.console_per_second = 5).await;
    let addr = service.http_addr;
    let tasks: Vec<_> = (0..40)
        .map(|_| tokio::spawn(async move { http_get(addr, "/console/pending").await.0 }))
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let served = statuses.iter().filter(|s| **s == 200).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    // Ten at once (twice the rate), a few more as the seconds pass.
    assert!(served <= 14, "{served} of 40 served: {statuses:?}");
    assert!(limited >= 26, "{statuses:?}");
    assert_eq!(
        http_get(addr, "/healthz").await.0,
        200,
        "probes are not limited"
    );
    assert_eq!(http_get(addr, "/metrics").await.0, 200);
    assert!(service.metrics.http_refused_of("rate") >= 26);
    service.stop().await.unwrap();
}
