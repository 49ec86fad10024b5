//! The seed design, as a baseline (`bench --baseline seed`): what the
//! project replaces, reimplemented as simply as it was built.
//!
//! - One classic queue, [`SEED_DELAY_QUEUE`], each message carrying its
//!   own TTL (`expiration` = the time left to the order's deadline),
//!   dead-lettering into a second classic queue, [`SEED_CANCEL_QUEUE`].
//! - A plain consumer: one message at a time, one conditional UPDATE per
//!   order on the shop's table (`status = 'CANCELLED'`, `cancelled_at` =
//!   the database's clock, `WHERE id = … AND status = 'UNPAID'`),
//!   autocommit, then the ack. No stock release, no event, no outbox, no
//!   retry, no batching.
//!
//! The broker dead-letters only from the head of a queue, so with one
//! shared timeout (queue order = expiry order) this design has no
//! head-of-line problem: it is the one to beat on that workload. The
//! consumer runs as a child process of the bench (`order-timeout-tools
//! seed-consumer`, see [`consume`]) so that its CPU is measured apart.

use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::Connection;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use sqlx::{ConnectOptions, Connection as _, MySqlConnection, PgConnection};

use super::BenchError;
use super::amqp::{QueuePair, declare_pair};
use order_timeout::settings::SecretUrl;
use order_timeout::testing::broker::connect_amqp;

/// The seed's delay queue (classic, per-message TTL), where
/// [`super::load::Route::Seed`] publishes.
pub const SEED_DELAY_QUEUE: &str = "bench.seed.delay";
/// Where the delay queue dead-letters to; the seed consumer's queue.
pub const SEED_CANCEL_QUEUE: &str = "bench.seed.cancel";
/// Deliveries the consumer's channel holds unacked (it still handles them
/// one at a time).
pub const SEED_PREFETCH: u16 = 100;

/// Declares the seed's two classic queues (durable).
pub async fn declare(conn: &Connection) -> Result<(), BenchError> {
    let ch = conn.create_channel().await?;
    declare_pair(
        &ch,
        QueuePair::Classic,
        SEED_DELAY_QUEUE,
        SEED_CANCEL_QUEUE,
        None,
    )
    .await?;
    let _ = ch.close(200, "ok".into()).await;
    Ok(())
}

/// The seed consumer's one database connection.
enum SeedDb {
    Postgres(PgConnection),
    MySql(MySqlConnection),
}

impl SeedDb {
    async fn connect(url: &SecretUrl) -> anyhow::Result<Self> {
        Ok(if url.expose().starts_with("mysql://") {
            Self::MySql(
                order_timeout::testing::store::mysql_options(url)?
                    .connect()
                    .await?,
            )
        } else {
            Self::Postgres(
                order_timeout::testing::store::pg_options(url)?
                    .connect()
                    .await?,
            )
        })
    }

    /// The seed's one statement: cancel the order if it is still unpaid.
    async fn cancel(&mut self, order_id: &str) -> Result<u64, sqlx::Error> {
        Ok(match self {
            Self::Postgres(c) => sqlx::query(
                "UPDATE orders SET status = 'CANCELLED', cancelled_at = now() \
                  WHERE id = $1 AND status = 'UNPAID'",
            )
            .bind(order_id)
            .execute(c)
            .await?
            .rows_affected(),
            Self::MySql(c) => sqlx::query(
                "UPDATE orders SET status = 'CANCELLED', cancelled_at = UTC_TIMESTAMP(6) \
                  WHERE id = ? AND status = 'UNPAID'",
            )
            .bind(order_id)
            .execute(c)
            .await?
            .rows_affected(),
        })
    }

    async fn close(self) {
        let _ = match self {
            Self::Postgres(c) => c.close().await,
            Self::MySql(c) => c.close().await,
        };
    }
}

/// The order id of a timeout message (`{"order_id": …}`, a string or an
/// integer), if it has one.
fn order_id(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    match &v["order_id"] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The seed consumer: takes messages from [`SEED_CANCEL_QUEUE`] one at a
/// time until `stop` resolves or the broker closes the channel. A message
/// without an order id is acked and logged; a failed UPDATE is logged and
/// the message requeued after a short pause on a fresh connection.
pub async fn consume(
    amqp_url: &SecretUrl,
    database_url: &SecretUrl,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut db = SeedDb::connect(database_url).await?;
    let conn = connect_amqp(amqp_url, "order-timeout-bench-seed").await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(SEED_PREFETCH, BasicQosOptions::default())
        .await?;
    let mut deliveries = ch
        .basic_consume(
            SEED_CANCEL_QUEUE.into(),
            "seed".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    tokio::pin!(stop);
    loop {
        let delivery = tokio::select! {
            _ = &mut stop => break,
            d = deliveries.next() => d,
        };
        let Some(delivery) = delivery else { break };
        let delivery = delivery?;
        let Some(id) = order_id(&delivery.data) else {
            tracing::warn!("seed consumer: a message without an order id, dropped");
            delivery.ack(BasicAckOptions::default()).await?;
            continue;
        };
        match db.cancel(&id).await {
            Ok(_) => {
                delivery.ack(BasicAckOptions::default()).await?;
            }
            Err(e) => {
                tracing::warn!(error = %e, order_id = %id, "seed consumer: UPDATE failed; requeued");
                tokio::time::sleep(Duration::from_millis(100)).await;
                if let Ok(fresh) = SeedDb::connect(database_url).await {
                    std::mem::replace(&mut db, fresh).close().await;
                }
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                };
                delivery.nack(requeue).await?;
            }
        }
    }
    db.close().await;
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_order_id_of_the_contract_body() {
        let body = br#"{"order_id":"shop-000000001","cancel_at":"2026-11-21T10:30:00.000Z"}"#;
        assert_eq!(order_id(body).as_deref(), Some("shop-000000001"));
        assert_eq!(order_id(br#"{"order_id":12345}"#).as_deref(), Some("12345"));
        assert_eq!(order_id(br#"{"id":"x"}"#), None);
        assert_eq!(order_id(b"not json"), None);
    }
}
