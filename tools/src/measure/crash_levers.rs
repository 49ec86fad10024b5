//! `order-timeout-tools crash-levers`: both levers against a broker crash,
//! measured on issue 12's run. Per run (`--levers`, one after the other):
//! a fresh [`World`], a private single RabbitMQ node
//! ([`crate::private_broker`], never the machine's broker) with the shipped
//! `deploy/rabbitmq/advanced.config` and the dead-letter retry
//! (`dead_letter_worker_publisher_confirm_timeout`) left at RabbitMQ's
//! default of 180 s or set lower, and the service's catch-up sweeps on
//! (shipped) or off. 600 orders due evenly over 3–30 s, the node `kill -9`ed
//! 2 s in and started again 8 s after the kill; once the service consumes
//! again, 40 more orders due 6–10 s later. Every order is waited for (at
//! most 270 s); then the figures, from the orders' rows: lost, early, the
//! outage, how soon the service consumed again, the latest order, and the
//! lateness of the orders due during or just after the outage and of those
//! due 5 s or more after the node was back. About 2 minutes a run.
//!
//! `tests/e2e/broker_faults.rs` checks the same kind of run with bounds;
//! docs/benchmarks-log.md "Broker crashes" records the figures.

use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use order_timeout::app::RunningService;
use order_timeout::broker::connect_amqp;
use order_timeout::broker::publisher::Publisher;
use order_timeout::message::{Deadline, OrderId, TimeoutRequest};
use order_timeout::settings::{SecretUrl, Settings};
use order_timeout::store::OrderItem;

use super::{World, poll, sku};
use crate::private_broker::{ClusterConfig, PrivateCluster, wait_for};
use crate::shop::NewOrder;

/// SKUs the orders reserve (one unit each).
const SKUS: usize = 8;

/// Orders published once the broker is back, due 6 to 10 s later.
const AFTER_RECOVERY: usize = 40;

/// One run's levers: `RETRY:CATCH_UP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lever {
    /// The dead-letter retry, ms (`None`: RabbitMQ's default, 180 s, as
    /// shipped).
    pub retry_ms: Option<u64>,
    /// The service's catch-up sweeps (`[sweeper] catch_up_window`: the
    /// default, or 0).
    pub catch_up: bool,
}

impl Lever {
    fn label(&self) -> String {
        format!(
            "dead-letter retry {}, {}",
            self.retry_ms
                .map_or("180 s (default)".into(), |ms| format!("{ms} ms")),
            if self.catch_up {
                "catch-up sweeps"
            } else {
                "no catch-up"
            }
        )
    }
}

/// Parses `RETRY:CATCH_UP` (`none:off`, `2000:on`).
fn parse_lever(s: &str) -> Result<Lever, String> {
    let (retry, catch_up) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected RETRY:on|off (e.g. none:off, 2000:on)"))?;
    let retry_ms = match retry {
        "none" => None,
        ms => Some(
            ms.parse()
                .map_err(|_| format!("{retry:?}: a retry in ms, or none"))?,
        ),
    };
    let catch_up = match catch_up {
        "on" => true,
        "off" => false,
        other => return Err(format!("{other:?}: catch-up sweeps on or off")),
    };
    Ok(Lever { retry_ms, catch_up })
}

/// `crash-levers`' arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct CrashLeversArgs {
    /// The runs, in order: each `RETRY:CATCH_UP`, the dead-letter retry in
    /// ms (`none`: RabbitMQ's default of 180 s, as shipped) and the
    /// service's catch-up sweeps `on` (as shipped) or `off`.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_lever,
        default_value = "none:off,none:on,2000:off,2000:on,10000:on"
    )]
    pub levers: Vec<Lever>,
    /// Also list the orders due 5 s or more after recovery that were
    /// cancelled more than 100 ms late.
    #[arg(long)]
    pub list_late: bool,
}

/// What a run measured.
#[derive(Debug)]
pub struct Figures {
    label: String,
    orders: usize,
    cancelled: i64,
    early: i64,
    /// From the kill until the node accepted connections again.
    outage: Duration,
    /// From the node being back until the service was ready (consuming).
    reconnect: Duration,
    /// Latest cancellation of all, ms.
    max_late_ms: f64,
    /// Orders due at least 5 s after recovery: how many, p99 and max ms.
    after: (usize, f64, f64),
    /// Orders due before recovery + 5 s: how many, max ms.
    around: (usize, f64),
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

/// Runs `crash-levers` (the command): each run's figures as it ends, then
/// all of them together.
pub async fn command(args: CrashLeversArgs) -> anyhow::Result<ExitCode> {
    let mut table = Vec::new();
    for lever in &args.levers {
        let figures = one(*lever, args.list_late).await?;
        println!("{figures}");
        table.push(figures.to_string());
    }
    println!("\n{}", table.join("\n"));
    Ok(ExitCode::SUCCESS)
}

/// One run (module docs) with `lever`.
async fn one(lever: Lever, list_late: bool) -> anyhow::Result<Figures> {
    let world = World::build(false).await?;
    world.stock_skus(SKUS).await?;
    let cluster = PrivateCluster::start(ClusterConfig {
        advanced_config: Some(advanced_config(lever.retry_ms)?),
        ..ClusterConfig::nodes(1)
    })
    .await?;
    let mut settings = world.settings.clone();
    settings.amqp_url = SecretUrl::new(cluster.urls_from(1));
    if !lever.catch_up {
        settings.sweeper.catch_up_window = Duration::ZERO;
    }
    let plan = Plan {
        label: lever.label(),
        list_late,
    };
    run(&world, &cluster, settings, &plan).await
}

/// `deploy/rabbitmq/advanced.config`, plus the dead-letter retry set to
/// `retry_ms` (`None`: as shipped, RabbitMQ's default of 180 s).
fn advanced_config(retry_ms: Option<u64>) -> anyhow::Result<String> {
    let shipped = include_str!("../../../deploy/rabbitmq/advanced.config");
    let prefetch = "{dead_letter_worker_consumer_prefetch, 512}";
    anyhow::ensure!(
        shipped.contains(prefetch),
        "deploy/rabbitmq/advanced.config no longer sets {prefetch}"
    );
    Ok(match retry_ms {
        Some(ms) => shipped.replace(
            prefetch,
            &format!("{prefetch},\n    {{dead_letter_worker_publisher_confirm_timeout, {ms}}}"),
        ),
        None => shipped.to_owned(),
    })
}

/// The run: issue 12's, 600 orders due evenly over 3–30 s from now, the
/// only node `kill -9`ed 2 s in, for 8 s.
struct Plan {
    label: String,
    list_late: bool,
}

impl Plan {
    const PREFIX: &str = "k-";
    const ORDERS: usize = 600;
    const SPREAD: (Duration, Duration) = (Duration::from_secs(3), Duration::from_secs(30));
    const NODE: usize = 1;
    const FAULT_AFTER: Duration = Duration::from_secs(2);
    const DOWN: Duration = Duration::from_secs(8);
}

/// When the node was killed and when it was back.
struct Outage {
    fault_at: DateTime<Utc>,
    back_at: DateTime<Utc>,
    outage: Duration,
    reconnect: Duration,
}

/// Runs `plan` against `cluster` with a service built from `settings`
/// (whose `AMQP_URL` points at the cluster), then measures.
async fn run(
    world: &World,
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
    schedule_wave(world, url, 0..Plan::ORDERS, Plan::SPREAD).await?;
    let outage = kill_and_restart(cluster, addr).await?;
    let total = Plan::ORDERS + AFTER_RECOVERY;
    let later = (Duration::from_secs(6), Duration::from_secs(10));
    schedule_wave(world, url, Plan::ORDERS..total, later).await?;
    // Every order settles; generous: the figures tell how late.
    let last_due = Plan::SPREAD.1.max(Duration::from_secs(10));
    let all = poll(last_due + Duration::from_secs(240), || async {
        Ok(cancelled(world).await? == total as i64)
    })
    .await?;
    anyhow::ensure!(
        all,
        "{}: not all {total} orders cancelled within {:?}",
        plan.label,
        last_due + Duration::from_secs(240)
    );
    service.stop().await?;
    measure(world, plan, total, &outage).await
}

/// Kills the node [`Plan::FAULT_AFTER`] from now, starts it again
/// [`Plan::DOWN`] after the kill, and waits until the service at `addr` is
/// ready again.
async fn kill_and_restart(
    cluster: &PrivateCluster,
    addr: std::net::SocketAddr,
) -> anyhow::Result<Outage> {
    tokio::time::sleep(Plan::FAULT_AFTER).await;
    let fault_at = Utc::now();
    let started = tokio::time::Instant::now();
    cluster.kill_node(Plan::NODE).await?;
    tokio::time::sleep(Plan::DOWN.saturating_sub(started.elapsed())).await;
    cluster.start_node(Plan::NODE).await?;
    let back_at = Utc::now();
    let outage = started.elapsed();
    let back = tokio::time::Instant::now();
    if !wait_for(Duration::from_secs(60), || crate::partition::ready(addr)).await {
        anyhow::bail!(
            "the service is not consuming 60 s after the node was back; cluster:\n{}",
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

/// Creates the orders numbered `numbers` (stock reserved, rows inserted),
/// due evenly over `spread` from now, and publishes their timeouts to
/// `amqp_url`, 32 at a time.
async fn schedule_wave(
    world: &World,
    amqp_url: &SecretUrl,
    numbers: std::ops::Range<usize>,
    spread: (Duration, Duration),
) -> anyhow::Result<()> {
    let conn = connect_amqp(amqp_url, "crash-levers-order-service").await?;
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
                    create_order(world, &format!("{}{i:04}", Plan::PREFIX), timeout, i).await?;
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
    world: &World,
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
    world.inventory.reserve(&order.id, &order.items).await?;
    crate::shop::insert_order(&world.pool, &order).await?;
    Ok(order)
}

/// The run's orders cancelled so far.
async fn cancelled(world: &World) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE left(id, char_length($1)) = $2 AND status = $3",
    )
    .bind(Plan::PREFIX)
    .bind(Plan::PREFIX)
    .bind("CANCELLED")
    .fetch_one(&world.pool)
    .await?)
}

/// The figures, from the cancelled orders' rows.
async fn measure(
    world: &World,
    plan: &Plan,
    total: usize,
    outage: &Outage,
) -> anyhow::Result<Figures> {
    let rows: Vec<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT expires_at, cancelled_at FROM orders WHERE starts_with(id, $1) AND status = 'CANCELLED'",
    )
    .bind(Plan::PREFIX)
    .fetch_all(&world.pool)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levers_parse_as_the_test_took_them() {
        assert_eq!(
            parse_lever("none:off"),
            Ok(Lever {
                retry_ms: None,
                catch_up: false
            })
        );
        assert_eq!(
            parse_lever("2000:on"),
            Ok(Lever {
                retry_ms: Some(2000),
                catch_up: true
            })
        );
        assert!(parse_lever("2000").is_err());
        assert!(parse_lever("soon:on").is_err());
        assert!(parse_lever("none:maybe").is_err());
    }

    #[test]
    fn the_retry_goes_beside_the_shipped_window() {
        let shipped = advanced_config(None).unwrap();
        assert!(!shipped.contains("{dead_letter_worker_publisher_confirm_timeout,"));
        let set = advanced_config(Some(2000)).unwrap();
        assert!(set.contains("{dead_letter_worker_publisher_confirm_timeout, 2000}"));
    }
}
