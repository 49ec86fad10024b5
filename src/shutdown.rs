//! Graceful shutdown as a small explicit type.
//!
//! One [`Shutdown`] is created per process (or per in-process service in the
//! tests) and cloned into every long-running task. Triggering it stops the
//! consumer from taking new messages; in-flight work then finishes within the
//! configured timeout and unacknowledged messages go back to the broker.

use tokio_util::sync::CancellationToken;

/// A shutdown signal shared by all tasks of one service instance.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    token: CancellationToken,
}

impl Shutdown {
    /// A signal that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the signal (idempotent).
    pub fn trigger(&self) {
        self.token.cancel();
    }

    /// Whether the signal has fired.
    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes once the signal has fired.
    pub async fn wait(&self) {
        self.token.cancelled().await;
    }

    /// A signal that fires with this one, and can also fire on its own
    /// (e.g. for one broker session's tasks).
    pub fn child(&self) -> Self {
        Self {
            token: self.token.child_token(),
        }
    }

    /// Fires the signal on SIGINT or SIGTERM, from a background task.
    pub fn trigger_on_signals(&self) {
        let this = self.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown signal received; finishing in-flight work");
            this.trigger();
        });
    }
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM (docker stop, Kubernetes).
pub async fn wait_for_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
