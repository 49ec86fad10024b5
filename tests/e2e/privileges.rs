//! Least privilege, as docs/permissions.md writes it: the test reads the
//! marked blocks of that file (RabbitMQ permissions, PostgreSQL and MySQL
//! grants), applies them to users of its own, and runs the real binary as
//! those users — `migrate` as the migrating user, `serve` and the operator
//! commands as the serving one, the order service and an events consumer
//! with theirs — on both dialects. Nothing runs as `guest`, `postgres` or
//! `root` but the shop's own part (its schema, its orders, its inventory).
//! A permission the code needs and the file lacks fails here.
//!
//! The users' names are unique per run ([`scratch::owned_name`]) and
//! removed afterwards, also when the test fails; a run killed before its
//! cleanup leaves them to the next run's sweep.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use order_timeout::broker::topology;
use order_timeout::settings::{self, SecretUrl};
use order_timeout::shutdown::Shutdown;
use order_timeout::store::OrderItem;
use order_timeout_tools::inventory::{ReferenceInventory, ShopInventory};
use order_timeout_tools::scratch;
use order_timeout_tools::shop::{self, NewOrder};
use sqlx::{Connection as _, Executor as _};

use crate::adopt::MallDb;
use crate::common::{http_get, ready};
use crate::store::mysql_base;

const PERMISSIONS_DOC: &str = include_str!("../../docs/permissions.md");

/// The fenced block after `<!-- tested: NAME -->` in docs/permissions.md.
fn doc_block(name: &str) -> &'static str {
    let marker = format!("<!-- tested: {name} -->");
    let after = PERMISSIONS_DOC
        .split_once(&marker)
        .unwrap_or_else(|| panic!("docs/permissions.md has no {marker}"))
        .1;
    let body = after
        .split_once("```")
        .and_then(|(_, rest)| rest.split_once('\n'))
        .map(|(_, rest)| rest)
        .expect("a fenced block after the marker");
    body.split_once("```").expect("the block ends").0
}

/// `text` with every whole-word `from` (not inside a longer name of
/// letters, digits, `_` or `-`) replaced by `to`.
fn replace_word(text: &str, from: &str, to: &str) -> String {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(from) {
        let before = rest[..i].chars().next_back();
        let after = rest[i + from.len()..].chars().next();
        out.push_str(&rest[..i]);
        if before.is_some_and(word) || after.is_some_and(word) {
            out.push_str(from);
        } else {
            out.push_str(to);
        }
        rest = &rest[i + from.len()..];
    }
    out.push_str(rest);
    out
}

/// The documented SQL, with the test's names and passwords, as statements.
fn doc_statements(block: &str, names: &[(&str, &str)]) -> Vec<String> {
    let mut sql: String = block
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for (from, to) in names {
        sql = replace_word(&sql, from, to);
    }
    sql.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The documented `rabbitmqctl set_permissions -p VHOST USER C W R` lines:
/// `(USER, [C, W, R])`, the patterns unquoted.
fn doc_rabbitmq_permissions() -> Vec<(String, [String; 3])> {
    doc_block("rabbitmq")
        .lines()
        .filter(|l| l.starts_with("rabbitmqctl set_permissions"))
        .map(|line| {
            let words = shell_words(line);
            let [_, _, _, _, user, c, w, r] = words.as_slice() else {
                panic!("unexpected line in docs/permissions.md: {line}");
            };
            (user.clone(), [c.clone(), w.clone(), r.clone()])
        })
        .collect()
}

/// Splits a shell line on spaces outside single quotes.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// A password for a test user.
fn password() -> String {
    format!("pw-{}", uuid::Uuid::new_v4().simple())
}

/// The value of the sample `series` (its full name and labels) in
/// Prometheus text, 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A vhost with the documented users: the service (`order-timeout`), the
/// order service (`order-service`) and an events consumer
/// (`notifications`), each with its documented permissions and a name of
/// this run. Removed (vhost and users) when dropped.
struct Broker {
    vhost: String,
    /// Documented user name → (this run's user, password).
    users: Vec<(String, String, String)>,
}

impl Broker {
    fn new() -> Self {
        let vhost = scratch::owned_name("ot_priv");
        let base = SecretUrl::new(
            std::env::var("AMQP_URL").unwrap_or_else(|_| settings::DEFAULT_AMQP_URL.into()),
        );
        // The test's own observer (guest) may look at the vhost; the users
        // under test get exactly the documented permissions.
        scratch::create_vhost(&base, &vhost).expect("create the vhost");
        let mut broker = Self {
            vhost,
            users: Vec::new(),
        };
        for (documented, patterns) in doc_rabbitmq_permissions() {
            let user = scratch::owned_name("ot_u");
            let pw = password();
            scratch::create_user(&user, &pw).expect("create a broker user");
            broker.users.push((documented, user.clone(), pw));
            let [c, w, r] = &patterns;
            scratch::set_permissions(&broker.vhost, &user, [c, w, r]).expect("set_permissions");
        }
        broker
    }

    /// `AMQP_URL` for the documented user `documented` on the vhost.
    fn url(&self, documented: &str) -> String {
        let (_, user, pw) = self
            .users
            .iter()
            .find(|(d, _, _)| d == documented)
            .unwrap_or_else(|| panic!("docs/permissions.md sets no permissions for {documented}"));
        let base = std::env::var("AMQP_URL").unwrap_or_else(|_| settings::DEFAULT_AMQP_URL.into());
        let mut url = url::Url::parse(&base).unwrap();
        url.set_username(user).unwrap();
        url.set_password(Some(pw)).unwrap();
        url.set_path(&format!("/{}", self.vhost));
        url.to_string()
    }

    /// This run's name of the documented user.
    fn user(&self, documented: &str) -> &str {
        &self
            .users
            .iter()
            .find(|(d, _, _)| d == documented)
            .unwrap()
            .1
    }

    /// How many connections `documented`'s user has open.
    fn connections_of(&self, documented: &str) -> usize {
        let out = scratch::rabbitmqctl(&["list_connections", "user"]).unwrap();
        out.lines()
            .filter(|l| l.trim() == self.user(documented))
            .count()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        for (_, user, _) in &self.users {
            if let Err(e) = scratch::delete_user(user) {
                eprintln!("{e}");
            }
        }
        if let Err(e) = scratch::delete_vhost(&self.vhost) {
            eprintln!("{e}");
        }
    }
}

/// Database users made for one test; dropped after the databases they
/// were used in (declare this guard before the database's).
struct DbUsers {
    server: SecretUrl,
    names: Vec<String>,
}

impl Drop for DbUsers {
    fn drop(&mut self) {
        let (server, names) = (self.server.clone(), self.names.clone());
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    for name in &names {
                        if let Err(e) = scratch::drop_database_user(&server, name).await {
                            eprintln!("{e}");
                        }
                    }
                })
        })
        .join();
        if dropped.is_err() {
            eprintln!("dropping the test's database users panicked");
        }
    }
}

/// `url` (a database server) as user `user` with `password`, on database
/// `database`.
fn as_user(url: &SecretUrl, user: &str, password: &str, database: &str) -> String {
    let mut url = url::Url::parse(url.expose()).unwrap();
    url.set_username(user).unwrap();
    url.set_password(Some(password)).unwrap();
    url.set_path(&format!("/{database}"));
    url.to_string()
}

/// Environment of the real binary run as the restricted users.
struct Run {
    amqp_url: String,
    database_url: String,
    inventory_url: String,
    config: PathBuf,
}

impl Run {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_order-timeout"));
        cmd.args(args)
            .env("AMQP_URL", &self.amqp_url)
            .env("DATABASE_URL", &self.database_url)
            .env("INVENTORY_URL", &self.inventory_url)
            .env("ORDER_TIMEOUT_CONFIG", &self.config)
            .env("RUST_LOG", "warn")
            .env_remove("ADMIN_TOKEN");
        cmd
    }

    /// Runs a command to its end (at most 2 minutes) and returns its
    /// output, failing the test unless it succeeds.
    async fn ok(&self, args: &[&str]) -> String {
        let mut cmd = self.command(args);
        let args = args.join(" ");
        let out = tokio::task::spawn_blocking(move || {
            cmd.stdin(Stdio::null());
            let child = cmd
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            wait_output(child, Duration::from_secs(120))
        })
        .await
        .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "order-timeout {args} as the restricted users failed ({:?}):\n{text}",
            out.status
        );
        text
    }

    /// Starts `serve` listening on `http`, logging to `log`.
    fn serve(&self, http: SocketAddr, log: &Path) -> Serve {
        let file = std::fs::File::create(log).unwrap();
        let child = self
            .command(&["serve"])
            .env("HTTP_ADDR", http.to_string())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start order-timeout serve");
        Serve(Some(child))
    }
}

/// A running `serve`, killed if the test ends (a failure included) before
/// [`stop`] stopped it: it must not outlive its users and vhost.
struct Serve(Option<Child>);

impl Serve {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("serve runs")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits for `child` to exit within `limit` (killing it past that).
fn wait_output(child: Child, limit: Duration) -> std::process::Output {
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &id.to_string()])
                .status();
            panic!("order-timeout did not finish within {limit:?}");
        }
    }
}

/// A free local port for `HTTP_ADDR`.
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Waits until `serve` is ready; fails with its log if it exits first or
/// takes over a minute.
async fn wait_ready(serve: &mut Serve, http: SocketAddr, log: &Path) {
    let child = serve.child();
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    while !ready(http).await {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "serve exited ({status}) as the restricted users:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            tokio::time::Instant::now() < end,
            "serve not ready within a minute:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stops `serve` with SIGTERM and requires a clean exit and a log free of
/// refusals.
async fn stop(mut serve: Serve, log: &Path) {
    let child = serve.child();
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -TERM");
    let end = tokio::time::Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if tokio::time::Instant::now() > end {
            let _ = child.kill();
            panic!("serve did not stop within 40 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let logs = std::fs::read_to_string(log).unwrap_or_default();
    assert!(status.success(), "serve's exit: {status:?}\n{logs}");
    for refused in [
        "ACCESS_REFUSED",
        "access denied",
        "Access denied",
        "permission denied",
        "command denied",
    ] {
        assert!(
            !logs.contains(refused),
            "a refusal in serve's log ({refused}):\n{logs}"
        );
    }
    let _ = std::fs::remove_file(log);
}

/// A confirm-mode channel of the order service's user.
async fn publisher(url: &str) -> (Connection, Channel) {
    let conn = order_timeout::broker::connect_amqp(&SecretUrl::new(url), "order-service")
        .await
        .expect("the order service's user connects");
    let channel = conn.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    (conn, channel)
}

/// Publishes `body` as the order service does (persistent, confirmed,
/// mandatory) with `routing_key`, and requires the broker's ack.
async fn publish(channel: &Channel, routing_key: &str, body: &[u8]) {
    let confirm = channel
        .basic_publish(
            topology::ENTRY_EXCHANGE.into(),
            routing_key.into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            body,
            BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into()),
        )
        .await
        .expect("the order service's user may publish to order-timeout")
        .await
        .unwrap();
    assert!(confirm.is_ack(), "publish confirmed");
    assert!(confirm.take_message().is_none(), "{routing_key} is routed");
}

/// Polls `check` every 100 ms for up to `limit`; fails with serve's log
/// (where a refused permission shows) if it never holds.
async fn eventually<F, Fut>(limit: Duration, what: &str, log: &Path, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out after {limit:?}: {what}\n{}",
            serve_log(log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// serve's log, its warnings and errors, for a failure message.
fn serve_log(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    format!(
        "serve's warnings and errors:\n{}",
        lines[lines.len().saturating_sub(40)..].join("\n")
    )
}

fn temp_file(name: &str, ext: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{name}.{ext}"))
}

/// The events consumer, as the documented `notifications` user: its own
/// queue, bound to `order.cancelled`.
async fn notifications(url: &str) -> (Connection, lapin::Consumer) {
    let conn = order_timeout::broker::connect_amqp(&SecretUrl::new(url), "notifications")
        .await
        .expect("the events consumer's user connects");
    let channel = conn.create_channel().await.unwrap();
    let queue = "notifications.order-cancelled";
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare its own queue");
    channel
        .queue_bind(
            queue.into(),
            topology::EVENTS_EXCHANGE.into(),
            topology::CANCELLED_ROUTING_KEY.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind it to order-timeout.events");
    let consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("consume it");
    (conn, consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrate_serve_and_operate_as_documented_least_privilege_users() {
    crate::common::sweep_abandoned().await;
    let broker = Broker::new();
    let server = scratch::test_pg_server();
    let (migrator, app) = (scratch::owned_name("ot_m"), scratch::owned_name("ot_s"));
    let pw = password();
    let _users = DbUsers {
        server: server.clone(),
        names: vec![migrator.clone(), app.clone()],
    };
    let db = scratch::ScratchDatabase::on_test_server("ot_priv");
    let db_url = db.url().unwrap();

    // The shop's side, as its owner: the database, the reference schema,
    // stock, the inventory service.
    {
        let admin = scratch::with_path(&server, "/postgres").unwrap();
        let mut conn =
            sqlx::PgConnection::connect_with(&order_timeout::store::pg_options(&admin).unwrap())
                .await
                .unwrap();
        conn.execute(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE \"{}\"",
            db.name()
        )))
        .await
        .unwrap();
    }
    let shop_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(order_timeout::store::pg_options(&db_url).unwrap())
        .await
        .unwrap();
    shop::create_reference_schema(&shop_pool).await.unwrap();
    shop::set_stock(&shop_pool, &[("sku-0".to_owned(), 1_000)])
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let inventory_url = format!("http://{}", listener.local_addr().unwrap());
    let stop_inventory = Shutdown::new();
    {
        let stop = stop_inventory.clone();
        tokio::spawn(
            ReferenceInventory::new(shop_pool.clone())
                .serve(listener, async move { stop.wait().await }),
        );
    }
    let inventory = ShopInventory::connect_lazy(&inventory_url, Duration::from_secs(5)).unwrap();

    // The documented grants, as the database's owner.
    for statement in doc_statements(
        doc_block("postgres"),
        &[
            ("ot_migrate", &migrator),
            ("ot_serve", &app),
            ("change-me", &pw),
        ],
    ) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&shop_pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }

    let config = temp_file(db.name(), "toml");
    std::fs::write(
        &config,
        r#"
cascade_shards = 1
lanes = ["5s"]
lane_shards = 1
[sweeper]
interval = "1s"
grace = "1s"
# A second timer with a watch: its lease and scans need their table's rows.
[[timers]]
name = "expire_paid"
from = "PAID"
to = "CANCELLED"
deadline = "expires_at + interval '30 days'"
watch = "1m"
"#,
    )
    .unwrap();
    let mut run = Run {
        amqp_url: broker.url("order-timeout"),
        database_url: as_user(&server, &migrator, &pw, db.name()),
        inventory_url: inventory_url.clone(),
        config: config.clone(),
    };
    let out = run.ok(&["migrate"]).await;
    assert!(out.contains("migrations applied"), "{out}");
    run.database_url = as_user(&server, &app, &pw, db.name());
    run.ok(&["schema", "check"]).await;

    let http = free_addr();
    let log = temp_file(db.name(), "log");
    let mut serve = run.serve(http, &log);
    wait_ready(&mut serve, http, &log).await;
    assert_eq!(
        broker.connections_of("order-timeout"),
        2,
        "serve's connections (consume, publish)"
    );

    let (_events_conn, mut events) = notifications(&broker.url("notifications")).await;
    let (_pub_conn, channel) = publisher(&broker.url("order-service")).await;
    let order = |id: &str, in_ms: i64| NewOrder {
        id: id.to_owned(),
        expires_at: Utc::now() + chrono::Duration::milliseconds(in_ms),
        items: vec![OrderItem {
            sku: "sku-0".into(),
            quantity: 2,
        }],
    };
    let mut cancelled = BTreeSet::new();
    // Published with `schedule`, with a lane entry, and one the order
    // service never published (the sweeper's); a paid one; a bad message.
    for (id, in_ms, key) in [
        ("lp-1", 2_000, Some("schedule")),
        ("lp-2", 2_500, Some("schedule")),
        ("lp-3", 3_000, Some("schedule")),
        ("lp-lane", 5_000, Some("schedule.5s")),
        ("lp-swept", 500, None),
    ] {
        let o = order(id, in_ms);
        inventory.reserve(&o.id, &o.items).await.unwrap();
        shop::insert_order(&shop_pool, &o).await.unwrap();
        if let Some(key) = key {
            let body = serde_json::json!({
                "order_id": o.id,
                "cancel_at": order_timeout::message::format_instant(o.expires_at),
            });
            publish(&channel, key, body.to_string().as_bytes()).await;
        }
        cancelled.insert(id.to_owned());
    }
    let paid = order("lp-paid", 1_000);
    shop::insert_order(&shop_pool, &paid).await.unwrap();
    shop::pay(&shop_pool, &paid.id).await.unwrap();
    publish(&channel, "schedule", br#""lp-paid""#).await;
    publish(&channel, "schedule", b"not json").await;

    let status = |id: String| {
        let pool = shop_pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT status FROM orders WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    eventually(
        Duration::from_secs(40),
        "every unpaid order cancelled",
        &log,
        || {
            let ids = cancelled.clone();
            let status = &status;
            async move {
                for id in ids {
                    if status(id).await != "CANCELLED" {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
    assert_eq!(status("lp-paid".into()).await, "PAID");

    // Every cancellation's event reached the consumer, and its stock came
    // back once.
    let mut seen = BTreeSet::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        while seen.len() < cancelled.len() {
            let Some(Ok(delivery)) = events.next().await else {
                break;
            };
            let event: serde_json::Value = serde_json::from_slice(&delivery.data).unwrap();
            seen.insert(event["order_id"].as_str().unwrap().to_owned());
        }
    })
    .await;
    assert_eq!(seen, cancelled, "events\n{}", serve_log(&log));
    for id in &cancelled {
        let calls: Option<i64> =
            sqlx::query_scalar("SELECT calls FROM inventory.releases WHERE order_id = $1")
                .bind(id)
                .fetch_optional(&shop_pool)
                .await
                .unwrap();
        assert_eq!(calls, Some(1), "release of {id}\n{}", serve_log(&log));
    }
    let (status_code, metrics) = http_get(http, "/metrics").await;
    assert_eq!(status_code, 200);
    assert!(
        metric(
            &metrics,
            r#"order_timeout_sweeper_orders_total{timer="cancel_unpaid"}"#
        ) >= 1.0,
        "the sweeper cancelled the order nobody published:\n{metrics}"
    );
    let watched: i64 = sqlx::query_scalar("SELECT count(*) FROM order_timeout_watch")
        .fetch_one(&shop_pool)
        .await
        .unwrap();
    assert_eq!(watched, 1, "the watch's lease row");

    // The operator commands, with the service's users.
    let listed = run.ok(&["parked", "list"]).await;
    assert!(listed.contains("not_json"), "{listed}");
    run.ok(&["pending"]).await;
    run.ok(&["topology", "check"]).await;
    let purged = run.ok(&["parked", "purge", "--yes"]).await;
    assert!(purged.contains("deleted 1 parked message"), "{purged}");

    stop(serve, &log).await;
    stop_inventory.trigger();
    shop_pool.close().await;
    let _ = std::fs::remove_file(&config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_migrate_and_serve_a_mall_shop_as_documented_least_privilege_users() {
    crate::common::sweep_abandoned().await;
    let broker = Broker::new();
    let server = mysql_base();
    let (migrator, app) = (scratch::owned_name("ot_m"), scratch::owned_name("ot_s"));
    let pw = password();
    let _users = DbUsers {
        server: server.clone(),
        names: vec![migrator.clone(), app.clone()],
    };
    // The shop's database as it is before adoption (mall's tables, as root).
    let db = MallDb::unmigrated().await;
    for statement in doc_statements(
        doc_block("mysql"),
        &[
            ("ot_migrate", &migrator),
            ("ot_serve", &app),
            ("shop", &db.name),
            ("change-me", &pw),
        ],
    ) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&db.pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }

    // The worked config for mall, as a shop would deploy it.
    let config = temp_file(&db.name, "toml");
    std::fs::write(
        &config,
        format!(
            "cascade_shards = 1\nlane_shards = 1\n{}\n[sweeper]\ninterval = \"1s\"\ngrace = \"1s\"\n",
            include_str!("../../config/examples/mall-mysql.toml")
        ),
    )
    .unwrap();
    let mut run = Run {
        amqp_url: broker.url("order-timeout"),
        database_url: as_user(&server, &migrator, &pw, &db.name),
        inventory_url: "http://127.0.0.1:9".into(),
        config: config.clone(),
    };
    let out = run.ok(&["migrate"]).await;
    assert!(out.contains("migrations applied"), "{out}");
    for statement in doc_statements(
        doc_block("mysql-after-migrate"),
        &[("ot_serve", &app), ("shop", &db.name)],
    ) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&db.pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    run.database_url = as_user(&server, &app, &pw, &db.name);
    run.ok(&["schema", "check"]).await;

    let http = free_addr();
    let log = temp_file(&db.name, "log");
    let mut serve = run.serve(http, &log);
    wait_ready(&mut serve, http, &log).await;

    let (_pub_conn, channel) = publisher(&broker.url("order-service")).await;
    let hour = Duration::from_secs(3600);
    // Due in 2-3 s and published (bare ids, as mall does); one never
    // published (swept); a paid one and a soft-deleted one left alone.
    for id in 100..103 {
        db.order(
            id,
            hour - Duration::from_secs(2 + (id as u64 % 2)),
            0,
            false,
            1,
        )
        .await;
        publish(&channel, "schedule", id.to_string().as_bytes()).await;
    }
    db.order(110, hour - Duration::from_millis(500), 0, false, 2)
        .await;
    db.order(200, hour * 2, 1, false, 3).await;
    db.order(300, hour * 2, 0, true, 3).await;
    publish(&channel, "schedule", b"300").await;
    publish(&channel, "schedule", b"not json").await;

    eventually(
        Duration::from_secs(40),
        "mall's unpaid orders closed",
        &log,
        || async {
            for id in [100, 101, 102, 110] {
                if db.status(id).await != 4 {
                    return false;
                }
            }
            true
        },
    )
    .await;
    assert_eq!(db.status(200).await, 1, "paid: untouched");
    assert_eq!(db.status(300).await, 0, "soft-deleted: untouched");
    let locked = db.lock_stock().await;
    assert_eq!(
        locked.values().sum::<i32>(),
        4,
        "lock_stock given back for the four closed orders (two left locked): {locked:?}"
    );
    let (_, metrics) = http_get(http, "/metrics").await;
    assert!(
        metric(
            &metrics,
            r#"order_timeout_sweeper_orders_total{timer="cancel_unpaid"}"#
        ) >= 1.0,
        "the sweeper closed the order nobody published:\n{metrics}"
    );
    let listed = run.ok(&["parked", "list"]).await;
    assert!(listed.contains("not_json"), "{listed}");

    stop(serve, &log).await;
    let _ = std::fs::remove_file(&config);
}

#[test]
fn the_documented_blocks_are_found_and_complete() {
    let users: Vec<String> = doc_rabbitmq_permissions()
        .into_iter()
        .map(|(user, _)| user)
        .collect();
    assert_eq!(users, ["order-timeout", "order-service", "notifications"]);
    let pg = doc_statements(doc_block("postgres"), &[]);
    assert!(pg.iter().any(|s| s.contains("ON orders")), "{pg:?}");
    let my = doc_statements(doc_block("mysql"), &[("shop", "db1")]);
    assert!(my.iter().all(|s| !s.contains("shop.")), "{my:?}");
    assert_eq!(
        replace_word(
            "ot_serve ot_serve_x x_ot_serve 'ot_serve'@",
            "ot_serve",
            "u"
        ),
        "u ot_serve_x x_ot_serve 'u'@"
    );
}
