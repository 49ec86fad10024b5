//! Test harness: every test gets its own RabbitMQ vhost and its own
//! PostgreSQL database (migrated), a reference inventory server on a free
//! port, and helpers to play the order service. Everything is removed when
//! the [`TestEnv`] is dropped, also when the test fails.
//!
//! [`TestEnv::on`]`(Dialect::MySql)` puts the shop's orders (and the
//! service's own tables) in a MariaDB database of the test's own instead;
//! the helpers that read or change orders work on either, and
//! [`on_both_dialects!`] runs a test body once per dialect.
//!
//! Needs a local RabbitMQ (`rabbitmqctl` creates the vhosts, as root),
//! PostgreSQL and (for the MariaDB worlds) MariaDB; `scripts/test.sh` makes
//! sure they run. `AMQP_URL`, `DATABASE_URL` and `MYSQL_URL` name the
//! servers (their vhost / database part is replaced).

#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions,
    ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use order_timeout::app::RunningService;
use order_timeout::broker::{connect_amqp, declare_topology, topology};
use order_timeout::observe::metrics::Outcome;
use order_timeout::settings::{self, SecretUrl, Settings, Shards};
use order_timeout::shutdown::Shutdown;
use order_timeout::store::OrderItem;
use order_timeout_tools::inventory::{ReferenceInventory, ShopInventory};
use order_timeout_tools::scratch;
use order_timeout_tools::shop::{self, NewOrder, ShopDb};
use sqlx::mysql::MySqlRow;
use sqlx::postgres::PgRow;
use sqlx::{MySqlPool, PgPool};

pub use order_timeout::store::Dialect;

/// Runs one statement on the shop's orders database of a [`TestEnv`] (or
/// of anything with a `shop:` [`ShopDb`] field, the store suite's fixture),
/// whichever its dialect: `on_shop!(env, fetch_one, query_scalar(pg, my),
/// binds…)` runs `pg` (placeholders `$1`, `$2`, … in bind order) on
/// PostgreSQL, `my` (`?`) on MariaDB, with the same binds. Written once
/// here so that each helper below states its SQL per dialect side by side
/// instead of a `match` repeating the binds and the fetch.
macro_rules! on_shop {
    ($env:expr, execute, $kind:ident($pg:expr, $my:expr) $(, $b:expr)* $(,)?) => {
        match &$env.shop {
            ShopDb::Postgres(pool) => sqlx::$kind($pg)$(.bind($b))*.execute(pool).await.map(|r| r.rows_affected()),
            ShopDb::MySql(pool) => sqlx::$kind($my)$(.bind($b))*.execute(pool).await.map(|r| r.rows_affected()),
        }
    };
    ($env:expr, $fetch:ident, $kind:ident($pg:expr, $my:expr) $(, $b:expr)* $(,)?) => {
        match &$env.shop {
            ShopDb::Postgres(pool) => sqlx::$kind($pg)$(.bind($b))*.$fetch(pool).await,
            ShopDb::MySql(pool) => sqlx::$kind($my)$(.bind($b))*.$fetch(pool).await,
        }
    };
}
pub(crate) use on_shop;

/// Instantiates each listed test body, `async fn name(dialect: Dialect)`,
/// as two tests of the suite: `postgres::name` (the shop's orders on
/// PostgreSQL) and `mariadb::name` (on MariaDB), so that a suite states
/// once which of its tests run on both dialects, and `cargo test
/// SUITE::mariadb::` picks one dialect's. `#[mariadb(ignore = "why")]`
/// before a name ignores its MariaDB test only (a known bug, reported).
macro_rules! on_both_dialects {
    ($($(#[mariadb($($attr:tt)*)])? $name:ident),* $(,)?) => {
        /// The suite's tests with the shop's orders on PostgreSQL.
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Dialect::Postgres).await;
                }
            )*
        }
        /// The suite's tests with the shop's orders on MariaDB.
        mod mariadb {
            $(
                $(#[$($attr)*])?
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Dialect::MySql).await;
                }
            )*
        }
    };
}
pub(crate) use on_both_dialects;

/// Tests that stop or kill a `serve` process holding hundreds of messages
/// and then restart it take turns. On the shared RabbitMQ 3.10.8, two such
/// consumers going away within a second of each other (in different vhosts)
/// were followed by a ~30 s stall of the whole broker (nothing accepted,
/// nothing logged), three times in full runs of this binary; the restart
/// then missed its deadline. One at a time, the restarts stay quick.
pub static RESTARTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Removes, once per test process, the vhosts and databases that earlier
/// runs killed before their cleanup left behind ([`scratch::sweep_abandoned`]):
/// a dozen left vhosts are enough to stall the shared broker.
pub async fn sweep_abandoned() {
    static SWEPT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    SWEPT
        .get_or_init(|| async {
            let swept =
                scratch::sweep_abandoned(&[scratch::test_pg_server(), crate::store::mysql_base()])
                    .await;
            if !swept.removed.is_empty() {
                eprintln!(
                    "removed what ended test runs left behind: {}",
                    swept.removed.join(", ")
                );
            }
            for failure in &swept.failed {
                eprintln!("warning: sweeping what ended test runs left behind: {failure}");
            }
        })
        .await;
}

/// `[orders].set`'s `cancelled_at` in a MariaDB world: `NOW(6)`, as a
/// MariaDB shop configures it, where the default `now()` has whole seconds
/// there (docs/limits.md): a row cancelled 0.3 s after a deadline of
/// 12:00:00.7 would read 12:00:00, before its deadline, and the tests'
/// "never early" checks read the row's own `cancelled_at`.
pub const MYSQL_CANCELLED_AT: &str = "NOW(6)";

/// A MariaDB world's `[orders].set`: the default with `cancelled_at =`
/// [`MYSQL_CANCELLED_AT`].
fn mysql_orders_set() -> std::collections::BTreeMap<String, String> {
    let mut set = Settings::default().orders.set;
    set.insert("cancelled_at".into(), MYSQL_CANCELLED_AT.into());
    set
}

/// Initial stock of every SKU a test uses.
pub const STOCK: i64 = 1_000;

/// One test's isolated world.
pub struct TestEnv {
    /// Unique name of this test's vhost and database.
    pub name: String,
    /// Settings pointing at this test's vhost, database and inventory.
    pub settings: Settings,
    /// Where the shop's orders and the service's own tables live
    /// (`settings.database_url`).
    pub dialect: Dialect,
    /// The shop's orders database (`settings.database_url`), on either
    /// dialect: what the helpers that read or change orders use.
    pub shop: ShopDb,
    /// This test's PostgreSQL database. On PostgreSQL the shop's orders
    /// live here too (the same database as [`TestEnv::shop`]); on MariaDB
    /// it holds only the reference inventory's `inventory.*`: no `orders`
    /// and no service tables, so a query meant for the orders fails there
    /// instead of reading an empty table.
    pub pool: PgPool,
    /// Client of this test's inventory server.
    pub inventory: ShopInventory,
    /// A plain AMQP connection playing the order service / an observer.
    pub amqp: Connection,
    /// Confirm-mode channel on `amqp`.
    pub channel: Channel,
    stop_inventory: std::sync::Mutex<Shutdown>,
    inventory_addr: std::net::SocketAddr,
    base_db_url: SecretUrl,
    /// The MariaDB server holding the orders database, when
    /// [`TestEnv::dialect`] is MySQL (the database is dropped with the test).
    mysql_base: Option<SecretUrl>,
    /// The vhost was made for this test (and is deleted with it).
    owns_vhost: bool,
    /// Ends the run, naming the test, if it hangs.
    _watchdog: crate::bounds::Watchdog,
}

impl TestEnv {
    /// Creates the vhost and database (migrated, with the reference shop
    /// schema), declares the topology and starts the inventory server.
    pub async fn new() -> Self {
        Self::on(Dialect::Postgres).await
    }

    /// [`TestEnv::new`] with the shop's orders database (and the service's
    /// own tables, migrated) on `dialect`: on MariaDB, a database of the
    /// test's own on the server of `MYSQL_URL`, with the reference orders
    /// schema. The reference inventory server keeps its stock in the
    /// test's PostgreSQL database whatever the dialect: the inventory is a
    /// separate service in production, with its own database, so a shop on
    /// MariaDB talking to an inventory on PostgreSQL is a real deployment.
    pub async fn on(dialect: Dialect) -> Self {
        Self::build_with(dialect, None, None).await
    }

    /// [`TestEnv::new`] on a broker of the test's own (a private node,
    /// `amqp_url` naming its vhost) instead of a new vhost on the shared
    /// one: the vhost is used as it is and left alone afterwards.
    pub async fn on_broker(amqp_url: SecretUrl) -> Self {
        Self::build_with(Dialect::Postgres, Some(amqp_url), None).await
    }

    /// [`TestEnv::new`] as an earlier release left it: its binary `bin`
    /// created the database and ran its own migrations, and nothing is
    /// declared on the broker yet (its `serve` does that). For upgrades.
    pub async fn migrated_by(bin: &std::path::Path) -> Self {
        Self::build_with(Dialect::Postgres, None, Some(bin)).await
    }

    async fn build_with(
        dialect: Dialect,
        own_broker: Option<SecretUrl>,
        release: Option<&std::path::Path>,
    ) -> Self {
        let watchdog = crate::bounds::Watchdog::start();
        crate::bounds::step("creating the test's vhost and database");
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        sweep_abandoned().await;
        let name = scratch::owned_name("ot_test");
        let owns_vhost = own_broker.is_none();
        let amqp_url = match own_broker {
            Some(url) => url,
            None => {
                let amqp_base =
                    std::env::var("AMQP_URL").unwrap_or_else(|_| settings::DEFAULT_AMQP_URL.into());
                scratch::create_vhost(&SecretUrl::new(amqp_base), &name)
                    .expect("create the test's vhost")
            }
        };

        let base_db_url = scratch::test_pg_server();
        let pg_url = scratch::with_path(&base_db_url, &name).unwrap();
        let (database_url, pool, shop, mysql_base) = match (dialect, release) {
            (Dialect::Postgres, None) => {
                let pool = shop::prepare_database(&pg_url, 10)
                    .await
                    .expect("prepare the test database");
                (pg_url, pool.clone(), ShopDb::Postgres(pool), None)
            }
            (Dialect::Postgres, Some(bin)) => {
                let out = crate::bounds::output_within(
                    Command::new(bin)
                        .arg("migrate")
                        .env("DATABASE_URL", pg_url.expose()),
                    Duration::from_secs(60),
                    "the earlier release's migrate",
                );
                assert!(
                    out.status.success(),
                    "{} migrate: {}",
                    bin.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
                let pool = pg_pool(&pg_url).await;
                shop::create_reference_schema(&pool)
                    .await
                    .expect("the reference shop schema");
                (pg_url, pool.clone(), ShopDb::Postgres(pool), None)
            }
            (Dialect::MySql, None) => {
                let base = crate::store::mysql_base();
                let url = scratch::with_path(&base, &name).unwrap();
                let orders = shop::prepare_mysql_database(&url, 10)
                    .await
                    .expect("prepare the test's MariaDB database");
                scratch::create_database(&base_db_url, &name)
                    .await
                    .expect("create the inventory's PostgreSQL database");
                let inventory = pg_pool(&pg_url).await;
                shop::create_inventory_schema(&inventory)
                    .await
                    .expect("the reference inventory's schema");
                (url, inventory, ShopDb::MySql(orders), Some(base))
            }
            (Dialect::MySql, Some(_)) => {
                unreachable!("earlier releases are migrated on PostgreSQL only")
            }
        };

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let inventory_addr = listener.local_addr().unwrap();
        let inventory_url = format!("http://{inventory_addr}");
        let stop_inventory = Shutdown::new();
        {
            let stop = stop_inventory.clone();
            tokio::spawn(
                ReferenceInventory::new(pool.clone())
                    .serve(listener, async move { stop.wait().await }),
            );
        }
        let inventory =
            ShopInventory::connect_lazy(&inventory_url, Duration::from_secs(5)).unwrap();

        let mut settings = Settings {
            amqp_url,
            database_url,
            inventory_url: SecretUrl::new(inventory_url),
            ..Settings::default()
        };
        settings.shutdown_timeout = Duration::from_secs(10);
        // Two cascade shards, not the default four: every test still routes
        // orders through more than one shard, with half the quorum queues
        // to create and delete per test (the suite makes a vhost per test,
        // and thousands of quorum queues per run weigh on a small broker).
        settings.cascade_shards = Shards::try_from(2).unwrap();
        // Several services per test: let each pick a free port.
        settings.http_addr = "127.0.0.1:0".parse().unwrap();
        if dialect == Dialect::MySql {
            settings.orders.set = mysql_orders_set();
        }
        if release.is_none() {
            declare_topology(&settings).await.expect("declare topology");
        }
        let amqp = connect_amqp(&settings.amqp_url, "test-client")
            .await
            .unwrap();
        let channel = amqp.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Self {
            name,
            settings,
            dialect,
            shop,
            pool,
            inventory,
            amqp,
            channel,
            stop_inventory: std::sync::Mutex::new(stop_inventory),
            inventory_addr,
            base_db_url,
            mysql_base,
            owns_vhost,
            _watchdog: watchdog,
        }
    }

    /// Starts an in-process service instance on this world.
    pub async fn service(&self) -> RunningService {
        self.service_with(self.settings.clone()).await
    }

    /// Starts an in-process service instance with other settings.
    pub async fn service_with(&self, settings: Settings) -> RunningService {
        RunningService::start(settings)
            .await
            .expect("start the service")
    }

    /// Stops the inventory server (calls then fail with "unavailable").
    pub fn stop_inventory(&self) {
        self.stop_inventory.lock().unwrap().trigger();
    }

    /// A listener on the inventory server's address, once the old listener
    /// has let go of the port (it may take a moment).
    async fn inventory_listener(&self) -> tokio::net::TcpListener {
        let end = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match tokio::net::TcpListener::bind(self.inventory_addr).await {
                Ok(l) => break l,
                Err(e) if tokio::time::Instant::now() < end => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!(
                    "the inventory's port {} is still taken after 30 s: {e}",
                    self.inventory_addr
                ),
            }
        }
    }

    /// Replaces the test's inventory server by `server` (a wrapper that
    /// refuses or counts some calls) on the same address; returns the
    /// switch that stops it.
    pub async fn replace_inventory<S>(&self, server: S) -> Shutdown
    where
        S: order_timeout_tools::inventory::pb::inventory_server::Inventory,
    {
        self.stop_inventory();
        let listener = self.inventory_listener().await;
        let stop = Shutdown::new();
        let stopped = stop.clone();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(
                    order_timeout_tools::inventory::pb::inventory_server::InventoryServer::new(
                        server,
                    ),
                )
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener),
                    async move { stopped.wait().await },
                ),
        );
        stop
    }

    /// Starts the inventory server again on the same address.
    pub async fn start_inventory(&self) {
        let listener = self.inventory_listener().await;
        let stop = Shutdown::new();
        *self.stop_inventory.lock().unwrap() = stop.clone();
        tokio::spawn(
            ReferenceInventory::new(self.pool.clone())
                .serve(listener, async move { stop.wait().await }),
        );
    }

    /// The SKU name `n` of this test.
    pub fn sku(&self, n: usize) -> String {
        format!("sku-{n}")
    }

    /// Stocks SKUs 0..n with [`STOCK`] each.
    pub async fn stock_skus(&self, n: usize) {
        let stock: Vec<(String, i64)> = (0..n).map(|i| (self.sku(i), STOCK)).collect();
        shop::set_stock(&self.pool, &stock).await.unwrap();
    }

    /// Creates an order as the order service would: reserves its stock,
    /// then inserts the row with `expires_at = now + timeout`. Does not
    /// publish.
    pub async fn create_order(
        &self,
        id: &str,
        timeout: Duration,
        items: &[(usize, i64)],
    ) -> NewOrder {
        let order = NewOrder {
            id: id.to_owned(),
            expires_at: Utc::now() + chrono::Duration::from_std(timeout).unwrap(),
            items: items
                .iter()
                .map(|(sku, quantity)| OrderItem {
                    sku: self.sku(*sku),
                    quantity: *quantity,
                })
                .collect(),
        };
        self.inventory
            .reserve(&order.id, &order.items)
            .await
            .expect("reserve");
        self.shop.insert_order(&order).await.expect("insert order");
        order
    }

    /// Pays the order as the order service would (`false`: it was not
    /// unpaid any more).
    pub async fn pay(&self, id: &str) -> bool {
        self.shop.pay(id).await.unwrap()
    }

    /// Moves the order's deadline to `at`, as the order service does when
    /// it extends the payment window.
    pub async fn set_deadline(&self, id: &str, at: DateTime<Utc>) {
        on_shop!(
            self,
            execute,
            query(
                "UPDATE orders SET expires_at = $1 WHERE id = $2",
                "UPDATE orders SET expires_at = ? WHERE id = ?"
            ),
            at,
            id
        )
        .unwrap();
    }

    /// Sets the order's deadline to `after` from now on the database's own
    /// clock (not this host's), for a test that compares only the
    /// database's times.
    pub async fn set_deadline_on_db_clock(&self, id: &str, after: Duration) {
        let micros = i64::try_from(after.as_micros()).unwrap();
        on_shop!(self, execute, query(
            "UPDATE orders SET expires_at = now() + make_interval(secs => $1::float8 / 1e6) WHERE id = $2",
            "UPDATE orders SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE id = ?"
        ), micros, id)
        .unwrap();
    }

    /// Leaves the order as a crash right after the cancel transaction's
    /// commit leaves it: the row CANCELLED (now, on the database's clock),
    /// its outbox row pending, no stock released and no event published.
    pub async fn cancel_without_effects(&self, id: &str) {
        on_shop!(self, execute, query(
            "UPDATE orders SET status = 'CANCELLED', cancelled_at = now() WHERE id = $1",
            "UPDATE orders SET status = 'CANCELLED', cancelled_at = UTC_TIMESTAMP(6) WHERE id = ?"
        ), id)
        .unwrap();
        on_shop!(self, execute, query(
            "INSERT INTO order_timeout_cancel_outbox (order_id) VALUES ($1)",
            "INSERT INTO order_timeout_cancel_outbox (order_id, created_at) VALUES (?, UTC_TIMESTAMP(6))"
        ), id)
        .unwrap();
    }

    /// Opens a transaction of the shop's that holds the order row's lock
    /// (`SELECT … FOR UPDATE`, as a slow payment callback would) until it
    /// commits ([`ShopTx::commit`]).
    pub async fn hold_row(&self, id: &str) -> ShopTx {
        let mut tx = ShopTx::begin(&self.shop).await;
        tx.execute(
            "SELECT 1 FROM orders WHERE id = $1 FOR UPDATE",
            "SELECT 1 FROM orders WHERE id = ? FOR UPDATE",
            id,
        )
        .await;
        tx
    }

    /// `pg` on PostgreSQL, `my` on MariaDB: a test's own statement (a table
    /// of its own, an `also` statement) in the dialect of its world.
    pub fn sql<'a>(&self, pg: &'a str, my: &'a str) -> &'a str {
        match self.dialect {
            Dialect::Postgres => pg,
            Dialect::MySql => my,
        }
    }

    /// Runs `sql` (one or more statements, in the dialect: see
    /// [`TestEnv::sql`]) on the shop's orders database.
    pub async fn shop_exec(&self, sql: &str) {
        let text = || sqlx::AssertSqlSafe(sql.to_owned());
        on_shop!(self, execute, raw_sql(text(), text())).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The rows of `sql` (in the dialect: see [`TestEnv::sql`]) on the
    /// shop's orders database, each decoded as `T` (a tuple).
    pub async fn shop_rows<T>(&self, sql: &str) -> Vec<T>
    where
        T: for<'r> sqlx::FromRow<'r, PgRow> + for<'r> sqlx::FromRow<'r, MySqlRow> + Send + Unpin,
    {
        let text = || sqlx::AssertSqlSafe(sql.to_owned());
        on_shop!(self, fetch_all, query_as(text(), text())).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Orders cancelled before their deadline, by the database's own
    /// timestamps (every test expects 0).
    pub async fn cancelled_early(&self) -> i64 {
        let sql = "SELECT count(*) FROM orders WHERE cancelled_at < expires_at";
        on_shop!(self, fetch_one, query_scalar(sql, sql)).unwrap()
    }

    /// Cancelled orders whose stock release is not marked done in the
    /// outbox: the only ones whose `ReleaseStock` another process may call
    /// again.
    pub async fn outbox_unreleased(&self) -> i64 {
        let sql =
            "SELECT count(*) FROM order_timeout_cancel_outbox WHERE stock_released_at IS NULL";
        on_shop!(self, fetch_one, query_scalar(sql, sql)).unwrap()
    }

    /// Kills every connection to this test's databases but the killer's
    /// own (the service's, the inventory server's, the harness's), on
    /// PostgreSQL and, in a MariaDB world, on MariaDB too; returns how many
    /// of them were to the shop's orders database (on MariaDB: not counting
    /// the inventory's), so that a test can tell the service's own were
    /// among them. For the tests of a database that drops its sessions.
    pub async fn kill_database_connections(&self) -> i64 {
        let admin = scratch::with_path(&self.base_db_url, "postgres").unwrap();
        let admin = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_with(order_timeout::store::pg_options(&admin).unwrap())
            .await
            .unwrap();
        let mut killed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()) t",
        )
        .bind(&self.name)
        .fetch_one(&admin)
        .await
        .unwrap();
        admin.close().await;
        if let Some(base) = &self.mysql_base {
            // The inventory's, killed above: not the shop's.
            killed = 0;
            let admin = scratch::with_path(base, "information_schema").unwrap();
            let admin: MySqlPool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(1)
                .connect_with(order_timeout::store::mysql_options(&admin).unwrap())
                .await
                .unwrap();
            let ids: Vec<i64> = sqlx::query_scalar(
                "SELECT ID FROM information_schema.PROCESSLIST \
                  WHERE DB = ? AND ID <> CONNECTION_ID()",
            )
            .bind(&self.name)
            .fetch_all(&admin)
            .await
            .unwrap();
            for id in ids {
                // Gone meanwhile (1094, unknown thread): nothing to kill.
                let sql = sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}"));
                if sqlx::query(sql).execute(&admin).await.is_ok() {
                    killed += 1;
                }
            }
            admin.close().await;
        }
        killed
    }

    /// Publishes raw bytes to the entry exchange with a plain AMQP client,
    /// as any order service would, and waits for the confirm.
    pub async fn publish_raw(&self, body: &[u8]) {
        self.publish_raw_as(topology::SCHEDULE_ROUTING_KEY, body)
            .await;
    }

    /// [`TestEnv::publish_raw`] with routing key `key` (a lane entry).
    pub async fn publish_raw_as(&self, key: &str, body: &[u8]) {
        let confirm = self
            .channel
            .basic_publish(
                topology::ENTRY_EXCHANGE.into(),
                key.into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_content_type("application/json".into()),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }

    /// Publishes `{"order_id", "cancel_at"}` for `order`.
    pub async fn publish_timeout(&self, order: &NewOrder) {
        self.publish_timeout_as(topology::SCHEDULE_ROUTING_KEY, order)
            .await;
    }

    /// [`TestEnv::publish_timeout`] with routing key `key` (a lane entry).
    pub async fn publish_timeout_as(&self, key: &str, order: &NewOrder) {
        let body = serde_json::json!({
            "order_id": order.id,
            "cancel_at": order_timeout::message::format_instant(order.expires_at),
        });
        self.publish_raw_as(key, body.to_string().as_bytes()).await;
    }

    /// An exclusive queue bound to the `order.cancelled` events.
    pub async fn subscribe_events(&self) -> lapin::Consumer {
        self.subscribe_events_on(topology::CANCELLED_ROUTING_KEY)
            .await
    }

    /// An exclusive queue bound to the events whose routing key matches
    /// `binding` (`#`: every timer's).
    pub async fn subscribe_events_on(&self, binding: &str) -> lapin::Consumer {
        let channel = self.amqp.create_channel().await.unwrap();
        let queue = exclusive_queue(&channel).await;
        channel
            .queue_bind(
                queue.name().clone(),
                topology::EVENTS_EXCHANGE.into(),
                binding.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .basic_consume(
                queue.name().clone(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
    }

    /// Takes every message now in the parked queue (acking them).
    pub async fn drain_parked(&self) -> Vec<lapin::message::BasicGetMessage> {
        let channel = self.amqp.create_channel().await.unwrap();
        let mut out = Vec::new();
        while let Some(msg) = channel
            .basic_get(topology::PARKED_QUEUE.into(), BasicGetOptions::default())
            .await
            .unwrap()
        {
            msg.ack(BasicAckOptions::default()).await.unwrap();
            out.push(msg);
        }
        out
    }

    /// `(status, expires_at, cancelled_at)` of an order.
    pub async fn order_state(&self, id: &str) -> (String, DateTime<Utc>, Option<DateTime<Utc>>) {
        on_shop!(
            self,
            fetch_one,
            query_as(
                "SELECT status, expires_at, cancelled_at FROM orders WHERE id = $1",
                "SELECT status, expires_at, cancelled_at FROM orders WHERE id = ?"
            ),
            id
        )
        .unwrap()
    }

    /// Available stock of SKU `n`.
    pub async fn stock(&self, n: usize) -> i64 {
        let sku = self.sku(n);
        *self
            .inventory
            .stock(std::slice::from_ref(&sku))
            .await
            .unwrap()
            .get(&sku)
            .unwrap()
    }

    /// How many `ReleaseStock` calls the inventory saw for an order (None:
    /// never released).
    pub async fn release_calls(&self, id: &str) -> Option<i64> {
        sqlx::query_scalar("SELECT calls FROM inventory.releases WHERE order_id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .unwrap()
    }

    /// Counts orders by status among ids starting with `prefix`.
    pub async fn count(&self, prefix: &str, status: &str) -> i64 {
        on_shop!(
            self,
            fetch_one,
            query_scalar(
                "SELECT count(*) FROM orders WHERE left(id, char_length($1)) = $2 AND status = $3",
                "SELECT count(*) FROM orders WHERE LEFT(id, CHAR_LENGTH(?)) = ? AND status = ?"
            ),
            prefix,
            prefix,
            status
        )
        .unwrap()
    }

    /// Polls `check` every 50 ms until it holds or `timeout` passes.
    pub async fn eventually<F, Fut>(&self, timeout: Duration, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        crate::bounds::step(what);
        let end = tokio::time::Instant::now() + timeout;
        loop {
            if check().await {
                return;
            }
            assert!(
                tokio::time::Instant::now() < end,
                "timed out after {timeout:?} waiting for: {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `service` has acked exactly `n` messages as
    /// `outcome`. A row flips before its message is acked (the release,
    /// the event and the outbox marks come first), so after the rows are
    /// seen cancelled the counter may still trail by a batch.
    pub async fn acked_exactly(&self, service: &RunningService, outcome: Outcome, n: u64) {
        self.eventually(
            Duration::from_secs(10),
            &format!("{n} messages acked as {outcome:?}"),
            || async { service.metrics.count(outcome) >= n },
        )
        .await;
        assert_eq!(service.metrics.count(outcome), n, "{outcome:?}");
    }

    /// Waits (at most `wait` each) until every one of `orders` is settled,
    /// and checks each was cancelled at or after its deadline, less than
    /// `late_ok` after it.
    pub async fn cancelled_on_time<'a>(
        &self,
        orders: impl Iterator<Item = &'a NewOrder>,
        wait: Duration,
        late_ok: chrono::Duration,
    ) {
        for order in orders {
            let (status, expires_at, cancelled_at) = self.wait_settled(&order.id, wait).await;
            assert_eq!(status, "CANCELLED", "{}", order.id);
            let cancelled_at = cancelled_at.expect("cancelled_at set");
            assert!(
                cancelled_at >= expires_at,
                "{} cancelled early: {cancelled_at} < {expires_at}",
                order.id
            );
            assert!(
                cancelled_at - expires_at < late_ok,
                "{} too late: {}",
                order.id,
                cancelled_at - expires_at
            );
        }
    }

    /// Waits until the order with `id` is no longer UNPAID.
    pub async fn wait_settled(
        &self,
        id: &str,
        timeout: Duration,
    ) -> (String, DateTime<Utc>, Option<DateTime<Utc>>) {
        self.eventually(timeout, &format!("order {id} settled"), || async {
            self.order_state(id).await.0 != "UNPAID"
        })
        .await;
        self.order_state(id).await
    }

    /// Waits until no cancelled order has outbox work (stock release,
    /// event) pending: the order row flips to CANCELLED before the release.
    pub async fn wait_outbox_done(&self, timeout: Duration) {
        self.eventually(timeout, "no outbox work pending", || async {
            let sql = "SELECT count(*) FROM order_timeout_cancel_outbox \
                        WHERE stock_released_at IS NULL OR event_published_at IS NULL";
            let pending: i64 = on_shop!(self, fetch_one, query_scalar(sql, sql)).unwrap();
            pending == 0
        })
        .await;
    }

    /// Asserts that the inventory holds exactly `STOCK - reserved by
    /// orders not cancelled` for SKUs 0..n, and that every cancelled order's
    /// stock was released exactly once (after waiting for pending releases).
    pub async fn assert_stock_exact(&self, skus: usize) {
        self.wait_outbox_done(Duration::from_secs(10)).await;
        let rows: Vec<(String, i64)> = on_shop!(
            self,
            fetch_all,
            query_as(
                "SELECT i.sku, sum(i.quantity)::bigint \
               FROM order_items i JOIN orders o ON o.id = i.order_id \
              WHERE o.status <> 'CANCELLED' GROUP BY i.sku",
                "SELECT i.sku, CAST(SUM(i.quantity) AS SIGNED) \
               FROM order_items i JOIN orders o ON o.id = i.order_id \
              WHERE o.status <> 'CANCELLED' GROUP BY i.sku"
            )
        )
        .unwrap();
        for n in 0..skus {
            let held: i64 = rows
                .iter()
                .find(|(s, _)| *s == self.sku(n))
                .map(|(_, q)| *q)
                .unwrap_or(0);
            assert_eq!(
                self.stock(n).await,
                STOCK - held,
                "stock of {}",
                self.sku(n)
            );
        }
        let sql = "SELECT count(*) FROM orders WHERE status = 'CANCELLED'";
        let cancelled: i64 = on_shop!(self, fetch_one, query_scalar(sql, sql)).unwrap();
        // The inventory's own database, PostgreSQL in either world.
        let released: i64 = sqlx::query_scalar("SELECT count(*) FROM inventory.releases")
            .fetch_one(&self.pool)
            .await
            .unwrap();
        assert_eq!(released, cancelled, "one release per cancelled order");
    }

    /// Reads up to `n` events within `timeout`.
    pub async fn read_events(
        consumer: &mut lapin::Consumer,
        n: usize,
        timeout: Duration,
    ) -> Vec<order_timeout::broker::publisher::TimerEvent> {
        let mut events = Vec::new();
        let _ = tokio::time::timeout(timeout, async {
            while events.len() < n {
                let Some(Ok(delivery)) = consumer.next().await else {
                    break;
                };
                events.push(serde_json::from_slice(&delivery.data).expect("event is JSON"));
            }
        })
        .await;
        events
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.stop_inventory();
        if self.owns_vhost {
            let _ = scratch::delete_vhost(&self.name);
        }
        let _ = scratch::drop_database_blocking(&self.base_db_url, &self.name);
        if let Some(base) = &self.mysql_base {
            let _ = scratch::drop_database_blocking(base, &self.name);
        }
        let _ =
            std::fs::remove_file(std::env::temp_dir().join(format!("{}-serve.toml", self.name)));
    }
}

/// A pool of at most 10 on the PostgreSQL database `url`.
async fn pg_pool(url: &SecretUrl) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(10)
        .connect_with(order_timeout::store::pg_options(url).unwrap())
        .await
        .expect("connect to the test database")
}

/// A transaction of the shop's held open, on either dialect: the row lock
/// of a slow payment callback ([`TestEnv::hold_row`]), the store suite's
/// concurrent session. One type so that each holder states only its SQL.
pub enum ShopTx {
    /// On PostgreSQL.
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    /// On MariaDB.
    MySql(sqlx::Transaction<'static, sqlx::MySql>),
}

impl ShopTx {
    /// Begins a transaction on a session of `shop`'s own.
    pub async fn begin(shop: &ShopDb) -> Self {
        match shop {
            ShopDb::Postgres(pool) => Self::Postgres(pool.begin().await.unwrap()),
            ShopDb::MySql(pool) => Self::MySql(pool.begin().await.unwrap()),
        }
    }

    /// Runs `pg` (PostgreSQL) or `my` (MariaDB) with `id` bound.
    pub async fn execute(&mut self, pg: &'static str, my: &'static str, id: &str) {
        match self {
            Self::Postgres(tx) => sqlx::query(pg).bind(id).execute(&mut **tx).await.map(drop),
            Self::MySql(tx) => sqlx::query(my).bind(id).execute(&mut **tx).await.map(drop),
        }
        .unwrap();
    }

    /// Runs `sql` (one or more statements, in the dialect).
    pub async fn raw(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        let text = || sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Self::Postgres(tx) => sqlx::raw_sql(text()).execute(&mut **tx).await.map(drop),
            Self::MySql(tx) => sqlx::raw_sql(text()).execute(&mut **tx).await.map(drop),
        }
    }

    /// The database's clock, read in the transaction with `pg` or `my`.
    pub async fn now(&mut self, pg: &'static str, my: &'static str) -> DateTime<Utc> {
        match self {
            Self::Postgres(tx) => sqlx::query_scalar(pg).fetch_one(&mut **tx).await,
            Self::MySql(tx) => sqlx::query_scalar(my).fetch_one(&mut **tx).await,
        }
        .unwrap()
    }

    /// Commits: the locks go.
    pub async fn commit(self) {
        match self {
            Self::Postgres(tx) => tx.commit().await,
            Self::MySql(tx) => tx.commit().await,
        }
        .unwrap();
    }

    /// Rolls back: the locks go, nothing it wrote stays.
    pub async fn rollback(self) {
        match self {
            Self::Postgres(tx) => tx.rollback().await,
            Self::MySql(tx) => tx.rollback().await,
        }
        .unwrap();
    }
}

// ---- Operator tooling helpers (tests/operations.rs) ----

/// Output of one run of the real `order-timeout` binary.
#[derive(Debug)]
pub struct CliOutput {
    /// Exit code (None: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl TestEnv {
    /// Runs the real binary against this test's vhost and database with
    /// empty standard input, and waits for it (on a blocking thread, so the
    /// test's runtime keeps serving the in-process service).
    pub async fn cli(&self, args: &[&str]) -> CliOutput {
        self.cli_stdin(args, "").await
    }

    /// [`TestEnv::cli`] with `stdin` as the binary's standard input.
    pub async fn cli_stdin(&self, args: &[&str], stdin: &str) -> CliOutput {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let stdin = stdin.to_owned();
        let env = EnvForCli {
            amqp_url: self.settings.amqp_url.expose().to_owned(),
            database_url: self.settings.database_url.expose().to_owned(),
            inventory_url: self.settings.inventory_url.expose().to_owned(),
            config: std::env::temp_dir().join(format!("{}-cli.toml", self.name)),
            config_toml: self.config_toml(),
        };
        tokio::task::spawn_blocking(move || env.run(&args, &stdin))
            .await
            .unwrap()
    }

    /// The config file's text for the settings the environment variables
    /// cannot carry: the cascade shards and lanes this test's vhost was
    /// declared with and, in a MariaDB world, `[orders].set` with
    /// [`MYSQL_CANCELLED_AT`] (written only there: a PostgreSQL world's
    /// processes keep the defaults, whatever a test changed in its
    /// settings).
    fn config_toml(&self) -> String {
        let lanes: Vec<String> = self.settings.lanes.iter().map(|l| l.to_string()).collect();
        let mut toml = format!(
            "cascade_shards = {}\nlanes = {lanes:?}\nlane_shards = {}\n",
            self.settings.cascade_shards.get(),
            self.settings.lane_shards.get(),
        );
        if self.dialect == Dialect::MySql {
            let set: Vec<String> = mysql_orders_set()
                .iter()
                .map(|(column, value)| format!("{column:?} = {value:?}"))
                .collect();
            toml.push_str(&format!("[orders]\nset = {{ {} }}\n", set.join(", ")));
        }
        toml
    }

    /// The real binary with this world's environment variables and a
    /// config file of what they cannot carry ([`TestEnv::config_toml`]),
    /// for a test that runs `serve` as a process of its own (to kill it):
    /// configured as the in-process services and [`TestEnv::cli`] are.
    pub fn command(&self) -> Command {
        let config = std::env::temp_dir().join(format!("{}-serve.toml", self.name));
        std::fs::write(&config, self.config_toml()).expect("write the config file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_order-timeout"));
        command
            .env("AMQP_URL", self.settings.amqp_url.expose())
            .env("DATABASE_URL", self.settings.database_url.expose())
            .env("INVENTORY_URL", self.settings.inventory_url.expose())
            .env("RUST_LOG", "warn")
            .env("ORDER_TIMEOUT_CONFIG", config);
        command
    }

    /// Messages ready in the parked queue (passive declare).
    pub async fn parked_count(&self) -> u32 {
        self.queue_depth(topology::PARKED_QUEUE).await
    }

    /// Messages ready in `queue` (passive declare; the queue must exist).
    pub async fn queue_depth(&self, queue: &str) -> u32 {
        let channel = self.amqp.create_channel().await.unwrap();
        let depth = depth_on(&channel, queue).await;
        let _ = channel.close(200, "".into()).await;
        depth
    }

    /// Publishes a message straight into the parked queue with these
    /// string headers, as the service's `park` would, and waits for the
    /// confirm.
    pub async fn park_raw(&self, body: &[u8], headers: &[(&str, String)]) {
        let mut table = FieldTable::default();
        for (k, v) in headers {
            table.insert(
                (*k).into(),
                lapin::types::AMQPValue::LongString(v.as_str().into()),
            );
        }
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                topology::PARKED_QUEUE.into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_headers(table),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }
}

/// What a CLI run needs from a [`TestEnv`], movable to a blocking thread.
struct EnvForCli {
    amqp_url: String,
    database_url: String,
    inventory_url: String,
    /// Config file for the settings the environment variables cannot
    /// carry, and its text ([`TestEnv::config_toml`]).
    config: std::path::PathBuf,
    config_toml: String,
}

impl EnvForCli {
    fn run(&self, args: &[String], stdin: &str) -> CliOutput {
        std::fs::write(&self.config, &self.config_toml).expect("write the CLI's config file");
        let out = crate::bounds::output_with_input(
            Command::new(env!("CARGO_BIN_EXE_order-timeout"))
                .args(args)
                .env("AMQP_URL", &self.amqp_url)
                .env("DATABASE_URL", &self.database_url)
                .env("INVENTORY_URL", &self.inventory_url)
                .env("RUST_LOG", "warn")
                .env("ORDER_TIMEOUT_CONFIG", &self.config),
            Some(stdin.as_bytes()),
            Duration::from_secs(180),
            &format!("order-timeout {}", args.join(" ")),
        );
        let _ = std::fs::remove_file(&self.config);
        CliOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// A server-named queue of `channel`'s own, gone with it: where a test
/// binds what it wants to look at.
pub async fn exclusive_queue(channel: &Channel) -> lapin::Queue {
    channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap()
}

/// Declares a durable queue `name` of `queue_type` (`quorum`, `classic`)
/// with `args` besides, as a test's own or in place of one the service
/// declared.
pub async fn declare_durable_queue(
    channel: &Channel,
    name: &str,
    queue_type: &str,
    mut args: FieldTable,
) {
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(queue_type.into()),
    );
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await
        .unwrap();
}

/// Whether the service at `addr` is ready (`/readyz` answers 200): its
/// topology declared, so what tests then bind, unbind or publish with a
/// lane entry key meets the service's queues.
pub async fn ready(addr: std::net::SocketAddr) -> bool {
    http_get(addr, "/readyz").await.0 == 200
}

/// A bare-bones HTTP/1.1 GET: `(status, body)`.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return (0, String::new());
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Messages ready in `queue`, by a passive declare on `channel` (one
/// already open, where nothing may stand between an action and the count).
pub async fn depth_on(channel: &Channel, queue: &str) -> u32 {
    order_timeout::broker::peek_queue(channel, queue)
        .await
        .unwrap()
        .message_count()
}

/// What a [`RuleInventory`] answers the `call`-th release (from 1) of
/// `order`: `Some(status)` refuses it, `None` hands it to the reference
/// inventory.
pub type ReleaseRule = dyn Fn(&str, usize) -> Option<tonic::Status> + Send + Sync;

/// The reference inventory with some releases refused by a rule, counting
/// every release call per order: the one double for the tests that need
/// the inventory to fail (an unavailable shard, an order it froze).
#[derive(Clone)]
pub struct RuleInventory {
    inner: ReferenceInventory,
    rule: std::sync::Arc<ReleaseRule>,
    calls: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
}

impl RuleInventory {
    /// Release calls seen for `order`, refused ones included.
    pub fn calls(&self, order: &str) -> usize {
        self.calls.lock().unwrap().get(order).copied().unwrap_or(0)
    }
}

#[tonic::async_trait]
impl order_timeout_tools::inventory::pb::inventory_server::Inventory for RuleInventory {
    async fn release_stock(
        &self,
        request: tonic::Request<order_timeout_tools::inventory::pb::ReleaseStockRequest>,
    ) -> Result<
        tonic::Response<order_timeout_tools::inventory::pb::ReleaseStockResponse>,
        tonic::Status,
    > {
        let id = request.get_ref().order_id.clone();
        let call = {
            let mut all = self.calls.lock().unwrap();
            let n = all.entry(id.clone()).or_default();
            *n += 1;
            *n
        };
        if let Some(status) = (self.rule)(&id, call) {
            return Err(status);
        }
        self.inner.release_stock(request).await
    }

    async fn reserve_stock(
        &self,
        request: tonic::Request<order_timeout_tools::inventory::pb::ReserveStockRequest>,
    ) -> Result<
        tonic::Response<order_timeout_tools::inventory::pb::ReserveStockResponse>,
        tonic::Status,
    > {
        self.inner.reserve_stock(request).await
    }

    async fn get_stock(
        &self,
        request: tonic::Request<order_timeout_tools::inventory::pb::GetStockRequest>,
    ) -> Result<tonic::Response<order_timeout_tools::inventory::pb::GetStockResponse>, tonic::Status>
    {
        self.inner.get_stock(request).await
    }
}

impl TestEnv {
    /// Replaces the test's inventory server by a [`RuleInventory`] refusing
    /// releases by `rule`, on the same address; returns it and the switch
    /// that stops it.
    pub async fn inventory_refusing(
        &self,
        rule: impl Fn(&str, usize) -> Option<tonic::Status> + Send + Sync + 'static,
    ) -> (RuleInventory, Shutdown) {
        let server = RuleInventory {
            inner: ReferenceInventory::new(self.pool.clone()),
            rule: std::sync::Arc::new(rule),
            calls: std::sync::Arc::default(),
        };
        let stop = self.replace_inventory(server.clone()).await;
        (server, stop)
    }
}
