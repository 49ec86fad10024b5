//! The bench's AMQP helpers, at the bottom of its layers: confirm-mode
//! channels and the durable delay queues that the baselines and the broker
//! paths declare (a delay queue dead-lettering into the queue a consumer
//! reads).

use std::time::Duration;

use lapin::options::{ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection};

use super::BenchError;
use order_timeout::settings::QueueType;

/// The single-queue baseline's delay queue (declared by the baseline),
/// where [`Route::SingleQueue`] publishes.
pub const SINGLE_DELAY_QUEUE: &str = "bench.single-queue.delay";

/// Opens `n` confirm-mode channels on `conn`.
pub async fn confirm_channels(conn: &Connection, n: usize) -> Result<Vec<Channel>, BenchError> {
    let mut out = Vec::new();
    for _ in 0..n.max(1) {
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        out.push(ch);
    }
    Ok(out)
}

/// A durable queue's arguments: its type, TTL and dead-letter target
/// (at-least-once from a quorum queue, as the service's levels).
pub(super) fn args(
    queue_type: QueueType,
    ttl_ms: Option<u64>,
    dlx: Option<(&str, &str)>,
) -> FieldTable {
    dead_letter_args(queue_type, ttl_ms, dlx, true)
}

/// [`args`], with at-most-once dead-lettering from a quorum queue unless
/// `at_least_once`.
pub(super) fn dead_letter_args(
    queue_type: QueueType,
    ttl_ms: Option<u64>,
    dlx: Option<(&str, &str)>,
    at_least_once: bool,
) -> FieldTable {
    let mut t = FieldTable::default();
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    let qt = match queue_type {
        QueueType::Quorum => "quorum",
        QueueType::Classic => "classic",
    };
    t.insert(ShortString::from("x-queue-type"), text(qt));
    if let Some(ttl) = ttl_ms {
        t.insert(
            ShortString::from("x-message-ttl"),
            AMQPValue::LongLongInt(ttl as i64),
        );
    }
    if let Some((exchange, key)) = dlx {
        t.insert(ShortString::from("x-dead-letter-exchange"), text(exchange));
        t.insert(ShortString::from("x-dead-letter-routing-key"), text(key));
        if queue_type == QueueType::Quorum && at_least_once {
            // The same durability as the cascade's levels.
            t.insert(
                ShortString::from("x-dead-letter-strategy"),
                text("at-least-once"),
            );
            t.insert(ShortString::from("x-overflow"), text("reject-publish"));
        }
    }
    t
}

/// Declares a durable queue with arguments `a`.
pub(super) async fn declare(
    channel: &Channel,
    name: &str,
    a: FieldTable,
) -> Result<(), BenchError> {
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            a,
        )
        .await?;
    Ok(())
}

/// The two queues of a delay path: a delay queue dead-lettering into the
/// queue a consumer reads, both of one type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueuePair {
    /// Quorum queues, dead-lettering at least once (as the service's lanes
    /// and levels) or at most once (the broker's default).
    Quorum {
        /// `x-dead-letter-strategy = at-least-once`.
        at_least_once: bool,
    },
    /// Classic queues (the seed design's).
    Classic,
}

/// Declares a delay path, durable: `due`, and `delay` dead-lettering into
/// it (through the default exchange), with a queue TTL of `ttl` if given.
/// The seed design's queues ([`super::seed`]) and the broker paths'
/// ([`super::paths`]).
pub async fn declare_pair(
    channel: &Channel,
    pair: QueuePair,
    delay: &str,
    due: &str,
    ttl: Option<Duration>,
) -> Result<(), BenchError> {
    let (queue_type, at_least_once) = match pair {
        QueuePair::Quorum { at_least_once } => (QueueType::Quorum, at_least_once),
        QueuePair::Classic => (QueueType::Classic, false),
    };
    let ttl_ms = ttl.map(|t| t.as_millis() as u64);
    declare(channel, due, args(queue_type, None, None)).await?;
    let a = dead_letter_args(queue_type, ttl_ms, Some(("", due)), at_least_once);
    declare(channel, delay, a).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strategy(t: &FieldTable) -> Option<String> {
        t.inner()
            .get("x-dead-letter-strategy")
            .and_then(|v| v.as_long_string())
            .map(|s| s.to_string())
    }

    #[test]
    fn quorum_queues_dead_letter_at_least_once_unless_asked_not_to() {
        let dlx = Some(("", "due"));
        let at_least_once = dead_letter_args(QueueType::Quorum, Some(2000), dlx, true);
        assert_eq!(strategy(&at_least_once).as_deref(), Some("at-least-once"));
        let at_most_once = dead_letter_args(QueueType::Quorum, Some(2000), dlx, false);
        assert_eq!(strategy(&at_most_once), None);
        assert!(
            at_most_once
                .inner()
                .contains_key("x-dead-letter-routing-key")
        );
        // Classic queues have no strategy to set.
        assert_eq!(strategy(&args(QueueType::Classic, None, dlx)), None);
        assert_eq!(
            strategy(&args(QueueType::Quorum, None, dlx)).as_deref(),
            Some("at-least-once")
        );
    }
}
