//! Zone-less deadlines are read in the zone the shop wrote them in (issue
//! 57), on both dialects: a shop database whose sessions start on local
//! time (`-05:00`, `+08:00`, `America/New_York`, and a zone whose clocks
//! went back a minute ago), a shop writing `NOW() + INTERVAL …` in its
//! ordinary session, and the service at its default config. Each shop is
//! a database of its own: on PostgreSQL with `ALTER DATABASE … SET
//! timezone`, on MariaDB a private server started in that zone (the
//! machine's shared server's `time_zone` is every test's).
//!
//! A shop's ordinary session: on PostgreSQL one that names no zone (psql,
//! psycopg, PHP); sqlx names UTC in its start-up packet, so the shop's
//! connection here sets the database's zone itself, as such a session has
//! it. On MariaDB a session that sets nothing (`timezone(None)`).
//!
//! They need root and `ip netns` for the private MariaDB (this suite runs
//! as root).

use std::time::{Duration, Instant};

use chrono::{Datelike, Timelike, Utc};
use order_timeout::settings::{InventorySettings, Release, SecretUrl, Settings};
use order_timeout::testing::metrics::Outcome;
use order_timeout::testing::store::Dialect;
use order_timeout_tools::private_mariadb::{PrivateMariaDb, Zone};
use order_timeout_tools::private_pg::PrivatePostgres;
use order_timeout_tools::scratch;
use sqlx::{Connection, Executor};

use crate::common::TestEnv;
use crate::common::http_get;

/// A shop's database whose sessions start in a zone of their own.
struct ZonedShop {
    dialect: Dialect,
    url: SecretUrl,
    /// PostgreSQL: the zone, as the shop's session sets it.
    pg_zone: Option<String>,
    /// PostgreSQL on the shared server: its base URL and database name,
    /// dropped with the shop.
    pg_scratch: Option<(SecretUrl, String)>,
    _mariadb: Option<PrivateMariaDb>,
    _postgres: Option<PrivatePostgres>,
}

/// `zone` as PostgreSQL's `timezone` setting: an ISO offset (`-05:00`) in
/// POSIX form (`<-05:00>+05:00`, the sign the other way round), names and
/// POSIX rules as they are.
fn pg_zone(zone: &str) -> String {
    match zone.as_bytes().first() {
        Some(b'+') => format!("<{zone}>-{}", &zone[1..]),
        Some(b'-') => format!("<{zone}>+{}", &zone[1..]),
        _ => zone.to_owned(),
    }
}

const PG_TABLES: &str = "CREATE TABLE orders (id varchar(32) PRIMARY KEY, \
     status varchar(16) NOT NULL, expires_at timestamp(3) NOT NULL, \
     cancelled_at timestamp(3), cancel_reason varchar(64)); \
     CREATE TABLE order_items (order_id varchar(32) NOT NULL, sku varchar(32) NOT NULL, \
     quantity int NOT NULL)";

const MYSQL_TABLES: [&str; 2] = [
    "CREATE TABLE orders (id varchar(32) PRIMARY KEY, status varchar(16) NOT NULL, \
     expires_at DATETIME(3) NOT NULL, cancelled_at DATETIME(3) NULL, \
     cancel_reason varchar(64) NULL)",
    "CREATE TABLE order_items (order_id varchar(32) NOT NULL, sku varchar(32) NOT NULL, \
     quantity int NOT NULL)",
];

impl ZonedShop {
    /// A PostgreSQL database on the shared server whose sessions start in
    /// `zone` (`ALTER DATABASE … SET timezone`).
    async fn postgres(zone: &str) -> Self {
        let base = scratch::test_pg_server();
        let name = scratch::owned_name("ot_zone");
        Self::postgres_on(base, name, zone, None).await
    }

    /// A PostgreSQL database in `zone` on the private server `server`.
    async fn postgres_private(server: PrivatePostgres, zone: &str) -> Self {
        let base = server.base_url();
        Self::postgres_on(base, "shop".into(), zone, Some(server)).await
    }

    async fn postgres_on(
        base: SecretUrl,
        name: String,
        zone: &str,
        server: Option<PrivatePostgres>,
    ) -> Self {
        let url = scratch::with_path(&base, &name).unwrap();
        order_timeout::testing::store::migrate(&url).await.unwrap();
        let zone = pg_zone(zone);
        let options = order_timeout::testing::store::pg_options(&url).unwrap();
        let mut conn = sqlx::PgConnection::connect_with(&options).await.unwrap();
        conn.execute(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE \"{name}\" SET timezone = '{zone}'"
        )))
        .await
        .unwrap();
        conn.execute(PG_TABLES).await.unwrap();
        let _ = conn.close().await;
        Self {
            dialect: Dialect::Postgres,
            url,
            pg_zone: Some(zone),
            pg_scratch: server.is_none().then_some((base, name)),
            _mariadb: None,
            _postgres: server,
        }
    }

    /// A database on a private MariaDB server keeping `zone`.
    async fn mariadb(zone: Zone) -> Self {
        let server = PrivateMariaDb::start(zone)
            .await
            .unwrap_or_else(|e| panic!("the private MariaDB: {e}"));
        let url = scratch::with_path(&server.base_url(), "shop").unwrap();
        order_timeout::testing::store::migrate(&url).await.unwrap();
        let shop = Self {
            dialect: Dialect::MySql,
            url,
            pg_zone: None,
            pg_scratch: None,
            _mariadb: Some(server),
            _postgres: None,
        };
        for ddl in MYSQL_TABLES {
            shop.exec(ddl).await;
        }
        shop
    }

    /// A connection as the shop's programs have one: in the database's
    /// own zone.
    async fn session(&self) -> ShopSession {
        match self.dialect {
            Dialect::Postgres => {
                let options = order_timeout::testing::store::pg_options(&self.url).unwrap();
                let mut conn = sqlx::PgConnection::connect_with(&options).await.unwrap();
                let zone = self.pg_zone.as_deref().unwrap();
                sqlx::query("SELECT set_config('TimeZone', $1, false)")
                    .bind(zone)
                    .execute(&mut conn)
                    .await
                    .unwrap();
                ShopSession::Postgres(conn)
            }
            Dialect::MySql => {
                let options: sqlx::mysql::MySqlConnectOptions = self.url.expose().parse().unwrap();
                // sqlx sets `time_zone = '+00:00'` unless told not to.
                let conn = sqlx::MySqlConnection::connect_with(&options.timezone(None))
                    .await
                    .unwrap();
                ShopSession::MySql(conn)
            }
        }
    }

    async fn exec(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        let done = match self.session().await {
            ShopSession::Postgres(mut c) => c.execute(sql).await.map(|_| ()),
            ShopSession::MySql(mut c) => c.execute(sql).await.map(|_| ()),
        };
        done.unwrap();
    }

    /// The service's settings for this shop: the default mapping with no
    /// `time_zone` (unless `time_zone`), stock given back by nobody.
    fn settings(&self, env: &TestEnv, time_zone: Option<&str>) -> Settings {
        let mut settings = Settings {
            database_url: self.url.clone(),
            inventory: InventorySettings {
                release: Release::None,
            },
            // Nothing listens here: with release = "none" nothing may call it.
            inventory_url: SecretUrl::new("http://127.0.0.1:9"),
            ..env.settings.clone()
        };
        settings.orders = Default::default();
        settings.orders.time_zone = time_zone.map(str::to_owned);
        if self.dialect == Dialect::MySql {
            // MySQL's NOW() has whole seconds: NOW(3), as the deadlines.
            (settings.orders.set).insert("cancelled_at".into(), "NOW(3)".into());
        }
        settings
    }
}

impl Drop for ZonedShop {
    fn drop(&mut self) {
        if let Some((base, name)) = &self.pg_scratch {
            let _ = scratch::drop_database_blocking(base, name);
        }
    }
}

/// A session of the shop's.
enum ShopSession {
    Postgres(sqlx::PgConnection),
    MySql(sqlx::MySqlConnection),
}

impl ShopSession {
    /// Writes an unpaid order due `secs` from now by the server's clock
    /// in this session's zone, as the shop does.
    async fn order_due_in(&mut self, id: &str, secs: i64) {
        match self {
            ShopSession::Postgres(c) => sqlx::query(
                "INSERT INTO orders (id, status, expires_at) \
                 VALUES ($1, 'UNPAID', localtimestamp + make_interval(secs => $2))",
            )
            .bind(id)
            .bind(secs as f64)
            .execute(c)
            .await
            .map(drop),
            ShopSession::MySql(c) => sqlx::query(
                "INSERT INTO orders (id, status, expires_at) \
                 VALUES (?, 'UNPAID', NOW(3) + INTERVAL ? SECOND)",
            )
            .bind(id)
            .bind(secs)
            .execute(c)
            .await
            .map(drop),
        }
        .unwrap();
    }

    /// The order's status.
    async fn status(&mut self, id: &str) -> String {
        match self {
            ShopSession::Postgres(c) => {
                sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
                    .bind(id)
                    .fetch_one(c)
                    .await
            }
            ShopSession::MySql(c) => {
                sqlx::query_scalar("SELECT status FROM orders WHERE id = ?")
                    .bind(id)
                    .fetch_one(c)
                    .await
            }
        }
        .unwrap()
    }

    /// How many cancelled rows say they were cancelled before their
    /// deadline (both read in the shop's zone).
    async fn cancelled_before_deadline(&mut self) -> i64 {
        let sql = "SELECT COUNT(*) FROM orders \
                   WHERE status = 'CANCELLED' AND cancelled_at < expires_at";
        match self {
            ShopSession::Postgres(c) => sqlx::query_scalar(sql).fetch_one(c).await,
            ShopSession::MySql(c) => sqlx::query_scalar(sql).fetch_one(c).await,
        }
        .unwrap()
    }
}

/// Publishes the order's timeout message saying it is due in a second:
/// earlier than its row, so the service must read the row's deadline to
/// know when to cancel it.
async fn publish_early(env: &TestEnv, id: &str) {
    let body = serde_json::json!({
        "order_id": id,
        "cancel_at": order_timeout::message::format_instant(Utc::now() + chrono::Duration::seconds(1)),
    });
    env.publish_raw(body.to_string().as_bytes()).await;
}

/// Three orders due `due_s` seconds after they were written and two due
/// in an hour, each with a message saying it is due in a second; the
/// service (with `time_zone`, default none) cancels the first three
/// never before their deadline (watched by this host's clock: a
/// cancellation seen less than `due_s` after the write is early) and
/// leaves the others.
async fn never_early_and_on_time(shop: &ZonedShop, time_zone: Option<&str>, due_s: i64) {
    let env = TestEnv::new().await;
    let service = env.service_with(shop.settings(&env, time_zone)).await;
    let mut session = shop.session().await;
    let written = Instant::now();
    for id in ["due-1", "due-2", "due-3"] {
        session.order_due_in(id, due_s).await;
    }
    for id in ["later-1", "later-2"] {
        session.order_due_in(id, 3_600).await;
    }
    for id in ["due-1", "due-2", "due-3", "later-1", "later-2"] {
        publish_early(&env, id).await;
    }
    let bound = Duration::from_secs(due_s as u64 + 30);
    for id in ["due-1", "due-2", "due-3"] {
        loop {
            let status = session.status(id).await;
            if status == "CANCELLED" {
                break;
            }
            assert!(
                written.elapsed() < bound,
                "{id} not cancelled within {bound:?} of its write (status {status}): \
                 its deadline read hours late"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let seen = written.elapsed();
        assert!(
            seen >= Duration::from_secs(due_s as u64),
            "{id} cancelled {seen:?} after it was written, due {due_s} s after: early"
        );
    }
    assert_eq!(session.cancelled_before_deadline().await, 0, "never early");
    // Every message taken (the two of the later orders rescheduled, at
    // least once each), then the later orders still wait.
    env.eventually(
        Duration::from_secs(30),
        "the later orders' messages rescheduled",
        || async { service.metrics.count(Outcome::Rescheduled) >= 5 },
    )
    .await;
    env.more_sweeps(&service, 1).await;
    for id in ["later-1", "later-2"] {
        assert_eq!(session.status(id).await, "UNPAID", "{id}: an hour to go");
    }
    service.stop().await.unwrap();
}

/// The service reads zone-less deadlines in the zone the shop's sessions
/// start in, with its default config: west of UTC (read in UTC, the hour
/// orders were cancelled at once, 5 hours early) and east (read 8 hours
/// late), with an offset and with a named zone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_deadlines_are_read_in_the_databases_zone() {
    for zone in ["-05:00", "+08:00", "America/New_York"] {
        crate::bounds::step(&format!("PostgreSQL in {zone}"));
        let shop = ZonedShop::postgres(zone).await;
        never_early_and_on_time(&shop, None, 4).await;
    }
}

/// [`on_postgresql_deadlines_are_read_in_the_databases_zone`] on MariaDB:
/// a server whose `time_zone` is an offset, and one on a machine on New
/// York time (`SYSTEM`, `TZ=America/New_York`: its time zone tables are
/// empty, as on most servers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_mariadb_deadlines_are_read_in_the_servers_zone() {
    for (what, zone) in [
        (
            "-05:00",
            Zone {
                tz: None,
                default_time_zone: Some("-05:00".into()),
            },
        ),
        (
            "+08:00",
            Zone {
                tz: None,
                default_time_zone: Some("+08:00".into()),
            },
        ),
        (
            "SYSTEM on America/New_York",
            Zone {
                tz: Some("America/New_York".into()),
                default_time_zone: None,
            },
        ),
    ] {
        crate::bounds::step(&format!("MariaDB in {what}"));
        let shop = ZonedShop::mariadb(zone).await;
        never_early_and_on_time(&shop, None, 4).await;
    }
}

/// A configured `time_zone` is obeyed where it differs from the server's
/// (the shop's programs write in `+08:00`, the database's sessions start
/// on New York time), and `schema check` shows both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_zone_is_obeyed_and_shown_beside_the_servers() {
    for dialect in [Dialect::Postgres, Dialect::MySql] {
        crate::bounds::step(&format!("{dialect:?}"));
        let shop = match dialect {
            Dialect::Postgres => ZonedShop::postgres("America/New_York").await,
            Dialect::MySql => {
                ZonedShop::mariadb(Zone {
                    tz: Some("America/New_York".into()),
                    default_time_zone: None,
                })
                .await
            }
        };
        let env = TestEnv::new().await;
        let settings = shop.settings(&env, Some("+08:00"));
        let timer = settings.timers().unwrap().remove(0);
        let store = order_timeout::testing::store::connect_timer(
            &settings.database_url,
            order_timeout::testing::store::PoolSettings::new(2),
            &timer,
        )
        .unwrap();
        let text = store.prepare().await.unwrap().to_string();
        let server = match dialect {
            Dialect::Postgres => "start in America/New_York (the database's setting)",
            Dialect::MySql => "start in SYSTEM (EST)",
        };
        assert!(
            text.contains("zone:     +08:00 (configured: time_zone") && text.contains(server),
            "schema check shows the configured zone and the server's:\n{text}"
        );
        drop(store);
        drop(env);
        // The shop's programs set their own zone, +08:00.
        let mut session = shop.session().await;
        match &mut session {
            ShopSession::Postgres(c) => {
                c.execute("SET timezone = '<+08:00>-08:00'").await.unwrap();
            }
            ShopSession::MySql(c) => {
                c.execute("SET time_zone = '+08:00'").await.unwrap();
            }
        }
        never_early_with(&shop, session, Some("+08:00")).await;
    }
}

/// [`never_early_and_on_time`] with a session of the caller's.
async fn never_early_with(shop: &ZonedShop, mut session: ShopSession, time_zone: Option<&str>) {
    let env = TestEnv::new().await;
    let service = env.service_with(shop.settings(&env, time_zone)).await;
    let written = Instant::now();
    session.order_due_in("due-1", 4).await;
    session.order_due_in("later-1", 3_600).await;
    publish_early(&env, "due-1").await;
    publish_early(&env, "later-1").await;
    loop {
        if session.status("due-1").await == "CANCELLED" {
            break;
        }
        assert!(
            written.elapsed() < Duration::from_secs(34),
            "due-1 not cancelled within 34 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(written.elapsed() >= Duration::from_secs(4), "early");
    env.eventually(Duration::from_secs(30), "both messages taken", || async {
        service.metrics.count(Outcome::Rescheduled) >= 2
    })
    .await;
    env.more_sweeps(&service, 1).await;
    assert_eq!(session.status("later-1").await, "UNPAID");
    service.stop().await.unwrap();
}

/// A POSIX rule whose clocks went back (from UTC-4 to UTC-5) 30 seconds
/// ago, today, after daylight saving since the first Sunday of March:
/// the wall-clock times of the last hour come again, and an order written
/// now is due at a wall-clock time that also stood for an instant an hour
/// earlier. Julian day `Jn` counts 1..365 without 29 February.
fn autumn_rule() -> String {
    // The change's day and time are given in the time in force before it
    // (UTC-4).
    let local = Utc::now() - chrono::Duration::seconds(30) - chrono::Duration::hours(4);
    let year = local.year();
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let mut day = local.ordinal();
    if leap && day > 59 {
        day -= 1;
    }
    format!(
        "XST5XDT,M3.1.0/0,J{day}/{:02}:{:02}:{:02}",
        local.hour(),
        local.minute(),
        local.second()
    )
}

/// Orders written in the repeated hour of autumn are never early: their
/// deadlines are read as the later of the two instants they could name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_written_in_the_repeated_hour_of_autumn_are_never_early() {
    let rule = autumn_rule();
    crate::bounds::step(&format!("PostgreSQL in {rule}"));
    let shop = ZonedShop::postgres(&rule).await;
    never_early_and_on_time(&shop, None, 8).await;
    let rule = autumn_rule();
    crate::bounds::step(&format!("MariaDB in {rule}"));
    let shop = ZonedShop::mariadb(Zone {
        tz: Some(rule),
        default_time_zone: None,
    })
    .await;
    never_early_and_on_time(&shop, None, 8).await;
}

/// The shop's database is cut off (a silent network) with nothing left to
/// cancel, and healed: readiness goes red during the cut, and is green
/// again within 5 s of the heal (it waited for the next sweep before, up
/// to its 30 s interval).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_is_green_within_seconds_of_a_database_heal() {
    for dialect in [Dialect::Postgres, Dialect::MySql] {
        crate::bounds::step(&format!("{dialect:?}"));
        let shop = match dialect {
            Dialect::Postgres => {
                let server = PrivatePostgres::start()
                    .await
                    .unwrap_or_else(|e| panic!("the private PostgreSQL: {e}"));
                ZonedShop::postgres_private(server, "UTC").await
            }
            Dialect::MySql => ZonedShop::mariadb(Zone::default()).await,
        };
        let link = match (&shop._postgres, &shop._mariadb) {
            (Some(pg), _) => &pg.link,
            (_, Some(m)) => &m.link,
            _ => unreachable!(),
        };
        let env = TestEnv::new().await;
        let mut settings = shop.settings(&env, None);
        settings.liveness.database_timeout = Duration::from_secs(3);
        // Past the catch-up after start (a sweep a second) at once: the
        // sweeper's interval is then the default 30 s, and the statements'
        // flag must not wait for the next regular sweep.
        settings.sweeper.catch_up_window = Duration::from_secs(1);
        let service = env.service_with(settings).await;
        let addr = service.http_addr;
        env.eventually(Duration::from_secs(30), "ready", || async {
            http_get(addr, "/readyz").await.0 == 200
        })
        .await;
        link.cut().unwrap();
        env.eventually(
            Duration::from_secs(60),
            "not ready during the cut",
            || async {
                let (status, body) = http_get(addr, "/readyz").await;
                status == 503 && body.contains("\"statements\":false")
            },
        )
        .await;
        link.heal().unwrap();
        let healed = Instant::now();
        env.eventually(Duration::from_secs(60), "ready after the heal", || async {
            http_get(addr, "/readyz").await.0 == 200
        })
        .await;
        let took = healed.elapsed();
        assert!(
            took <= Duration::from_secs(5),
            "{dialect:?}: ready {took:?} after the heal"
        );
        service.stop().await.unwrap();
    }
}
