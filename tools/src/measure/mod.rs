//! Measurements that assert nothing, run against the real servers with the
//! service in-process (as the end-to-end tests run it), and print figures:
//!
//! - [`crash_levers`] (`order-timeout-tools crash-levers`): a private
//!   RabbitMQ node `kill -9`ed under load, with and without the two levers
//!   (the broker's dead-letter retry, the service's catch-up sweeps);
//! - [`sweep_lateness`] (`order-timeout-tools sweep-lateness`): how late the
//!   sweeper cancels an unpublished order with the default settings behind
//!   a poison row or 600 re-opened rows, on PostgreSQL and MariaDB.
//!
//! Both were ignored tests of `tests/e2e` (issue 44: measurements belong to
//! the bench); the workloads and settings are the same. Each run builds a
//! [`World`] as the suite's `TestEnv` does. What the remaining tests share
//! with them lives here and the tests call it: [`broker_fault`] (a broker
//! fault under load and its figures, for `tests/e2e/broker_faults.rs`) and
//! [`sweep_lateness::Shop`] (a shop's orders table on either dialect, for
//! `tests/e2e/safety_net.rs`).

use std::time::Duration;

use order_timeout::settings::{SecretUrl, Settings, Shards};
use order_timeout::shutdown::Shutdown;
use sqlx::PgPool;

use crate::inventory::{ReferenceInventory, ShopInventory};
use crate::scratch::{self, ScratchDatabase};
use crate::shop;

pub mod broker_fault;
pub mod crash_levers;
pub mod sweep_lateness;

/// A vhost of the run's own on the machine's broker, deleted on drop.
struct Vhost(String);

impl Drop for Vhost {
    fn drop(&mut self) {
        if let Err(e) = scratch::delete_vhost(&self.0) {
            eprintln!("deleting vhost {}: {e}", self.0);
        }
    }
}

/// One run's world, as the suite's `TestEnv` builds it: a database of its
/// own on the PostgreSQL server of `DATABASE_URL` (the service's migrations
/// and the reference shop schema), the reference inventory server over its
/// stock on the loopback, and (when asked) a vhost of its own on the
/// machine's broker (`AMQP_URL`) with the topology declared. Everything is
/// removed on drop, also when the run fails; what a killed run left is
/// swept by the next test run ([`scratch::sweep_abandoned`]).
pub(crate) struct World {
    /// The service's settings: the defaults, with two cascade shards, a
    /// 10 s shutdown timeout and a free HTTP port (as in the suite).
    pub(crate) settings: Settings,
    /// The run's PostgreSQL database (orders and stock).
    pub(crate) pool: PgPool,
    /// The order service's client of the inventory.
    pub(crate) inventory: ShopInventory,
    stop_inventory: Shutdown,
    // Dropped after the pool and the inventory's stop.
    _vhost: Option<Vhost>,
    _database: ScratchDatabase,
}

impl World {
    /// Builds a world; `vhost`: a vhost of its own on the machine's broker
    /// (else `settings.amqp_url` is left for the caller to set).
    pub(crate) async fn build(vhost: bool) -> anyhow::Result<Self> {
        let database = ScratchDatabase::on_test_server("ot_measure");
        let database_url = database.url()?;
        let pool = shop::prepare_database(&database_url, 10).await?;
        let amqp_base = SecretUrl::new(
            std::env::var("AMQP_URL")
                .unwrap_or_else(|_| order_timeout::settings::DEFAULT_AMQP_URL.into()),
        );
        let (amqp_url, vhost) = if vhost {
            let name = database.name().to_owned();
            let url = scratch::create_vhost(&amqp_base, &name)?;
            (url, Some(Vhost(name)))
        } else {
            (amqp_base, None)
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let inventory_url = format!("http://{}", listener.local_addr()?);
        let stop_inventory = Shutdown::new();
        let stopped = stop_inventory.clone();
        tokio::spawn(
            ReferenceInventory::new(pool.clone())
                .serve(listener, async move { stopped.wait().await }),
        );
        let inventory = ShopInventory::connect_lazy(&inventory_url, Duration::from_secs(5))?;
        let mut settings = Settings {
            amqp_url,
            database_url,
            inventory_url: SecretUrl::new(inventory_url),
            ..Settings::default()
        };
        settings.shutdown_timeout = Duration::from_secs(10);
        settings.cascade_shards = Shards::try_from(2).expect("2 shards");
        settings.http_addr = "127.0.0.1:0".parse()?;
        if vhost.is_some() {
            order_timeout::testing::broker::declare_topology(&settings).await?;
        }
        Ok(Self {
            settings,
            pool,
            inventory,
            stop_inventory,
            _vhost: vhost,
            _database: database,
        })
    }

    /// The world's shop, for [`broker_fault::run`].
    pub(crate) fn shop(&self) -> broker_fault::Shop<'_> {
        broker_fault::Shop {
            pool: &self.pool,
            inventory: &self.inventory,
        }
    }

    /// Stocks SKUs `sku-0` .. `sku-{n-1}` with 1,000 each.
    pub(crate) async fn stock_skus(&self, n: usize) -> anyhow::Result<()> {
        let stock: Vec<(String, i64)> = (0..n).map(|i| (sku(i), 1_000)).collect();
        shop::set_stock(&self.pool, &stock).await?;
        Ok(())
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop_inventory.trigger();
    }
}

/// SKU `n`'s name.
pub(crate) fn sku(n: usize) -> String {
    format!("sku-{n}")
}

/// Polls `check` every 50 ms until it holds (`Ok(true)`) or `limit`
/// passes (`Ok(false)`).
pub(crate) async fn poll<F, Fut>(limit: Duration, mut check: F) -> anyhow::Result<bool>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let end = tokio::time::Instant::now() + limit;
    loop {
        if check().await? {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= end {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
