//! The worked configurations of `config/examples/` run end to end, each
//! loaded from its file as a deployment loads it (the URLs from the
//! environment), against a schema shaped like the real project's tables
//! (the columns the config uses, typed as the project types them) and the
//! schema changes the file's comments document:
//!
//! - `mall-timers-mysql.toml` on MariaDB: macrozheng/mall's `oms_order` and
//!   friends (`document/sql/mall.sql`) plus the two columns and the
//!   "settle the past" statement the file documents;
//! - `yudao-timers-postgres.toml` on PostgreSQL: YunaiV/ruoyi-vue-pro's
//!   trade, product, promotion, member and pay tables as its PostgreSQL
//!   scripts type them (ids from `<table>_seq` sequences), in `+08:00`.
//!
//! In each, the shop publishes its unpaid orders' ids (as the shop does)
//! and nobody publishes for the other timers: their watches find the rows.
//! Every timer must flip exactly its rows, once, never before the deadline,
//! with its `set` columns and `also` effects, and leave alone the rows that
//! moved on meanwhile or fail its guard; one event per flip, on the timer's
//! routing key.
//!
//! This file holds what both share (loading a worked config, running it,
//! reading its events); each worked config is a module of its own
//! ([`mall`], [`yudao`]).

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::StreamExt;
use order_timeout::settings::{SecretUrl, Settings, Timer};
use order_timeout::testing::broker::TimerEvent;
use order_timeout::testing::metrics::{Metrics, Outcome};
use order_timeout_tools::scratch::ScratchDatabase;
use order_timeout_tools::shop::ShopDb;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, PgPool};

use crate::common::{TestEnv, on_shop};
use crate::store::{mysql_base, mysql_pool};

mod mall;
mod yudao;

const MALL: &str = include_str!("../../config/examples/mall-timers-mysql.toml");
const YUDAO: &str = include_str!("../../config/examples/yudao-timers-postgres.toml");

/// How long a test waits for the flips it expects (the last deadline is
/// 14 s after the rows are written).
const FLIPS: Duration = Duration::from_secs(40);

/// The settings a deployment gets from a worked config file: the file as
/// written, then the environment variables (here: this test's vhost, the
/// shop's database, the test's inventory server, a free port), and the
/// cascade shards this test's vhost was declared with.
fn from_worked_config(text: &str, env: &TestEnv, database_url: &SecretUrl) -> Settings {
    let mut settings: Settings = toml::from_str(text).expect("the worked config parses");
    let vars = [
        ("AMQP_URL", env.settings.amqp_url.expose().to_owned()),
        ("DATABASE_URL", database_url.expose().to_owned()),
        (
            "INVENTORY_URL",
            env.settings.inventory_url.expose().to_owned(),
        ),
        ("HTTP_ADDR", env.settings.http_addr.to_string()),
    ];
    settings
        .apply_env(|name| {
            vars.iter()
                .find(|(var, _)| *var == name)
                .map(|(_, value)| value.clone())
        })
        .unwrap();
    settings.cascade_shards = env.settings.cascade_shards;
    settings.validate().expect("the worked config validates");
    settings
}

/// The SQL a config file's comments document: the comment lines from the
/// one whose SQL starts with `first` up to the next empty comment line,
/// without their `#`.
fn documented_sql(text: &str, first: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.trim_start_matches('#').trim_start().starts_with(first))
        .take_while(|line| line.trim() != "#")
        .map(|line| line.strip_prefix('#').expect("a comment line"))
        .collect();
    assert!(!lines.is_empty(), "the file documents {first:?}");
    lines.join("\n")
}

/// The timer called `name`.
fn timer<'a>(timers: &'a [Timer], name: &str) -> &'a Timer {
    timers
        .iter()
        .find(|t| t.name.as_str() == name)
        .unwrap_or_else(|| panic!("no timer {name}"))
}

/// Up to `n` events within `timeout`, each with its routing key.
pub(crate) async fn read_events(
    consumer: &mut lapin::Consumer,
    n: usize,
    timeout: Duration,
) -> Vec<(String, TimerEvent)> {
    let mut events = Vec::new();
    let _ = tokio::time::timeout(timeout, async {
        while events.len() < n {
            let Some(Ok(delivery)) = consumer.next().await else {
                break;
            };
            let event = serde_json::from_slice(&delivery.data).expect("event is JSON");
            events.push((delivery.routing_key.to_string(), event));
        }
    })
    .await;
    events
}

/// `(routing key, timer, order id)` of each event, checking that none is
/// early: flipped at or after its deadline.
pub(crate) fn keyed(events: &[(String, TimerEvent)]) -> Vec<(String, String, String)> {
    for (key, e) in events {
        assert!(
            e.lateness_ms >= 0 && e.cancelled_at >= e.expires_at,
            "never early: {key} {e:?}"
        );
    }
    let mut keys: Vec<_> = events
        .iter()
        .map(|(key, e)| (key.clone(), e.timer.clone(), e.order_id.clone()))
        .collect();
    keys.sort();
    keys
}

fn expected_events(list: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    let mut keys: Vec<_> = list
        .iter()
        .map(|(k, t, id)| (k.to_string(), t.to_string(), id.to_string()))
        .collect();
    keys.sort();
    keys
}

/// Waits until the service has counted at least `n` messages of `timer`
/// with `outcome`: the message of a row that moved on or fails the guard
/// was answered, so checking that the row was left alone means something.
async fn wait_outcome(env: &TestEnv, metrics: &Metrics, timer: &str, outcome: Outcome, n: u64) {
    env.eventually(
        FLIPS,
        &format!("{n} {outcome:?} message(s) of {timer}"),
        || async { metrics.count_of(timer, outcome) >= n },
    )
    .await;
}

/// The watches' first tick (at the service's start) scheduled exactly the
/// rows of each timer falling due within the next minute.
async fn wait_watched(env: &TestEnv, metrics: &Metrics, expected: &[(&str, u64)]) {
    env.eventually(FLIPS, "the watches' first scans", || async {
        expected
            .iter()
            .all(|(timer, n)| metrics.watched_of(timer) >= *n)
    })
    .await;
    for (timer, n) in expected {
        assert_eq!(
            metrics.watched_of(timer),
            *n,
            "rows the watch of {timer} found"
        );
    }
}

/// A worked config's shop database, in the shop's zone: mall's on MariaDB
/// (a database of its own, dropped afterwards), yudao's the test's
/// PostgreSQL database. What [`run_worked_config`] reads and writes through.
struct Shop {
    /// The database's URL, as the config's `DATABASE_URL`.
    url: SecretUrl,
    /// Its pool (named for `on_shop!`).
    shop: ShopDb,
    /// The MariaDB database, dropped after the pool closes.
    _scratch: Option<ScratchDatabase>,
}

impl Shop {
    /// Runs `sql` (one or more statements) as the shop would; the rows
    /// changed.
    async fn run(&self, sql: &str) -> u64 {
        let text = || AssertSqlSafe(sql.to_owned());
        on_shop!(self, execute, raw_sql(text(), text())).unwrap_or_else(|e| panic!("{e}: {sql}"))
    }

    /// How many of `ids` of `table` match `condition`.
    async fn count(&self, table: &str, ids: &[i64], condition: &str) -> i64 {
        let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
        let sql = || {
            AssertSqlSafe(format!(
                "SELECT COUNT(*) FROM {table} WHERE id IN ({}) AND ({condition})",
                ids.join(", ")
            ))
        };
        on_shop!(self, fetch_one, query_scalar(sql(), sql())).unwrap()
    }

    /// Checks that the event's deadline is its row's, read in the shop's
    /// zone: to the second on MariaDB (mall's `DATETIME`s have whole
    /// seconds), exactly on PostgreSQL.
    async fn check_deadline(&self, t: &Timer, e: &TimerEvent) {
        let id = e.order_id.parse::<i64>().unwrap();
        let (deadline, table) = (&t.deadline, &t.table);
        match &self.shop {
            ShopDb::MySql(pool) => {
                let deadline: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT CAST(UNIX_TIMESTAMP({deadline}) AS SIGNED) FROM {table} WHERE id = ?"
                )))
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap();
                assert_eq!(e.expires_at.timestamp(), deadline, "{e:?}");
            }
            ShopDb::Postgres(pool) => {
                let deadline: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(AssertSqlSafe(
                    format!("SELECT ({deadline})::timestamptz FROM {table} WHERE id = $1"),
                ))
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap();
                assert_eq!(e.expires_at, deadline, "{e:?}");
            }
        }
    }

    /// The service's outbox rows, `(timer, order id)`.
    async fn outbox(&self) -> BTreeSet<(String, String)> {
        let rows: Vec<(String, String)> = on_shop!(self, fetch_all, query_as(
            "SELECT timer, order_id FROM order_timeout_cancel_outbox",
            "SELECT CAST(timer AS CHAR), CAST(order_id AS CHAR) FROM order_timeout_cancel_outbox"
        ))
        .unwrap();
        rows.into_iter().collect()
    }
}

/// What a worked config's run expects, shop by shop; the steps are the same
/// ([`run_worked_config`]).
struct WorkedConfig<'a> {
    /// The config file's text, as a deployment loads it.
    config: &'static str,
    /// The bodies the order service publishes for its unpaid orders.
    published: Vec<String>,
    /// Rows each watch's first scan must find: `(timer, rows)`.
    watched: &'a [(&'a str, u64)],
    /// What the members do while the test runs, before the deadlines:
    /// `(what, statement)`, each changing one row.
    moves: &'a [(&'a str, &'a str)],
    /// Messages answered without a flip (rows that moved on or fail the
    /// guard): `(timer, outcome, at least)`.
    answered: &'a [(&'a str, Outcome, u64)],
    /// The rows flipped, to wait for: `(table, ids, condition each meets)`.
    flipped: &'a [(&'a str, &'a [i64], &'a str)],
    /// One event per flip: `(routing key, timer, id)`.
    events: &'a [(&'a str, &'a str, &'a str)],
    /// The `set` time columns of each timer's flipped rows, each at or
    /// after the timer's deadline: `(timer, columns, ids)`.
    set_times: &'a [(&'a str, &'a [&'a str], &'a [i64])],
}

/// A worked config's service, and the events of its flips, after
/// [`run_worked_config`].
struct Ran {
    service: order_timeout::RunningService,
    events: Vec<(String, TimerEvent)>,
}

impl Ran {
    /// The checks that end every worked config: one outbox row per flip
    /// (its event's), nothing parked; then the service stops.
    async fn finish(self, env: &TestEnv, shop: &Shop) {
        let want: BTreeSet<(String, String)> = (self.events.iter())
            .map(|(_, e)| (e.timer.clone(), e.order_id.clone()))
            .collect();
        assert_eq!(shop.outbox().await, want, "one outbox row per flip");
        assert!(env.drain_parked().await.is_empty(), "nothing parked");
        self.service.stop().await.unwrap();
    }
}

/// Runs `run.config` on `shop` (its schema and rows written) with the
/// test's vhost and inventory: the order service publishes, the watches'
/// first scans find their rows, the members make their moves, the moved
/// rows' messages are answered, the due rows flip; then one event per flip
/// on the timer's routing key, none early, each with its row's deadline;
/// the rows' own `set` times at or after the deadlines; and nothing more
/// afterwards. The steps every worked config shares, written once.
async fn run_worked_config(env: &TestEnv, shop: &Shop, run: WorkedConfig<'_>) -> Ran {
    let settings = from_worked_config(run.config, env, &shop.url);
    let timers = settings.timers().unwrap();
    let mut events = env.subscribe_events_on("#").await;
    let service = env.service_with(settings).await;
    let metrics = service.metrics.clone();
    for body in &run.published {
        env.publish_raw(body.as_bytes()).await;
    }
    wait_watched(env, &metrics, run.watched).await;
    for (what, sql) in run.moves {
        assert_eq!(shop.run(sql).await, 1, "{what} before its deadline");
    }
    for (timer, outcome, n) in run.answered {
        wait_outcome(env, &metrics, timer, *outcome, *n).await;
    }
    env.eventually(FLIPS, "every due row flipped", || async {
        for (table, ids, condition) in run.flipped {
            if shop.count(table, ids, condition).await != ids.len() as i64 {
                return false;
            }
        }
        true
    })
    .await;

    let got = read_events(&mut events, run.events.len(), Duration::from_secs(20)).await;
    assert_eq!(keyed(&got), expected_events(run.events));
    for (_, e) in &got {
        shop.check_deadline(timer(&timers, &e.timer), e).await;
    }
    // Never early, by the rows themselves.
    for (name, columns, ids) in run.set_times {
        let t = timer(&timers, name);
        for column in *columns {
            let condition = format!("{column} >= {}", t.deadline);
            let on_time = shop.count(&t.table, ids, &condition).await;
            assert_eq!(on_time, ids.len() as i64, "{name}: {condition}");
        }
    }
    // Nothing else happens afterwards: no second flip, no further event,
    // across two more sweeps of every timer (what would flip a row again).
    for t in &timers {
        env.more_sweeps_of(&service, t.name.as_str(), 2).await;
    }
    let more = read_events(&mut events, 1, Duration::from_secs(1)).await;
    assert!(more.is_empty(), "no further events: {more:?}");
    Ran {
        service,
        events: got,
    }
}
