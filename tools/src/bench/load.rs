//! The load generator: plays the order service at a paced rate (insert
//! the order rows → publish their timeouts with publisher confirms → pay
//! some of them before their deadline), then waits for every order to
//! settle and measures the outcome from the database.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, DurationRound, Utc};
use futures_util::future::join_all;
use indicatif::{ProgressBar, ProgressStyle};
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel};
use rand::Rng;
use sqlx::{AssertSqlSafe, MySqlPool, PgPool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use super::BenchError;
use super::amqp::SINGLE_DELAY_QUEUE;
use super::workload::TimeoutDist;
use crate::shop::ShopDb;
use order_timeout::message::{Deadline, OrderId, TimeoutRequest};
use order_timeout::settings::Lane;
use order_timeout::testing::topology::{ENTRY_EXCHANGE, SCHEDULE_ROUTING_KEY, lane_entry_key};

/// Where the generator publishes each order's timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The product's contract: exchange `order-timeout`, key `schedule`,
    /// into the service (its lanes and cascade).
    Service,
    /// The single-queue baseline: one delay queue, per-message
    /// `expiration` = time left to the deadline, into the service.
    SingleQueue,
    /// The seed design ([`super::seed`]): one classic delay queue,
    /// per-message `expiration`, into a plain consumer.
    Seed,
}

impl Route {
    /// Label in reports.
    pub fn design(self) -> &'static str {
        match self {
            Self::Service => "service",
            Self::SingleQueue => "single-queue",
            Self::Seed => "seed",
        }
    }

    /// The delay queue the generator publishes into with a per-message
    /// TTL, or `None` for the product's contract.
    fn delay_queue(self) -> Option<&'static str> {
        match self {
            Self::Service => None,
            Self::SingleQueue => Some(SINGLE_DELAY_QUEUE),
            Self::Seed => Some(super::seed::SEED_DELAY_QUEUE),
        }
    }

    /// The process groups this design runs on: its CPU per order counts
    /// these (the others sit idle meanwhile).
    pub fn processes(self) -> &'static [&'static str] {
        match self {
            Self::Service | Self::SingleQueue => &[
                "broker",
                "postgres",
                "mariadb",
                "service",
                "inventory",
                "bench",
            ],
            Self::Seed => &["broker", "postgres", "mariadb", "seed", "bench"],
        }
    }

    /// The design's own process among [`Route::processes`].
    pub fn own_process(self) -> &'static str {
        match self {
            Self::Seed => "seed",
            Self::Service | Self::SingleQueue => "service",
        }
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Orders per second.
    pub rate: f64,
    /// How long to generate.
    pub duration: Duration,
    /// Payment windows.
    pub timeouts: TimeoutDist,
    /// Share of orders paid before their deadline.
    pub paid_ratio: f64,
    /// SKUs the order items draw from.
    pub skus: Vec<String>,
    /// Confirm-mode channels to publish on (round robin).
    pub publish_channels: usize,
    /// Longest wait for the orders to settle after the last deadline.
    pub settle_timeout: Duration,
    /// Lanes the generator publishes straight into (a lane entry, routing
    /// key `schedule.<W>s`) for orders of exactly that window, as the README
    /// tells a shop with one payment window to do; other orders, and every
    /// order when this is empty, go with key `schedule`.
    pub entry_lanes: Vec<Lane>,
    /// HTTP clients hammering the services' endpoints during the product's
    /// phase (`--flood`; 0: none).
    pub http_flood: usize,
    /// The flood's turns (`--flood-every`; `None`: on for the whole phase).
    pub flood_every: Option<Duration>,
}

/// Ticks per second of the pacer.
const TICKS_PER_SEC: u64 = 100;
/// Batches (insert + publish) in flight at once before the pacer waits.
const BATCHES_IN_FLIGHT: usize = 16;
/// Payments must happen at least this long before the deadline.
const PAY_MARGIN: Duration = Duration::from_millis(300);

/// What the generator and the payer count while a phase runs, read when
/// it settles ([`super::outcome::settle`]).
#[derive(Default)]
pub(super) struct Counters {
    created: AtomicU64,
    errors: AtomicU64,
    pub(super) paid: AtomicU64,
    pub(super) pay_failures: AtomicU64,
    pub(super) late_payments: AtomicU64,
}

struct Order {
    id: String,
    /// The order's payment window: its deadline is this after creation.
    window: Duration,
    expires_at: DateTime<Utc>,
    skus: Vec<String>,
    quantities: Vec<i64>,
    pay_in: Option<Duration>,
}

/// The bench's databases: where the orders live (PostgreSQL or
/// MySQL/MariaDB), and the reference inventory's (always PostgreSQL; the
/// same database when the orders are in PostgreSQL too).
#[derive(Clone, Debug)]
pub struct BenchDb {
    /// The orders (the service's `DATABASE_URL`).
    pub orders: ShopDb,
    /// The reference inventory's stock and release log.
    pub inventory: PgPool,
    /// Stock goes back by an `also` statement into the orders' `shop_stock`
    /// table (`--stock also`), not over gRPC.
    pub also_stock: bool,
}

/// [`insert_batch`] on MySQL: multi-row inserts.
async fn insert_batch_mysql(pool: &MySqlPool, orders: &[Order]) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let rows = vec!["(?, 'UNPAID', ?)"; orders.len()].join(", ");
    let mut q = sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO orders (id, status, expires_at) VALUES {rows}"
    )));
    for o in orders {
        q = q.bind(&o.id).bind(o.expires_at);
    }
    q.execute(&mut *tx).await?;
    let lines: Vec<(&str, &str, i64)> = orders
        .iter()
        .flat_map(|o| {
            o.skus
                .iter()
                .zip(&o.quantities)
                .map(|(s, q)| (o.id.as_str(), s.as_str(), *q))
        })
        .collect();
    if !lines.is_empty() {
        let rows = vec!["(?, ?, ?)"; lines.len()].join(", ");
        let mut q = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO order_items (order_id, sku, quantity) VALUES {rows}"
        )));
        for (id, sku, qty) in lines {
            q = q.bind(id).bind(sku).bind(qty);
        }
        q.execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// Inserts a batch of orders and their items in one transaction.
async fn insert_batch(db: &BenchDb, orders: &[Order]) -> Result<(), sqlx::Error> {
    let pool = match &db.orders {
        ShopDb::Postgres(pool) => pool,
        ShopDb::MySql(pool) => return insert_batch_mysql(pool, orders).await,
    };
    let ids: Vec<&str> = orders.iter().map(|o| o.id.as_str()).collect();
    let expires: Vec<DateTime<Utc>> = orders.iter().map(|o| o.expires_at).collect();
    let mut item_order = Vec::new();
    let mut item_sku = Vec::new();
    let mut item_qty = Vec::new();
    for o in orders {
        for (s, q) in o.skus.iter().zip(&o.quantities) {
            item_order.push(o.id.as_str());
            item_sku.push(s.as_str());
            item_qty.push(*q);
        }
    }
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO orders (id, status, expires_at) SELECT id, 'UNPAID', e FROM unnest($1::text[], $2::timestamptz[]) AS t(id, e)",
    )
    .bind(&ids)
    .bind(&expires)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO order_items (order_id, sku, quantity) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
    )
    .bind(&item_order)
    .bind(&item_sku)
    .bind(&item_qty)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// The routing key on the entry exchange for an order of `window`: its
/// lane's entry among `entry_lanes`, else `schedule`.
fn entry_key(window: Duration, entry_lanes: &[Lane]) -> String {
    entry_lanes
        .iter()
        .find(|lane| Duration::from_secs(lane.secs()) == window)
        .map_or_else(
            || SCHEDULE_ROUTING_KEY.to_owned(),
            |&lane| lane_entry_key(lane),
        )
}

/// Publishes the timeouts of `orders` on `channel` (into `entry_lanes` where
/// an order's window has one, for [`Route::Service`]) and waits for all
/// confirms; returns how many were not confirmed.
async fn publish_batch(
    channel: &Channel,
    route: Route,
    entry_lanes: &[Lane],
    orders: &[Order],
) -> u64 {
    let mut confirms = Vec::with_capacity(orders.len());
    let mut failed = 0;
    for o in orders {
        let Ok(order_id) = OrderId::parse(&o.id) else {
            failed += 1;
            continue;
        };
        let body = TimeoutRequest::new(order_id, Deadline::At(o.expires_at)).to_json();
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into());
        let (exchange, key, props) = match route.delay_queue() {
            None => (ENTRY_EXCHANGE, entry_key(o.window, entry_lanes), props),
            Some(queue) => {
                let left = (o.expires_at - Utc::now()).num_milliseconds().max(0);
                (
                    "",
                    queue.to_owned(),
                    props.with_expiration(left.to_string().into()),
                )
            }
        };
        match channel
            .basic_publish(
                exchange.into(),
                key.as_str().into(),
                BasicPublishOptions::default(),
                &body,
                props,
            )
            .await
        {
            Ok(c) => confirms.push(c),
            Err(e) => {
                tracing::warn!(error = %e, "publish failed");
                failed += 1;
            }
        }
    }
    for c in join_all(confirms).await {
        match c {
            Ok(c) if c.is_ack() => {}
            _ => failed += 1,
        }
    }
    failed
}

/// Pays orders at their time, in batches, as an order service would: only
/// while the payment window is open (`expires_at > now()`, the database's
/// clock). Counts payments made in time that found the order no longer
/// UNPAID (a failure: it was cancelled before its deadline) apart from
/// payments that came after the deadline because the payer fell behind on
/// an overloaded machine (not a failure: those orders must be cancelled).
async fn payer(
    db: BenchDb,
    mut rx: mpsc::UnboundedReceiver<(Instant, String)>,
    counters: Arc<Counters>,
) {
    let mut heap: BinaryHeap<Reverse<(Instant, String)>> = BinaryHeap::new();
    let mut open = true;
    while open || !heap.is_empty() {
        let next = heap.peek().map(|Reverse((t, _))| *t);
        tokio::select! {
            msg = rx.recv(), if open => match msg {
                Some(item) => heap.push(Reverse(item)),
                None => open = false,
            },
            _ = async {
                match next {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => {
                let now = Instant::now();
                let mut due = Vec::new();
                while let Some(Reverse((t, _))) = heap.peek() {
                    if *t > now {
                        break;
                    }
                    if let Some(Reverse((_, id))) = heap.pop() {
                        due.push(id);
                    }
                }
                // The row lock makes the status read the latest one; a
                // cancel statement running at the same time waits for it.
                let counts = pay_batch(&db.orders, &due).await;
                let (done, late, failed) = match counts {
                    Ok((done, late, failed)) => (done as u64, late as u64, failed as u64),
                    // The payment did not go through: count it as failed
                    // rather than lose it.
                    Err(_) => (0, 0, due.len() as u64),
                };
                counters.paid.fetch_add(done, Ordering::Relaxed);
                counters.late_payments.fetch_add(late, Ordering::Relaxed);
                counters.pay_failures.fetch_add(failed, Ordering::Relaxed);
            }
        }
    }
}

/// Pays the orders `due` that are still unpaid and whose window is open:
/// `(paid now, too late, found no longer unpaid in time)`.
async fn pay_batch(orders: &ShopDb, due: &[String]) -> Result<(i64, i64, i64), sqlx::Error> {
    match orders {
        ShopDb::Postgres(pool) => pay_pg(pool, due).await,
        ShopDb::MySql(pool) => pay_mysql(pool, due).await,
    }
}

/// [`pay_batch`] on PostgreSQL. The row lock makes the status read the
/// latest one; a cancel statement running at the same time waits for it.
/// Whether the window is still open is judged once the lock is held
/// (`clock_timestamp()`, not the transaction's start, `now()`): a payment
/// that waited for the lock of a cancel which began after the deadline
/// reached the row too late, like any late payment.
async fn pay_pg(pool: &PgPool, due: &[String]) -> Result<(i64, i64, i64), sqlx::Error> {
    sqlx::query_as(
        "WITH target AS ( \
             SELECT id, status, expires_at > clock_timestamp() AS in_time \
             FROM orders WHERE id = ANY($1) FOR UPDATE), \
         paid AS ( \
             UPDATE orders o SET status = 'PAID' FROM target t \
             WHERE o.id = t.id AND t.status = 'UNPAID' AND t.in_time \
             RETURNING o.id) \
         SELECT (SELECT count(*) FROM paid), \
                (SELECT count(*) FROM target WHERE NOT in_time), \
                (SELECT count(*) FROM target WHERE in_time AND status <> 'UNPAID')",
    )
    .bind(due)
    .fetch_one(pool)
    .await
}

/// [`pay_batch`] on MySQL: the rows locked, then whether each window is
/// still open judged once the locks are held.
async fn pay_mysql(pool: &MySqlPool, due: &[String]) -> Result<(i64, i64, i64), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let marks = vec!["?"; due.len()].join(", ");
    let mut q = sqlx::query_as::<_, (String, String)>(AssertSqlSafe(format!(
        "SELECT id, status FROM orders WHERE id IN ({marks}) FOR UPDATE"
    )));
    for id in due {
        q = q.bind(id);
    }
    let target = q.fetch_all(&mut *tx).await?;
    // Whether the window is still open, judged once the locks are
    // held: a new statement, a new UTC_TIMESTAMP (a statement's is
    // its start, before any wait for a lock).
    let mut q = sqlx::query_scalar::<_, String>(AssertSqlSafe(format!(
        "SELECT id FROM orders WHERE id IN ({marks}) AND expires_at > UTC_TIMESTAMP(6)"
    )));
    for id in due {
        q = q.bind(id);
    }
    let open: HashSet<String> = q.fetch_all(&mut *tx).await?.into_iter().collect();
    let to_pay: Vec<&str> = target
        .iter()
        .filter(|(id, status)| status == "UNPAID" && open.contains(id))
        .map(|(id, _)| id.as_str())
        .collect();
    if !to_pay.is_empty() {
        let marks = vec!["?"; to_pay.len()].join(", ");
        let mut q = sqlx::query(AssertSqlSafe(format!(
            "UPDATE orders SET status = 'PAID' WHERE id IN ({marks})"
        )));
        for id in &to_pay {
            q = q.bind(*id);
        }
        q.execute(&mut *tx).await?;
    }
    tx.commit().await?;
    let late = target.iter().filter(|(id, _)| !open.contains(id)).count();
    let failed = target
        .iter()
        .filter(|(id, status)| open.contains(id) && status != "UNPAID")
        .count();
    Ok((to_pay.len() as i64, late as i64, failed as i64))
}

/// What generating one phase produced, before measuring.
pub struct Generated {
    /// Order id prefix of this phase.
    pub prefix: String,
    /// When the first order was created.
    pub started: DateTime<Utc>,
    /// Latest deadline of any order.
    pub last_deadline: DateTime<Utc>,
    /// Orders created and published.
    pub created: u64,
    /// Orders that failed to be created or published.
    pub errors: u64,
    /// Seconds the generator ran.
    pub create_seconds: f64,
    pub(super) counters: Arc<Counters>,
    pub(super) payer: tokio::task::JoinHandle<()>,
}

/// The progress bar of a phase's order creation.
fn creation_bar(total: u64, route: Route) -> Result<ProgressBar, BenchError> {
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{spinner} {prefix} [{elapsed_precise}] {bar:30} {pos}/{len} created ({per_sec}) {msg}",
        )
        .map_err(|e| BenchError::Setup(e.to_string()))?,
    );
    bar.set_prefix(route.design());
    Ok(bar)
}

/// Generates one phase's orders at the paced rate.
pub async fn generate(
    db: &BenchDb,
    channels: &[Channel],
    route: Route,
    w: &Workload,
    prefix: &str,
) -> Result<Generated, BenchError> {
    let total = (w.rate * w.duration.as_secs_f64()).round() as u64;
    let counters = Arc::new(Counters::default());
    let (pay_tx, pay_rx) = mpsc::unbounded_channel();
    let payer = tokio::spawn(payer(db.clone(), pay_rx, counters.clone()));
    let bar = creation_bar(total, route)?;
    let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
    let started_wall = Utc::now();
    let started = Instant::now();
    let mut issued: u64 = 0;
    let mut tasks = Vec::new();
    let mut interval = tokio::time::interval(Duration::from_millis(1000 / TICKS_PER_SEC));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_deadline = started_wall;
    while issued < total {
        interval.tick().await;
        let due = ((started.elapsed().as_secs_f64() * w.rate) as u64).min(total);
        if due <= issued {
            continue;
        }
        let slot = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| BenchError::Setup(e.to_string()))?;
        let orders = draw_orders(w, prefix, issued, due - issued);
        if let Some(max) = orders.iter().map(|o| o.expires_at).max() {
            last_deadline = last_deadline.max(max);
        }
        let batch = Batch {
            db: db.clone(),
            channel: channels[tasks.len() % channels.len()].clone(),
            route,
            entry_lanes: w.entry_lanes.clone(),
            counters: counters.clone(),
            pay_tx: pay_tx.clone(),
            bar: bar.clone(),
            created_at: Instant::now(),
        };
        issued = due;
        tasks.push(tokio::spawn(batch.send(orders, slot)));
    }
    join_all(tasks).await;
    drop(pay_tx);
    let create_seconds = started.elapsed().as_secs_f64();
    bar.finish();
    Ok(Generated {
        prefix: prefix.to_owned(),
        started: started_wall,
        last_deadline,
        created: counters.created.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        create_seconds,
        counters,
        payer,
    })
}

/// Draws `n` orders numbered after the first `before` of the phase, due
/// from now by the workload's timeouts.
fn draw_orders(w: &Workload, prefix: &str, before: u64, n: u64) -> Vec<Order> {
    let now = Utc::now();
    let mut rng = rand::rng();
    (before + 1..=before + n)
        .map(|seq| {
            let timeout = w.timeouts.sample(&mut rng);
            let expires_at = (now + chrono::Duration::from_std(timeout).unwrap_or_default())
                .duration_trunc(chrono::Duration::milliseconds(1))
                .unwrap_or(now);
            let k = rng.random_range(1..=3usize);
            let mut skus: Vec<String> = (0..k)
                .map(|_| w.skus[rng.random_range(0..w.skus.len())].clone())
                .collect();
            skus.sort();
            skus.dedup();
            let quantities = skus.iter().map(|_| rng.random_range(1..=5)).collect();
            let pay_in = (rng.random_bool(w.paid_ratio) && timeout > PAY_MARGIN)
                .then(|| (timeout - PAY_MARGIN).mul_f64(rng.random_range(0.0..1.0)));
            Order {
                id: format!("{prefix}{seq:09}"),
                window: timeout,
                expires_at,
                skus,
                quantities,
                pay_in,
            }
        })
        .collect()
}

/// One pacer tick's orders on their way: inserted in one transaction,
/// their timeouts published on `channel`, the paid ones handed to the
/// payer.
struct Batch {
    db: BenchDb,
    channel: Channel,
    route: Route,
    entry_lanes: Vec<Lane>,
    counters: Arc<Counters>,
    pay_tx: mpsc::UnboundedSender<(Instant, String)>,
    bar: ProgressBar,
    created_at: Instant,
}

impl Batch {
    async fn send(self, orders: Vec<Order>, _slot: OwnedSemaphorePermit) {
        let Self {
            db,
            channel,
            route,
            entry_lanes,
            counters,
            pay_tx,
            bar,
            created_at,
        } = self;
        if let Err(e) = insert_batch(&db, &orders).await {
            tracing::warn!(error = %e, "insert failed");
            counters
                .errors
                .fetch_add(orders.len() as u64, Ordering::Relaxed);
            return;
        }
        let failed = publish_batch(&channel, route, &entry_lanes, &orders).await;
        counters.errors.fetch_add(failed, Ordering::Relaxed);
        counters
            .created
            .fetch_add(orders.len() as u64 - failed, Ordering::Relaxed);
        for o in &orders {
            if let Some(d) = o.pay_in {
                let _ = pay_tx.send((created_at + d, o.id.clone()));
            }
        }
        bar.inc(orders.len() as u64);
    }
}

/// `--pending`: creates `n` orders (rows without items, nothing is ever
/// cancelled) and publishes their timeouts as fast as confirms allow, a
/// few batches at a time. Returns how many failed.
pub async fn fill(
    db: &BenchDb,
    channels: &[Channel],
    timeouts: &TimeoutDist,
    n: u64,
    bar: &ProgressBar,
) -> Result<u64, BenchError> {
    const BATCH: u64 = 2000;
    let slots = Arc::new(Semaphore::new(4));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let mut seq = 0u64;
    let mut i = 0usize;
    while seq < n {
        let k = BATCH.min(n - seq);
        let slot = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| BenchError::Setup(e.to_string()))?;
        let now = Utc::now();
        let orders: Vec<Order> = {
            let mut rng = rand::rng();
            (0..k)
                .map(|j| {
                    let timeout = timeouts.sample(&mut rng);
                    Order {
                        id: format!("pending-{:09}", seq + j),
                        window: timeout,
                        expires_at: (now + chrono::Duration::from_std(timeout).unwrap_or_default())
                            .duration_trunc(chrono::Duration::milliseconds(1))
                            .unwrap_or(now),
                        skus: Vec::new(),
                        quantities: Vec::new(),
                        pay_in: None,
                    }
                })
                .collect()
        };
        seq += k;
        let channel = channels[i % channels.len()].clone();
        i += 1;
        let (db, errors, bar) = (db.clone(), errors.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = insert_batch(&db, &orders).await {
                tracing::warn!(error = %e, "insert failed");
                errors.fetch_add(orders.len() as u64, Ordering::Relaxed);
                return;
            }
            let failed = publish_batch(&channel, Route::Service, &[], &orders).await;
            errors.fetch_add(failed, Ordering::Relaxed);
            bar.inc(orders.len() as u64);
        }));
    }
    join_all(tasks).await;
    Ok(errors.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_orders_of_a_lanes_window_take_its_entry() {
        let lanes = [Lane::try_from("31s".to_owned()).unwrap()];
        assert_eq!(entry_key(Duration::from_secs(31), &lanes), "schedule.31s");
        for window in [Duration::from_secs(8), Duration::from_millis(31_500)] {
            assert_eq!(entry_key(window, &lanes), SCHEDULE_ROUTING_KEY);
        }
        assert_eq!(
            entry_key(Duration::from_secs(31), &[]),
            SCHEDULE_ROUTING_KEY,
            "--entry schedule"
        );
    }
}
