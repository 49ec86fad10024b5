//! The inventory side of the shop: the reference gRPC inventory server
//! (stock in schema `inventory`, run by the demo, the bench and the tests in
//! place of a shop's real one), and a client with the calls the order
//! service makes (reserve, read stock) that the production client does not
//! carry.
//!
//! The contract the service relies on is idempotency by order id:
//! `ReleaseStock` is called at least once per cancelled order, and the
//! server releases exactly once.
//!
//! The server writes releases in batches ([`release_batches`]): calls that
//! arrive while a batch is being written wait and go together in the next
//! one, a single statement and commit for all of them. A shop's orders all
//! draw on the same few hot stock rows; one writer of releases updates each
//! row once per batch, where one transaction per call had every call queue
//! on the row locks of the others (what broke the bench's failed runs at
//! 2,000 orders/s), and paid a statement and a commit per order.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use order_timeout::testing::store::OrderItem;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

/// Code generated from `proto/inventory.proto` (server and client).
#[allow(missing_docs, clippy::too_many_lines)]
pub mod pb {
    tonic::include_proto!("inventory.v1");
}

use pb::inventory_server::InventoryServer;

/// A failed call of the shop's inventory client.
#[derive(Debug, thiserror::Error)]
#[error("inventory {call} failed: {code:?}: {message}")]
pub struct CallError {
    /// The RPC.
    pub call: &'static str,
    /// The gRPC status code.
    pub code: tonic::Code,
    /// The server's message.
    pub message: String,
}

fn call_error(call: &'static str) -> impl FnOnce(Status) -> CallError {
    move |status| CallError {
        call,
        code: status.code(),
        message: status.message().to_owned(),
    }
}

fn to_pb(items: &[OrderItem]) -> Vec<pb::Item> {
    items
        .iter()
        .map(|i| pb::Item {
            sku: i.sku.clone(),
            quantity: i.quantity,
        })
        .collect()
}

/// The order service's client of the inventory: reserve stock for a new
/// order, read stock. (Releasing is the service's job: its own client,
/// `order_timeout::testing::InventoryClient`.)
#[derive(Clone, Debug)]
pub struct ShopInventory {
    client: pb::inventory_client::InventoryClient<Channel>,
}

impl ShopInventory {
    /// A client that connects lazily to `url`; every call times out after
    /// `timeout`.
    pub fn connect_lazy(url: &str, timeout: Duration) -> anyhow::Result<Self> {
        let endpoint = Endpoint::from_shared(url.to_owned())?
            .timeout(timeout)
            .connect_timeout(timeout)
            .tcp_nodelay(true);
        Ok(Self {
            client: pb::inventory_client::InventoryClient::new(endpoint.connect_lazy()),
        })
    }

    /// Reserves an order's stock (the order service's job; used by the demo
    /// and tests). `Ok(false)` if already reserved.
    #[tracing::instrument(skip(self, items), fields(items = items.len()))]
    pub async fn reserve(&self, order_id: &str, items: &[OrderItem]) -> Result<bool, CallError> {
        let response = self
            .client
            .clone()
            .reserve_stock(pb::ReserveStockRequest {
                order_id: order_id.to_owned(),
                items: to_pb(items),
            })
            .await
            .map_err(call_error("ReserveStock"))?;
        Ok(response.into_inner().reserved)
    }

    /// Available stock of `skus` (unknown SKUs are left out).
    #[tracing::instrument(skip(self, skus), fields(skus = skus.len()))]
    pub async fn stock(&self, skus: &[String]) -> Result<BTreeMap<String, i64>, CallError> {
        let response = self
            .client
            .clone()
            .get_stock(pb::GetStockRequest {
                skus: skus.to_vec(),
            })
            .await
            .map_err(call_error("GetStock"))?;
        Ok(response
            .into_inner()
            .stock
            .into_iter()
            .map(|i| (i.sku, i.quantity))
            .collect())
    }
}

/// The reference inventory server: stock in `inventory.stock`, idempotency
/// keys in `inventory.reservations` / `inventory.releases`.
#[derive(Clone, Debug)]
pub struct ReferenceInventory {
    pool: PgPool,
    /// Where `ReleaseStock` calls wait for [`release_batches`].
    releases: mpsc::Sender<ReleaseCall>,
}

/// Most calls one release statement carries.
const MAX_RELEASE_BATCH: usize = 256;

/// Calls waiting for the release writer before a new one waits to be
/// queued (back-pressure on the callers, not unbounded memory).
const RELEASE_QUEUE: usize = 4 * MAX_RELEASE_BATCH;

/// One `ReleaseStock` call, checked, waiting for its batch.
#[derive(Debug)]
struct ReleaseCall {
    order_id: String,
    /// Distinct SKUs, sorted, with their summed quantities.
    skus: Vec<String>,
    quantities: Vec<i64>,
    /// Whether this call released the stock (the first for its order).
    reply: Reply,
}

/// Where a [`ReleaseCall`]'s answer goes.
type Reply = oneshot::Sender<Result<bool, Status>>;

/// The release writer: takes every call queued so far (up to
/// [`MAX_RELEASE_BATCH`]), writes them in one statement, answers each, and
/// goes on until every [`ReferenceInventory`] clone is gone. No waiting for
/// a batch to fill: under load the calls that come in while one statement
/// runs make the next batch; when idle a call goes alone at once.
async fn release_batches(pool: PgPool, mut calls: mpsc::Receiver<ReleaseCall>) {
    let mut batch = Vec::with_capacity(MAX_RELEASE_BATCH);
    while calls.recv_many(&mut batch, MAX_RELEASE_BATCH).await > 0 {
        release_batch(&pool, std::mem::take(&mut batch)).await;
    }
}

/// Writes one batch and answers its calls. A second call for an order in
/// the same batch is a retry that raced the first: it is counted, and
/// answers `false` (the first one released). If the statement fails, each
/// order is tried alone, so that one order the database refuses fails only
/// its own calls.
#[tracing::instrument(skip_all, fields(calls = batch.len()))]
async fn release_batch(pool: &PgPool, batch: Vec<ReleaseCall>) {
    // Per order: its first call, and the replies of its later calls.
    let mut orders: Vec<(ReleaseCall, Vec<Reply>)> = Vec::with_capacity(batch.len());
    let mut index: HashMap<String, usize> = HashMap::with_capacity(batch.len());
    for call in batch {
        match index.get(&call.order_id) {
            Some(&i) => orders[i].1.push(call.reply),
            None => {
                index.insert(call.order_id.clone(), orders.len());
                orders.push((call, Vec::new()));
            }
        }
    }
    let writes: Vec<(&ReleaseCall, i64)> = orders
        .iter()
        .map(|(c, repeats)| (c, 1 + repeats.len() as i64))
        .collect();
    let results: Vec<Result<bool, Status>> = match write_releases(pool, &writes).await {
        Ok(first) => first.into_iter().map(Ok).collect(),
        Err(e) if writes.len() > 1 => {
            tracing::warn!(error = %e, orders = writes.len(), "a release batch failed; writing its orders one by one");
            let mut results = Vec::with_capacity(writes.len());
            for write in &writes {
                results.push(
                    write_releases(pool, std::slice::from_ref(write))
                        .await
                        .map(|first| first[0])
                        .map_err(internal),
                );
            }
            results
        }
        Err(e) => vec![Err(internal(e))],
    };
    for ((call, repeats), result) in orders.into_iter().zip(results) {
        for reply in repeats {
            let _ = reply.send(result.clone().map(|_| false));
        }
        // A caller that gave up (its deadline passed) is not an error here.
        let _ = call.reply.send(result);
    }
}

/// One statement (one round trip, one commit) for `orders`, distinct, each
/// with how many calls it had: the idempotency keys (inserted by an order's
/// first call, counting calls after) and, for the orders released now, the
/// stock, summed per SKU and written in SKU order (so a concurrent writer
/// of the same rows waits instead of deadlocking). Returns, per order,
/// whether it was released now.
async fn write_releases(
    pool: &PgPool,
    orders: &[(&ReleaseCall, i64)],
) -> Result<Vec<bool>, sqlx::Error> {
    let ids: Vec<&str> = orders.iter().map(|(c, _)| c.order_id.as_str()).collect();
    let counts: Vec<i64> = orders.iter().map(|(_, n)| *n).collect();
    let (mut item_orders, mut item_skus, mut item_quantities) =
        (Vec::new(), Vec::new(), Vec::new());
    for (call, _) in orders {
        for (sku, quantity) in call.skus.iter().zip(&call.quantities) {
            item_orders.push(call.order_id.as_str());
            item_skus.push(sku.as_str());
            item_quantities.push(*quantity);
        }
    }
    // A new key's `calls` is this batch's count; a known key's is more.
    let rows: Vec<(String, bool)> = sqlx::query_as(
        r#"
        WITH release AS (
            INSERT INTO inventory.releases (order_id, calls)
            SELECT o.id, o.calls FROM unnest($1::text[], $2::bigint[]) AS o(id, calls) ORDER BY o.id
            ON CONFLICT (order_id) DO UPDATE SET calls = inventory.releases.calls + EXCLUDED.calls
            RETURNING order_id, calls
        ), fresh AS (
            SELECT release.order_id
              FROM release JOIN unnest($1::text[], $2::bigint[]) AS o(id, calls)
                ON o.id = release.order_id AND o.calls = release.calls
        ), stock AS (
            INSERT INTO inventory.stock (sku, available)
            SELECT i.sku, sum(i.quantity)::bigint
              FROM unnest($3::text[], $4::text[], $5::bigint[]) AS i(order_id, sku, quantity)
              JOIN fresh ON fresh.order_id = i.order_id
             GROUP BY i.sku
             ORDER BY i.sku
            ON CONFLICT (sku) DO UPDATE SET available = inventory.stock.available + EXCLUDED.available
        )
        SELECT release.order_id, fresh.order_id IS NOT NULL
          FROM release LEFT JOIN fresh ON fresh.order_id = release.order_id
        "#,
    )
    .bind(&ids)
    .bind(&counts)
    .bind(&item_orders)
    .bind(&item_skus)
    .bind(&item_quantities)
    .fetch_all(pool)
    .await?;
    let first: HashMap<String, bool> = rows.into_iter().collect();
    orders
        .iter()
        .map(|(c, _)| {
            first.get(&c.order_id).copied().ok_or_else(|| {
                sqlx::Error::Protocol(format!("no release row came back for order {}", c.order_id))
            })
        })
        .collect()
}

/// Sums quantities per SKU and rejects non-positive ones.
fn aggregate(items: &[pb::Item]) -> Result<(Vec<String>, Vec<i64>), Status> {
    let mut per_sku: BTreeMap<&str, i64> = BTreeMap::new();
    for item in items {
        if item.sku.is_empty() || item.quantity <= 0 {
            return Err(Status::invalid_argument(format!(
                "item {:?} x {}: sku must be non-empty and quantity positive",
                item.sku, item.quantity
            )));
        }
        *per_sku.entry(&item.sku).or_default() += item.quantity;
    }
    Ok(per_sku.into_iter().map(|(s, q)| (s.to_owned(), q)).unzip())
}

fn internal(e: sqlx::Error) -> Status {
    tracing::warn!(error = %e, "inventory database error");
    Status::unavailable(format!("database: {e}"))
}

impl ReferenceInventory {
    /// A server over `pool` (which must have the `inventory` schema). Starts
    /// its release writer on the current Tokio runtime (so call it inside
    /// one); the writer ends when the last clone is dropped.
    pub fn new(pool: PgPool) -> Self {
        let (releases, calls) = mpsc::channel(RELEASE_QUEUE);
        tokio::spawn(release_batches(pool.clone(), calls));
        Self { pool, releases }
    }

    /// Serves gRPC on an already-bound listener until `shutdown` completes.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        Server::builder()
            .add_service(InventoryServer::new(self))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }

    /// Binds `addr` and serves until `shutdown` completes.
    pub async fn serve_addr(
        self,
        addr: SocketAddr,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> anyhow::Result<()> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(%addr, "inventory server listening");
        self.serve(listener, shutdown).await?;
        Ok(())
    }
}

#[tonic::async_trait]
impl pb::inventory_server::Inventory for ReferenceInventory {
    #[tracing::instrument(skip_all, fields(order_id = %request.get_ref().order_id))]
    async fn release_stock(
        &self,
        request: Request<pb::ReleaseStockRequest>,
    ) -> Result<Response<pb::ReleaseStockResponse>, Status> {
        let req = request.into_inner();
        if req.order_id.is_empty() {
            return Err(Status::invalid_argument("order_id is empty"));
        }
        let (skus, quantities) = aggregate(&req.items)?;
        let (reply, answer) = oneshot::channel();
        let call = ReleaseCall {
            order_id: req.order_id,
            skus,
            quantities,
            reply,
        };
        let gone = || Status::unavailable("the inventory server is shutting down");
        self.releases.send(call).await.map_err(|_| gone())?;
        let released = answer.await.map_err(|_| gone())??;
        Ok(Response::new(pb::ReleaseStockResponse { released }))
    }

    #[tracing::instrument(skip_all, fields(order_id = %request.get_ref().order_id))]
    async fn reserve_stock(
        &self,
        request: Request<pb::ReserveStockRequest>,
    ) -> Result<Response<pb::ReserveStockResponse>, Status> {
        let req = request.into_inner();
        if req.order_id.is_empty() {
            return Err(Status::invalid_argument("order_id is empty"));
        }
        let (skus, quantities) = aggregate(&req.items)?;
        let mut tx = self.pool.begin().await.map_err(internal)?;
        let inserted = sqlx::query(
            "INSERT INTO inventory.reservations (order_id) VALUES ($1) ON CONFLICT DO NOTHING",
        )
        .bind(&req.order_id)
        .execute(&mut *tx)
        .await
        .map_err(internal)?
        .rows_affected();
        if inserted == 0 {
            return Ok(Response::new(pb::ReserveStockResponse { reserved: false }));
        }
        // Lock the rows in SKU order first: concurrent reservations of
        // overlapping SKUs then queue up instead of deadlocking.
        sqlx::query("SELECT 1 FROM inventory.stock WHERE sku = ANY($1) ORDER BY sku FOR UPDATE")
            .bind(&skus)
            .execute(&mut *tx)
            .await
            .map_err(internal)?;
        let updated = sqlx::query(
            r#"
            UPDATE inventory.stock s SET available = s.available - r.quantity
              FROM unnest($1::text[], $2::bigint[]) AS r(sku, quantity)
             WHERE s.sku = r.sku AND s.available >= r.quantity
            "#,
        )
        .bind(&skus)
        .bind(&quantities)
        .execute(&mut *tx)
        .await
        .map_err(internal)?
        .rows_affected();
        if updated != skus.len() as u64 {
            // Rolled back on drop.
            return Err(Status::failed_precondition(
                "insufficient stock or unknown sku",
            ));
        }
        tx.commit().await.map_err(internal)?;
        Ok(Response::new(pb::ReserveStockResponse { reserved: true }))
    }

    async fn get_stock(
        &self,
        request: Request<pb::GetStockRequest>,
    ) -> Result<Response<pb::GetStockResponse>, Status> {
        let skus = request.into_inner().skus;
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT sku, available FROM inventory.stock WHERE sku = ANY($1) ORDER BY sku",
        )
        .bind(&skus)
        .fetch_all(&self.pool)
        .await
        .map_err(internal)?;
        Ok(Response::new(pb::GetStockResponse {
            stock: rows
                .into_iter()
                .map(|(sku, quantity)| pb::Item { sku, quantity })
                .collect(),
        }))
    }
}
