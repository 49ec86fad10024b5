//! One run of a broker fault under load, on private RabbitMQ nodes
//! ([`crate::private_broker`], never the machine's broker): a service
//! started on the cluster, [`Plan::orders`] orders due evenly over
//! [`Plan::spread`], the [`Fault`] on [`Plan::node`] [`Plan::fault_after`]
//! in and undone [`Plan::down`] after it; once the service consumes again,
//! [`AFTER_RECOVERY`] more orders due 6–10 s later. Every order is waited
//! for (at most the last due + 240 s); then the [`Figures`], from the
//! orders' rows.
//!
//! `order-timeout-tools crash-levers` ([`super::crash_levers`]) prints the
//! figures of issue 12's run; `tests/e2e/broker_faults.rs` runs the same
//! [`run`] and checks bounds on its figures.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use order_timeout::RunningService;
use order_timeout::message::{Deadline, OrderId, TimeoutRequest};
use order_timeout::settings::{SecretUrl, Settings};
use order_timeout::testing::broker::{Publisher, connect_amqp};
use order_timeout::testing::store::OrderItem;
use sqlx::PgPool;

use super::{poll, sku};
use crate::inventory::ShopInventory;
use crate::private_broker::{PrivateCluster, wait_for};
use crate::shop::NewOrder;

/// SKUs the orders reserve (one unit each of SKU `n % SKUS`): stock
/// `sku-0` .. `sku-7` before a run.
pub const SKUS: usize = 8;

/// Orders published once the broker is back, due 6 to 10 s later: however
/// long the outage lasted on a loaded machine, some orders are due well
/// after recovery, and they must be on time.
pub const AFTER_RECOVERY: usize = 40;

/// What happens to the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` of the node's VM, then a restart from its data.
    Kill,
    /// `rabbitmqctl stop_app`, then `start_app`.
    StopApp,
    /// `rabbitmqctl stop`, then a restart.
    Stop,
}

/// One run: orders due over `spread` from now, the fault `fault_after`
/// into it, on node `node`, for `down`.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The run's name in its figures.
    pub label: String,
    /// The run's order ids' prefix (distinct per run on one database).
    pub prefix: &'static str,
    /// Orders scheduled before the fault, besides [`AFTER_RECOVERY`].
    pub orders: usize,
    /// When they fall due, evenly, from now.
    pub spread: (Duration, Duration),
    /// What happens to the broker.
    pub fault: Fault,
    /// The node it happens to (1-based).
    pub node: usize,
    /// From the first orders scheduled to the fault.
    pub fault_after: Duration,
    /// From the fault until it is undone.
    pub down: Duration,
    /// Also print the orders due 5 s or more after recovery that were
    /// cancelled more than 100 ms late.
    pub list_late: bool,
}

impl Plan {
    /// `orders` due evenly from 3 s to `last_due_s` from now, `fault` on
    /// `node` 2 s in, for `down_s`.
    pub fn new(
        label: impl Into<String>,
        prefix: &'static str,
        orders: usize,
        last_due_s: u64,
        fault: Fault,
        node: usize,
        down_s: u64,
    ) -> Self {
        Self {
            label: label.into(),
            prefix,
            orders,
            spread: (Duration::from_secs(3), Duration::from_secs(last_due_s)),
            fault,
            node,
            fault_after: Duration::from_secs(2),
            down: Duration::from_secs(down_s),
            list_late: false,
        }
    }
}

/// Where the run's orders go: the shop's PostgreSQL database (orders and
/// the reference inventory's stock) and the order service's client of the
/// inventory.
#[derive(Clone, Copy)]
pub struct Shop<'a> {
    /// The shop's database.
    pub pool: &'a PgPool,
    /// The order service's client of the inventory.
    pub inventory: &'a ShopInventory,
}

/// What a run measured.
#[derive(Debug)]
pub struct Figures {
    /// The plan's label.
    pub label: String,
    /// Orders scheduled, before and after the fault.
    pub orders: usize,
    /// Orders cancelled.
    pub cancelled: i64,
    /// Orders cancelled before they were due.
    pub early: i64,
    /// From the fault until the node accepted connections again.
    pub outage: Duration,
    /// From the node being back until the service was ready (consuming).
    pub reconnect: Duration,
    /// Latest cancellation of all, ms.
    pub max_late_ms: f64,
    /// Orders due at least 5 s after recovery: how many, p99 and max ms.
    pub after: (usize, f64, f64),
    /// Orders due before recovery + 5 s: how many, max ms.
    pub around: (usize, f64),
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} orders, {} cancelled, {} early; outage {:.1} s, consuming {:.2} s after the broker was back; \
             latest {:.0} ms late; due during/just after the outage: {} (max {:.0} ms); \
             due >= 5 s after recovery: {} (p99 {:.0} ms, max {:.0} ms)",
            self.label,
            self.orders,
            self.cancelled,
            self.early,
            self.outage.as_secs_f64(),
            self.reconnect.as_secs_f64(),
            self.max_late_ms,
            self.around.0,
            self.around.1,
            self.after.0,
            self.after.1,
            self.after.2,
        )
    }
}

/// When the fault began and when the node was back.
struct Outage {
    fault_at: DateTime<Utc>,
    back_at: DateTime<Utc>,
    outage: Duration,
    reconnect: Duration,
}

/// Runs `plan` against `cluster` with a service built from `settings`
/// (whose `AMQP_URL` points at the cluster) on `shop`, then measures.
///
/// # Errors
///
/// The service not ready within 60 s of its start or of the node's
/// return, not every order cancelled in time, or any server failing.
pub async fn run(
    shop: Shop<'_>,
    cluster: &PrivateCluster,
    settings: Settings,
    plan: &Plan,
) -> anyhow::Result<Figures> {
    let service = RunningService::start(settings.clone()).await?;
    let addr = service.http_addr;
    anyhow::ensure!(
        wait_for(Duration::from_secs(60), || crate::partition::ready(addr)).await,
        "the service is not ready on the private broker after 60 s"
    );
    let url = &settings.amqp_url;
    schedule_wave(shop, url, plan, 0..plan.orders, plan.spread).await?;
    let outage = fault_and_undo(cluster, plan, addr).await?;
    let total = plan.orders + AFTER_RECOVERY;
    let later = (Duration::from_secs(6), Duration::from_secs(10));
    schedule_wave(shop, url, plan, plan.orders..total, later).await?;
    // Every order settles; generous: the figures tell how late.
    let last_due = plan.spread.1.max(Duration::from_secs(10));
    let limit = last_due + Duration::from_secs(240);
    let all = poll(limit, || async {
        Ok(cancelled(shop, plan.prefix).await? == total as i64)
    })
    .await?;
    anyhow::ensure!(
        all,
        "{}: not all {total} orders cancelled within {limit:?}",
        plan.label,
    );
    service.stop().await?;
    measure(shop, plan, total, &outage).await
}

/// Causes `plan.fault` on its node [`Plan::fault_after`] from now, undoes
/// it [`Plan::down`] after it began, and waits until the service at `addr`
/// is ready again.
async fn fault_and_undo(
    cluster: &PrivateCluster,
    plan: &Plan,
    addr: std::net::SocketAddr,
) -> anyhow::Result<Outage> {
    tokio::time::sleep(plan.fault_after).await;
    let fault_at = Utc::now();
    let started = tokio::time::Instant::now();
    match plan.fault {
        Fault::Kill => cluster.kill_node(plan.node).await?,
        Fault::StopApp => cluster.stop_app(plan.node).await?,
        Fault::Stop => cluster.stop_node(plan.node).await?,
    }
    tokio::time::sleep(plan.down.saturating_sub(started.elapsed())).await;
    match plan.fault {
        Fault::Kill | Fault::Stop => cluster.start_node(plan.node).await?,
        Fault::StopApp => cluster.start_app(plan.node).await?,
    }
    let back_at = Utc::now();
    let outage = started.elapsed();
    let back = tokio::time::Instant::now();
    if !wait_for(Duration::from_secs(60), || crate::partition::ready(addr)).await {
        anyhow::bail!(
            "the service is not consuming 60 s after the node was back ({:?}); cluster:\n{}",
            plan.fault,
            cluster.status().await
        );
    }
    Ok(Outage {
        fault_at,
        back_at,
        outage,
        reconnect: back.elapsed(),
    })
}

/// Creates the orders numbered `numbers` of `plan`'s prefix (stock
/// reserved, rows inserted), due evenly over `spread` from now, and
/// publishes their timeouts to `amqp_url`, 32 at a time.
async fn schedule_wave(
    shop: Shop<'_>,
    amqp_url: &SecretUrl,
    plan: &Plan,
    numbers: std::ops::Range<usize>,
    spread: (Duration, Duration),
) -> anyhow::Result<()> {
    let conn = connect_amqp(amqp_url, "broker-fault-order-service").await?;
    let publisher = Publisher::new(&conn).await?;
    let (from, to) = spread;
    let first = numbers.start;
    let step = (to - from).as_secs_f64() / numbers.len().max(1) as f64;
    let results: Vec<anyhow::Result<()>> = futures_util::stream::iter(numbers)
        .map(|i| {
            let publisher = &publisher;
            async move {
                let timeout = from + Duration::from_secs_f64(step * (i - first) as f64);
                let order =
                    create_order(shop, &format!("{}{i:04}", plan.prefix), timeout, i).await?;
                let request =
                    TimeoutRequest::new(OrderId::parse(&order.id)?, Deadline::At(order.expires_at));
                publisher.schedule(&request).await?;
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let _ = conn.close(200, "scheduled".into()).await;
    results.into_iter().collect()
}

/// Creates order `id` as the order service would: reserves one unit of
/// SKU `n % SKUS`, then inserts the row due `timeout` from now.
async fn create_order(
    shop: Shop<'_>,
    id: &str,
    timeout: Duration,
    n: usize,
) -> anyhow::Result<NewOrder> {
    let order = NewOrder {
        id: id.to_owned(),
        expires_at: Utc::now() + chrono::Duration::from_std(timeout)?,
        items: vec![OrderItem {
            sku: sku(n % SKUS),
            quantity: 1,
        }],
    };
    shop.inventory.reserve(&order.id, &order.items).await?;
    crate::shop::insert_order(shop.pool, &order).await?;
    Ok(order)
}

/// The orders of `prefix` cancelled so far.
async fn cancelled(shop: Shop<'_>, prefix: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE left(id, char_length($1)) = $2 AND status = $3",
    )
    .bind(prefix)
    .bind(prefix)
    .bind("CANCELLED")
    .fetch_one(shop.pool)
    .await?)
}

/// The figures, from the cancelled orders' rows.
async fn measure(
    shop: Shop<'_>,
    plan: &Plan,
    total: usize,
    outage: &Outage,
) -> anyhow::Result<Figures> {
    let rows: Vec<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT expires_at, cancelled_at FROM orders WHERE starts_with(id, $1) AND status = 'CANCELLED'",
    )
    .bind(plan.prefix)
    .fetch_all(shop.pool)
    .await?;
    let late_ms = |(due, done): &(DateTime<Utc>, DateTime<Utc>)| {
        (*done - *due).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0
    };
    let recovered = outage.back_at + chrono::Duration::seconds(5);
    let mut after: Vec<f64> = rows
        .iter()
        .filter(|(due, _)| *due >= recovered)
        .map(late_ms)
        .collect();
    after.sort_by(f64::total_cmp);
    if plan.list_late {
        for r in rows.iter().filter(|(due, _)| *due >= recovered) {
            if late_ms(r) > 100.0 {
                println!(
                    "late: due {:+.1} s after back, {:.0} ms late",
                    (r.0 - outage.back_at).num_milliseconds() as f64 / 1000.0,
                    late_ms(r)
                );
            }
        }
    }
    let around: Vec<f64> = rows
        .iter()
        .filter(|(due, _)| *due >= outage.fault_at && *due < recovered)
        .map(late_ms)
        .collect();
    let p99 = |v: &[f64]| {
        v.get(((v.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0.0)
    };
    Ok(Figures {
        label: plan.label.clone(),
        orders: total,
        cancelled: rows.len() as i64,
        early: rows.iter().filter(|r| late_ms(r) < 0.0).count() as i64,
        outage: outage.outage,
        reconnect: outage.reconnect,
        max_late_ms: rows.iter().map(late_ms).fold(0.0, f64::max),
        after: (
            after.len(),
            p99(&after),
            after.last().copied().unwrap_or(0.0),
        ),
        around: (around.len(), around.iter().copied().fold(0.0, f64::max)),
    })
}
