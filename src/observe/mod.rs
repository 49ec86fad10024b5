//! What operators see: Prometheus [`metrics`] (with the [`pending`]
//! gauges), the [`http`] endpoints (`/metrics`, `/healthz`, `/readyz`), the
//! instance's [`recent`] history for the console, and the log subscriber
//! ([`telemetry`]).

pub(crate) mod http;
#[cfg(feature = "testing")]
pub mod metrics;
#[cfg(not(feature = "testing"))]
pub(crate) mod metrics;
pub(crate) mod pending;
pub(crate) mod recent;
#[cfg(feature = "testing")]
pub mod telemetry;
#[cfg(not(feature = "testing"))]
pub(crate) mod telemetry;
