//! Publishing with publisher confirms: every message this service sends
//! (a re-schedule into the delay cascade, a parked failure, an event such
//! as `order.cancelled`, a timeout from the CLI) is confirmed by the
//! broker before the caller moves on, so nothing is acked upstream that was
//! not safely handed over.

use chrono::{DateTime, Utc};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use serde::Serialize;

use super::headers::{Attempts, H_DEADLINE_MS};
use super::parked::{ParkInfo, park_properties};
use super::topology::{
    ENTRY_EXCHANGE, EVENTS_EXCHANGE, Layout, PARKED_QUEUE, SCHEDULE_ROUTING_KEY,
};
use crate::message::{OrderId, TimeoutRequest};

/// Errors publishing a message.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The channel or connection failed.
    #[error("publishing to {exchange:?} with key {routing_key:?}: {error}")]
    Amqp {
        /// Where it was published.
        exchange: String,
        /// With which key.
        routing_key: String,
        /// What failed.
        error: lapin::Error,
    },
    /// The broker refused the message (nack), e.g. a full queue.
    #[error("broker refused the message (nack) on {exchange:?} with key {routing_key:?}")]
    Nacked {
        /// Where it was published.
        exchange: String,
        /// With which key.
        routing_key: String,
    },
    /// The broker did not confirm the message in time (a connection it
    /// blocks on a resource alarm, a node cut off, a dead channel): it may
    /// or may not have been taken, so the work is retried.
    #[error(
        "the broker did not confirm the message to {exchange:?} with key {routing_key:?} within {waited:?}"
    )]
    Unconfirmed {
        /// Where it was published.
        exchange: String,
        /// With which key.
        routing_key: String,
        /// How long the publisher waited.
        waited: std::time::Duration,
    },
    /// A mandatory message matched no queue: the topology is missing.
    #[error(
        "message to {exchange:?} with key {routing_key:?} was unroutable (is the topology declared?)"
    )]
    Unroutable {
        /// Where it was published.
        exchange: String,
        /// With which key.
        routing_key: String,
    },
}

/// The body of a timer's event on `order-timeout.events`: `order.cancelled`
/// for the default timer, the timer's `event` routing key for another
/// (`order.received`, `coupon.expired`).
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct TimerEvent {
    /// The cancelled order (the row flipped, for another timer).
    pub order_id: String,
    /// The deadline it was cancelled (flipped) for: the row's deadline.
    pub expires_at: DateTime<Utc>,
    /// When the cancellation (the flip) committed.
    pub cancelled_at: DateTime<Utc>,
    /// `cancelled_at - expires_at`, in milliseconds.
    pub lateness_ms: i64,
    /// The timer that flipped it (`cancel_unpaid` for a cancellation).
    pub timer: String,
}

/// Confirm-mode channels on one connection, used in turn. Cheap to clone;
/// clones share the channels.
///
/// Several channels because the broker handles each channel's publishes in
/// one process, one after the other: measured with `bench` at 2,000
/// orders/s, a single channel's confirms took 700 ms on average and the
/// service fell behind.
#[derive(Clone)]
pub struct Publisher {
    channels: std::sync::Arc<[Channel]>,
    next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    confirm_timeout: std::time::Duration,
}

/// Channels a [`Publisher`] opens.
pub(crate) const PUBLISH_CHANNELS: usize = 4;

impl Publisher {
    /// Opens [`PUBLISH_CHANNELS`] channels on `connection` in confirm mode.
    pub async fn new(connection: &Connection) -> Result<Self, lapin::Error> {
        let mut channels = Vec::with_capacity(PUBLISH_CHANNELS);
        for _ in 0..PUBLISH_CHANNELS {
            let channel = connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            channels.push(channel);
        }
        Ok(Self {
            channels: channels.into(),
            next: Default::default(),
            confirm_timeout: crate::settings::LivenessSettings::default().confirm_timeout,
        })
    }

    /// The same publisher, waiting at most `limit` for each confirm
    /// (`[liveness].confirm_timeout`).
    pub fn with_confirm_timeout(self, limit: std::time::Duration) -> Self {
        Self {
            confirm_timeout: limit,
            ..self
        }
    }

    /// The first channel (for declarations).
    pub(crate) fn channel(&self) -> &Channel {
        &self.channels[0]
    }

    /// Every channel (to close them).
    pub(crate) fn channels(&self) -> &[Channel] {
        &self.channels
    }

    /// Closes every channel, each close confirmed (or given up after a
    /// moment): a channel left to close itself when dropped races its
    /// connection's close, and lapin then logs `ERROR lapin::channels:
    /// Connection error … Closed` for a normal end. Call before closing the
    /// connection.
    pub(crate) async fn close(&self) {
        for channel in self.channels.iter() {
            super::close_channel_quietly(channel).await;
        }
    }

    fn pick(&self) -> &Channel {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.channels[i % self.channels.len()]
    }

    /// Publishes one persistent message and waits for the broker's confirm.
    pub(crate) async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let amqp = |error| PublishError::Amqp {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            error,
        };
        let confirmed = async {
            self.pick()
                .basic_publish(
                    ShortString::from(exchange),
                    ShortString::from(routing_key),
                    BasicPublishOptions {
                        mandatory,
                        ..Default::default()
                    },
                    body,
                    properties.with_delivery_mode(2),
                )
                .await?
                .await
        };
        let confirm = tokio::time::timeout(self.confirm_timeout, confirmed)
            .await
            .map_err(|_| PublishError::Unconfirmed {
                exchange: exchange.into(),
                routing_key: routing_key.into(),
                waited: self.confirm_timeout,
            })?
            .map_err(amqp)?;
        if confirm.is_nack() {
            return Err(PublishError::Nacked {
                exchange: exchange.into(),
                routing_key: routing_key.into(),
            });
        }
        if confirm.take_message().is_some() {
            return Err(PublishError::Unroutable {
                exchange: exchange.into(),
                routing_key: routing_key.into(),
            });
        }
        Ok(())
    }

    /// Publishes a timeout the way the order service does: to the entry
    /// exchange with routing key `schedule`.
    #[tracing::instrument(skip(self), fields(order_id = %request.order_id))]
    pub async fn schedule(&self, request: &TimeoutRequest) -> Result<(), PublishError> {
        self.publish(
            ENTRY_EXCHANGE,
            SCHEDULE_ROUTING_KEY,
            true,
            &request.to_json(),
            json_properties(FieldTable::default()),
        )
        .await
    }

    /// Sends `body` into the delay store so it comes back to the consumer
    /// less than [`super::cascade::HOLD_WINDOW_SECS`] before `deadline`
    /// (the consumer holds the rest): into the lane it fits, else through
    /// the cascade by the delay with the fewest hops, in the order's shard
    /// ([`Layout::route`]).
    /// Returns the number of hops.
    #[tracing::instrument(skip(self, body, attempts, layout), fields(attempts = attempts.count))]
    pub(crate) async fn delay(
        &self,
        body: &[u8],
        order_id: &OrderId,
        deadline: DateTime<Utc>,
        now: DateTime<Utc>,
        attempts: &Attempts,
        layout: &Layout,
    ) -> Result<u32, PublishError> {
        let remaining_ms = (deadline - now).num_milliseconds().max(0) as u64;
        let route = layout.route(remaining_ms, order_id.as_str());
        let mut headers = FieldTable::default();
        headers.insert(
            H_DEADLINE_MS.into(),
            AMQPValue::LongLongInt(deadline.timestamp_millis()),
        );
        attempts.write(&mut headers);
        self.publish(
            &route.exchange,
            &route.routing_key,
            true,
            body,
            json_properties(headers),
        )
        .await?;
        Ok(route.hops)
    }

    /// Parks a message: original body and properties (content type,
    /// message id, the sender's own headers…), plus headers saying why, in
    /// the format of [`super::parked`] ([`park_properties`]).
    #[tracing::instrument(skip(self, body, original, info), fields(kind = %info.kind, order_id = ?info.order_id))]
    pub(crate) async fn park(
        &self,
        body: &[u8],
        original: &BasicProperties,
        info: &ParkInfo,
    ) -> Result<(), PublishError> {
        self.publish(
            "",
            PARKED_QUEUE,
            true,
            body,
            park_properties(original, info, Utc::now()),
        )
        .await
    }

    /// Publishes a timer's event with its routing key (`order.cancelled`
    /// for the default timer).
    #[tracing::instrument(skip(self, event), fields(order_id = %event.order_id, timer = %event.timer))]
    pub(crate) async fn event(
        &self,
        routing_key: &str,
        event: &TimerEvent,
    ) -> Result<(), PublishError> {
        let body = serde_json::to_vec(event).expect("event serializes");
        self.publish(
            EVENTS_EXCHANGE,
            routing_key,
            false,
            &body,
            json_properties(FieldTable::default()).with_message_id(event.order_id.as_str().into()),
        )
        .await
    }
}

fn json_properties(headers: FieldTable) -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_headers(headers)
}
