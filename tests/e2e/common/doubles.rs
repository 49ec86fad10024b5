//! Test doubles of the real services, where a test needs them to fail on
//! purpose: an inventory that refuses releases by rule ([`RuleInventory`]).

use super::*;

/// What a [`RuleInventory`] answers the `call`-th release (from 1) of
/// `order`: `Some(status)` refuses it, `None` hands it to the reference
/// inventory.
pub type ReleaseRule = dyn Fn(&str, usize) -> Option<tonic::Status> + Send + Sync;

/// How long a [`RuleInventory`] takes before it answers a release of
/// `order` (`None`: no pause): a slow inventory.
pub type PauseRule = dyn Fn(&str) -> Option<std::time::Duration> + Send + Sync;

/// The reference inventory with some releases refused by a rule, counting
/// every release call per order: the one double for the tests that need
/// the inventory to fail (an unavailable shard, an order it froze).
#[derive(Clone)]
pub struct RuleInventory {
    inner: ReferenceInventory,
    rule: std::sync::Arc<ReleaseRule>,
    pause: std::sync::Arc<PauseRule>,
    calls: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
}

impl RuleInventory {
    /// Release calls seen for `order`, refused ones included.
    pub fn calls(&self, order: &str) -> usize {
        self.calls.lock().unwrap().get(order).copied().unwrap_or(0)
    }
}

#[tonic::async_trait]
impl order_timeout_tools::inventory::pb::inventory_server::Inventory for RuleInventory {
    async fn release_stock(
        &self,
        request: tonic::Request<order_timeout_tools::inventory::pb::ReleaseStockRequest>,
    ) -> Result<
        tonic::Response<order_timeout_tools::inventory::pb::ReleaseStockResponse>,
        tonic::Status,
    > {
        let id = request.get_ref().order_id.clone();
        let call = {
            let mut all = self.calls.lock().unwrap();
            let n = all.entry(id.clone()).or_default();
            *n += 1;
            *n
        };
        if let Some(pause) = (self.pause)(&id) {
            tokio::time::sleep(pause).await;
        }
        if let Some(status) = (self.rule)(&id, call) {
            return Err(status);
        }
        self.inner.release_stock(request).await
    }

    async fn reserve_stock(
        &self,
        request: tonic::Request<order_timeout_tools::inventory::pb::ReserveStockRequest>,
    ) -> Result<
        tonic::Response<order_timeout_tools::inventory::pb::ReserveStockResponse>,
        tonic::Status,
    > {
        self.inner.reserve_stock(request).await
    }

    async fn get_stock(
        &self,
        request: tonic::Request<order_timeout_tools::inventory::pb::GetStockRequest>,
    ) -> Result<tonic::Response<order_timeout_tools::inventory::pb::GetStockResponse>, tonic::Status>
    {
        self.inner.get_stock(request).await
    }
}

impl TestEnv {
    /// Replaces the test's inventory server by a [`RuleInventory`] refusing
    /// releases by `rule`, on the same address; returns it and the switch
    /// that stops it.
    pub async fn inventory_refusing(
        &self,
        rule: impl Fn(&str, usize) -> Option<tonic::Status> + Send + Sync + 'static,
    ) -> (RuleInventory, Shutdown) {
        self.inventory_pausing(rule, |_| None).await
    }

    /// [`TestEnv::inventory_refusing`], answering releases only after the
    /// pause `pause` says (a slow inventory).
    pub async fn inventory_pausing(
        &self,
        rule: impl Fn(&str, usize) -> Option<tonic::Status> + Send + Sync + 'static,
        pause: impl Fn(&str) -> Option<std::time::Duration> + Send + Sync + 'static,
    ) -> (RuleInventory, Shutdown) {
        let server = RuleInventory {
            inner: ReferenceInventory::new(self.pool.clone()),
            rule: std::sync::Arc::new(rule),
            pause: std::sync::Arc::new(pause),
            calls: std::sync::Arc::default(),
        };
        let stop = self.replace_inventory(server.clone()).await;
        (server, stop)
    }
}
