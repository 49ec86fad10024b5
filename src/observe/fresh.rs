//! A body computed at most once per interval and served from memory in
//! between: the console's pages of figures and `/metrics` read the
//! metrics, the recent history and readiness, and a flood of viewers must
//! not turn into a flood of computations.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// The last body of one page, and when it was computed.
#[derive(Debug)]
pub(crate) struct Fresh {
    fresh: Duration,
    /// Held while computing, so that concurrent viewers wait for the one
    /// computation instead of each computing.
    last: tokio::sync::Mutex<Option<(Instant, Arc<str>)>>,
}

impl Fresh {
    /// Bodies are served for `fresh` after they are computed.
    pub(crate) fn new(fresh: Duration) -> Self {
        Self {
            fresh,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// The body computed within the interval, or a new one from `compute`.
    pub(crate) async fn get_or(&self, compute: impl AsyncFnOnce() -> String) -> Arc<str> {
        let mut last = self.last.lock().await;
        if let Some((at, body)) = last.as_ref()
            && at.elapsed() < self.fresh
        {
            return body.clone();
        }
        let body: Arc<str> = compute().await.into();
        *last = Some((Instant::now(), body.clone()));
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_is_computed_once_per_interval() {
        let fresh = Fresh::new(Duration::from_secs(60));
        let mut computed = 0;
        for _ in 0..5 {
            let body = fresh
                .get_or(async || {
                    computed += 1;
                    "page".to_owned()
                })
                .await;
            assert_eq!(&*body, "page");
        }
        assert_eq!(computed, 1);
    }
}
