//! `order-timeout-tools demo`: the product working end to end on the local
//! servers.
//!
//! Migrates, creates the reference shop schema, starts the reference inventory server and the service in this
//! process, creates orders with random timeouts (reserving their stock and
//! publishing their timeouts the way an order service would), pays some of
//! them before their deadline, and checks the outcome from the database:
//! every unpaid order cancelled, never early; every paid order untouched;
//! stock after = stock before − stock of paid orders.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use chrono::Utc;
use clap::Args;
use futures_util::{StreamExt, TryStreamExt, stream};
use indicatif::{ProgressBar, ProgressStyle};
use rand::Rng;
use rand::seq::IndexedRandom;

use order_timeout::RunningService;
use order_timeout::message::{Deadline, OrderId, TimeoutRequest};
use order_timeout::settings::{SecretUrl, Settings};
use order_timeout::shutdown::Shutdown;
use order_timeout::testing::broker::{Publisher, connect_amqp, declare_topology};
use order_timeout::testing::store::OrderItem;

use crate::inventory::{ReferenceInventory, ShopInventory};
use crate::shop::{self, NewOrder, OrdersDatabase, Progress, ShopDb};

/// Arguments of `demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Orders to create.
    #[arg(long, default_value_t = 2000)]
    pub orders: usize,
    /// Shortest payment window.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub min_timeout: Duration,
    /// Longest payment window.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub max_timeout: Duration,
    /// Share of orders paid before their deadline.
    #[arg(long, default_value_t = 0.3)]
    pub paid_ratio: f64,
    /// Distinct SKUs the orders draw from.
    #[arg(long, default_value_t = 20)]
    pub skus: usize,
    /// Where the orders live: `postgres` (DATABASE_URL), or `mysql` (MYSQL_URL's
    /// server, database `order_timeout`, or DATABASE_URL when it is mysql://).
    /// The reference inventory server keeps its stock in PostgreSQL either way.
    #[arg(long, value_enum, default_value_t = OrdersDatabase::Postgres)]
    pub database: OrdersDatabase,
}

/// Where the orders live and where the inventory keeps its stock, and the
/// service's settings for them.
fn databases(
    settings: &Settings,
    database: OrdersDatabase,
) -> anyhow::Result<(Settings, SecretUrl)> {
    let pg_default = SecretUrl::new(order_timeout::settings::DEFAULT_DATABASE_URL);
    let on_mysql = settings.database_url.expose().starts_with("mysql://");
    match database {
        OrdersDatabase::Postgres if !on_mysql => {
            Ok((settings.clone(), settings.database_url.clone()))
        }
        OrdersDatabase::Postgres => {
            anyhow::bail!("DATABASE_URL is mysql://: run with --database mysql")
        }
        OrdersDatabase::Mysql => {
            let orders_url = if on_mysql {
                settings.database_url.clone()
            } else {
                shop::mysql_url("order_timeout")?
            };
            let inventory_db = if on_mysql {
                pg_default
            } else {
                settings.database_url.clone()
            };
            let mut orders = settings.orders.clone();
            // MySQL's now() has whole seconds; the demo measures lateness
            // in milliseconds from this column.
            orders.set.insert("cancelled_at".into(), "NOW(6)".into());
            // The demo writes the reference shop's DATETIMEs in UTC (from
            // this host's clock), whatever zone the server's sessions
            // start in.
            orders.time_zone = Some("UTC".into());
            Ok((
                Settings {
                    database_url: orders_url,
                    orders,
                    ..settings.clone()
                },
                inventory_db,
            ))
        }
    }
}

const STOCK_PER_SKU: i64 = 1_000_000;

/// Runs the demo; the exit code says whether every check passed.
pub async fn run(settings: Settings, args: DemoArgs) -> anyhow::Result<ExitCode> {
    check_args(&args)?;
    let world = World::start(&settings, args.database).await?;
    let run_id = Utc::now().format("%Y%m%d%H%M%S%3f").to_string();
    let prefix = format!("demo-{run_id}-");
    let skus: Vec<String> = (0..args.skus.max(1))
        .map(|i| format!("{prefix}sku-{i:02}"))
        .collect();
    shop::set_stock(
        &world.pool,
        &skus
            .iter()
            .map(|s| (s.clone(), STOCK_PER_SKU))
            .collect::<Vec<_>>(),
    )
    .await?;
    let plans = plan_orders(&args, &skus, &prefix);
    eprintln!(
        "== creating {} orders (timeouts {:?}..{:?}, {:.0}% to be paid), run {run_id}",
        args.orders,
        args.min_timeout,
        args.max_timeout,
        args.paid_ratio * 100.0
    );
    let pay_failures = Arc::new(AtomicU64::new(0));
    let creating = std::time::Instant::now();
    let created = world.create_orders(plans, &pay_failures).await?;
    let took = creating.elapsed();
    eprintln!(
        "== created {} orders in {:.1} s ({:.0} orders/s); waiting for their deadlines",
        created.len(),
        took.as_secs_f64(),
        created.len() as f64 / took.as_secs_f64()
    );
    let give_up = tokio::time::Instant::now() + args.max_timeout + Duration::from_secs(30);
    wait_settled(&world.shop, &prefix, created.len(), give_up).await?;
    let report = check(
        &world.shop,
        &world.pool,
        &world.inventory,
        &prefix,
        &created,
        &skus,
    )
    .await?;
    let pay_failures = pay_failures.load(Ordering::Relaxed);
    world.stop().await?;
    Ok(verdict(&report, pay_failures))
}

fn check_args(args: &DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.orders > 0, "--orders must be positive");
    anyhow::ensure!(
        args.min_timeout >= Duration::from_millis(500) && args.max_timeout >= args.min_timeout,
        "need 500ms <= --min-timeout <= --max-timeout"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.paid_ratio),
        "--paid-ratio is a share in 0..=1"
    );
    Ok(())
}

/// What the demo runs on: the orders' database, the reference inventory
/// server (in this process, on a free port) and its client, the service
/// (in this process), and the order service's own publisher.
struct World {
    shop: ShopDb,
    /// The reference inventory's database.
    pool: sqlx::PgPool,
    inventory: ShopInventory,
    stop_inventory: Shutdown,
    inventory_task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    service: RunningService,
    amqp: lapin::Connection,
    publisher: Publisher,
}

impl World {
    async fn start(settings: &Settings, database: OrdersDatabase) -> anyhow::Result<Self> {
        let (settings, inventory_db) = databases(settings, database)?;
        eprintln!("== migrating {}", settings.database_url);
        let shop = ShopDb::prepare(&settings.database_url, 20).await?;
        let pool = if inventory_db == settings.database_url {
            match &shop {
                ShopDb::Postgres(pool) => pool.clone(),
                ShopDb::MySql(_) => unreachable!("a mysql:// URL is never the inventory's"),
            }
        } else {
            eprintln!("== the reference inventory keeps its stock in {inventory_db}");
            shop::prepare_database(&inventory_db, 10).await?
        };

        // The reference inventory server, on a free local port.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let inventory_url = format!("http://{}", listener.local_addr()?);
        let stop_inventory = Shutdown::new();
        let inventory_task = tokio::spawn({
            let stop = stop_inventory.clone();
            ReferenceInventory::new(pool.clone()).serve(listener, async move { stop.wait().await })
        });
        let inventory = ShopInventory::connect_lazy(&inventory_url, Duration::from_secs(5))?;

        eprintln!("== starting the service (inventory at {inventory_url})");
        declare_topology(&settings).await?;
        let service = RunningService::start(Settings {
            inventory_url: SecretUrl::new(inventory_url.clone()),
            // The demo may run beside a `serve` that holds HTTP_ADDR.
            http_addr: "127.0.0.1:0".parse().expect("valid address"),
            ..settings.clone()
        })
        .await?;

        // The order service's side: its own connection and publisher.
        let amqp = connect_amqp(&settings.amqp_url, "order-timeout-demo-shop").await?;
        let publisher = Publisher::new(&amqp).await?;
        Ok(Self {
            shop,
            pool,
            inventory,
            stop_inventory,
            inventory_task,
            service,
            amqp,
            publisher,
        })
    }

    /// Creates the planned orders as an order service would (reserve
    /// stock, insert the row, publish the timeout), 32 at a time, and pays
    /// the ones to be paid at a random moment of their window; a payment
    /// that does not go through is counted in `pay_failures`.
    async fn create_orders(
        &self,
        plans: Vec<(NewOrder, Duration, bool)>,
        pay_failures: &Arc<AtomicU64>,
    ) -> anyhow::Result<Vec<NewOrder>> {
        stream::iter(plans)
            .map(|(order, timeout, will_pay)| {
                self.create_order(order, timeout, will_pay, pay_failures)
            })
            .buffer_unordered(32)
            .try_collect()
            .await
    }

    async fn create_order(
        &self,
        mut order: NewOrder,
        timeout: Duration,
        will_pay: bool,
        pay_failures: &Arc<AtomicU64>,
    ) -> anyhow::Result<NewOrder> {
        self.inventory
            .reserve(&order.id, &order.items)
            .await
            .context("reserving stock")?;
        order.expires_at = Utc::now() + chrono::Duration::from_std(timeout)?;
        self.shop
            .insert_order(&order)
            .await
            .context("inserting order")?;
        self.publisher
            .schedule(&TimeoutRequest::new(
                OrderId::parse(&order.id)?,
                Deadline::At(order.expires_at),
            ))
            .await?;
        if will_pay {
            // Pay somewhere in the window, at least 300 ms before the deadline.
            let window = timeout.saturating_sub(Duration::from_millis(300));
            let wait = window.mul_f64(rand::rng().random_range(0.0..1.0));
            let (shop, id, pay_failures) =
                (self.shop.clone(), order.id.clone(), pay_failures.clone());
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                if !matches!(shop.pay(&id).await, Ok(true)) {
                    pay_failures.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        Ok(order)
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.service.stop().await?;
        self.stop_inventory.trigger();
        let _ = self.inventory_task.await;
        let _ = self.amqp.close(200, "demo done".into()).await;
        Ok(())
    }
}

/// Each order with its timeout and whether it will be paid.
fn plan_orders(args: &DemoArgs, skus: &[String], prefix: &str) -> Vec<(NewOrder, Duration, bool)> {
    let mut rng = rand::rng();
    (0..args.orders)
        .map(|i| {
            let timeout = rng.random_range(args.min_timeout..=args.max_timeout);
            let mut items: BTreeMap<String, i64> = BTreeMap::new();
            for _ in 0..rng.random_range(1..=3) {
                let sku = skus.choose(&mut rng).expect("at least one sku").clone();
                *items.entry(sku).or_default() += rng.random_range(1..=5);
            }
            let order = NewOrder {
                id: format!("{prefix}{i:05}"),
                expires_at: Utc::now(),
                items: items
                    .into_iter()
                    .map(|(sku, quantity)| OrderItem { sku, quantity })
                    .collect(),
            };
            (order, timeout, rng.random_bool(args.paid_ratio))
        })
        .collect()
}

/// Waits until the `created` orders have settled (paid orders once their
/// deadline has passed), showing progress, or until `give_up`.
async fn wait_settled(
    shop: &ShopDb,
    prefix: &str,
    created: usize,
    give_up: tokio::time::Instant,
) -> anyhow::Result<()> {
    let bar = ProgressBar::new(created as u64).with_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} settled  {msg}",
        )
        .expect("valid template"),
    );
    loop {
        let Progress {
            cancelled,
            paid,
            unpaid,
            // Paid orders count as settled once their deadline has passed.
            paid_past,
            pending_outbox,
        } = shop.progress(prefix).await?;
        bar.set_position((cancelled + paid_past) as u64);
        bar.set_message(format!(
            "cancelled {cancelled}, paid {paid}, unpaid {unpaid}"
        ));
        if unpaid == 0 && pending_outbox == 0 && cancelled + paid_past == created as i64 {
            break;
        }
        if tokio::time::Instant::now() > give_up {
            bar.abandon_with_message("gave up waiting".to_string());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bar.finish();
    Ok(())
}

/// Prints the summary and the failures; the exit code.
fn verdict(report: &Report, pay_failures: u64) -> ExitCode {
    println!("{}", report.summary());
    let mut ok = report.failures.is_empty();
    if pay_failures > 0 {
        println!("FAIL: {pay_failures} orders could not be paid before their deadline");
        ok = false;
    }
    for failure in &report.failures {
        println!("FAIL: {failure}");
    }
    if ok {
        println!("demo: all checks passed");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

struct Report {
    orders: usize,
    cancelled: i64,
    paid: i64,
    releases: i64,
    duplicate_release_calls: i64,
    lateness: shop::Lateness,
    failures: Vec<String>,
}

impl Report {
    fn summary(&self) -> String {
        format!(
            "demo summary: {} orders: {} cancelled, {} paid and untouched, {} cancelled early; \
             lateness p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {} stock releases ({} duplicate calls absorbed); stock check {}",
            self.orders,
            self.cancelled,
            self.paid,
            self.lateness.early,
            self.lateness.p50_ms,
            self.lateness.p99_ms,
            self.lateness.max_ms,
            self.releases,
            self.duplicate_release_calls,
            if self.failures.iter().any(|f| f.starts_with("stock")) {
                "FAILED"
            } else {
                "ok"
            },
        )
    }
}

async fn check(
    shop: &ShopDb,
    pool: &sqlx::PgPool,
    inventory: &ShopInventory,
    prefix: &str,
    created: &[NewOrder],
    skus: &[String],
) -> anyhow::Result<Report> {
    let mut failures = Vec::new();
    let statuses: BTreeMap<String, String> = shop.statuses(prefix).await?.into_iter().collect();
    let cancelled = statuses.values().filter(|s| *s == "CANCELLED").count() as i64;
    let paid = statuses.values().filter(|s| *s == "PAID").count() as i64;
    let unpaid = statuses.values().filter(|s| *s == "UNPAID").count();
    if unpaid > 0 {
        failures.push(format!(
            "{unpaid} orders are still UNPAID after their deadline"
        ));
    }
    let lateness = shop.lateness(prefix).await?;
    if lateness.early > 0 {
        failures.push(format!(
            "{} orders were cancelled before their deadline",
            lateness.early
        ));
    }

    if let Some(wrong) = stock_mismatch(inventory, created, &statuses, skus).await? {
        failures.push(wrong);
    }
    let (releases, calls): (i64, Option<i64>) = sqlx::query_as(
        "SELECT count(*), sum(calls)::bigint FROM inventory.releases WHERE starts_with(order_id, $1)",
    )
    .bind(prefix)
    .fetch_one(pool)
    .await?;
    if releases != cancelled {
        failures.push(format!(
            "stock released for {releases} orders but {cancelled} were cancelled"
        ));
    }
    Ok(Report {
        orders: created.len(),
        cancelled,
        paid,
        releases,
        duplicate_release_calls: calls.unwrap_or(0) - releases,
        lateness,
        failures,
    })
}

/// Stock after = stock before − stock of paid orders; what differs, if
/// anything.
async fn stock_mismatch(
    inventory: &ShopInventory,
    created: &[NewOrder],
    statuses: &BTreeMap<String, String>,
    skus: &[String],
) -> anyhow::Result<Option<String>> {
    let mut expected: BTreeMap<String, i64> =
        skus.iter().map(|s| (s.clone(), STOCK_PER_SKU)).collect();
    for order in created {
        if statuses.get(&order.id).map(String::as_str) == Some("PAID") {
            for item in &order.items {
                *expected.entry(item.sku.clone()).or_default() -= item.quantity;
            }
        }
    }
    let actual = inventory.stock(skus).await?;
    let wrong: Vec<String> = expected
        .iter()
        .filter(|(sku, want)| actual.get(*sku) != Some(want))
        .map(|(sku, want)| format!("{sku}: expected {want}, found {:?}", actual.get(sku)))
        .collect();
    Ok((!wrong.is_empty()).then(|| {
        format!(
            "stock mismatch on {} SKUs: {}",
            wrong.len(),
            wrong.join(", ")
        )
    }))
}
