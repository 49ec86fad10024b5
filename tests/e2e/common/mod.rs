//! Test harness: every test gets its own RabbitMQ vhost and its own
//! PostgreSQL database (migrated), a reference inventory server on a free
//! port, and helpers to play the order service. Everything is removed when
//! the [`TestEnv`] is dropped, also when the test fails.
//!
//! [`TestEnv::on`]`(Dialect::MySql)` puts the shop's orders (and the
//! service's own tables) in a MariaDB database of the test's own instead;
//! the helpers that read or change orders work on either, and the test
//! matrix ([`matrix`], [`on_both_dialects!`]) runs a test body once per
//! dialect.
//!
//! Needs a local RabbitMQ (`rabbitmqctl` creates the vhosts, as root),
//! PostgreSQL and (for the MariaDB worlds) MariaDB; `scripts/test.sh` makes
//! sure they run. `AMQP_URL`, `DATABASE_URL` and `MYSQL_URL` name the
//! servers (their vhost / database part is replaced).
//!
//! The vhost is made on the broker of [`Broker::current`]: the machine's,
//! or the RabbitMQ 4.x test node for the tests [`on_rabbitmq4!`] and
//! [`on_both_brokers!`] make ([`brokers`]).

#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use order_timeout::RunningService;
use order_timeout::settings::{SecretUrl, Settings, Shards};
use order_timeout::shutdown::Shutdown;
use order_timeout::testing::broker::{connect_amqp, declare_topology};
use order_timeout::testing::metrics::Outcome;
use order_timeout::testing::store::OrderItem;
use order_timeout::testing::topology::DUE_QUEUE;
use order_timeout_tools::inventory::{ReferenceInventory, ShopInventory};
use order_timeout_tools::scratch;
use order_timeout_tools::shop::{self, NewOrder, ShopDb};
use sqlx::mysql::MySqlRow;
use sqlx::postgres::PgRow;
use sqlx::{MySqlPool, PgPool};

pub use order_timeout::testing::store::Dialect;

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

/// Tests that stop or kill a `serve` process holding hundreds of messages
/// and then restart it take turns. On the shared RabbitMQ 3.10.8, two such
/// consumers going away within a second of each other (in different vhosts)
/// were followed by a ~30 s stall of the whole broker (nothing accepted,
/// nothing logged), three times in full runs of this binary; the restart
/// then missed its deadline. One at a time, the restarts stay quick.
///
/// The turn is a lock on a file (`flock`), so it holds between test
/// processes (cargo-nextest runs each test in a process of its own, and
/// another checkout's run may share the broker) as well as between the
/// threads of one; it is released when the returned [`RestartTurn`] is
/// dropped, also when the test fails. `.config/nextest.toml` puts these
/// tests in one test group as well, so that the runner does not start them
/// side by side only to have all but one wait here.
pub async fn restart_turn() -> RestartTurn {
    let path = std::env::temp_dir().join("order-timeout-tests-restarts.lock");
    let file = tokio::task::spawn_blocking(move || {
        let file = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        file.lock()
            .unwrap_or_else(|e| panic!("cannot lock {}: {e}", path.display()));
        file
    })
    .await
    .expect("the lock's thread");
    RestartTurn(file)
}

/// A test's turn to stop and restart a service ([`restart_turn`]).
pub struct RestartTurn(#[allow(dead_code)] std::fs::File);

/// Removes, once per test run, the vhosts and databases that earlier
/// runs killed before their cleanup left behind ([`scratch::sweep_abandoned`]):
/// a dozen left vhosts are enough to stall the shared broker.
pub async fn sweep_abandoned() {
    static SWEPT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    SWEPT
        .get_or_init(|| async {
            let Some(turn) = tokio::task::spawn_blocking(|| first_in_run("sweep"))
                .await
                .expect("the lock's thread")
            else {
                return;
            };
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
            turn.done();
        })
        .await;
}

/// Runs `work` once per test run: in the first test process of a
/// cargo-nextest run (which runs each test in a process of its own, and
/// names the run in `NEXTEST_RUN_ID`) to get here, or once per process
/// under `cargo test` (all of whose tests share one). The caller keeps it
/// to once per process.
pub fn once_per_run(what: &str, work: impl FnOnce()) {
    if let Some(turn) = first_in_run(what) {
        work();
        turn.done();
    }
}

/// Whether this process is the first of its test run to do `what`
/// ([`once_per_run`]): `Some` turn, to be marked [`RunTurn::done`], or
/// `None` when another process of the run has done it. Blocks while
/// another process is doing it.
pub fn first_in_run(what: &str) -> Option<RunTurn> {
    let Ok(run) = std::env::var("NEXTEST_RUN_ID") else {
        return Some(RunTurn(None));
    };
    let dir = std::env::temp_dir().join("order-timeout-test-runs");
    let open = || -> std::io::Result<std::fs::File> {
        std::fs::create_dir_all(&dir)?;
        let lock = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{run}.lock")))?;
        lock.lock()?;
        Ok(lock)
    };
    let lock = match open() {
        Ok(lock) => lock,
        Err(e) => {
            eprintln!(
                "warning: no lock for {what} in {} ({e}): doing it",
                dir.display()
            );
            return Some(RunTurn(None));
        }
    };
    let marker = dir.join(format!("{run}.{what}"));
    if marker.exists() {
        return None;
    }
    Some(RunTurn(Some((lock, marker))))
}

/// The turn [`first_in_run`] gives: the run's lock, held until
/// [`RunTurn::done`] marks the work done (or, if the work panics, released
/// unmarked, so that the next process tries).
pub struct RunTurn(Option<(std::fs::File, std::path::PathBuf)>);

impl RunTurn {
    /// Marks the work done for the rest of the run, and removes the marks
    /// of runs older than a day.
    pub fn done(self) {
        let Some((_lock, marker)) = self.0 else {
            return;
        };
        if let Err(e) = std::fs::write(&marker, b"") {
            eprintln!("warning: cannot write {}: {e}", marker.display());
        }
        let day = Duration::from_secs(24 * 3600);
        let old = |e: &std::fs::DirEntry| {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > day))
        };
        if let Some(dir) = marker.parent()
            && let Ok(entries) = std::fs::read_dir(dir)
        {
            for entry in entries.flatten().filter(old) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
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
    /// The database of the service started last (its parked store), when
    /// it is not [`Settings::database_url`] (a shop of its own).
    service_database: std::sync::Mutex<Option<SecretUrl>>,
    inventory_addr: std::net::SocketAddr,
    base_db_url: SecretUrl,
    /// The MariaDB server holding the orders database, when
    /// [`TestEnv::dialect`] is MySQL (the database is dropped with the test).
    mysql_base: Option<SecretUrl>,
    /// The vhost was made for this test (and is deleted with it).
    owns_vhost: bool,
    /// The broker of the test's vhost ([`Broker::current`] when it was
    /// made).
    pub broker: Broker,
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
        let broker = Broker::current();
        let amqp_url = match own_broker {
            Some(url) => url,
            None => broker
                .create_vhost(&name)
                .unwrap_or_else(|e| panic!("create the test's vhost on {broker:?}: {e}")),
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
            // The reference shop's DATETIMEs hold UTC: the harness writes
            // them from this host's clock, as instants (`set_deadline`),
            // whatever zone the server's sessions start in.
            settings.orders.time_zone = Some("UTC".into());
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
            service_database: std::sync::Mutex::new(None),
            inventory_addr,
            base_db_url,
            mysql_base,
            owns_vhost,
            broker,
            _watchdog: watchdog,
        }
    }

    /// `rabbitmqctl -q ARGS` against the broker of this test's vhost
    /// ([`TestEnv::broker`]); panics with its output when it fails.
    pub fn rabbitmqctl(&self, args: &[&str]) -> String {
        self.broker
            .rabbitmqctl(args)
            .unwrap_or_else(|e| panic!("rabbitmqctl on {:?}: {e}", self.broker))
    }

    /// Starts an in-process service instance on this world.
    pub async fn service(&self) -> RunningService {
        self.service_with(self.settings.clone()).await
    }

    /// Starts an in-process service instance with other settings, and
    /// waits (at most 60 s) until it consumes its queue when it runs on
    /// this test's vhost: what a test publishes next is read at once, not
    /// after however long a loaded broker takes to let the service in (a
    /// test once published a 1.5 s order before the service had connected
    /// to a busy RabbitMQ 4.x node, and read it 6.5 s late).
    pub async fn service_with(&self, settings: Settings) -> RunningService {
        *self.service_database.lock().unwrap() = Some(settings.database_url.clone());
        let here = settings.amqp_url == self.settings.amqp_url;
        let before = if here { self.due_consumers().await } else { 0 };
        let service = RunningService::start(settings)
            .await
            .expect("start the service");
        if here {
            self.eventually(
                Duration::from_secs(60),
                "the service consuming its queue",
                || async { self.due_consumers().await > before },
            )
            .await;
        }
        service
    }

    /// [`TestEnv::service_with`] without waiting for it to consume: for a
    /// service that is not meant to (its broker refuses it, say).
    pub async fn service_unwaited(&self, settings: Settings) -> RunningService {
        *self.service_database.lock().unwrap() = Some(settings.database_url.clone());
        RunningService::start(settings)
            .await
            .expect("start the service")
    }

    /// Consumers of the service's queue on this test's vhost (0 when it
    /// cannot be asked).
    async fn due_consumers(&self) -> u32 {
        let Ok(channel) = self.amqp.create_channel().await else {
            return 0;
        };
        let consumers = order_timeout::testing::broker::peek_queue(&channel, DUE_QUEUE)
            .await
            .map_or(0, |q| q.consumer_count());
        let _ = channel.close(200, "".into()).await;
        consumers
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
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.stop_inventory();
        if self.owns_vhost {
            let _ = self.broker.delete_vhost(&self.name);
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
        .connect_with(order_timeout::testing::store::pg_options(url).unwrap())
        .await
        .expect("connect to the test database")
}

pub mod brokers;
mod cli;
mod doubles;
pub mod matrix;
mod orders;
mod probes;
mod shop_tx;

pub use brokers::Broker;
pub use cli::CliOutput;
pub use doubles::RuleInventory;
pub(crate) use matrix::{matrix, on_both_brokers, on_both_dialects, on_rabbitmq4};
pub use orders::refusing_trigger;
pub use probes::{
    csrf_of, declare_durable_queue, depth_on, exclusive_queue, http_get, http_send, ready,
};
pub use shop_tx::ShopTx;
