//! Adopting a shop's own schema with a config file alone: a mall-like shop
//! on MariaDB (integer status codes, the deadline computed from the creation
//! time and a settings row, a soft-delete guard, stock given back by an
//! `also` statement, bare integer ids) and a saleor-like shop on PostgreSQL
//! (uuid keys, text statuses, stock released over gRPC from its own lines
//! table). Each runs the real service against the real servers.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use order_timeout::settings::{
    InventorySettings, ItemsMapping, OrdersMapping, Release, SecretUrl, Settings, StatusValue,
};
use order_timeout::testing::metrics::Outcome;
use order_timeout::testing::store::OrderItem;
use order_timeout_tools::scratch;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{Connection, MySqlPool};

use crate::common::TestEnv;
use crate::store::{mysql_base, mysql_pool};

/// A fresh MariaDB database with the service's migrations and a schema
/// shaped like macrozheng/mall's, dropped afterwards.
pub(crate) struct MallDb {
    pub(crate) name: String,
    pub(crate) url: SecretUrl,
    /// A pool whose sessions use the shop's zone (`+08:00`), as mall's do.
    pub(crate) pool: MySqlPool,
}

impl MallDb {
    async fn new() -> Self {
        Self::create(true).await
    }

    /// The shop's database as it is before `order-timeout migrate`.
    pub(crate) async fn unmigrated() -> Self {
        Self::create(false).await
    }

    async fn create(migrated: bool) -> Self {
        let name = scratch::owned_name("ot_mall");
        let url = scratch::with_path(&mysql_base(), &name).unwrap();
        if migrated {
            order_timeout::testing::store::migrate(&url).await.unwrap();
        } else {
            let options: MySqlConnectOptions = mysql_base().expose().parse().unwrap();
            let mut conn = sqlx::MySqlConnection::connect_with(&options).await.unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
                .execute(&mut conn)
                .await
                .unwrap();
        }
        let pool = mysql_pool(&url, "+08:00", 4).await;
        sqlx::raw_sql(
            r#"
            CREATE TABLE oms_order (
                id            BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                member_id     BIGINT NOT NULL DEFAULT 0,
                order_sn      VARCHAR(64),
                create_time   DATETIME NULL,
                status        INT(1) NULL COMMENT '0 unpaid, 1 paid, 2 shipped, 3 done, 4 closed',
                delete_status INT(1) NOT NULL DEFAULT 0,
                modify_time   DATETIME NULL,
                KEY idx_status_create_time (status, create_time)
            ) ENGINE = InnoDB;
            CREATE TABLE oms_order_item (
                id               BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                order_id         BIGINT,
                product_sku_id   BIGINT,
                product_quantity INT
            ) ENGINE = InnoDB;
            CREATE TABLE pms_sku_stock (
                id         BIGINT NOT NULL PRIMARY KEY,
                stock      INT,
                lock_stock INT
            ) ENGINE = InnoDB;
            CREATE TABLE oms_order_setting (
                id                    BIGINT NOT NULL PRIMARY KEY,
                normal_order_overtime INT COMMENT 'minutes'
            ) ENGINE = InnoDB;
            INSERT INTO oms_order_setting VALUES (1, 60);
            INSERT INTO pms_sku_stock VALUES (1, 100, 0), (2, 100, 0), (3, 100, 0);
            "#,
        )
        .execute(&pool)
        .await
        .unwrap();
        Self { name, url, pool }
    }

    /// An order created `age` ago (so due `60 min - age` from now) with
    /// `quantity` of SKU `sku` locked, as mall's order service does.
    pub(crate) async fn order(&self, id: i64, age: Duration, status: i32, deleted: bool, sku: i64) {
        sqlx::query(
            "INSERT INTO oms_order (id, order_sn, create_time, status, delete_status) \
             VALUES (?, ?, NOW() - INTERVAL ? SECOND, ?, ?)",
        )
        .bind(id)
        .bind(format!("sn{id}"))
        .bind(age.as_secs() as i64)
        .bind(status)
        .bind(i32::from(deleted))
        .execute(&self.pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO oms_order_item (order_id, product_sku_id, product_quantity) VALUES (?, ?, 2)",
        )
        .bind(id)
        .bind(sku)
        .execute(&self.pool)
        .await
        .unwrap();
        sqlx::query("UPDATE pms_sku_stock SET lock_stock = lock_stock + 2 WHERE id = ?")
            .bind(sku)
            .execute(&self.pool)
            .await
            .unwrap();
    }

    pub(crate) async fn status(&self, id: i64) -> i32 {
        sqlx::query_scalar("SELECT status FROM oms_order WHERE id = ?")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    pub(crate) async fn lock_stock(&self) -> BTreeMap<i64, i32> {
        sqlx::query_as::<_, (i64, i32)>("SELECT id, lock_stock FROM pms_sku_stock")
            .fetch_all(&self.pool)
            .await
            .unwrap()
            .into_iter()
            .collect()
    }
}

impl Drop for MallDb {
    fn drop(&mut self) {
        let _ = scratch::drop_database_blocking(&mysql_base(), &self.name);
    }
}

/// A header of a parked message, as text.
/// Messages the service settled for good (each counted once, whatever its
/// way: not the re-schedules, retries and holds on the way).
fn settled(service: &order_timeout::RunningService) -> u64 {
    let m = &service.metrics;
    m.total() - m.count(Outcome::Rescheduled) - m.count(Outcome::Retried) - m.count(Outcome::Locked)
}

fn header(m: &order_timeout::ops::parked::ParkedMessage, name: &str) -> Option<String> {
    order_timeout::testing::broker::header_str(m.properties.headers().as_ref()?.inner().get(name))
}

/// The mapping a mall shop writes (config/examples/mall-mysql.toml).
fn mall_mapping() -> (OrdersMapping, InventorySettings) {
    let orders = OrdersMapping {
        table: "oms_order".into(),
        id: "id".into(),
        status: "status".into(),
        unpaid: StatusValue::Int(0),
        paid: Some(StatusValue::Int(1)),
        cancelled: StatusValue::Int(4),
        deadline: "create_time + INTERVAL (SELECT normal_order_overtime FROM oms_order_setting WHERE id = 1) MINUTE".into(),
        deadline_unit: order_timeout::settings::DeadlineUnit::Time,
        guard: "delete_status = 0".into(),
        time_zone: Some("+08:00".into()),
        set: BTreeMap::from([("modify_time".to_owned(), "NOW()".to_owned())]),
        also: vec![
            "UPDATE pms_sku_stock s JOIN oms_order_item i ON i.product_sku_id = s.id \
             SET s.lock_stock = s.lock_stock - i.product_quantity WHERE i.order_id = ?"
                .into(),
        ],
        also_keys: "SELECT product_sku_id FROM oms_order_item WHERE order_id = ?".into(),
    };
    (
        orders,
        InventorySettings {
            release: Release::None,
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mall_shop_on_mariadb_adopts_by_config_alone() {
    let env = TestEnv::new().await;
    let db = MallDb::new().await;
    let hour = Duration::from_secs(3600);
    // 12 unpaid orders due 2-7 s from now, 3 paid and 3 soft-deleted ones
    // long overdue, all with stock locked.
    for i in 0..12 {
        db.order(
            100 + i,
            hour - Duration::from_secs(2 + (i as u64 % 6)),
            0,
            false,
            1 + i % 3,
        )
        .await;
    }
    for i in 0..3 {
        db.order(200 + i, hour * 2, 1, false, 1 + i % 3).await;
        db.order(300 + i, hour * 2, 0, true, 1 + i % 3).await;
    }
    let locked_before = db.lock_stock().await;
    assert_eq!(locked_before.values().sum::<i32>(), 18 * 2);

    let (orders, inventory) = mall_mapping();
    let settings = Settings {
        database_url: db.url.clone(),
        orders,
        inventory,
        // Nothing listens here: with release = "none" nothing may call it.
        inventory_url: SecretUrl::new("http://127.0.0.1:9"),
        ..env.settings.clone()
    };
    let mut events = env.subscribe_events().await;
    let service = env.service_with(settings.clone()).await;
    // Bare integer ids, each published twice; and two ids no row has.
    for id in (100..112).chain(200..203).chain(300..303) {
        env.publish_raw(id.to_string().as_bytes()).await;
        env.publish_raw(id.to_string().as_bytes()).await;
    }
    env.publish_raw(b"999999").await;
    env.publish_raw(br#""not-a-number""#).await;

    env.eventually(
        Duration::from_secs(40),
        "every due order closed",
        || async {
            let mut all = true;
            for id in 100..112 {
                all &= db.status(id).await == 4;
            }
            all
        },
    )
    .await;
    // Every message settled (each of the 38 counted once, with its
    // outcome): every event it will publish is published by then (an event
    // is confirmed before its message is acked).
    env.eventually(Duration::from_secs(20), "every message settled", || async {
        settled(&service) >= 38
    })
    .await;
    assert_eq!(settled(&service), 38);
    // All of them: a duplicate event would be among them.
    let got = TestEnv::read_events(&mut events, 13, Duration::from_secs(3)).await;
    let ids: HashSet<String> = got.iter().map(|e| e.order_id.clone()).collect();
    assert_eq!(ids.len(), 12, "one event per closed order: {got:?}");
    assert_eq!(got.len(), 12, "and no event twice: {got:?}");
    assert!(
        got.iter().all(|e| e.lateness_ms >= 0),
        "never early: {got:?}"
    );
    for id in (200..203).chain(300..303) {
        let status = db.status(id).await;
        assert!(status == 1 || status == 0, "order {id} untouched: {status}");
    }
    assert_eq!(db.status(200).await, 1, "paid stays paid");
    assert_eq!(db.status(300).await, 0, "a deleted order is left alone");
    // lock_stock given back once per closed order, by the also statement.
    let locked_after = db.lock_stock().await;
    assert_eq!(
        locked_after.values().sum::<i32>(),
        6 * 2,
        "{locked_after:?}"
    );
    let modified: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM oms_order WHERE modify_time IS NOT NULL")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(modified, 12, "set applies to the closed orders only");
    let parked = env.drain_parked().await;
    let kinds: Vec<String> = parked
        .iter()
        .filter_map(|m| header(m, "x-error-kind"))
        .collect();
    assert_eq!(kinds, ["unknown_order", "unknown_order"], "{kinds:?}");
    // The id no bigint can be is parked with the reason.
    let errors: Vec<String> = parked.iter().filter_map(|m| header(m, "x-error")).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("not-a-number") && e.contains("not an integer")),
        "{errors:?}"
    );
    service.stop().await.unwrap();

    // The shop's tables: exactly as they were created (the service only
    // added its own).
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(TABLE_NAME AS CHAR) FROM information_schema.TABLES \
          WHERE TABLE_SCHEMA = DATABASE() ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        tables,
        [
            "oms_order",
            "oms_order_item",
            "oms_order_setting",
            "order_timeout_also_locks",
            "order_timeout_cancel_outbox",
            "order_timeout_logouts",
            "order_timeout_migrations",
            "order_timeout_parked",
            "order_timeout_replicas",
            "order_timeout_set_aside",
            "order_timeout_watch",
            "pms_sku_stock"
        ]
    );
}

#[tokio::test]
async fn schema_check_names_the_key_that_does_not_fit() {
    let env = TestEnv::new().await;
    let db = MallDb::new().await;
    let config = std::env::temp_dir().join(format!("{}-mall.toml", env.name));
    let write = |extra: &str| {
        std::fs::write(
            &config,
            format!(
                r#"
                [orders]
                table = "oms_order"
                unpaid = 0
                paid = 1
                cancelled = 4
                deadline = "create_time + INTERVAL 60 MINUTE"
                time_zone = "+08:00"
                set = {{ modify_time = "NOW()" }}
                {extra}
                [inventory]
                release = "none"
                "#
            ),
        )
        .unwrap();
    };
    let check = || {
        crate::bounds::output_within(
            std::process::Command::new(env!("CARGO_BIN_EXE_order-timeout"))
                .args(["--config", config.to_str().unwrap(), "schema", "check"])
                .env("DATABASE_URL", db.url.expose())
                .env("RUST_LOG", "off"),
            Duration::from_secs(60),
            "order-timeout schema check",
        )
    };
    write(r#"guard = "delete_status = 0""#);
    let out = check();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("OK"), "{stdout}");
    for (extra, key) in [
        (
            r#"guard = "deleted = 0""#,
            "[orders].deadline / [orders].guard",
        ),
        (r#"status = "state""#, "[orders].status"),
        (
            r#"also = ["UPDATE nowhere SET x = 1 WHERE id = ?"]"#,
            "[orders].also",
        ),
    ] {
        write(extra);
        let out = check();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra} should fail");
        assert!(stderr.contains(key), "{extra}: {stderr}");
    }
    // A database nobody migrated: what to run, not a page of SQL.
    let fresh = MallDb::unmigrated().await;
    write(r#"guard = "delete_status = 0""#);
    let out = crate::bounds::output_within(
        std::process::Command::new(env!("CARGO_BIN_EXE_order-timeout"))
            .args(["--config", config.to_str().unwrap(), "schema", "check"])
            .env("DATABASE_URL", fresh.url.expose())
            .env("RUST_LOG", "off"),
        Duration::from_secs(60),
        "order-timeout schema check on an unmigrated database",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("run `order-timeout migrate`"), "{stderr}");
    assert!(!stderr.contains("SELECT"), "{stderr}");
    // A text code for the integer status column.
    std::fs::write(
        &config,
        "[orders]\ntable = \"oms_order\"\nunpaid = \"UNPAID\"\nset = {}\n",
    )
    .unwrap();
    let out = check();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("[orders].unpaid"), "{stderr}");
    let _ = std::fs::remove_file(&config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saleor_like_shop_on_postgres_with_uuid_keys_and_text_statuses() {
    let env = TestEnv::new().await;
    env.stock_skus(2).await;
    sqlx::raw_sql(
        r#"
        CREATE TABLE order_order (
            id         uuid PRIMARY KEY,
            status     varchar(32) NOT NULL,
            created_at timestamptz NOT NULL,
            updated_at timestamptz
        );
        CREATE TABLE order_orderline (
            id          serial PRIMARY KEY,
            order_id    uuid NOT NULL REFERENCES order_order (id),
            product_sku varchar(255) NOT NULL,
            quantity    integer NOT NULL
        );
        "#,
    )
    .execute(&env.pool)
    .await
    .unwrap();
    // Four unconfirmed orders due in 2-5 s, one already confirmed.
    let mut ids = Vec::new();
    for i in 0..5u64 {
        let id = uuid::Uuid::new_v4();
        let status = if i == 4 { "unfulfilled" } else { "unconfirmed" };
        sqlx::query(
            "INSERT INTO order_order (id, status, created_at) \
             VALUES ($1::uuid, $2, now() - interval '30 minutes' + $3 * interval '1 second')",
        )
        .bind(id.to_string())
        .bind(status)
        .bind(2.0 + i as f64)
        .execute(&env.pool)
        .await
        .unwrap();
        let sku = env.sku(i as usize % 2);
        sqlx::query("INSERT INTO order_orderline (order_id, product_sku, quantity) VALUES ($1::uuid, $2, 3)")
            .bind(id.to_string())
            .bind(&sku)
            .execute(&env.pool)
            .await
            .unwrap();
        let items = [OrderItem { sku, quantity: 3 }];
        env.inventory
            .reserve(&id.to_string(), &items)
            .await
            .unwrap();
        ids.push(id);
    }
    let settings = Settings {
        orders: OrdersMapping {
            table: "order_order".into(),
            status: "status".into(),
            unpaid: StatusValue::Text("unconfirmed".into()),
            paid: Some(StatusValue::Text("unfulfilled".into())),
            cancelled: StatusValue::Text("expired".into()),
            deadline: "created_at + interval '30 minutes'".into(),
            set: BTreeMap::from([("updated_at".to_owned(), "now()".to_owned())]),
            ..OrdersMapping::default()
        },
        items: ItemsMapping {
            table: "order_orderline".into(),
            order_id: "order_id".into(),
            sku: "product_sku".into(),
            quantity: "quantity".into(),
        },
        ..env.settings.clone()
    };
    let service = env.service_with(settings).await;
    // Upper-case uuids in the messages: the same orders as the rows'.
    for id in &ids {
        let upper = id.to_string().to_uppercase();
        env.publish_raw(format!(r#"{{"order_id":"{upper}"}}"#).as_bytes())
            .await;
        env.publish_raw(format!("{:?}", upper).as_bytes()).await;
    }
    env.eventually(
        Duration::from_secs(40),
        "unconfirmed orders expired",
        || async {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM order_order WHERE status = 'expired'")
                    .fetch_one(&env.pool)
                    .await
                    .unwrap();
            n == 4
        },
    )
    .await;
    env.wait_outbox_done(Duration::from_secs(20)).await;
    let confirmed: String =
        sqlx::query_scalar("SELECT status FROM order_order WHERE id = $1::uuid")
            .bind(ids[4].to_string())
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(confirmed, "unfulfilled");
    let early: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM order_order o JOIN order_timeout_cancel_outbox b ON b.order_id = o.id::text \
          WHERE b.created_at < o.created_at + interval '30 minutes'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(early, 0, "never early");
    // Stock: the four expired orders' 3 units each back, once; the
    // confirmed one's still reserved.
    let calls: i64 = sqlx::query_scalar("SELECT coalesce(max(calls), 0) FROM inventory.releases")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(calls, 1, "one ReleaseStock per order despite duplicates");
    // Order 4 (sku 0) is still reserved; the others were given back.
    assert_eq!(env.stock(0).await, crate::common::STOCK - 3);
    assert_eq!(env.stock(1).await, crate::common::STOCK);
    service.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_schedules_the_unpaid_orders_already_in_the_table() {
    let env = TestEnv::new().await;
    let db = MallDb::new().await;
    let hour = Duration::from_secs(3600);
    // Adoption day: orders the order service created before the switch,
    // never published. Four due in 3-6 s, three long overdue, one deleted
    // and overdue, one paid.
    for i in 0..4 {
        db.order(
            400 + i,
            hour - Duration::from_secs(3 + i as u64),
            0,
            false,
            1 + i % 3,
        )
        .await;
    }
    for i in 0..3 {
        db.order(500 + i, hour * 3, 0, false, 1 + i % 3).await;
    }
    db.order(600, hour * 3, 0, true, 1).await;
    db.order(700, hour * 3, 1, false, 2).await;
    let (orders, inventory) = mall_mapping();
    let config = std::env::temp_dir().join(format!("{}-backfill.toml", env.name));
    std::fs::write(
        &config,
        format!(
            r#"
            cascade_shards = {shards}
            [orders]
            table = "oms_order"
            unpaid = 0
            paid = 1
            cancelled = 4
            deadline = "create_time + INTERVAL (SELECT normal_order_overtime FROM oms_order_setting WHERE id = 1) MINUTE"
            guard = "delete_status = 0"
            time_zone = "+08:00"
            set = {{ modify_time = "NOW()" }}
            [inventory]
            release = "none"
            "#,
            shards = env.settings.cascade_shards.get()
        ),
    )
    .unwrap();
    let backfill_with = |extra: &[&str]| {
        crate::bounds::output_within(
            std::process::Command::new(env!("CARGO_BIN_EXE_order-timeout"))
                .args([
                    "--config",
                    config.to_str().unwrap(),
                    "backfill",
                    "--batch",
                    "3",
                ])
                .args(extra)
                .env("AMQP_URL", env.settings.amqp_url.expose())
                .env("DATABASE_URL", db.url.expose())
                .env("RUST_LOG", "warn"),
            Duration::from_secs(120),
            "order-timeout backfill",
        )
    };
    let backfill = || backfill_with(&[]);
    // A dry run says what would be scheduled, by when it falls due, and
    // publishes nothing.
    let dry = backfill_with(&["--dry-run"]);
    let said = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(
        said.contains("would schedule 7 rows of oms_order"),
        "{said}"
    );
    let count = |label: &str| -> u64 {
        said.lines()
            .find(|l| l.trim_start().starts_with(label))
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or_else(|| panic!("no {label:?} line in {said}"))
    };
    assert_eq!(count("overdue"), 3, "{said}");
    assert_eq!(count("due within 1m"), 4, "{said}");
    assert_eq!(count("due later"), 0, "{said}");
    let pending = env
        .cli(&["pending", "--json", "--parked-scan-limit", "0"])
        .await;
    let report: serde_json::Value = serde_json::from_str(&pending.stdout).unwrap();
    assert_eq!(
        report["total"]["messages"], 0,
        "the dry run published nothing"
    );
    let out = backfill();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("scheduled 7 unpaid orders"), "{stdout}");
    // The service starts after the first backfill: its catch-up sweeps
    // would otherwise settle the long overdue orders before it counts them.
    let service = env
        .service_with(Settings {
            database_url: db.url.clone(),
            orders,
            inventory,
            ..env.settings.clone()
        })
        .await;
    // Twice is harmless.
    assert!(backfill().status.success());
    env.eventually(
        Duration::from_secs(40),
        "every unpaid order closed",
        || async {
            let mut all = true;
            for id in (400..404).chain(500..503) {
                all &= db.status(id).await == 4;
            }
            all
        },
    )
    .await;
    env.more_sweeps(&service, 2).await;
    assert_eq!(db.status(600).await, 0, "a deleted order is left alone");
    assert_eq!(db.status(700).await, 1, "a paid order is left alone");
    // 9 orders locked 2 units each; the 7 closed ones gave theirs back once.
    let locked = db.lock_stock().await;
    assert_eq!(locked.values().sum::<i32>(), 2 * 2, "{locked:?}");
    service.stop().await.unwrap();
    let _ = std::fs::remove_file(&config);
}

/// A shop keyed by `int4`: 100 due orders and, among their messages, one
/// for `3000000000`, which no `integer` can be. The 100 are cancelled
/// without a retry; the odd one is parked as an unknown order with the
/// reason, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_out_of_the_columns_range_is_parked_with_the_reason_and_fails_nothing_else() {
    let env = TestEnv::new().await;
    sqlx::raw_sql(
        r#"
        CREATE TABLE shop_orders (
            id         int4 PRIMARY KEY,
            status     text NOT NULL,
            expires_at timestamptz NOT NULL
        );
        INSERT INTO shop_orders
        SELECT g, 'UNPAID', now() + interval '2 seconds' FROM generate_series(1, 100) g;
        "#,
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let settings = Settings {
        orders: OrdersMapping {
            table: "shop_orders".into(),
            set: BTreeMap::new(),
            ..OrdersMapping::default()
        },
        inventory: InventorySettings {
            release: Release::None,
        },
        ..env.settings.clone()
    };
    let service = env.service_with(settings).await;
    for id in (1..=50u64).chain([3_000_000_000]).chain(51..=100) {
        env.publish_raw(id.to_string().as_bytes()).await;
    }
    let cancelled = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM shop_orders WHERE status = 'CANCELLED'")
            .fetch_one(&env.pool)
            .await
            .unwrap()
    };
    env.eventually(Duration::from_secs(30), "100 orders cancelled", || async {
        cancelled().await == 100
    })
    .await;
    env.eventually(Duration::from_secs(10), "the odd one parked", || async {
        env.parked_count().await == 1
    })
    .await;
    let parked = env.drain_parked().await;
    assert_eq!(
        header(&parked[0], "x-error-kind").as_deref(),
        Some("unknown_order")
    );
    let error = header(&parked[0], "x-error").unwrap_or_default();
    assert!(
        error.contains("3000000000 is out of range for integer"),
        "{error}"
    );
    // Without a retry: every message settled on its first delivery.
    env.eventually(Duration::from_secs(10), "101 messages settled", || async {
        settled(&service) >= 101
    })
    .await;
    assert_eq!(service.metrics.count(Outcome::Cancelled), 100);
    assert_eq!(service.metrics.count(Outcome::Parked), 1);
    assert_eq!(service.metrics.count(Outcome::Retried), 0, "no retry");
    assert_eq!(settled(&service), 101);
    service.stop().await.unwrap();
}
