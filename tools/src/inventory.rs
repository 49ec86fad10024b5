//! The inventory side of the shop: the reference gRPC inventory server
//! (stock in schema `inventory`, run by the demo, the bench and the tests in
//! place of a shop's real one), and a client with the calls the order
//! service makes (reserve, read stock) that the production client does not
//! carry.
//!
//! The contract the service relies on is idempotency by order id:
//! `ReleaseStock` is called at least once per cancelled order, and the
//! server releases exactly once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use order_timeout::store::OrderItem;
use sqlx::PgPool;
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
/// `order_timeout::inventory::InventoryClient`.)
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
    /// A server over `pool` (which must have the `inventory` schema).
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
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
        // One statement (so one round trip and one commit): the idempotency
        // key (only the first call for an order inserts) and, on the first
        // call only, the stock. The service calls this once per cancelled
        // order, so its cost sets the database's load (measured with
        // `bench`: BEGIN + 2 statements + COMMIT made the database the
        // busiest process at 1,000 orders/s).
        let released: bool = sqlx::query_scalar(
            r#"
            WITH release AS (
                INSERT INTO inventory.releases (order_id) VALUES ($1)
                ON CONFLICT (order_id) DO UPDATE SET calls = inventory.releases.calls + 1
                RETURNING calls = 1 AS first
            ), stock AS (
                INSERT INTO inventory.stock (sku, available)
                SELECT r.sku, r.quantity
                  FROM unnest($2::text[], $3::bigint[]) AS r(sku, quantity), release
                 WHERE release.first
                 ORDER BY r.sku
                ON CONFLICT (sku) DO UPDATE SET available = inventory.stock.available + EXCLUDED.available
            )
            SELECT first FROM release
            "#,
        )
        .bind(&req.order_id)
        .bind(&skus)
        .bind(&quantities)
        .fetch_one(&self.pool)
        .await
        .map_err(internal)?;
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
