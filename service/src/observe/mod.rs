//! What operators see: Prometheus [`metrics`], the [`http`] endpoints
//! (`/metrics`, `/healthz`, `/readyz`) and the log subscriber
//! ([`telemetry`]).

pub mod http;
pub mod metrics;
pub mod telemetry;
