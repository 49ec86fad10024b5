//! The publishers in `clients/`, one per language the shops write their
//! order service in (Java, PHP, Go, Node.js, Python), each run as a
//! subprocess against the real broker and a running service, as an order
//! service would run it right after its INSERT commits.
//!
//! Each test publishes, with that language's publisher: an unpaid order
//! (`ID@CANCEL_AT`), one paid before its deadline (`ID+TIMEOUT_MS`), one
//! whose row's deadline is extended after the publish, one published twice
//! (`ID@CANCEL_AT` and a bare `ID`), one through the lane's routing key
//! (`--lane 4`), and one to a routing key nothing is bound to, which the
//! publisher must report as failed after its bounded retries; then checks
//! that every message is persistent JSON of the contract's forms (a tap
//! queue bound beside the service's), and that the orders end as the
//! contract says: never early, the paid one untouched, the extended one not
//! before its new deadline, the duplicate cancelled once (one release, one
//! event), and the one whose publish failed cancelled anyway, by the
//! sweeper. A publisher that loses a message fails the test: the messages'
//! cancellations are counted apart from the sweeper's.
//!
//! What each needs is installed by `scripts/ensure-services.sh --publishers`
//! (`scripts/test.sh` runs it): Debian's JDK, `librabbitmq-client-java`,
//! `php-cli`, `php-amqplib`, `golang-go`,
//! `golang-github-rabbitmq-amqp091-go-dev`, `python3-pika`, and `amqplib`
//! from npm in `clients/node`. Run outside `scripts/test.sh` and CI, a test
//! whose language is missing says which package and passes; with `CI` or
//! `ORDER_TIMEOUT_REQUIRE_PUBLISHERS=1` set (`scripts/test.sh` sets it) it
//! fails instead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::options::{BasicGetOptions, QueueBindOptions};
use lapin::types::FieldTable;
use order_timeout::message::format_instant;
use order_timeout::settings::Lane;
use order_timeout::testing::metrics::Outcome;
use order_timeout::testing::topology::{ENTRY_EXCHANGE, SCHEDULE_ROUTING_KEY, lane_entry_key};
use order_timeout_tools::shop;
use serde_json::Value;

use crate::common::{TestEnv, exclusive_queue, ready};

/// The lane the service runs in these tests: every order of a 4 s window.
const LANE_SECS: u64 = 4;
/// The payment window of the orders published with `schedule`.
const WINDOW: Duration = Duration::from_secs(5);
/// How far the extended order's row deadline moves after its publish.
const EXTENSION: chrono::Duration = chrono::Duration::seconds(3);
/// Catch-up sweeps take orders overdue by more than this: the order whose
/// publish failed is cancelled this long after its deadline, and a message
/// later than this would be counted as swept (and fail the test).
const SWEEP_GRACE: Duration = Duration::from_secs(2);
/// Generous bound on lateness (the benchmarks measure the real figure).
const LATE_OK: chrono::Duration = chrono::Duration::milliseconds(1500);
/// Bound on building a publisher (compiling Java or Go).
const BUILD_LIMIT: Duration = Duration::from_secs(180);
/// Bound on one run of a publisher.
const RUN_LIMIT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);

/// The repository's root (where `clients/` is).
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether a missing language fails the test instead of skipping it.
fn required() -> bool {
    let set =
        |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    set("CI") || set("ORDER_TIMEOUT_REQUIRE_PUBLISHERS")
}

/// `name` on `PATH`, if there.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Runs `cmd` to its end within `limit`, or fails the test naming `what`
/// (the process is killed when the limit passes).
async fn step(what: &str, mut cmd: tokio::process::Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => panic!("{what}: {e}"),
        Err(_) => panic!("{what}: did not finish within {limit:?}; killed"),
    }
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A step that must succeed.
async fn build_step(what: &str, cmd: tokio::process::Command) {
    let out = step(what, cmd, BUILD_LIMIT).await;
    assert!(out.status.success(), "{what} failed: {}", text(&out));
}

/// How to run one language's publisher: a program and the arguments before
/// the publisher's own (`AMQP_URL [--lane SECONDS] SPEC...`).
struct Publisher {
    language: &'static str,
    program: PathBuf,
    prefix: Vec<String>,
}

impl Publisher {
    async fn run(&self, what: &str, args: &[String]) -> Output {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.prefix).args(args).current_dir(repo());
        step(
            &format!("the {} publisher, {what}", self.language),
            cmd,
            RUN_LIMIT,
        )
        .await
    }
}

/// A language's publisher, ready to run; or what is missing for it.
type Prepared = Result<Publisher, String>;

/// Where a test's build output goes (one directory per language).
fn build_dir(language: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("publishers")
        .join(language);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Fails, or skips with the message, when something is missing.
fn or_skip(prepared: Prepared) -> Option<Publisher> {
    match prepared {
        Ok(publisher) => Some(publisher),
        Err(missing) if required() => panic!(
            "{missing}; scripts/ensure-services.sh --publishers installs it (CI / ORDER_TIMEOUT_REQUIRE_PUBLISHERS is set, so this fails instead of skipping)"
        ),
        Err(missing) => {
            eprintln!(
                "SKIPPED: {missing}; install it with scripts/ensure-services.sh --publishers (scripts/test.sh does)"
            );
            None
        }
    }
}

const AMQP_CLIENT_JAR: &str = "/usr/share/java/amqp-client.jar";

async fn java() -> Prepared {
    let (Some(javac), Some(java)) = (on_path("javac"), on_path("java")) else {
        return Err("no javac/java (Debian package default-jdk-headless)".into());
    };
    if !Path::new(AMQP_CLIENT_JAR).exists() {
        return Err(format!(
            "no {AMQP_CLIENT_JAR} (Debian package librabbitmq-client-java)"
        ));
    }
    let out = build_dir("java");
    let mut cmd = tokio::process::Command::new(javac);
    cmd.arg("-d")
        .arg(&out)
        .args(["-cp", AMQP_CLIENT_JAR])
        .arg(repo().join("clients/java/OrderTimeoutPublisher.java"));
    build_step("javac clients/java/OrderTimeoutPublisher.java", cmd).await;
    // The client logs through SLF4J (Debian's libslf4j-java, its
    // dependency): the API and the no-op binding, quiet.
    let mut classpath = vec![out.display().to_string(), AMQP_CLIENT_JAR.to_owned()];
    for jar in ["slf4j-api.jar", "slf4j-nop.jar"] {
        let jar = Path::new("/usr/share/java").join(jar);
        if jar.exists() {
            classpath.push(jar.display().to_string());
        }
    }
    Ok(Publisher {
        language: "Java",
        program: java,
        prefix: vec![
            "-cp".into(),
            classpath.join(":"),
            "OrderTimeoutPublisher".into(),
        ],
    })
}

async fn php() -> Prepared {
    let Some(php) = on_path("php") else {
        return Err("no php (Debian package php-cli)".into());
    };
    let debian = Path::new("/usr/share/php/PhpAmqpLib/autoload.php");
    let composer = repo().join("clients/php/vendor/autoload.php");
    if !debian.exists() && !composer.exists() {
        return Err("no php-amqplib (Debian package php-amqplib)".into());
    }
    Ok(Publisher {
        language: "PHP",
        program: php,
        prefix: vec!["clients/php/OrderTimeoutPublisher.php".into()],
    })
}

/// Debian's amqp091-go source, a GOPATH tree.
const GOPATH: &str = "/usr/share/gocode";

async fn go() -> Prepared {
    let Some(go) = on_path("go") else {
        return Err("no go (Debian package golang-go)".into());
    };
    if !Path::new(GOPATH)
        .join("src/github.com/rabbitmq/amqp091-go")
        .exists()
    {
        return Err(
            "no amqp091-go in /usr/share/gocode (Debian package golang-github-rabbitmq-amqp091-go-dev)"
                .into(),
        );
    }
    let out = build_dir("go");
    let mut cmd = tokio::process::Command::new(go);
    // Offline, against Debian's package: GOPATH mode (a shop builds the
    // same files as a module, with clients/go/go.mod).
    cmd.args(["build", "-o"])
        .arg(out.join("publisher"))
        .arg(".")
        .current_dir(repo().join("clients/go"))
        .env("GO111MODULE", "off")
        .env("GOPATH", GOPATH)
        .env("GOFLAGS", "")
        .env("GOCACHE", out.join("cache"));
    build_step("go build clients/go", cmd).await;
    Ok(Publisher {
        language: "Go",
        program: out.join("publisher"),
        prefix: Vec::new(),
    })
}

async fn node() -> Prepared {
    let Some(node) = on_path("node") else {
        return Err("no node (Debian package nodejs)".into());
    };
    if !repo()
        .join("clients/node/node_modules/amqplib/package.json")
        .exists()
    {
        return Err("no amqplib in clients/node/node_modules (npm ci in clients/node)".into());
    }
    Ok(Publisher {
        language: "Node.js",
        program: node,
        prefix: vec!["clients/node/publish.js".into()],
    })
}

async fn python() -> Prepared {
    // Debian's python3-pika is for Debian's python3; a python3 first on PATH
    // (pyenv, a virtualenv) may have pika from PyPI instead.
    let mut candidates: Vec<PathBuf> = std::env::var_os("PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend(on_path("python3"));
    candidates.push("/usr/bin/python3".into());
    for python in candidates.into_iter().filter(|p| p.exists()) {
        let mut cmd = tokio::process::Command::new(&python);
        cmd.args(["-c", "import pika"]);
        if step("python3 -c 'import pika'", cmd, RUN_LIMIT)
            .await
            .status
            .success()
        {
            return Ok(Publisher {
                language: "Python",
                program: python,
                prefix: vec!["clients/python/order_timeout_publisher.py".into()],
            });
        }
    }
    Err("no python3 with pika (Debian package python3-pika, or pip install pika)".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_java_publisher_keeps_the_contract() {
    if let Some(publisher) = or_skip(java().await) {
        keeps_the_contract(publisher).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_php_publisher_keeps_the_contract() {
    if let Some(publisher) = or_skip(php().await) {
        keeps_the_contract(publisher).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_publisher_keeps_the_contract() {
    if let Some(publisher) = or_skip(go().await) {
        keeps_the_contract(publisher).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_publisher_keeps_the_contract() {
    if let Some(publisher) = or_skip(node().await) {
        keeps_the_contract(publisher).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_publisher_keeps_the_contract() {
    if let Some(publisher) = or_skip(python().await) {
        keeps_the_contract(publisher).await;
    }
}

/// An exclusive queue bound to the entry exchange beside the service's due
/// queue, with the plain and the lane routing keys: a copy of every message
/// the publisher got routed, to look at.
async fn tap(env: &TestEnv, lane: Lane) -> (lapin::Channel, String) {
    let channel = env.amqp.create_channel().await.unwrap();
    let queue = exclusive_queue(&channel).await;
    for key in [SCHEDULE_ROUTING_KEY.to_owned(), lane_entry_key(lane)] {
        channel
            .queue_bind(
                queue.name().clone(),
                ENTRY_EXCHANGE.into(),
                key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    (channel, queue.name().to_string())
}

/// One message the tap saw.
#[derive(Debug)]
struct Tapped {
    routing_key: String,
    delivery_mode: Option<u8>,
    content_type: Option<String>,
    body: Value,
}

/// Takes the `n` messages the tap should hold, waiting for them a while.
async fn tapped((channel, queue): &(lapin::Channel, String), n: usize) -> Vec<Tapped> {
    let mut got = Vec::new();
    let end = tokio::time::Instant::now() + WAIT;
    while got.len() < n && tokio::time::Instant::now() < end {
        let Some(msg) = channel
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let body = serde_json::from_slice(&msg.delivery.data).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}",
                String::from_utf8_lossy(&msg.delivery.data)
            )
        });
        got.push(Tapped {
            routing_key: msg.delivery.routing_key.to_string(),
            delivery_mode: *msg.delivery.properties.delivery_mode(),
            content_type: msg
                .delivery
                .properties
                .content_type()
                .as_ref()
                .map(|c| c.to_string()),
            body,
        });
    }
    // Nothing more than expected either.
    tokio::time::sleep(Duration::from_millis(200)).await;
    if let Some(msg) = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        panic!(
            "an unexpected message: {}",
            String::from_utf8_lossy(&msg.delivery.data)
        );
    }
    assert_eq!(got.len(), n, "{got:#?}");
    got
}

/// The instant in a body's field.
fn instant(body: &Value, field: &str) -> DateTime<Utc> {
    let text = body[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field} in {body}"));
    DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("{field} {text:?} is not RFC 3339: {e}"))
        .with_timezone(&Utc)
}

/// Checks the messages' properties and body forms.
fn check_messages(
    language: &str,
    messages: &[Tapped],
    deadlines: &HashMap<&str, DateTime<Utc>>,
    lane: Lane,
) {
    let mut dup_forms = Vec::new();
    for m in messages {
        assert_eq!(m.delivery_mode, Some(2), "{language}: persistent: {m:?}");
        assert_eq!(
            m.content_type.as_deref(),
            Some("application/json"),
            "{language}: {m:?}"
        );
        let id = m.body["order_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{language}: no string order_id: {m:?}"));
        let keys: Vec<&str> = m
            .body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let expected_key = if id == "lane-1" {
            lane_entry_key(lane)
        } else {
            SCHEDULE_ROUTING_KEY.to_owned()
        };
        assert_eq!(m.routing_key, expected_key, "{language}: {m:?}");
        match id {
            "unpaid-1" | "extended-1" => {
                assert_eq!(keys.len(), 2, "{language}: {m:?}");
                // The wire has milliseconds, as the test gave them.
                let given = DateTime::parse_from_rfc3339(&format_instant(deadlines[id])).unwrap();
                assert_eq!(instant(&m.body, "cancel_at"), given, "{language}: {m:?}");
            }
            "paid-1" => {
                assert_eq!(keys.len(), 3, "{language}: {m:?}");
                assert_eq!(
                    m.body["timeout_ms"].as_u64(),
                    Some(WINDOW.as_millis() as u64),
                    "{language}: {m:?}"
                );
                let created_at = instant(&m.body, "created_at");
                let lag =
                    created_at - (deadlines[id] - chrono::Duration::from_std(WINDOW).unwrap());
                assert!(
                    lag >= chrono::Duration::zero() && lag < chrono::Duration::seconds(30),
                    "{language}: created_at is the time of the publish: {m:?}"
                );
            }
            "dup-1" => dup_forms.push(keys.len()),
            "lane-1" => assert_eq!(keys, ["order_id"], "{language}: a bare id: {m:?}"),
            other => panic!("{language}: unexpected order {other}: {m:?}"),
        }
    }
    dup_forms.sort_unstable();
    assert_eq!(
        dup_forms,
        [1, 2],
        "{language}: dup-1 with its deadline and as a bare id"
    );
}

/// The scenario of every language (module docs).
async fn keeps_the_contract(publisher: Publisher) {
    let language = publisher.language;
    let mut env = TestEnv::new().await;
    let lane = Lane::try_from(format!("{LANE_SECS}s")).unwrap();
    env.settings.lanes = vec![lane];
    env.settings.sweeper.catch_up_grace = SWEEP_GRACE;
    env.stock_skus(1).await;
    let mut events = env.subscribe_events().await;
    let service = env.service().await;
    // The lane's entry is bound once the service has declared its topology.
    env.eventually(WAIT, "the service ready", || ready(service.http_addr))
        .await;
    let tap = tap(&env, lane).await;
    let url = env.settings.amqp_url.expose().to_owned();

    let mut deadlines = HashMap::new();
    let mut spec = Vec::new();
    for (i, id) in ["unpaid-1", "paid-1", "extended-1", "dup-1"]
        .into_iter()
        .enumerate()
    {
        let order = env.create_order(id, WINDOW, &[(0, 1 + i as i64)]).await;
        deadlines.insert(id, order.expires_at);
        spec.push(if id == "paid-1" {
            format!("{id}+{}", WINDOW.as_millis())
        } else {
            format!("{id}@{}", format_instant(order.expires_at))
        });
    }
    spec.push("dup-1".into());
    let out = publisher
        .run(
            "four orders",
            &std::iter::once(url.clone()).chain(spec).collect::<Vec<_>>(),
        )
        .await;
    assert!(out.status.success(), "{language}: {}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for id in ["unpaid-1", "paid-1", "extended-1", "dup-1"] {
        assert!(
            stdout.contains(&format!("published {id}")),
            "{language}: {}",
            text(&out)
        );
    }

    // The customer pays one; the shop extends another's payment window.
    assert!(
        Utc::now() < deadlines["paid-1"] - chrono::Duration::milliseconds(300),
        "{language}: the publisher took longer than the orders' window; the test cannot pay in time"
    );
    assert!(shop::pay(&env.pool, "paid-1").await.unwrap());
    let extended_to = deadlines["extended-1"] + EXTENSION;
    sqlx::query("UPDATE orders SET expires_at = $1 WHERE id = 'extended-1'")
        .bind(extended_to)
        .execute(&env.pool)
        .await
        .unwrap();

    // The shop's one payment window, through the lane's routing key.
    let order = env
        .create_order("lane-1", Duration::from_secs(LANE_SECS), &[(0, 5)])
        .await;
    deadlines.insert("lane-1", order.expires_at);
    let out = publisher
        .run(
            "through the lane",
            &[
                url.clone(),
                "--lane".into(),
                LANE_SECS.to_string(),
                "lane-1".into(),
            ],
        )
        .await;
    assert!(out.status.success(), "{language}: {}", text(&out));

    // A routing key nothing is bound to: every attempt comes back
    // unroutable, the publisher gives up and says so; the order stands.
    let lost = env
        .create_order("lost-1", Duration::from_secs(1), &[(0, 6)])
        .await;
    let out = publisher
        .run(
            "to a key nothing is bound to",
            &[url.clone(), "--lane".into(), "9".into(), "lost-1".into()],
        )
        .await;
    assert_eq!(out.status.code(), Some(1), "{language}: {}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("FAILED lost-1"),
        "{language}: {}",
        text(&out)
    );
    let password = url::Url::parse(&url)
        .unwrap()
        .password()
        .unwrap_or("")
        .to_owned();
    let all = format!("{}{stderr}", String::from_utf8_lossy(&out.stdout));
    assert!(
        !all.contains(&url) && (password.is_empty() || !all.contains(&format!(":{password}@"))),
        "{language}: the output shows the URL or its password: {all}"
    );

    let messages = tapped(&tap, 6).await;
    check_messages(language, &messages, &deadlines, lane);

    for id in ["unpaid-1", "dup-1", "lane-1"] {
        let (status, expires_at, cancelled_at) = env.wait_settled(id, WAIT).await;
        assert_eq!(status, "CANCELLED", "{language}: {id}");
        let late = cancelled_at.unwrap() - expires_at;
        assert!(
            late >= chrono::Duration::zero() && late < LATE_OK,
            "{language}: {id} cancelled {late} after its deadline"
        );
    }
    let (status, expires_at, cancelled_at) = env.wait_settled("extended-1", WAIT).await;
    assert_eq!(status, "CANCELLED", "{language}");
    assert!((expires_at - extended_to).abs() < chrono::Duration::milliseconds(1));
    let late = cancelled_at.unwrap() - extended_to;
    assert!(
        late >= chrono::Duration::zero() && late < LATE_OK,
        "{language}: extended-1 cancelled {late} after its extended deadline"
    );
    let (status, _, cancelled_at) = env.wait_settled("lost-1", WAIT).await;
    assert_eq!(status, "CANCELLED", "{language}: the sweeper's");
    assert!(cancelled_at.unwrap() >= lost.expires_at);

    env.eventually(WAIT, "the paid order's message processed", || async {
        service.metrics.count(Outcome::AlreadyPaid) >= 1
    })
    .await;
    let (status, _, cancelled_at) = env.order_state("paid-1").await;
    assert_eq!(
        (status.as_str(), cancelled_at),
        ("PAID", None),
        "{language}"
    );
    assert_eq!(env.release_calls("paid-1").await, None);

    // Four cancelled by their messages, the lost one by the sweeper.
    env.acked_exactly(&service, Outcome::Cancelled, 4).await;
    assert_eq!(service.metrics.swept_total(), 1, "{language}");
    env.assert_stock_exact(1).await;
    assert_eq!(env.release_calls("dup-1").await, Some(1), "{language}");
    let got = TestEnv::read_events(&mut events, 6, Duration::from_secs(3)).await;
    let mut ids: Vec<&str> = got.iter().map(|e| e.order_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        ["dup-1", "extended-1", "lane-1", "lost-1", "unpaid-1"],
        "{language}: one event per cancelled order"
    );
    service.stop().await.unwrap();
}
