//! Timers beyond cancel-unpaid, on both dialects: the same small shop on
//! PostgreSQL and on MariaDB, with three timers from one config file —
//! `cancel_unpaid` and `auto_receive` on the same orders table, and
//! `coupon_expiry` on a table of its own (whose ids overlap the orders').
//!
//! - Each timer flips only rows in its own `from` status, of its own table:
//!   a message naming the wrong timer for a row, a row that moved on (paid,
//!   received by hand) before its deadline, a coupon already used, are all
//!   left alone; an unknown timer name is parked with its reason. Effects
//!   (an `also` log row, one event on the timer's routing key) exist for
//!   exactly the rows flipped, none early.
//! - `backfill --timer NAME` schedules that timer's waiting rows only; the
//!   other timers' rows stay untouched past their deadlines until a
//!   `backfill` of every timer (the sweeper is off, so nothing else could
//!   flip them).
//! - A `watch` timer flips rows nobody published for, on time, with two
//!   replicas running: one scans at a time (the rows are scheduled once),
//!   and when the scanning replica stops, the other takes over.

use std::time::Duration;

use order_timeout::settings::{SecretUrl, Settings};
use order_timeout::testing::metrics::{Metrics, Outcome};
use order_timeout::testing::store::Dialect;
use order_timeout_tools::scratch;
use sqlx::{AssertSqlSafe, MySqlPool, PgPool};

use crate::common::{TestEnv, matrix, on_rabbitmq4};
use crate::store::{mysql_base, mysql_pool};
use crate::worked_configs::{keyed, read_events};

/// How long a test waits for what it expects (every deadline is at most
/// 15 s after the rows are written).
const WAIT: Duration = Duration::from_secs(45);

/// Lateness allowed for a row scheduled ahead of its deadline (a published
/// message or a watch): generous, so that a loaded CI machine does not
/// flake; a real miss would be the sweeper's (off here) or never. (What
/// a watch's lease that runs out instead of being given back would delay
/// is checked on the lease itself.)
const ON_TIME: i64 = 5_000;

/// The small shop's database: this test's PostgreSQL database, or a fresh
/// MariaDB one (dropped afterwards).
struct ShopDb {
    dialect: Dialect,
    url: SecretUrl,
    pool: Pool,
    /// The MariaDB database to drop.
    scratch: Option<String>,
}

enum Pool {
    Pg(PgPool),
    My(MySqlPool),
}

impl ShopDb {
    /// The shop's tables on `dialect`: orders, coupons and the log every
    /// timer's `also` statement writes.
    async fn new(env: &TestEnv, dialect: Dialect) -> Self {
        let db = match dialect {
            Dialect::Postgres => Self {
                dialect,
                url: env.settings.database_url.clone(),
                pool: Pool::Pg(env.pool.clone()),
                scratch: None,
            },
            Dialect::MySql => {
                let name = scratch::owned_name("ot_timers");
                let url = scratch::with_path(&mysql_base(), &name).unwrap();
                order_timeout::testing::store::migrate(&url).await.unwrap();
                let pool = mysql_pool(&url, "+00:00", 2).await;
                Self {
                    dialect,
                    url,
                    pool: Pool::My(pool),
                    scratch: Some(name),
                }
            }
        };
        let ts = db.timestamp_type();
        db.exec(&format!(
            "CREATE TABLE shop_order (\
               id BIGINT PRIMARY KEY, status SMALLINT NOT NULL, \
               pay_deadline {ts} NOT NULL, receive_deadline {ts} NULL, \
               flipped_at {ts} NULL, flipped_by VARCHAR(32) NULL)"
        ))
        .await;
        db.exec(&format!(
            "CREATE TABLE coupon_user (\
               id BIGINT PRIMARY KEY, status SMALLINT NOT NULL, \
               end_time {ts} NOT NULL, expired_at {ts} NULL)"
        ))
        .await;
        db.exec(
            "CREATE TABLE flip_log (timer VARCHAR(32) NOT NULL, id BIGINT NOT NULL, \
               PRIMARY KEY (timer, id))",
        )
        .await;
        db
    }

    fn timestamp_type(&self) -> &'static str {
        match self.dialect {
            Dialect::Postgres => "timestamptz",
            Dialect::MySql => "DATETIME(6)",
        }
    }

    /// The database's clock, to the microsecond, as the `set` columns read
    /// it.
    fn now(&self) -> &'static str {
        match self.dialect {
            Dialect::Postgres => "clock_timestamp()",
            Dialect::MySql => "NOW(6)",
        }
    }

    /// The database's clock plus `ms` milliseconds (negative: the past).
    fn in_ms(&self, ms: i64) -> String {
        match self.dialect {
            Dialect::Postgres => format!("(now() + interval '{ms} milliseconds')"),
            Dialect::MySql => format!("(NOW(6) + INTERVAL {} MICROSECOND)", ms * 1000),
        }
    }

    /// The order id's placeholder in an `also` statement.
    fn param(&self) -> &'static str {
        match self.dialect {
            Dialect::Postgres => "$1",
            Dialect::MySql => "?",
        }
    }

    async fn exec(&self, sql: &str) {
        let sql = AssertSqlSafe(sql.to_owned());
        let done = match &self.pool {
            Pool::Pg(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
            Pool::My(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
        };
        done.unwrap_or_else(|e| panic!("{e}"));
    }

    /// The first column of the first row of `sql`, an integer.
    /// The first column of `sql`'s one row, as text (NULL: `None`).
    async fn text(&self, sql: &str) -> Option<String> {
        let sql = AssertSqlSafe(sql.to_owned());
        match &self.pool {
            Pool::Pg(p) => sqlx::query_scalar(sql).fetch_one(p).await,
            Pool::My(p) => sqlx::query_scalar(sql).fetch_one(p).await,
        }
        .unwrap()
    }

    async fn int(&self, sql: &str) -> i64 {
        let sql = AssertSqlSafe(sql.to_owned());
        match &self.pool {
            Pool::Pg(p) => sqlx::query_scalar(sql).fetch_one(p).await,
            Pool::My(p) => sqlx::query_scalar(sql).fetch_one(p).await,
        }
        .unwrap()
    }

    /// `(id, status)` of every row of `table`, by id.
    async fn statuses(&self, table: &str) -> Vec<(i64, i16)> {
        let sql = AssertSqlSafe(format!("SELECT id, status FROM {table} ORDER BY id"));
        match &self.pool {
            Pool::Pg(p) => sqlx::query_as(sql).fetch_all(p).await,
            Pool::My(p) => sqlx::query_as(sql).fetch_all(p).await,
        }
        .unwrap()
    }

    /// `(timer, id)` of every `also` log row.
    async fn log(&self) -> Vec<(String, i64)> {
        let sql = "SELECT timer, id FROM flip_log ORDER BY timer, id";
        match &self.pool {
            Pool::Pg(p) => sqlx::query_as(sql).fetch_all(p).await,
            Pool::My(p) => sqlx::query_as(sql).fetch_all(p).await,
        }
        .unwrap()
    }

    /// An order row: `status`, due to be cancelled in `pay_ms` and
    /// received in `receive_ms` (milliseconds from now).
    async fn order(&self, id: i64, status: i16, pay_ms: i64, receive_ms: Option<i64>) {
        let receive = receive_ms.map_or("NULL".to_owned(), |ms| self.in_ms(ms));
        self.exec(&format!(
            "INSERT INTO shop_order (id, status, pay_deadline, receive_deadline) \
             VALUES ({id}, {status}, {}, {receive})",
            self.in_ms(pay_ms)
        ))
        .await;
    }

    /// A coupon: `status`, running out in `end_ms` milliseconds.
    async fn coupon(&self, id: i64, status: i16, end_ms: i64) {
        self.exec(&format!(
            "INSERT INTO coupon_user (id, status, end_time) VALUES ({id}, {status}, {})",
            self.in_ms(end_ms)
        ))
        .await;
    }

    /// The config file of this shop: the default timer and two more;
    /// `coupon_watch` is the coupon timer's `watch` ("" = off). The
    /// sweeper sweeps once an hour, after the test (a watch needs it on),
    /// so that only messages, backfills and watches flip rows.
    fn config(&self, coupon_watch: &str) -> String {
        let (now, p) = (self.now(), self.param());
        format!(
            r#"
            [sweeper]
            interval = "1h"
            catch_up_window = "0s"

            [orders]
            table = "shop_order"
            unpaid = 0
            paid = 1
            cancelled = 4
            deadline = "pay_deadline"
            set = {{ flipped_at = "{now}", flipped_by = "'cancel_unpaid'" }}
            also = ["INSERT INTO flip_log (timer, id) VALUES ('cancel_unpaid', {p})"]

            [inventory]
            release = "none"

            [[timers]]
            name = "auto_receive"
            from = 2
            to = 3
            deadline = "receive_deadline"
            set = {{ flipped_at = "{now}", flipped_by = "'auto_receive'" }}
            also = ["INSERT INTO flip_log (timer, id) VALUES ('auto_receive', {p})"]
            event = "order.received"

            [[timers]]
            name = "coupon_expiry"
            table = "coupon_user"
            from = 0
            to = 2
            deadline = "end_time"
            set = {{ expired_at = "{now}" }}
            also = ["INSERT INTO flip_log (timer, id) VALUES ('coupon_expiry', {p})"]
            watch = "{coupon_watch}"
            "#
        )
    }

    /// The settings a deployment of [`ShopDb::config`] gets on this test's
    /// vhost, inventory and a free port.
    fn settings(&self, env: &TestEnv, coupon_watch: &str) -> Settings {
        let mut settings: Settings =
            toml::from_str(&self.config(coupon_watch)).expect("the config parses");
        settings.amqp_url = env.settings.amqp_url.clone();
        settings.database_url = self.url.clone();
        settings.inventory_url = env.settings.inventory_url.clone();
        settings.http_addr = env.settings.http_addr;
        settings.cascade_shards = env.settings.cascade_shards;
        settings.shutdown_timeout = env.settings.shutdown_timeout;
        settings.validate().expect("the config validates");
        settings
    }

    /// Rows flipped before their deadline, by the `set` columns: none may
    /// be.
    async fn early(&self) -> i64 {
        self.int(
            "SELECT (SELECT COUNT(*) FROM shop_order WHERE flipped_by = 'cancel_unpaid' \
                       AND flipped_at < pay_deadline) \
                  + (SELECT COUNT(*) FROM shop_order WHERE flipped_by = 'auto_receive' \
                       AND flipped_at < receive_deadline) \
                  + (SELECT COUNT(*) FROM coupon_user WHERE expired_at < end_time)",
        )
        .await
    }
}

impl Drop for ShopDb {
    fn drop(&mut self) {
        if let Some(name) = &self.scratch {
            let _ = scratch::drop_database_blocking(&mysql_base(), name);
        }
    }
}

/// Waits until `metrics` counted at least `n` messages of `timer` with
/// `outcome`.
async fn wait_count(env: &TestEnv, metrics: &Metrics, timer: &str, outcome: Outcome, n: u64) {
    env.eventually(WAIT, &format!("{n} {outcome:?} of {timer}"), || async {
        metrics.count_of(timer, outcome) >= n
    })
    .await;
}

/// Runs the real binary's `backfill` with `config` and extra `args`;
/// returns its standard output.
async fn backfill(env: &TestEnv, db: &ShopDb, config: &str, args: &[&str]) -> String {
    let file = std::env::temp_dir().join(format!(
        "{}-timers-{}.toml",
        env.name,
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &file,
        format!(
            "cascade_shards = {}\n{config}",
            env.settings.cascade_shards.get()
        ),
    )
    .unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_order-timeout"));
    command
        .args(["--config", file.to_str().unwrap(), "backfill"])
        .args(args)
        .env("AMQP_URL", env.settings.amqp_url.expose())
        .env("DATABASE_URL", db.url.expose())
        .env("RUST_LOG", "warn");
    let out = tokio::task::spawn_blocking(move || {
        crate::bounds::output_within(
            &mut command,
            Duration::from_secs(120),
            "order-timeout backfill",
        )
    })
    .await
    .unwrap();
    let _ = std::fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "backfill {args:?}: {stdout}{stderr}");
    // Its own normal end logs no error (its publisher's channels closed
    // before the connection, not left to race it).
    assert!(!stderr.contains("ERROR"), "backfill {args:?}: {stderr}");
    stdout
}

/// Each timer flips only rows of its table in its `from` status; see the
/// module docs.
async fn timers_flip_only_their_own_rows(dialect: Dialect) {
    let env = TestEnv::new().await;
    let db = ShopDb::new(&env, dialect).await;
    let hour = 3_600_000;
    // Orders: 1 unpaid and due; 2 unpaid, paid before its deadline; 3
    // shipped and due; 4 shipped, received by hand before its deadline; 5
    // unpaid, sent an auto_receive message; 6 shipped, sent a cancel
    // message. Coupons (ids overlap the orders'): 1 unused and due; 2 used.
    db.order(1, 0, 3_000, None).await;
    db.order(2, 0, 3_000, None).await;
    db.order(3, 2, hour, Some(4_000)).await;
    db.order(4, 2, hour, Some(4_000)).await;
    db.order(5, 0, hour, Some(4_000)).await;
    db.order(6, 2, 3_000, Some(hour)).await;
    db.coupon(1, 0, 5_000).await;
    db.coupon(2, 1, 5_000).await;

    let mut events = env.subscribe_events_on("#").await;
    let service = env.service_with(db.settings(&env, "")).await;
    let metrics = service.metrics.clone();
    for body in [
        // The shop's order service publishes bare ids for cancel_unpaid.
        "1",
        "2",
        r#"{"order_id": 6}"#,
        r#"{"order_id": 3, "timer": "auto_receive"}"#,
        r#"{"order_id": "4", "timer": "auto_receive"}"#,
        r#"{"order_id": 5, "timer": "auto_receive"}"#,
        r#"{"order_id": 1, "timer": "coupon_expiry"}"#,
        r#"{"order_id": 2, "timer": "coupon_expiry"}"#,
        r#"{"order_id": 7, "timer": "no_such_timer"}"#,
    ] {
        env.publish_raw(body.as_bytes()).await;
    }
    // Before their deadlines, the shop moves two rows on.
    db.exec("UPDATE shop_order SET status = 1 WHERE id = 2 AND status = 0")
        .await;
    db.exec(&format!(
        "UPDATE shop_order SET status = 3, flipped_at = {}, flipped_by = 'hand' \
          WHERE id = 4 AND status = 2",
        db.now()
    ))
    .await;

    wait_count(&env, &metrics, "cancel_unpaid", Outcome::Cancelled, 1).await;
    wait_count(&env, &metrics, "cancel_unpaid", Outcome::AlreadyPaid, 1).await;
    wait_count(&env, &metrics, "auto_receive", Outcome::Cancelled, 1).await;
    wait_count(&env, &metrics, "coupon_expiry", Outcome::Cancelled, 1).await;
    // The rows that moved on, or were never in the timer's status, were
    // answered too: left alone (6 shipped, 5 unpaid, coupon 2 used) or
    // already in the `to` status (4, by hand).
    env.eventually(WAIT, "every message answered", || async {
        metrics.count_of("cancel_unpaid", Outcome::LeftAlone)
            + metrics.count_of("auto_receive", Outcome::LeftAlone)
            + metrics.count_of("auto_receive", Outcome::AlreadyCancelled)
            + metrics.count_of("coupon_expiry", Outcome::LeftAlone)
            >= 4
    })
    .await;

    assert_eq!(
        db.statuses("shop_order").await,
        vec![(1, 4), (2, 1), (3, 3), (4, 3), (5, 0), (6, 2)],
        "orders: only 1 cancelled and 3 received by a timer"
    );
    assert_eq!(
        db.statuses("coupon_user").await,
        vec![(1, 2), (2, 1)],
        "coupons: only 1 expired"
    );
    assert_eq!(
        db.int("SELECT COUNT(*) FROM shop_order WHERE id = 4 AND flipped_by = 'hand'")
            .await,
        1,
        "the order received by hand keeps the shop's own columns"
    );
    assert_eq!(
        db.log().await,
        vec![
            ("auto_receive".to_owned(), 3),
            ("cancel_unpaid".to_owned(), 1),
            ("coupon_expiry".to_owned(), 1),
        ],
        "each timer's `also` ran once, for its flip only"
    );
    assert_eq!(db.early().await, 0, "never early");

    // One event per flip, on the timer's routing key (the default one for
    // coupon_expiry: order.<name>), none early.
    let got = read_events(&mut events, 4, Duration::from_secs(5)).await;
    assert_eq!(
        keyed(&got),
        vec![
            ("order.cancelled".into(), "cancel_unpaid".into(), "1".into()),
            (
                "order.coupon_expiry".into(),
                "coupon_expiry".into(),
                "1".into()
            ),
            ("order.received".into(), "auto_receive".into(), "3".into()),
        ]
    );
    for (_, e) in &got {
        assert!(e.lateness_ms < ON_TIME, "on time: {e:?}");
    }

    // The unknown timer's message is parked with its reason.
    let parked = env.drain_parked().await;
    assert_eq!(parked.len(), 1, "one parked message");
    let kind =
        parked[0].properties.headers().as_ref().and_then(|h| {
            order_timeout::testing::broker::header_str(h.inner().get("x-error-kind"))
        });
    assert_eq!(kind.as_deref(), Some("unknown_timer"));
    service.stop().await.unwrap();
}

/// `backfill --timer NAME` schedules only that timer's rows; see the
/// module docs.
async fn backfill_schedules_one_timer_at_a_time(dialect: Dialect) {
    let env = TestEnv::new().await;
    let db = ShopDb::new(&env, dialect).await;
    let hour = 3_600_000;
    // Rows written before the service knew of them: two unpaid orders, two
    // shipped ones, one of each long overdue; two unused coupons; and rows
    // no timer wants (paid, received, used).
    let written = tokio::time::Instant::now();
    db.order(10, 0, 6_000, None).await;
    db.order(11, 0, -hour, None).await;
    db.order(12, 2, hour, Some(6_000)).await;
    db.order(13, 2, hour, Some(-hour)).await;
    db.order(14, 1, -hour, Some(-hour)).await;
    db.order(15, 3, -hour, Some(-hour)).await;
    db.coupon(10, 0, 6_000).await;
    db.coupon(11, 0, -hour).await;
    db.coupon(12, 1, -hour).await;

    let settings = db.settings(&env, "");
    let service = env.service_with(settings).await;
    let metrics = service.metrics.clone();
    let config = db.config("");

    let out = backfill(&env, &db, &config, &["--timer", "auto_receive"]).await;
    assert!(
        out.contains("timer auto_receive: scheduled 2 rows of shop_order in status 2"),
        "{out}"
    );
    assert!(
        !out.contains("cancel_unpaid") && !out.contains("coupon_expiry"),
        "{out}"
    );
    wait_count(&env, &metrics, "auto_receive", Outcome::Cancelled, 2).await;
    // The other timers' rows were not scheduled and nothing else flips
    // them (the sweeper sweeps once an hour): checked once the latest of
    // their deadlines (6 s after they were written) is 3 s past, longer than
    // a message scheduled for it would take to flip it.
    tokio::time::sleep_until(written + Duration::from_secs(6 + 3)).await;
    assert_eq!(
        db.statuses("shop_order").await,
        vec![(10, 0), (11, 0), (12, 3), (13, 3), (14, 1), (15, 3)],
        "only auto_receive's rows flipped"
    );
    assert_eq!(
        db.statuses("coupon_user").await,
        vec![(10, 0), (11, 0), (12, 1)]
    );
    assert_eq!(metrics.count_of("cancel_unpaid", Outcome::Cancelled), 0);
    assert_eq!(metrics.count_of("coupon_expiry", Outcome::Cancelled), 0);

    // Then every timer (the default): the rest, now overdue, at once; the
    // received ones again, harmlessly.
    let out = backfill(&env, &db, &config, &[]).await;
    assert!(
        out.contains("scheduled 2 unpaid orders of shop_order"),
        "{out}"
    );
    assert!(
        out.contains("timer auto_receive: scheduled 0 rows"),
        "{out}"
    );
    assert!(
        out.contains("timer coupon_expiry: scheduled 2 rows of coupon_user in status 0"),
        "{out}"
    );
    env.eventually(WAIT, "every waiting row flipped", || async {
        db.statuses("shop_order").await
            == vec![(10, 4), (11, 4), (12, 3), (13, 3), (14, 1), (15, 3)]
            && db.statuses("coupon_user").await == vec![(10, 2), (11, 2), (12, 1)]
    })
    .await;
    assert_eq!(
        db.log().await,
        vec![
            ("auto_receive".to_owned(), 12),
            ("auto_receive".to_owned(), 13),
            ("cancel_unpaid".to_owned(), 10),
            ("cancel_unpaid".to_owned(), 11),
            ("coupon_expiry".to_owned(), 10),
            ("coupon_expiry".to_owned(), 11),
        ],
        "each flip's effects once"
    );
    assert_eq!(db.early().await, 0, "never early");
    service.stop().await.unwrap();
}

/// A watch timer flips rows nobody published for, on time, one replica
/// scanning at a time; see the module docs.
async fn a_watch_flips_unpublished_rows_on_time_across_replicas(dialect: Dialect) {
    let env = TestEnv::new().await;
    let db = ShopDb::new(&env, dialect).await;
    let mut events = env.subscribe_events_on("#").await;
    let first = env.service_with(db.settings(&env, "2s")).await;
    let second = env.service_with(db.settings(&env, "2s")).await;
    let watched =
        |a: &Metrics, b: &Metrics| a.watched_of("coupon_expiry") + b.watched_of("coupon_expiry");

    // Coupons issued while both replicas run, nobody publishing: due in 6
    // to 12 s (over two windows ahead, so a scan sees each one before it is
    // due); and coupons used before they run out.
    for i in 0..24 {
        db.coupon(100 + i, 0, 6_000 + i * 250).await;
    }
    for i in 0..4 {
        db.coupon(200 + i, 1, 6_000).await;
    }
    env.eventually(WAIT, "the first 24 coupons expired", || async {
        db.int("SELECT COUNT(*) FROM coupon_user WHERE status = 2")
            .await
            == 24
    })
    .await;
    assert_eq!(
        watched(&first.metrics, &second.metrics),
        24,
        "one replica scans at a time: each row scheduled once"
    );
    let got = read_events(&mut events, 24, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 24, "one event per flip");
    for (key, e) in &got {
        assert_eq!(
            (key.as_str(), e.timer.as_str()),
            ("order.coupon_expiry", "coupon_expiry")
        );
        assert!(e.lateness_ms < ON_TIME, "on time: {e:?}");
    }
    let ids: std::collections::BTreeSet<_> = keyed(&got).into_iter().map(|k| k.2).collect();
    assert_eq!(ids.len(), 24, "24 different coupons");

    // The scanning replica stops (gracefully: it gives the lease back);
    // the other takes over, and the next coupons are on time too.
    let (scanner, other) = if first.metrics.watched_of("coupon_expiry") > 0 {
        (first, second)
    } else {
        (second, first)
    };
    let before = other.metrics.watched_of("coupon_expiry");
    let holder = db
        .text("SELECT holder FROM order_timeout_watch WHERE timer = 'coupon_expiry'")
        .await
        .expect("the scanning replica holds the watch");
    scanner.stop().await.unwrap();
    assert_eq!(
        db.int(&format!(
            "SELECT COUNT(*) FROM order_timeout_watch \
              WHERE timer = 'coupon_expiry' AND holder = '{holder}' AND lease_until IS NOT NULL"
        ))
        .await,
        0,
        "the stopped replica gave its watch's lease back: the other takes over at its next \
         tick, not when the lease (at least 10 s) runs out"
    );
    for i in 0..8 {
        db.coupon(300 + i, 0, 6_000 + i * 250).await;
    }
    env.eventually(WAIT, "the next 8 coupons expired", || async {
        db.int("SELECT COUNT(*) FROM coupon_user WHERE status = 2")
            .await
            == 32
    })
    .await;
    assert_eq!(
        other.metrics.watched_of("coupon_expiry") - before,
        8,
        "the other replica scheduled the rows after the stop"
    );
    let got = read_events(&mut events, 8, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 8);
    for (_, e) in &got {
        assert!(e.lateness_ms < ON_TIME, "on time: {e:?}");
    }
    assert_eq!(
        db.int("SELECT COUNT(*) FROM coupon_user WHERE status = 1")
            .await,
        4,
        "used coupons left alone"
    );
    assert_eq!(
        db.int("SELECT COUNT(*) FROM flip_log WHERE timer = 'coupon_expiry'")
            .await,
        32,
        "each flip's `also` once"
    );
    assert_eq!(db.early().await, 0, "never early");
    other.stop().await.unwrap();
}

// Every case above, for both dialects (`timers::postgres::…`,
// `timers::mysql::…`).
matrix! {
    pass: dialect,
    cells: [postgres(Postgres, Rabbitmq3), mysql(MySql, Rabbitmq3)],
    cases: [
        timers_flip_only_their_own_rows,
        backfill_schedules_one_timer_at_a_time,
        a_watch_flips_unpublished_rows_on_time_across_replicas,
    ],
}

// On RabbitMQ 4.x, with the orders on PostgreSQL.
on_rabbitmq4!(
    timers_flip_only_their_own_rows,
    a_watch_flips_unpublished_rows_on_time_across_replicas,
);
