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
//!
//! This file reads the documented blocks and holds the users, processes
//! and probes the runs share; the runs are [`postgres`] and [`mysql`].

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
use order_timeout::settings::{self, SecretUrl};
use order_timeout::shutdown::Shutdown;
use order_timeout::testing::store::OrderItem;
use order_timeout::testing::topology::{CANCELLED_ROUTING_KEY, ENTRY_EXCHANGE, EVENTS_EXCHANGE};
use order_timeout_tools::inventory::{ReferenceInventory, ShopInventory};
use order_timeout_tools::scratch;
use order_timeout_tools::shop::{self, NewOrder};
use sqlx::{Connection as _, Executor as _};

use crate::adopt::MallDb;
use crate::common::{http_get, ready};
use crate::store::mysql_base;

mod mysql;
mod postgres;

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
    let conn = order_timeout::testing::broker::connect_amqp(&SecretUrl::new(url), "order-service")
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
            ENTRY_EXCHANGE.into(),
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
    let conn = order_timeout::testing::broker::connect_amqp(&SecretUrl::new(url), "notifications")
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
            EVENTS_EXCHANGE.into(),
            CANCELLED_ROUTING_KEY.into(),
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
