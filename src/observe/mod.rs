//! What operators see: Prometheus [`metrics`] (with the [`pending`]
//! gauges), the [`http`] endpoints (`/metrics`, `/healthz`, `/readyz`), the
//! instance's [`recent`] history for the console, and the log subscriber
//! ([`telemetry`]).

pub mod http;
pub mod metrics;
pub mod pending;
pub mod recent;
pub mod telemetry;
