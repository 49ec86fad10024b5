//! What operators see: Prometheus [`metrics`] (with the [`pending`]
//! gauges), the [`http`] endpoints (`/metrics`, `/healthz`, `/readyz`) and the
//! [`server`] that accepts and bounds their connections, the
//! instance's [`recent`] history for the console, and the log subscriber
//! ([`telemetry`]).

pub(crate) mod fresh;
pub(crate) mod http;
pub(crate) mod metrics;
pub(crate) mod pending;
pub(crate) mod recent;
pub(crate) mod server;
pub(crate) mod telemetry;
