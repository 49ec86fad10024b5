//! The binary as operators run it: `serve` stopped with SIGTERM mid-stream,
//! and what its logs may (not) contain.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use order_timeout_tools::scratch;

use crate::bounds::KillOnDrop;
use crate::common::{STOCK, TestEnv};

/// `order-timeout serve` on the test's world, logging to `log`.
fn serve(
    env: &TestEnv,
    amqp_url: &str,
    database_url: &str,
    log: &Path,
    extra: &[(&str, &str)],
) -> KillOnDrop {
    let file = std::fs::File::create(log).expect("log file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_order-timeout"));
    cmd.arg("serve")
        .env("AMQP_URL", amqp_url)
        .env("DATABASE_URL", database_url)
        .env("INVENTORY_URL", env.settings.inventory_url.expose())
        .env("HTTP_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "info")
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    KillOnDrop(cmd.spawn().expect("start order-timeout serve"))
}

fn signal(child: &KillOnDrop, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.0.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

/// Waits up to `timeout` for the process to exit.
async fn wait_exit(child: &mut KillOnDrop, timeout: Duration) -> std::process::ExitStatus {
    let end = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            return status;
        }
        if tokio::time::Instant::now() > end {
            child.kill();
            panic!("the process did not exit within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn temp_log(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{name}-{}.log", uuid::Uuid::new_v4().simple()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_work_and_a_restart_loses_nothing() {
    let _turn = crate::common::restart_turn().await;
    let env = TestEnv::new().await;
    env.stock_skus(5).await;
    let log = temp_log("sigterm");
    let mut first = serve(
        &env,
        env.settings.amqp_url.expose(),
        env.settings.database_url.expose(),
        &log,
        &[],
    );
    // 300 orders due over 1.5–6 s: the signal lands mid-stream, with
    // messages held in-process and releases in flight.
    let n: i64 = 300;
    for i in 0..n {
        let order = env
            .create_order(
                &format!("term-{i:03}"),
                Duration::from_millis(1500 + (i as u64 * 15)),
                &[(i as usize % 5, 1 + (i % 3))],
            )
            .await;
        env.publish_timeout(&order).await;
    }
    env.eventually(Duration::from_secs(20), "some orders cancelled", || async {
        env.count("term-", "CANCELLED").await >= 60
    })
    .await;
    signal(&first, "-TERM");
    let status = wait_exit(&mut first, Duration::from_secs(30)).await;
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(
        status.success(),
        "clean exit on SIGTERM: {status:?}\n{logs}"
    );
    assert!(logs.contains("shutdown signal received"), "{logs}");
    assert!(logs.contains("stopped"), "{logs}");
    let at_stop = env.count("term-", "CANCELLED").await;
    assert!(
        at_stop < n,
        "the signal should land mid-stream ({at_stop}/{n})"
    );
    // Whatever it started, it finished: no cancellation is left with its
    // release pending or leased.
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM order_timeout_cancel_outbox WHERE stock_released_at IS NULL OR event_published_at IS NULL",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(pending, 0, "in-flight releases finished before exit");

    let log2 = temp_log("sigterm-restart");
    let mut second = serve(
        &env,
        env.settings.amqp_url.expose(),
        env.settings.database_url.expose(),
        &log2,
        &[],
    );
    env.eventually(Duration::from_secs(30), "every order cancelled", || async {
        env.count("term-", "CANCELLED").await == n
    })
    .await;
    // No lease from the first process is left to expire: this is quick.
    env.wait_outbox_done(Duration::from_secs(10)).await;
    signal(&second, "-TERM");
    assert!(
        wait_exit(&mut second, Duration::from_secs(30))
            .await
            .success()
    );
    let early: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE cancelled_at < expires_at")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(early, 0);
    let repeated: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inventory.releases WHERE calls <> 1")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(
        repeated, 0,
        "no release was called twice across the restart"
    );
    env.assert_stock_exact(5).await;
    for n in 0..5 {
        assert_eq!(env.stock(n).await, STOCK);
    }
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&log2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_appear_in_logs() {
    let _turn = crate::common::restart_turn().await;
    let env = TestEnv::new().await;
    env.stock_skus(1).await;
    // A broker user of our own with a password we can look for.
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let user = format!("ot_user_{}", &suffix[..8]);
    let amqp_secret = format!("AmqpS3cret{suffix}");
    let db_secret = format!("DbS3cret{suffix}");
    let run = |args: &[&str]| {
        scratch::rabbitmqctl(args).unwrap_or_else(|e| panic!("{e}"));
    };
    run(&["add_user", &user, &amqp_secret]);
    run(&["set_permissions", "-p", &env.name, &user, ".*", ".*", ".*"]);
    struct DeleteUser(String);
    impl Drop for DeleteUser {
        fn drop(&mut self) {
            let _ = scratch::rabbitmqctl(&["delete_user", &self.0]);
        }
    }
    let _cleanup = DeleteUser(user.clone());

    let with_password = |url: &str, user: &str, password: &str| {
        let mut url = url::Url::parse(url).unwrap();
        url.set_username(user).unwrap();
        url.set_password(Some(password)).unwrap();
        url.to_string()
    };
    let amqp_ok = with_password(env.settings.amqp_url.expose(), &user, &amqp_secret);
    let wrong_secret = format!("Wr0ngS3cret{suffix}");
    let amqp_wrong = with_password(env.settings.amqp_url.expose(), &user, &wrong_secret);
    // Trust authentication accepts any password, so the service connects.
    let db = with_password(env.settings.database_url.expose(), "postgres", &db_secret);
    let debug = [("RUST_LOG", "debug")];

    // 1. Wrong broker password: the service keeps retrying and logs why.
    let log_wrong = temp_log("secrets-wrong");
    let mut child = serve(&env, &amqp_wrong, &db, &log_wrong, &debug);
    env.eventually(
        Duration::from_secs(60),
        "the refused login logged, with the URL redacted",
        || async {
            let log = std::fs::read_to_string(&log_wrong).unwrap_or_default();
            log.contains("reconnecting") && log.contains(":***@")
        },
    )
    .await;
    signal(&child, "-TERM");
    wait_exit(&mut child, Duration::from_secs(20)).await;

    // 2. Right password, JSON logs, one order processed end to end.
    let log_ok = temp_log("secrets-ok");
    let mut child = serve(
        &env,
        &amqp_ok,
        &db,
        &log_ok,
        &[("RUST_LOG", "debug"), ("LOG_FORMAT", "json")],
    );
    let order = env
        .create_order("secret-order-1", Duration::from_millis(1500), &[(0, 1)])
        .await;
    env.publish_timeout(&order).await;
    let (status, _, _) = env
        .wait_settled("secret-order-1", Duration::from_secs(20))
        .await;
    assert_eq!(status, "CANCELLED");
    env.wait_outbox_done(Duration::from_secs(10)).await;
    signal(&child, "-TERM");
    assert!(
        wait_exit(&mut child, Duration::from_secs(20))
            .await
            .success()
    );

    // 3. The other commands that take URLs.
    let log_cmds = temp_log("secrets-cmds");
    let out = crate::bounds::output_within(
        Command::new(env!("CARGO_BIN_EXE_order-timeout"))
            .args(["schedule", "--order-id", "secret-order-2", "--in", "1h"])
            .env("AMQP_URL", &amqp_wrong)
            .env("RUST_LOG", "debug"),
        Duration::from_secs(120),
        "order-timeout schedule with a wrong password",
    );
    assert!(!out.status.success(), "a wrong password fails the command");
    let migrate = crate::bounds::output_within(
        Command::new(env!("CARGO_BIN_EXE_order-timeout"))
            .arg("migrate")
            .env("DATABASE_URL", &db)
            .env("RUST_LOG", "debug"),
        Duration::from_secs(120),
        "order-timeout migrate",
    );
    assert!(migrate.status.success(), "{migrate:?}");
    std::fs::write(
        &log_cmds,
        [out.stdout, out.stderr, migrate.stdout, migrate.stderr].concat(),
    )
    .unwrap();

    let wrong = std::fs::read_to_string(&log_wrong).unwrap();
    let ok = std::fs::read_to_string(&log_ok).unwrap();
    let cmds = std::fs::read_to_string(&log_cmds).unwrap();
    assert!(
        wrong.contains("reconnecting"),
        "the auth failure is logged:\n{wrong}"
    );
    assert!(
        wrong.contains(":***@"),
        "the URLs are logged, redacted (else this test proves nothing):\n{wrong}"
    );
    assert!(
        ok.lines()
            .any(|l| l.starts_with('{') && l.contains("secret-order-1")),
        "JSON log lines carry the order id:\n{ok}"
    );
    for (name, text) in [("wrong", &wrong), ("ok", &ok), ("commands", &cmds)] {
        for secret in [&amqp_secret, &db_secret, &wrong_secret] {
            assert!(
                !text.contains(secret.as_str()),
                "a password leaked into the {name} logs:\n{text}"
            );
        }
    }
    for log in [log_wrong, log_ok, log_cmds] {
        let _ = std::fs::remove_file(log);
    }
}

/// The resident memory of process `pid`, in bytes (`VmRSS`).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Four parked bodies of 25 MB (of `<`, which HTML escaping quadruples),
/// viewed by six readers at once on every parked page: each page stays
/// small and the service's memory grows by less than 64 MiB, far under the
/// 256 MiB limit of `deploy/kubernetes/deployment.yaml`. Before the parked
/// store, one view of the parked page held every whole body and escaped it
/// into one response (a 400 MB page, 959 MB resident).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_pages_take_bounded_memory_whatever_the_bodies() {
    const BODY: usize = 25 * 1024 * 1024;
    const GROWTH: u64 = 64 * 1024 * 1024;
    let env = TestEnv::new().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let log = temp_log("parked-memory");
    // Bodies shown to every visitor, the heaviest pages there are, and no
    // per-address rate: all six readers come from one address.
    let config = std::env::temp_dir().join(format!(
        "parked-memory-{}.toml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &config,
        "[http]\npublic_bodies = true\nconsole_per_second = 100000\n",
    )
    .unwrap();
    let mut child = serve(
        &env,
        env.settings.amqp_url.expose(),
        env.settings.database_url.expose(),
        &log,
        &[
            ("HTTP_ADDR", &addr.to_string()),
            ("ORDER_TIMEOUT_CONFIG", config.to_str().unwrap()),
        ],
    );
    let pid = child.0.id();
    let body = vec![b'<'; BODY];
    for _ in 0..4 {
        env.publish_raw(&body).await;
    }
    drop(body);
    env.eventually(
        Duration::from_secs(60),
        "four too_large bodies kept",
        || async { env.parked_kept().await == 4 },
    )
    .await;
    let ids: Vec<i64> = env
        .parked_listing()
        .await
        .messages
        .iter()
        .filter_map(|m| m.id)
        .collect();
    let pages: Vec<String> = std::iter::once("/console/parked?limit=200".to_owned())
        .chain(ids.iter().map(|id| format!("/console/parked/{id}")))
        .chain(ids.iter().map(|id| format!("/console/parked/{id}/body")))
        .collect();
    // Settle after the large deliveries, then measure from here.
    for page in &pages {
        let (status, _) = crate::common::http_get(addr, page).await;
        assert_eq!(status, 200, "{page}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss(pid);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampling = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let readers = (0..6).map(|_| {
        let pages = pages.clone();
        tokio::spawn(async move {
            let mut largest = 0;
            for _ in 0..5 {
                for page in &pages {
                    let (status, text) = crate::common::http_get(addr, page).await;
                    assert!(status == 200 || status == 503, "{page}: {status}");
                    if !page.ends_with("/body") {
                        largest = largest.max(text.len());
                    }
                }
            }
            largest
        })
    });
    let largest = futures_util::future::join_all(readers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .max()
        .unwrap();
    sampling.abort();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "rss before {} MiB, peak {} MiB; largest page {} KiB",
        before >> 20,
        peak >> 20,
        largest >> 10
    );
    assert!(largest < 1024 * 1024, "a page under 1 MiB: {largest} bytes");
    assert!(
        peak.saturating_sub(before) < GROWTH,
        "memory grew by {} MiB (before {} MiB, peak {} MiB)",
        (peak - before) >> 20,
        before >> 20,
        peak >> 20
    );
    assert!(peak < 256 * 1024 * 1024, "peak {} MiB", peak >> 20);
    signal(&child, "-TERM");
    wait_exit(&mut child, Duration::from_secs(30)).await;
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&config);
}
