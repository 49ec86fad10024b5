//! Which broker node to connect to, and how: the nodes of `AMQP_URL` in
//! turn, each within a short connect timeout, the node whose session just
//! failed tried last, and every connection asking for a heartbeat so that
//! a node that falls silent (a network cut sends no reset) is declared
//! dead within seconds instead of after the broker's proposed 60 s twice
//! over (issue 43).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::uri::AMQPUri;

use crate::settings::LivenessSettings;

/// No node failed yet.
const NONE: usize = usize::MAX;

/// How a connection to one of the nodes is opened: the heartbeat asked
/// for, the per-node connect timeout, and the node to try last. Cheap to
/// clone; clones share the record of the failed node.
#[derive(Clone, Debug)]
pub(crate) struct Dialer {
    heartbeat: u16,
    connect_timeout: Duration,
    failed: Arc<AtomicUsize>,
}

impl Default for Dialer {
    fn default() -> Self {
        Self::of(&LivenessSettings::default())
    }
}

impl Dialer {
    /// A dialer with the `[liveness]` heartbeat and connect timeout.
    pub(crate) fn of(liveness: &LivenessSettings) -> Self {
        Self {
            heartbeat: liveness.heartbeat_secs(),
            connect_timeout: liveness.broker_connect_timeout,
            failed: Arc::new(AtomicUsize::new(NONE)),
        }
    }

    /// Records that the session on node `index` (of the listed nodes)
    /// failed: the next connects try it last.
    pub(crate) fn failed(&self, index: usize) {
        self.failed.store(index, Ordering::Relaxed);
    }

    /// The order in which to try `count` nodes: as listed, except that
    /// the node that failed last comes last (the one after it first, so
    /// that the healthy nodes are tried before the silent one).
    pub(crate) fn order(&self, count: usize) -> Vec<usize> {
        let failed = self.failed.load(Ordering::Relaxed);
        if failed >= count {
            return (0..count).collect();
        }
        (1..=count).map(|k| (failed + k) % count).collect()
    }

    /// The node's URI with the heartbeat asked for, unless its URL asks
    /// for one itself, and how long its connect may take: the URL's
    /// `connection_timeout` (milliseconds, as in RabbitMQ's URI spec) if
    /// it has one, else the configured timeout.
    pub(crate) fn tune(&self, mut uri: AMQPUri) -> Result<(AMQPUri, Duration), String> {
        if uri.query.heartbeat.is_none() {
            uri.query.heartbeat = Some(self.heartbeat);
        }
        let limit = match uri.query.connection_timeout {
            Some(0) => {
                return Err("connection_timeout=0 would fail every connect; give milliseconds (e.g. connection_timeout=5000) or leave it out for [liveness].broker_connect_timeout".into());
            }
            Some(ms) => Duration::from_millis(ms),
            None => self.connect_timeout,
        };
        Ok((uri, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(text: &str) -> AMQPUri {
        text.parse().unwrap()
    }

    #[test]
    fn the_node_that_failed_is_tried_last() {
        let dialer = Dialer::default();
        assert_eq!(dialer.order(3), [0, 1, 2]);
        dialer.failed(0);
        assert_eq!(dialer.order(3), [1, 2, 0]);
        dialer.failed(1);
        assert_eq!(dialer.order(3), [2, 0, 1]);
        assert_eq!(dialer.order(1), [0]);
        dialer.failed(7);
        assert_eq!(dialer.order(2), [0, 1], "an index out of range is ignored");
    }

    #[test]
    fn a_heartbeat_is_asked_for_unless_the_url_names_one() {
        let dialer = Dialer::default();
        let (tuned, limit) = dialer.tune(uri("amqp://g:g@h:5672/%2f")).unwrap();
        assert_eq!(tuned.query.heartbeat, Some(5));
        assert_eq!(limit, Duration::from_secs(5));
        let (tuned, _) = dialer
            .tune(uri("amqp://g:g@h:5672/%2f?heartbeat=9"))
            .unwrap();
        assert_eq!(tuned.query.heartbeat, Some(9));
    }

    #[test]
    fn connection_timeout_in_the_url_is_the_node_s_connect_limit() {
        let dialer = Dialer::default();
        let (_, limit) = dialer
            .tune(uri("amqp://g:g@h:5672/%2f?connection_timeout=1500"))
            .unwrap();
        assert_eq!(limit, Duration::from_millis(1500));
        let err = dialer
            .tune(uri("amqp://g:g@h:5672/%2f?connection_timeout=0"))
            .unwrap_err();
        assert!(err.contains("connection_timeout=0"), "{err}");
    }
}
