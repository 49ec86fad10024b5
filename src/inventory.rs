//! The gRPC inventory service (`proto/inventory.proto`): the client the
//! service uses to release stock. (The reference server that the demo and
//! the tests run lives in the tools crate.)
//!
//! The contract is idempotency by order id: the service calls
//! `ReleaseStock` at least once per cancelled order and relies on the server
//! to release exactly once.

use std::time::Duration;

use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use crate::settings::SecretUrl;
use crate::store::OrderItem;

/// Code generated from `proto/inventory.proto`.
#[allow(missing_docs, unreachable_pub)]
pub mod pb {
    tonic::include_proto!("inventory.v1");
}

/// Errors calling the inventory service. All are treated as transient
/// (retried, then parked).
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// The endpoint URL is invalid.
    #[error("invalid INVENTORY_URL {url}: {reason}")]
    Url {
        /// The URL (its password redacted when shown).
        url: SecretUrl,
        /// Why it is invalid.
        reason: String,
    },
    /// The call failed or timed out.
    #[error("inventory {call} failed: {code:?}: {message}")]
    Call {
        /// The RPC, e.g. `ReleaseStock`.
        call: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The server's message.
        message: String,
    },
}

impl From<(&'static str, Status)> for InventoryError {
    fn from((call, status): (&'static str, Status)) -> Self {
        Self::Call {
            call,
            code: status.code(),
            message: status.message().to_owned(),
        }
    }
}

/// Client for the inventory service. Cheap to clone (HTTP/2 multiplexed).
#[derive(Clone, Debug)]
pub struct InventoryClient {
    client: pb::inventory_client::InventoryClient<Channel>,
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

impl InventoryClient {
    /// A client that connects lazily (and reconnects) to `url`; every call
    /// times out after `timeout`, and a connection whose HTTP/2 pings go
    /// unanswered for the default keep-alive
    /// (`[liveness].inventory_keepalive`) is dropped. (The service itself
    /// builds its client with [`InventoryClient::connect_lazy_with`].)
    pub fn connect_lazy(url: &SecretUrl, timeout: Duration) -> Result<Self, InventoryError> {
        let keepalive = crate::settings::LivenessSettings::default().inventory_keepalive;
        Self::connect_lazy_with(url, timeout, keepalive)
    }

    /// [`InventoryClient::connect_lazy`] with HTTP/2 pings every
    /// `keepalive`, idle or not, each answered within `keepalive`: an
    /// inventory cut off by the network (no reset, every packet dropped)
    /// loses its connection after about twice `keepalive`, and the next
    /// calls open a new one (within `timeout`) instead of waiting on the
    /// dead one until TCP gives up. TCP keep-alive as well, for the
    /// moments no stream is open.
    pub(crate) fn connect_lazy_with(
        url: &SecretUrl,
        timeout: Duration,
        keepalive: Duration,
    ) -> Result<Self, InventoryError> {
        let endpoint = Endpoint::from_shared(url.expose().to_owned())
            .map_err(|e| InventoryError::Url {
                url: url.clone(),
                reason: e.to_string(),
            })?
            .timeout(timeout)
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(keepalive)
            .keep_alive_timeout(keepalive)
            .keep_alive_while_idle(true)
            .tcp_keepalive(Some(keepalive));
        Ok(Self {
            client: pb::inventory_client::InventoryClient::new(endpoint.connect_lazy()),
        })
    }

    /// Releases an order's stock. `Ok(true)` if this call released it,
    /// `Ok(false)` if an earlier call already had.
    #[tracing::instrument(skip(self, items), fields(items = items.len()))]
    pub async fn release(
        &self,
        order_id: &str,
        items: &[OrderItem],
    ) -> Result<bool, InventoryError> {
        let response = self
            .client
            .clone()
            .release_stock(pb::ReleaseStockRequest {
                order_id: order_id.to_owned(),
                items: to_pb(items),
            })
            .await
            .map_err(|s| InventoryError::from(("ReleaseStock", s)))?;
        Ok(response.into_inner().released)
    }
}
