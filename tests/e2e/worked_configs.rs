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

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::StreamExt;
use order_timeout::broker::publisher::TimerEvent;
use order_timeout::observe::metrics::{Metrics, Outcome};
use order_timeout::settings::{SecretUrl, Settings, Timer};
use order_timeout_tools::scratch::ScratchDatabase;
use order_timeout_tools::shop::ShopDb;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, PgPool};

use crate::common::{TestEnv, on_shop};
use crate::store::{mysql_base, mysql_pool};

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
    // Nothing else happens afterwards: no second flip, no further event.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let more = read_events(&mut events, 1, Duration::from_secs(1)).await;
    assert!(more.is_empty(), "no further events: {more:?}");
    Ran {
        service,
        events: got,
    }
}

// ---- mall on MariaDB ----

/// A fresh MariaDB database for the mall shop, migrated, its sessions in
/// the shop's zone (`+08:00`); dropped with the [`Shop`].
async fn mall_db() -> Shop {
    let scratch = ScratchDatabase::new(&mysql_base(), "ot_mall_timers");
    let url = scratch.url().unwrap();
    order_timeout::store::migrate(&url).await.unwrap();
    let pool = mysql_pool(&url, "+08:00", 2).await;
    Shop {
        url,
        shop: ShopDb::MySql(pool),
        _scratch: Some(scratch),
    }
}

/// mall's tables as `document/sql/mall.sql` creates them, trimmed to the
/// columns the worked config reads and writes, with its settings row: the
/// shop before the migration the config's header documents.
const MALL_SCHEMA: &str = include_str!("../fixtures/mall_timers_mysql.sql");

/// The shop before the migration the config documents: two orders
/// received long ago (30 days: both windows closed long since) and lately
/// (3 days: both still open).
const MALL_PAST: &str = r#"
INSERT INTO oms_order (id, member_id, member_username, status, confirm_status,
                       create_time, delivery_time, receive_time)
VALUES (401, 1, 'windy', 3, 1, NOW() - INTERVAL 40 DAY, NOW() - INTERVAL 35 DAY,
        NOW() - INTERVAL 30 DAY),
       (402, 1, 'windy', 3, 1, NOW() - INTERVAL 10 DAY, NOW() - INTERVAL 5 DAY,
        NOW() - INTERVAL 3 DAY);
INSERT INTO oms_order_item (order_id, product_id, product_name, product_quantity, product_sku_id)
VALUES (401, 26, 'HUAWEI P20', 1, 1), (402, 26, 'HUAWEI P20', 1, 1);
"#;

/// Members, stock, coupons and orders, written after the migration. Every
/// deadline is relative to now: due 8 to 14 s from now, or much later.
const MALL_ROWS: &str = r#"
INSERT INTO ums_member (id, nickname, icon, integration)
VALUES (1, 'windy', 'https://example.com/icon/windy.png', 500),
       (2, NULL, NULL, 50),
       (3, 'lily', NULL, 30);
INSERT INTO pms_sku_stock (id, sku_code, stock, lock_stock)
VALUES (1, '201806070026001', 100, 15), (2, '201806070026002', 100, 17), (3, '201806070026003', 100, 14);
INSERT INTO sms_coupon_history (id, coupon_id, member_id, use_status, use_time)
VALUES (1, 7, 1, 0, NULL),
       (2, 7, 1, 1, NOW() - INTERVAL 1 HOUR),
       (3, 7, 1, 1, NOW() - INTERVAL 1 HOUR),
       (4, 7, 2, 1, NOW() - INTERVAL 1 HOUR),
       (5, 8, 1, 1, NOW() - INTERVAL 1 HOUR);

-- cancel_unpaid: created normal_order_overtime (120) minutes before the deadline.
-- 101: a coupon and 100 points used, two lines of SKU 1 and one of SKU 2;
-- 102: no coupon, no points; 103: paid already; 104: deleted by the member;
-- 105: due in two hours; 106: paid by the member while the test runs.
INSERT INTO oms_order (id, member_id, coupon_id, member_username, status, confirm_status,
                       delete_status, use_integration, create_time)
VALUES (101, 1, 7,    'windy', 0, 0, 0, 100, NOW() - INTERVAL 120 MINUTE + INTERVAL 8 SECOND),
       (102, 2, NULL, 'test',  0, 0, 0, 0,   NOW() - INTERVAL 120 MINUTE + INTERVAL 9 SECOND),
       (103, 3, NULL, 'lily',  1, 0, 0, 30,  NOW() - INTERVAL 120 MINUTE + INTERVAL 8 SECOND),
       (104, 1, 8,    'windy', 0, 0, 1, 20,  NOW() - INTERVAL 120 MINUTE + INTERVAL 8 SECOND),
       (105, 2, NULL, 'test',  0, 0, 0, 0,   NOW()),
       (106, 3, NULL, 'lily',  0, 0, 0, 30,  NOW() - INTERVAL 120 MINUTE + INTERVAL 14 SECOND);

-- auto_receive: shipped, auto_confirm_day days before the deadline (NULL: the
-- setting's 15). 204: deleted; 205: due in 10 days; 206: received by hand
-- while the test runs.
INSERT INTO oms_order (id, member_id, member_username, status, confirm_status, delete_status,
                       auto_confirm_day, create_time, delivery_time)
VALUES (201, 1, 'windy', 2, 0, 0, 15,   NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 15 DAY + INTERVAL 10 SECOND),
       (202, 2, 'test',  2, 0, 0, NULL, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 15 DAY + INTERVAL 11 SECOND),
       (203, 3, 'lily',  2, 0, 0, 3,    NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 3 DAY + INTERVAL 12 SECOND),
       (204, 1, 'windy', 2, 0, 1, 15,   NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 15 DAY + INTERVAL 10 SECOND),
       (205, 1, 'windy', 2, 0, 0, 15,   NOW() - INTERVAL 20 DAY, NOW() - INTERVAL 5 DAY),
       (206, 1, 'windy', 2, 0, 0, 15,   NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 15 DAY + INTERVAL 14 SECOND);

-- auto_complete and default_review: received 7 days before the deadline.
-- 301: both open; 302: reviewed by the member already; 303: after-sale
-- window closed already; 304: closed order (status 4); 305: due tomorrow;
-- 308: reviewed by the member while the test runs.
INSERT INTO oms_order (id, member_id, member_username, status, confirm_status,
                       finish_status, comment_status, create_time, receive_time)
VALUES (301, 1, 'windy', 3, 1, 0, 0, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 7 DAY + INTERVAL 10 SECOND),
       (302, 1, 'windy', 3, 1, 0, 1, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 7 DAY + INTERVAL 11 SECOND),
       (303, 2, 'test',  3, 1, 1, 0, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 7 DAY + INTERVAL 12 SECOND),
       (304, 1, 'windy', 4, 1, 0, 0, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 7 DAY + INTERVAL 10 SECOND),
       (305, 1, 'windy', 3, 1, 0, 0, NOW() - INTERVAL 20 DAY, NOW() - INTERVAL 6 DAY),
       (308, 3, 'lily',  3, 1, 0, 0, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 7 DAY + INTERVAL 14 SECOND);

INSERT INTO oms_order_item (order_id, product_id, product_name, product_quantity,
                            product_sku_id, product_attr)
VALUES (101, 26, 'HUAWEI P20', 2, 1, '[{"key":"颜色","value":"金色"}]'),
       (101, 26, 'HUAWEI P20', 3, 1, '[{"key":"颜色","value":"金色"}]'),
       (101, 27, '小米8', 1, 2, '[{"key":"容量","value":"64G"}]'),
       (102, 27, '小米8', 4, 2, '[{"key":"容量","value":"64G"}]'),
       (103, 28, '苹果 iPhone 8', 2, 3, NULL),
       (104, 28, '苹果 iPhone 8', 1, 3, NULL),
       (105, 28, '苹果 iPhone 8', 1, 3, NULL),
       (106, 27, '小米8', 2, 2, '[{"key":"容量","value":"64G"}]'),
       (301, 26, 'HUAWEI P20', 1, 1, '[{"key":"颜色","value":"金色"}]'),
       (301, 27, '小米8', 1, 2, '[{"key":"容量","value":"64G"}]'),
       (302, 26, 'HUAWEI P20', 1, 1, NULL),
       (303, 28, '苹果 iPhone 8', 1, 3, '[{"key":"颜色","value":"银色"}]'),
       (308, 27, '小米8', 1, 2, NULL);
"#;

/// `config/examples/mall-timers-mysql.toml` on MariaDB, as written: the
/// shop publishes bare order ids for `cancel_unpaid`; `auto_receive`,
/// `auto_complete` and `default_review` are found by their watches. Each
/// timer flips exactly the rows due and still in its `from` status and
/// passing its guard, at or after the deadline (the `set` columns say
/// when), gives back lock_stock (summed per SKU), the coupon and the points
/// once, writes one default review per line, and publishes one event per
/// flip on its routing key; the columns the file documents adding, and its
/// "settle the past" statement, keep old orders out of the new windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mall_timers_on_mariadb() {
    let env = TestEnv::new().await;
    let shop = mall_db().await;
    shop.run(MALL_SCHEMA).await;
    shop.run(MALL_PAST).await;
    // The migration the file documents: the two columns, the indexes, and
    // the past settled.
    shop.run(&documented_sql(MALL, "ALTER TABLE oms_order"))
        .await;
    shop.run(MALL_ROWS).await;

    let run = WorkedConfig {
        config: MALL,
        // The order service publishes each order id when it creates the order.
        published: (101..=106).map(|id: i64| id.to_string()).collect(),
        watched: &[
            ("auto_receive", 4),
            ("auto_complete", 3),
            ("default_review", 3),
        ],
        // While the test runs, before their deadlines: a member pays 106,
        // another confirms receipt of 206, a third reviews 308.
        moves: &[
            (
                "106 paid",
                "UPDATE oms_order SET status = 1 WHERE id = 106 AND status = 0 \
                   AND create_time + INTERVAL 120 MINUTE > NOW()",
            ),
            (
                "206 received",
                "UPDATE oms_order SET status = 3, confirm_status = 1, receive_time = NOW() \
                  WHERE id = 206 AND status = 2 AND delivery_time + INTERVAL 15 DAY > NOW()",
            ),
            (
                "308 reviewed",
                "UPDATE oms_order SET comment_status = 1, comment_time = NOW() \
                  WHERE id = 308 AND comment_status = 0 AND receive_time + INTERVAL 7 DAY > NOW()",
            ),
        ],
        // Paid (103, 106), deleted (104), and already in the timer's `to`
        // status by the member's hand (206, 308).
        answered: &[
            ("cancel_unpaid", Outcome::AlreadyPaid, 2),
            ("cancel_unpaid", Outcome::LeftAlone, 1),
            ("auto_receive", Outcome::AlreadyCancelled, 1),
            ("default_review", Outcome::AlreadyCancelled, 1),
        ],
        flipped: &[
            ("oms_order", &[101, 102], "status = 4"),
            ("oms_order", &[201, 202, 203], "status = 3"),
            ("oms_order", &[301, 302, 308], "finish_status = 1"),
            ("oms_order", &[301, 303], "comment_status = 1"),
        ],
        events: &[
            ("order.cancelled", "cancel_unpaid", "101"),
            ("order.cancelled", "cancel_unpaid", "102"),
            ("order.received", "auto_receive", "201"),
            ("order.received", "auto_receive", "202"),
            ("order.received", "auto_receive", "203"),
            ("order.completed", "auto_complete", "301"),
            ("order.completed", "auto_complete", "302"),
            ("order.completed", "auto_complete", "308"),
            ("order.reviewed", "default_review", "301"),
            ("order.reviewed", "default_review", "303"),
        ],
        set_times: &[
            ("cancel_unpaid", &["modify_time"], &[101, 102]),
            ("auto_receive", &["receive_time"], &[201, 202, 203]),
            ("auto_complete", &["modify_time"], &[301, 302, 308]),
            ("default_review", &["comment_time"], &[301, 303]),
        ],
    };
    let ran = run_worked_config(&env, &shop, run).await;
    let ShopDb::MySql(pool) = &shop.shop else {
        unreachable!("mall's shop is on MariaDB")
    };

    // Every order: (id, status, confirm_status, finish_status,
    // comment_status, modify_time set, comment_time set).
    type Order = (i64, Option<i32>, Option<i32>, i32, i32, i64, i64);
    let orders: Vec<Order> = sqlx::query_as(
        "SELECT id, status, confirm_status, finish_status, comment_status, \
                CAST(modify_time IS NOT NULL AS SIGNED), CAST(comment_time IS NOT NULL AS SIGNED) \
           FROM oms_order ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let s = Some;
    assert_eq!(
        orders,
        [
            (101, s(4), s(0), 0, 0, 1, 0),
            (102, s(4), s(0), 0, 0, 1, 0),
            (103, s(1), s(0), 0, 0, 0, 0),
            (104, s(0), s(0), 0, 0, 0, 0),
            (105, s(0), s(0), 0, 0, 0, 0),
            (106, s(1), s(0), 0, 0, 0, 0),
            (201, s(3), s(1), 0, 0, 0, 0),
            (202, s(3), s(1), 0, 0, 0, 0),
            (203, s(3), s(1), 0, 0, 0, 0),
            (204, s(2), s(0), 0, 0, 0, 0),
            (205, s(2), s(0), 0, 0, 0, 0),
            (206, s(3), s(1), 0, 0, 0, 0),
            (301, s(3), s(1), 1, 1, 1, 1),
            (302, s(3), s(1), 1, 1, 1, 0),
            (303, s(3), s(1), 1, 1, 0, 1),
            (304, s(4), s(1), 0, 0, 0, 0),
            (305, s(3), s(1), 0, 0, 0, 0),
            (308, s(3), s(1), 1, 1, 1, 1),
            // Settled by the migration; its windows stay closed.
            (401, s(3), s(1), 1, 1, 0, 0),
            (402, s(3), s(1), 0, 0, 0, 0),
        ]
    );

    // cancel_unpaid's `also`: lock_stock back for 101 (SKU 1: 2 + 3, SKU 2:
    // 1) and 102 (SKU 2: 4), once; the paid, deleted and later orders' stays.
    let locked: Vec<(i64, Option<i32>)> =
        sqlx::query_as("SELECT id, lock_stock FROM pms_sku_stock ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(locked, [(1, s(10)), (2, s(12)), (3, s(14))]);
    // The coupon back: member 1's first used history row of coupon 7 only.
    let coupons: Vec<(i64, Option<i32>)> =
        sqlx::query_as("SELECT id, use_status FROM sms_coupon_history ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        coupons,
        [(1, s(0)), (2, s(0)), (3, s(1)), (4, s(1)), (5, s(1))]
    );
    // The points back: 100 to member 1; nobody else's change.
    let points: Vec<(i64, Option<i32>)> =
        sqlx::query_as("SELECT id, integration FROM ums_member ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(points, [(1, s(600)), (2, s(50)), (3, s(30))]);

    // default_review's `also`: one 5-star review per line of 301 and 303,
    // named after the member (or the order's username when the member has
    // no nickname), none for 302 and 308 (reviewed by their members) or the
    // settled 401.
    type Review = (
        Option<i64>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<i32>,
        Option<i32>,
        Option<String>,
        Option<String>,
    );
    let reviews: Vec<Review> = sqlx::query_as(
        "SELECT product_id, member_nick_name, member_icon, product_name, star, show_status, \
                product_attribute, content \
           FROM pms_comment ORDER BY product_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let text = |s: &str| Some(s.to_owned());
    let icon = text("https://example.com/icon/windy.png");
    assert_eq!(
        reviews,
        [
            (
                Some(26),
                text("windy"),
                icon.clone(),
                text("HUAWEI P20"),
                s(5),
                s(1),
                text(r#"[{"key":"颜色","value":"金色"}]"#),
                text("系统默认好评"),
            ),
            (
                Some(27),
                text("windy"),
                icon,
                text("小米8"),
                s(5),
                s(1),
                text(r#"[{"key":"容量","value":"64G"}]"#),
                text("系统默认好评"),
            ),
            (
                Some(28),
                text("test"),
                None,
                text("苹果 iPhone 8"),
                s(5),
                s(1),
                text(r#"[{"key":"颜色","value":"银色"}]"#),
                text("系统默认好评"),
            ),
        ]
    );
    let late_reviews = sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM pms_comment c WHERE c.create_time < (SELECT MIN(o.receive_time) \
           + INTERVAL 7 DAY FROM oms_order o WHERE o.id IN (301, 303))",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(late_reviews, 0, "no review before the deadline");

    ran.finish(&env, &shop).await;
}

// ---- yudao on PostgreSQL ----

/// yudao's tables as its PostgreSQL scripts type them (converted from the
/// MySQL DDL by `sql/tools/convertor.py`: `bigint` -> int8, `int` -> int4,
/// `tinyint` -> int2, `bit(1)` -> bool except `deleted` -> int2,
/// `datetime` -> timestamp; ids without defaults, from `<table>_seq`
/// sequences), with the columns the worked config and this test use.
const YUDAO_SCHEMA: &str = include_str!("../fixtures/yudao_timers_postgres.sql");

/// The shop's rows, written in its zone (`+08:00`, as yudao writes them).
/// Every deadline is relative to now: due 8 to 14 s from now, or later.
const YUDAO_ROWS: &str = r#"
INSERT INTO member_user (id, nickname, avatar, point, tenant_id)
VALUES (1, '芋艿', 'https://example.com/avatar/1.png', 200, 1),
       (2, '小王', '', 100, 2),
       (3, '小李', '', 0, 1);
INSERT INTO product_spu (id, name, stock, sales_count, tenant_id)
VALUES (21, 'iPhone 15', 150, 15, 1), (22, 'AirPods', 20, 3, 1);
INSERT INTO product_sku (id, spu_id, properties, pic_url, stock, sales_count, tenant_id)
VALUES (11, 21, '[{"propertyId":1,"propertyName":"颜色","valueId":2,"valueName":"黑色"}]',
        'https://example.com/sku/11.png', 100, 10, 1),
       (12, 21, '[{"propertyId":1,"propertyName":"颜色","valueId":3,"valueName":"白色"}]',
        'https://example.com/sku/12.png', 50, 5, 1),
       (13, 22, NULL, 'https://example.com/sku/13.png', 20, 3, 1);
INSERT INTO pay_order (id, status) VALUES (9001, 0), (9002, 0), (9004, 10);
INSERT INTO promotion_coupon (id, name, status, user_id, valid_start_time, valid_end_time,
                              deleted, tenant_id)
VALUES
    -- Used by the unpaid orders: 501 valid for a month, 502 expired yesterday.
    (501, '满100减10', 2, 1, localtimestamp - interval '1 day', localtimestamp + interval '30 days', 0, 1),
    (502, '满100减10', 2, 2, localtimestamp - interval '9 days', localtimestamp - interval '1 day', 0, 2),
    (503, '满100减10', 2, 1, localtimestamp - interval '1 day', localtimestamp + interval '30 days', 0, 1),
    -- coupon_expiry: 601 due; 602 deleted; 603 used; 604 due tomorrow;
    -- 605 used by its member while the test runs.
    (601, '新人券', 1, 1, localtimestamp - interval '7 days', localtimestamp + interval '9 seconds', 0, 1),
    (602, '新人券', 1, 1, localtimestamp - interval '7 days', localtimestamp + interval '9 seconds', 1, 1),
    (603, '新人券', 2, 1, localtimestamp - interval '7 days', localtimestamp + interval '9 seconds', 0, 1),
    (604, '新人券', 1, 1, localtimestamp - interval '7 days', localtimestamp + interval '1 day', 0, 1),
    (605, '新人券', 1, 3, localtimestamp - interval '7 days', localtimestamp + interval '14 seconds', 0, 1);

-- cancel_unpaid: created 2 hours before the deadline. 1001: a coupon, 50
-- points over two lines of SKU 11, and a line of SKU 12 in after-sale;
-- 1002: another tenant's, its coupon expired meanwhile, no points; 1003: a
-- seckill order (type 1, the job's); 1004: its pay order succeeded (a late
-- callback); 1005: paid; 1006: deleted; 1007: paid by the member while the
-- test runs; 1008: due in two hours.
INSERT INTO trade_order (id, type, user_id, status, pay_order_id, coupon_id, deleted,
                         tenant_id, create_time)
VALUES (1001, 0, 1, 0,  9001, 501,  0, 1, localtimestamp - interval '2 hours' + interval '8 seconds'),
       (1002, 3, 2, 0,  9002, 502,  0, 2, localtimestamp - interval '2 hours' + interval '9 seconds'),
       (1003, 1, 1, 0,  NULL, 503,  0, 1, localtimestamp - interval '2 hours' + interval '8 seconds'),
       (1004, 0, 1, 0,  9004, NULL, 0, 1, localtimestamp - interval '2 hours' + interval '8 seconds'),
       (1005, 0, 1, 10, NULL, NULL, 0, 1, localtimestamp - interval '2 hours' + interval '8 seconds'),
       (1006, 0, 1, 0,  NULL, NULL, 1, 1, localtimestamp - interval '2 hours' + interval '8 seconds'),
       (1007, 0, 3, 0,  NULL, NULL, 0, 1, localtimestamp - interval '2 hours' + interval '14 seconds'),
       (1008, 0, 3, 0,  NULL, NULL, 0, 1, localtimestamp);

-- auto_receive: delivered 14 days before the deadline. 2003: deleted;
-- 2004: received by hand while the test runs; 2005: due in two days.
INSERT INTO trade_order (id, user_id, status, deleted, tenant_id, create_time, delivery_time)
VALUES (2001, 1, 20, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '14 days' + interval '10 seconds'),
       (2002, 2, 20, 0, 2, localtimestamp - interval '20 days', localtimestamp - interval '14 days' + interval '11 seconds'),
       (2003, 1, 20, 1, 1, localtimestamp - interval '20 days', localtimestamp - interval '14 days' + interval '10 seconds'),
       (2004, 1, 20, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '14 days' + interval '14 seconds'),
       (2005, 1, 20, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '12 days');

-- auto_comment: received 7 days before the deadline. 3001: two lines (and
-- a deleted one); 3002: another tenant's, one line reviewed already;
-- 3003: reviewed already; 3004: cancelled after receipt (status 40);
-- 3005: reviewed by its member while the test runs; 3006: due tomorrow.
INSERT INTO trade_order (id, user_id, status, comment_status, deleted, tenant_id, create_time,
                         receive_time)
VALUES (3001, 1, 30, false, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '7 days' + interval '10 seconds'),
       (3002, 2, 30, false, 0, 2, localtimestamp - interval '20 days', localtimestamp - interval '7 days' + interval '12 seconds'),
       (3003, 1, 30, true,  0, 1, localtimestamp - interval '20 days', localtimestamp - interval '7 days' + interval '10 seconds'),
       (3004, 1, 40, false, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '7 days' + interval '10 seconds'),
       (3005, 3, 30, false, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '7 days' + interval '14 seconds'),
       (3006, 1, 30, false, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '6 days');

INSERT INTO trade_order_item (id, user_id, order_id, spu_id, spu_name, sku_id, count, use_point,
                              after_sale_status, comment_status, deleted, tenant_id)
VALUES (1,  1, 1001, 21, 'iPhone 15', 11, 2, 30, 0,  false, 0, 1),
       (2,  1, 1001, 21, 'iPhone 15', 11, 1, 20, 0,  false, 0, 1),
       (3,  1, 1001, 21, 'iPhone 15', 12, 5, 40, 10, false, 0, 1),
       (4,  2, 1002, 22, 'AirPods',   13, 1, 0,  0,  false, 0, 2),
       (5,  1, 1003, 22, 'AirPods',   13, 4, 0,  0,  false, 0, 1),
       (6,  1, 1004, 21, 'iPhone 15', 11, 1, 10, 0,  false, 0, 1),
       (7,  3, 1007, 21, 'iPhone 15', 12, 1, 5,  0,  false, 0, 1),
       (31, 1, 3001, 21, 'iPhone 15', 11, 1, 0,  0,  false, 0, 1),
       (32, 1, 3001, 22, 'AirPods',   13, 2, 0,  0,  false, 0, 1),
       (37, 1, 3001, 21, 'iPhone 15', 12, 1, 0,  0,  false, 1, 1),
       (33, 2, 3002, 21, 'iPhone 15', 12, 1, 0,  0,  true,  0, 2),
       (34, 2, 3002, 21, 'iPhone 15', 11, 1, 0,  0,  false, 0, 2),
       (35, 1, 3004, 21, 'iPhone 15', 11, 1, 0,  0,  false, 0, 1),
       (36, 3, 3005, 22, 'AirPods',   13, 1, 0,  0,  false, 0, 1);
"#;

/// A pool on the test's database whose sessions are in yudao's zone.
async fn yudao_pool(env: &TestEnv) -> PgPool {
    let options: PgConnectOptions = env.settings.database_url.expose().parse().unwrap();
    PgPoolOptions::new()
        .max_connections(2)
        .connect_with(
            options
                .options([("TimeZone", "Asia/Shanghai")])
                .disable_statement_logging(),
        )
        .await
        .unwrap()
}

/// `config/examples/yudao-timers-postgres.toml` on PostgreSQL, as written:
/// the shop publishes `{"order_id": …}` for `cancel_unpaid`;
/// `auto_receive`, `auto_comment` and `coupon_expiry` are found by their
/// watches. Each timer flips exactly the rows due, still in its `from`
/// status and passing its guard (seckill orders, orders whose payment
/// succeeded, deleted rows are left alone), at or after the deadline, once:
/// SKU and SPU stock back for the lines not in after-sale, the coupon back
/// (or expired), the points back with their record, one product review
/// per unreviewed line, one trade_order_log row per flip, each row the
/// service inserts with an id from yudao's sequence and the order's
/// tenant; one event per flip on the timer's routing key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yudao_timers_on_postgres() {
    let env = TestEnv::new().await;
    let shop = Shop {
        url: env.settings.database_url.clone(),
        shop: ShopDb::Postgres(yudao_pool(&env).await),
        _scratch: None,
    };
    shop.run(YUDAO_SCHEMA).await;
    // The indexes the file documents.
    shop.run(&documented_sql(YUDAO, "CREATE INDEX")).await;
    shop.run(YUDAO_ROWS).await;

    let run = WorkedConfig {
        config: YUDAO,
        // The order service publishes each order when it creates it.
        published: (1001..=1008)
            .map(|id: i64| format!(r#"{{"order_id": {id}}}"#))
            .collect(),
        watched: &[
            ("auto_receive", 3),
            ("auto_comment", 3),
            ("coupon_expiry", 2),
        ],
        // While the test runs, before their deadlines: a member pays 1007,
        // another confirms receipt of 2004, reviews 3005, uses coupon 605.
        moves: &[
            (
                "1007 paid",
                "UPDATE trade_order SET status = 10 WHERE id = 1007 AND status = 0 \
                   AND create_time + interval '2 hours' > localtimestamp",
            ),
            (
                "2004 received",
                "UPDATE trade_order SET status = 30, receive_time = localtimestamp \
                  WHERE id = 2004 AND status = 20 \
                    AND delivery_time + interval '14 days' > localtimestamp",
            ),
            (
                "3005 reviewed",
                "UPDATE trade_order SET comment_status = true WHERE id = 3005 \
                   AND NOT comment_status AND receive_time + interval '7 days' > localtimestamp",
            ),
            (
                "605 used",
                "UPDATE promotion_coupon SET status = 2, use_time = localtimestamp \
                  WHERE id = 605 AND status = 1 AND valid_end_time > localtimestamp",
            ),
        ],
        // Paid (1005, 1007), failing the guard (1003, 1004, 1006), already
        // in the timer's `to` status by the member's hand (2004, 3005),
        // used (605).
        answered: &[
            ("cancel_unpaid", Outcome::AlreadyPaid, 2),
            ("cancel_unpaid", Outcome::LeftAlone, 3),
            ("auto_receive", Outcome::AlreadyCancelled, 1),
            ("auto_comment", Outcome::AlreadyCancelled, 1),
            ("coupon_expiry", Outcome::LeftAlone, 1),
        ],
        flipped: &[
            ("trade_order", &[1001, 1002], "status = 40"),
            ("trade_order", &[2001, 2002], "status = 30"),
            ("trade_order", &[3001, 3002], "comment_status"),
            ("promotion_coupon", &[601], "status = 3"),
        ],
        events: &[
            ("order.cancelled", "cancel_unpaid", "1001"),
            ("order.cancelled", "cancel_unpaid", "1002"),
            ("order.received", "auto_receive", "2001"),
            ("order.received", "auto_receive", "2002"),
            ("order.reviewed", "auto_comment", "3001"),
            ("order.reviewed", "auto_comment", "3002"),
            ("coupon.expired", "coupon_expiry", "601"),
        ],
        set_times: &[
            (
                "cancel_unpaid",
                &["cancel_time", "update_time"],
                &[1001, 1002],
            ),
            (
                "auto_receive",
                &["receive_time", "update_time"],
                &[2001, 2002],
            ),
            (
                "auto_comment",
                &["finish_time", "update_time"],
                &[3001, 3002],
            ),
            ("coupon_expiry", &["update_time"], &[601]),
        ],
    };
    let ran = run_worked_config(&env, &shop, run).await;
    let ShopDb::Postgres(shop_pool) = &shop.shop else {
        unreachable!("yudao's shop is on PostgreSQL")
    };

    // Every order: (id, status, cancel_type, comment_status, cancel_time
    // set, receive_time set, finish_time set).
    type Order = (i64, i32, Option<i32>, bool, bool, bool, bool);
    let orders: Vec<Order> = sqlx::query_as(
        "SELECT id, status, cancel_type, comment_status, cancel_time IS NOT NULL, \
                receive_time IS NOT NULL, finish_time IS NOT NULL \
           FROM trade_order ORDER BY id",
    )
    .fetch_all(shop_pool)
    .await
    .unwrap();
    let (t, f) = (true, false);
    assert_eq!(
        orders,
        [
            (1001, 40, Some(10), f, t, f, f),
            (1002, 40, Some(10), f, t, f, f),
            (1003, 0, None, f, f, f, f),
            (1004, 0, None, f, f, f, f),
            (1005, 10, None, f, f, f, f),
            (1006, 0, None, f, f, f, f),
            (1007, 10, None, f, f, f, f),
            (1008, 0, None, f, f, f, f),
            (2001, 30, None, f, f, t, f),
            (2002, 30, None, f, f, t, f),
            (2003, 20, None, f, f, f, f),
            (2004, 30, None, f, f, t, f),
            (2005, 20, None, f, f, f, f),
            (3001, 30, None, t, f, t, t),
            (3002, 30, None, t, f, t, t),
            (3003, 30, None, t, f, t, f),
            (3004, 40, None, f, f, t, f),
            (3005, 30, None, t, f, t, f),
            (3006, 30, None, f, f, t, f),
        ]
    );

    // Stock back for 1001's lines not in after-sale (SKU 11: 2 + 1) and
    // 1002's (SKU 13: 1), on the SKUs and their SPUs, once.
    let skus: Vec<(i64, Option<i32>, Option<i32>)> =
        sqlx::query_as("SELECT id, stock, sales_count FROM product_sku ORDER BY id")
            .fetch_all(shop_pool)
            .await
            .unwrap();
    assert_eq!(
        skus,
        [
            (11, Some(103), Some(7)),
            (12, Some(50), Some(5)),
            (13, Some(21), Some(2))
        ]
    );
    let spus: Vec<(i64, i32, Option<i32>)> =
        sqlx::query_as("SELECT id, stock, sales_count FROM product_spu ORDER BY id")
            .fetch_all(shop_pool)
            .await
            .unwrap();
    assert_eq!(spus, [(21, 153, Some(12)), (22, 21, Some(2))]);
    // Coupons: 501 back to unused, 502 expired (its validity ended), 601
    // expired by coupon_expiry; the others as they were or as their member
    // left them.
    let coupons: Vec<(i64, i32)> =
        sqlx::query_as("SELECT id, status::int4 FROM promotion_coupon ORDER BY id")
            .fetch_all(shop_pool)
            .await
            .unwrap();
    assert_eq!(
        coupons,
        [
            (501, 1),
            (502, 3),
            (503, 2),
            (601, 3),
            (602, 1),
            (603, 2),
            (604, 1),
            (605, 2)
        ]
    );
    // Points: 50 back to member 1 (the after-sale line's 40 not), with
    // their record; nobody else's change.
    let points: Vec<(i64, i32)> = sqlx::query_as("SELECT id, point FROM member_user ORDER BY id")
        .fetch_all(shop_pool)
        .await
        .unwrap();
    assert_eq!(points, [(1, 250), (2, 100), (3, 0)]);
    type Record = (bool, i64, String, i32, String, i32, i32, i64);
    let records: Vec<Record> = sqlx::query_as(
        "SELECT id >= 100, user_id, biz_id, biz_type::int4, description, point, total_point, \
                tenant_id \
           FROM member_point_record ORDER BY id",
    )
    .fetch_all(shop_pool)
    .await
    .unwrap();
    // (id from member_point_record_seq, user, biz id, biz type, description,
    // points, balance after, tenant)
    assert_eq!(
        records,
        [(
            true,
            1,
            "1001".to_owned(),
            12,
            "订单取消，退还 50 积分".to_owned(),
            50,
            250,
            1
        )]
    );

    // One review per unreviewed, undeleted line of 3001 and 3002, with the
    // member's name and avatar, the SPU's name, the SKU's picture and
    // properties, and the order's tenant.
    type Review = (
        i64,
        i64,
        i64,
        Option<String>,
        Option<String>,
        String,
        String,
        Option<String>,
        Option<i32>,
        i64,
    );
    let reviews: Vec<Review> = sqlx::query_as(
        "SELECT order_id, order_item_id, sku_id, user_nickname, user_avatar, spu_name, \
                sku_pic_url, sku_properties, scores::int4, tenant_id \
           FROM product_comment ORDER BY order_item_id",
    )
    .fetch_all(shop_pool)
    .await
    .unwrap();
    let text = |s: &str| Some(s.to_owned());
    assert_eq!(
        reviews,
        [
            (
                3001,
                31,
                11,
                text("芋艿"),
                text("https://example.com/avatar/1.png"),
                "iPhone 15".to_owned(),
                "https://example.com/sku/11.png".to_owned(),
                text(r#"[{"propertyId":1,"propertyName":"颜色","valueId":2,"valueName":"黑色"}]"#),
                Some(5),
                1
            ),
            (
                3001,
                32,
                13,
                text("芋艿"),
                text("https://example.com/avatar/1.png"),
                "AirPods".to_owned(),
                "https://example.com/sku/13.png".to_owned(),
                None,
                Some(5),
                1
            ),
            (
                3002,
                34,
                11,
                text("小王"),
                text(""),
                "iPhone 15".to_owned(),
                "https://example.com/sku/11.png".to_owned(),
                text(r#"[{"propertyId":1,"propertyName":"颜色","valueId":2,"valueName":"黑色"}]"#),
                Some(5),
                2
            ),
        ]
    );
    let comment_ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM product_comment ORDER BY id")
        .fetch_all(shop_pool)
        .await
        .unwrap();
    assert!(
        comment_ids.iter().all(|id| *id >= 100),
        "ids from product_comment_seq: {comment_ids:?}"
    );
    // The lines reviewed: 3001's and 3002's, not the deleted one (37).
    let reviewed: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM trade_order_item WHERE comment_status ORDER BY id")
            .fetch_all(shop_pool)
            .await
            .unwrap();
    assert_eq!(reviewed, [31, 32, 33, 34]);

    // One log row per flip, ids from trade_order_log_seq, the order's tenant.
    let logs: Vec<(i64, i32, i32, i32, i64)> = sqlx::query_as(
        "SELECT order_id, before_status::int4, after_status::int4, operate_type, tenant_id \
           FROM trade_order_log ORDER BY order_id",
    )
    .fetch_all(shop_pool)
    .await
    .unwrap();
    assert_eq!(
        logs,
        [
            (1001, 0, 40, 41, 1),
            (1002, 0, 40, 41, 2),
            (2001, 20, 30, 31, 1),
            (2002, 20, 30, 31, 2),
            (3001, 30, 30, 34, 1),
            (3002, 30, 30, 34, 2),
        ]
    );
    let log_ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM trade_order_log ORDER BY id")
        .fetch_all(shop_pool)
        .await
        .unwrap();
    assert!(
        log_ids.len() == 6 && log_ids.iter().all(|id| *id >= 100),
        "ids from trade_order_log_seq: {log_ids:?}"
    );

    ran.finish(&env, &shop).await;
}
