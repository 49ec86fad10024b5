//! Client-side deadlines on every database operation ([`Bounded`]). A
//! database cut off by the network answers nothing: a statement sent just
//! before the cut waits for an answer lost in it until TCP retransmits its
//! way through (measured: 57 s after the cut, 23–27 s after the heal), and
//! the server's `statement_timeout` cannot help, since its error is lost
//! the same way. sqlx has no TCP keep-alive or socket timeout option, so
//! the bound is the client's own: each operation (one statement, or one
//! transaction with its statements) gets `[liveness].database_timeout`;
//! past it the operation is abandoned with [`StoreError::Unanswered`], a
//! failure of the environment (retried, readiness red), and the pool
//! closes the connection it ran on instead of reusing it (the pool's
//! release check in each dialect's `pool()`: [`release_check`]).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{
    HistoryCursor, HistoryRow, IdRejected, NewParked, NextAttempt, OrderFacts, OrderItem,
    OrderState, OrderStore, OutboxFailure, Page, ParkedFilter, ParkedRow, RowCursor, SchemaReport,
    SetAsideRow, Store, StoreError, WatchMark,
};
use crate::message::OrderId;
use crate::settings::Timer;

/// A store whose every operation ends within `limit`, answered or not.
#[derive(Debug)]
pub(crate) struct Bounded {
    inner: Store,
    limit: Duration,
}

impl Bounded {
    /// `inner`, each operation bounded by `limit`.
    pub(crate) fn new(inner: Store, limit: Duration) -> Self {
        Self { inner, limit }
    }

    /// Runs `operation` within the limit.
    async fn within<T>(
        &self,
        name: &'static str,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.limit, operation).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(operation = name, limit = ?self.limit, "the database did not answer in time; the connection is closed");
                Err(StoreError::Unanswered {
                    operation: name,
                    limit: self.limit,
                })
            }
        }
    }
}

/// How long the pool's release check may wait for a connection to answer
/// before closing it: a connection whose operation was abandoned
/// ([`Bounded`]) still waits for the answer to it, which a silent server
/// never sends.
pub(crate) const RELEASE_CHECK: Duration = Duration::from_secs(2);

/// The pool's `after_release` check: `Ok(true)` (keep it) when the
/// connection answers a ping within [`RELEASE_CHECK`], `Ok(false)` (close
/// it) when it does not — what is left on it of an abandoned operation
/// would hold the next user (and a pool slot) until TCP gives up.
pub(crate) async fn release_check<C: sqlx::Connection>(conn: &mut C) -> Result<bool, sqlx::Error> {
    match tokio::time::timeout(RELEASE_CHECK, conn.ping()).await {
        Ok(Ok(())) => Ok(true),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            tracing::debug!("a released connection did not answer; closing it");
            Ok(false)
        }
    }
}

#[async_trait::async_trait]
impl OrderStore for Bounded {
    fn timer(&self) -> &Timer {
        self.inner.timer()
    }

    async fn prepare(&self) -> Result<SchemaReport, StoreError> {
        self.within("prepare", self.inner.prepare()).await
    }

    fn canonical(&self, id: &OrderId) -> Result<OrderId, IdRejected> {
        self.inner.canonical(id)
    }

    async fn reread_shape(&self) -> bool {
        tokio::time::timeout(self.limit, self.inner.reread_shape())
            .await
            .unwrap_or(false)
    }

    async fn prepare_every_template(&self) -> Result<usize, StoreError> {
        self.inner.prepare_every_template().await
    }

    async fn cancel_due(
        &self,
        ids: &[OrderId],
        lease: Duration,
    ) -> Result<Vec<(OrderId, OrderState)>, StoreError> {
        self.within("cancel_due", self.inner.cancel_due(ids, lease))
            .await
    }

    async fn explain(&self, id: &OrderId) -> Result<OrderFacts, StoreError> {
        self.within("explain", self.inner.explain(id)).await
    }

    async fn history(
        &self,
        cursor: Option<&HistoryCursor>,
        limit: u32,
    ) -> Result<Vec<HistoryRow>, StoreError> {
        self.within("history", self.inner.history(cursor, limit))
            .await
    }

    async fn items(&self, ids: &[&OrderId]) -> Result<HashMap<String, Vec<OrderItem>>, StoreError> {
        self.within("items", self.inner.items(ids)).await
    }

    async fn overdue(
        &self,
        grace: Duration,
        after: Option<&RowCursor>,
        limit: u32,
    ) -> Result<Page<RowCursor>, StoreError> {
        self.within("overdue", self.inner.overdue(grace, after, limit))
            .await
    }

    async fn waiting_page(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Page<String>, StoreError> {
        self.within("waiting_page", self.inner.waiting_page(after, limit))
            .await
    }

    async fn set_aside(&self, id: &OrderId, reason: &str) -> Result<Option<u32>, StoreError> {
        self.within("set_aside", self.inner.set_aside(id, reason))
            .await
    }

    async fn set_aside_rows(&self, limit: u32) -> Result<Vec<SetAsideRow>, StoreError> {
        self.within("set_aside_rows", self.inner.set_aside_rows(limit))
            .await
    }

    async fn forget_set_aside(&self, id: &OrderId) -> Result<(), StoreError> {
        self.within("forget_set_aside", self.inner.forget_set_aside(id))
            .await
    }

    async fn record_replica(&self, instance: &str, version: &str) -> Result<(), StoreError> {
        self.within(
            "record_replica",
            self.inner.record_replica(instance, version),
        )
        .await
    }

    async fn forget_replica(&self, instance: &str) -> Result<(), StoreError> {
        self.within("forget_replica", self.inner.forget_replica(instance))
            .await
    }

    async fn live_replicas(&self, within: Duration) -> Result<Vec<(String, String)>, StoreError> {
        self.within("live_replicas", self.inner.live_replicas(within))
            .await
    }

    async fn record_logout(&self, session: &str, until: DateTime<Utc>) -> Result<(), StoreError> {
        self.within("record_logout", self.inner.record_logout(session, until))
            .await
    }

    async fn logouts(&self) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
        self.within("logouts", self.inner.logouts()).await
    }

    async fn keep_parked(&self, message: &NewParked<'_>) -> Result<bool, StoreError> {
        self.within("keep_parked", self.inner.keep_parked(message))
            .await
    }

    async fn parked_page(
        &self,
        filter: &ParkedFilter,
        after: i64,
        limit: u32,
        excerpt: Option<usize>,
    ) -> Result<Vec<ParkedRow>, StoreError> {
        self.within(
            "parked_page",
            self.inner.parked_page(filter, after, limit, excerpt),
        )
        .await
    }

    async fn parked_ids(&self, filter: &ParkedFilter, upto: i64) -> Result<Vec<i64>, StoreError> {
        self.within("parked_ids", self.inner.parked_ids(filter, upto))
            .await
    }

    async fn parked_last_id(&self) -> Result<i64, StoreError> {
        self.within("parked_last_id", self.inner.parked_last_id())
            .await
    }

    async fn parked_counts(&self) -> Result<Vec<(Option<String>, u64)>, StoreError> {
        self.within("parked_counts", self.inner.parked_counts())
            .await
    }

    async fn delete_parked(&self, ids: &[i64]) -> Result<u64, StoreError> {
        self.within("delete_parked", self.inner.delete_parked(ids))
            .await
    }

    async fn set_aside_count(&self) -> Result<u64, StoreError> {
        self.within("set_aside_count", self.inner.set_aside_count())
            .await
    }

    async fn retry_set_aside(&self, ids: Option<&[&str]>) -> Result<u64, StoreError> {
        self.within("retry_set_aside", self.inner.retry_set_aside(ids))
            .await
    }

    async fn prune_set_aside(&self) -> Result<u64, StoreError> {
        self.within("prune_set_aside", self.inner.prune_set_aside())
            .await
    }

    async fn stale_outbox(&self, grace: Duration, limit: u32) -> Result<Vec<OrderId>, StoreError> {
        self.within("stale_outbox", self.inner.stale_outbox(grace, limit))
            .await
    }

    async fn record_failures(
        &self,
        failures: &[OutboxFailure<'_>],
        plan: &(dyn for<'r, 'f> Fn(&'r OutboxFailure<'f>, u32) -> NextAttempt + Send + Sync),
    ) -> Result<Vec<(String, u32, NextAttempt)>, StoreError> {
        self.within(
            "record_failures",
            self.inner.record_failures(failures, plan),
        )
        .await
    }

    async fn delete_finished(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError> {
        self.within(
            "delete_finished",
            self.inner.delete_finished(older_than, limit),
        )
        .await
    }

    async fn release_leases(&self, ids: &[&str]) -> Result<(), StoreError> {
        self.within("release_leases", self.inner.release_leases(ids))
            .await
    }

    async fn renew_leases(&self, ids: &[&str], lease: Duration) -> Result<(), StoreError> {
        self.within("renew_leases", self.inner.renew_leases(ids, lease))
            .await
    }

    async fn mark_done(&self, released: &[&str], published: &[&str]) -> Result<(), StoreError> {
        self.within("mark_done", self.inner.mark_done(released, published))
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.within("ping", self.inner.ping()).await
    }

    async fn watch_lease(
        &self,
        holder: &str,
        lease: Duration,
    ) -> Result<Option<WatchMark>, StoreError> {
        self.within("watch_lease", self.inner.watch_lease(holder, lease))
            .await
    }

    async fn due_between(
        &self,
        after: &RowCursor,
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Page<RowCursor>, StoreError> {
        self.within("due_between", self.inner.due_between(after, until, limit))
            .await
    }

    async fn watch_advance(&self, holder: &str, until: DateTime<Utc>) -> Result<bool, StoreError> {
        self.within("watch_advance", self.inner.watch_advance(holder, until))
            .await
    }

    async fn watch_release(&self, holder: &str) -> Result<(), StoreError> {
        self.within("watch_release", self.inner.watch_release(holder))
            .await
    }
}
