//! `order-timeout-tools partition --peer broker|database|inventory`: a peer
//! of the service cut off silently (no reset, every packet dropped: a
//! network namespace whose link goes down, [`crate::netns`]) while orders
//! come due, then healed; prints what it did to them. The end-to-end tests
//! (`tests/e2e/partitions.rs`) run the same [`run`] with generous bounds;
//! docs/benchmarks-log.md records the figures.
//!
//! One run: a service on the world of `world.rs`, `--orders` orders (500
//! for the broker, else 300) due evenly from 5 s to the cut + 25 s after
//! the start and a burst of 100 more due together 30 ms before the cut
//! (their work is in flight when the link goes), the peer cut 10 s in for
//! `--cut` (40 s for the broker, else 30 s), healed, and every order waited
//! for. Figures: orders lost, early, and their stock released more than
//! once (none may be); the lateness of the orders due before, during and
//! after the cut; when readiness went red and green; for the database,
//! when cancelling resumed after the heal; for the inventory, when the last
//! release was done; for the broker, each node's own view of the cluster
//! 24 s before the heal.
//!
//! The broker is a 3-node cluster of private nodes (`pause_minority`,
//! quorum queue leaders balanced, Erlang's `net_ticktime` 10 s), each in a
//! namespace of its own on one bridge ([`crate::netns::Bridge`]), named by
//! its address (long names) so that Erlang distribution works across the
//! namespaces; the service's `AMQP_URL` lists the three, node 1 first. The
//! cut takes node 1's bridge port down: node 1 loses the service and the
//! other two nodes alike, a real partition (on 3.10 node 1 pauses itself,
//! `pause_minority`; on 4.x with Khepri it runs on alone, without a
//! quorum). `--rabbitmq4` takes the nodes from the RabbitMQ 4.x root of
//! `scripts/rabbitmq4.sh` (run `scripts/rabbitmq4.sh prepare` first).
//! Everything (nodes, epmds, namespaces, bridge, vhost, database) is
//! removed afterwards by its own id, also on failure or panic; what a
//! killed run left is swept by the next run ([`crate::netns`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use order_timeout::RunningService;
use order_timeout::message::{Deadline, OrderId, TimeoutRequest};
use order_timeout::testing::broker::{Publisher, connect_amqp};
use order_timeout::testing::store::OrderItem;

mod figures;
mod world;

pub use figures::Figures;
use world::World;

/// The peer cut off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// The RabbitMQ node the service is connected to, of a 3-node cluster:
    /// partitioned from the service and from the other two nodes.
    Broker,
    /// The shop's PostgreSQL.
    Database,
    /// The gRPC inventory.
    Inventory,
}

/// `partition`'s arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct PartitionArgs {
    /// Which peer to cut off.
    #[arg(long, value_enum)]
    pub peer: Peer,
    /// How long the cut lasts (default: 40s for the broker, else 30s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub cut: Option<Duration>,
    /// Orders due over the run, besides the burst of 100 due just before
    /// the cut (default: 500 for the broker, about 600 in all, else 300).
    #[arg(long)]
    pub orders: Option<usize>,
    /// The broker's cluster of RabbitMQ 4.x nodes from the root that
    /// `scripts/rabbitmq4.sh` prepares (Debian trixie's 4.0.5, every
    /// deprecated feature denied, Khepri on) instead of the machine's
    /// RabbitMQ.
    #[arg(long)]
    pub rabbitmq4: bool,
}

impl PartitionArgs {
    /// The cut's length.
    pub fn cut(&self) -> Duration {
        self.cut.unwrap_or(match self.peer {
            Peer::Broker => Duration::from_secs(40),
            _ => Duration::from_secs(30),
        })
    }

    /// Orders due over the run, besides the burst.
    pub fn orders(&self) -> usize {
        self.orders.unwrap_or(match self.peer {
            Peer::Broker => 500,
            _ => 300,
        })
    }
}

/// SKUs the orders reserve, and each one's stock at the start.
const SKUS: usize = 8;
const STOCK: i64 = 100_000;
/// When the peer is cut, from the start of the run.
const CUT_AFTER: Duration = Duration::from_secs(10);
/// The first order falls due this long after the start.
const FIRST_DUE: Duration = Duration::from_secs(5);
/// The last order falls due this long after the heal.
const LAST_DUE_AFTER_HEAL: Duration = Duration::from_secs(25);
/// Orders due together just before the cut, besides `--orders`: their
/// cancel statements, releases and publishes are in flight when the link
/// goes (what a wait for an answer lost in the cut needs).
const BURST: usize = 100;
/// How long before the heal the cluster's nodes are asked for their view
/// (the broker run: is it a partition, who paused).
const VIEW_BEFORE_HEAL: Duration = Duration::from_secs(24);
/// How long before the cut the burst falls due.
const BURST_BEFORE_CUT: Duration = Duration::from_millis(30);

/// Runs `partition` (the command): prints the figures.
pub async fn command(args: PartitionArgs) -> anyhow::Result<std::process::ExitCode> {
    let figures = run(&args).await?;
    println!("{figures}");
    Ok(std::process::ExitCode::SUCCESS)
}

/// One run (module docs); the world is removed afterwards, also when the
/// run fails.
pub async fn run(args: &PartitionArgs) -> anyhow::Result<Figures> {
    anyhow::ensure!(
        !args.rabbitmq4 || args.peer == Peer::Broker,
        "--rabbitmq4 is for --peer broker"
    );
    let world = World::build(args.peer, args.rabbitmq4).await?;
    let result = run_in(&world, args).await;
    world.clean_up().await;
    result
}

async fn run_in(world: &World, args: &PartitionArgs) -> anyhow::Result<Figures> {
    let cut = args.cut();
    let orders = args.orders();
    let stock: Vec<(String, i64)> = (0..SKUS).map(|k| (sku(k), STOCK)).collect();
    crate::shop::set_stock(&world.shop, &stock).await?;
    let service = RunningService::start(world.settings.clone()).await?;
    let addr = service.http_addr;
    let watch = figures::Readiness::watch(addr);
    if !crate::private_broker::wait_for(Duration::from_secs(60), || ready(addr)).await {
        anyhow::bail!(
            "the service is not ready after 60 s; broker: {}",
            world.broker_status().await
        );
    }
    let start = Utc::now();
    let span = CUT_AFTER + cut + LAST_DUE_AFTER_HEAL - FIRST_DUE;
    if let Err(e) = schedule(world, orders, start, span).await {
        anyhow::bail!(
            "scheduling the orders: {e:#}; broker: {}",
            world.broker_status().await
        );
    }
    sleep_until(start, CUT_AFTER).await;
    world.cut()?;
    let cut_at = Utc::now();
    sleep_until(cut_at, cut.saturating_sub(VIEW_BEFORE_HEAL)).await;
    // Bounded: the heal must come on time whatever the nodes answer (a
    // node's view within 18 s, the script's own `timeout -k 5` past it).
    let view_limit = VIEW_BEFORE_HEAL - Duration::from_secs(1);
    let view = world.cluster_view(Duration::from_secs(18));
    let cluster_view = tokio::time::timeout(view_limit, view)
        .await
        .unwrap_or_else(|_| Some(format!("no view within {view_limit:?}")));
    sleep_until(cut_at, cut).await;
    world.heal()?;
    let healed_at = Utc::now();
    let settled = settle(world, orders + BURST, healed_at).await;
    let readiness = watch.stop();
    let reconnects = service.metrics.reconnects();
    service.stop().await?;
    settled?;
    let window = figures::Window {
        peer: args.peer,
        cut_at,
        healed_at,
    };
    let mut figures =
        Figures::measure(&world.shop, window, orders + BURST, readiness, reconnects).await?;
    figures.cluster_view = cluster_view;
    Ok(figures)
}

fn sku(k: usize) -> String {
    format!("PART-SKU-{k}")
}

/// Whether the service at `addr` answers `/readyz` with 200.
pub(crate) async fn ready(addr: std::net::SocketAddr) -> bool {
    let url = format!("http://{addr}/readyz");
    figures::http_status(&url).await == Some(200)
}

async fn sleep_until(from: DateTime<Utc>, after: Duration) {
    let at = from + chrono::Duration::from_std(after).unwrap_or_default();
    if let Ok(wait) = (at - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
}

/// Creates `n` orders (rows and items) due evenly over `span` from
/// `start` + [`FIRST_DUE`], and [`BURST`] more due [`BURST_BEFORE_CUT`]
/// before the cut, and publishes their timeouts as the order service does.
#[tracing::instrument(skip(world))]
async fn schedule(
    world: &World,
    n: usize,
    start: DateTime<Utc>,
    span: Duration,
) -> anyhow::Result<()> {
    let conn = world::patiently("connecting the order service", || {
        connect_amqp(&world.publish_url, "partition-order-service")
    })
    .await?;
    let publisher = Publisher::new(&conn).await?;
    let step = span.as_secs_f64() / n.max(1) as f64;
    let first = start + chrono::Duration::from_std(FIRST_DUE)?;
    let burst = start + chrono::Duration::from_std(CUT_AFTER - BURST_BEFORE_CUT)?;
    let due = |i: usize| match i.checked_sub(n) {
        None => first + chrono::Duration::milliseconds((step * 1000.0 * i as f64) as i64),
        Some(_) => burst,
    };
    let results: Vec<anyhow::Result<()>> = futures_util::stream::iter(0..n + BURST)
        .map(|i| {
            let publisher = &publisher;
            let order = crate::shop::NewOrder {
                id: figures::order_id(i),
                expires_at: due(i),
                items: vec![OrderItem {
                    sku: sku(i % SKUS),
                    quantity: 1 + (i % 3) as i64,
                }],
            };
            async move {
                crate::shop::insert_order(&world.shop, &order).await?;
                let request =
                    TimeoutRequest::new(OrderId::parse(&order.id)?, Deadline::At(order.expires_at));
                publisher.schedule(&request).await?;
                Ok(())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let closing = conn.close(200, "scheduled".into());
    let _ = tokio::time::timeout(Duration::from_secs(5), closing).await;
    results.into_iter().collect()
}

/// Waits (at most 3 minutes after the heal) until every order is
/// cancelled and its stock released.
#[tracing::instrument(skip(world))]
async fn settle(world: &World, n: usize, healed_at: DateTime<Utc>) -> anyhow::Result<()> {
    let limit = Duration::from_secs(180);
    let done = crate::private_broker::wait_for(limit, || async {
        figures::settled(&world.shop).await.unwrap_or(0) == n as i64
    })
    .await;
    if !done {
        let settled = figures::settled(&world.shop).await.unwrap_or(-1);
        anyhow::bail!(
            "only {settled} of {n} orders cancelled and released {:?} after the heal",
            (Utc::now() - healed_at).to_std().unwrap_or_default() + Duration::ZERO
        );
    }
    Ok(())
}
