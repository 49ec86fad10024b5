//! A connection the broker blocks (`connection.blocked`: a memory or disk
//! alarm) accepts publishes into its buffer but sends none of them on: the
//! confirms never come. The publisher bounds each wait
//! (`[liveness].confirm_timeout`), so the work is retried instead of
//! hanging; this watch says why in the log while it lasts.

use futures_util::{Stream, StreamExt};
use lapin::Event;

use crate::shutdown::Shutdown;

/// Logs the publishing connection's `blocked` and `unblocked` notices
/// (with the broker's reason) until `stop` fires or the connection ends.
pub(crate) async fn watch(events: impl Stream<Item = Event> + Send + 'static, stop: Shutdown) {
    let mut events = std::pin::pin!(events);
    let mut blocked_since = None;
    loop {
        let event = tokio::select! {
            _ = stop.wait() => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Event::ConnectionBlocked(reason)) => {
                blocked_since = Some(std::time::Instant::now());
                tracing::warn!(%reason, "the broker blocked the publishing connection (a resource alarm): publishes wait, each failing after [liveness].confirm_timeout and retried");
            }
            Some(Event::ConnectionUnblocked) => {
                let blocked_for = blocked_since.take().map(|t| t.elapsed());
                tracing::info!(
                    ?blocked_for,
                    "the broker unblocked the publishing connection"
                );
            }
            Some(_) => {}
        }
    }
}
