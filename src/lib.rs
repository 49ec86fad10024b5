//! order-timeout: cancels unpaid orders when their payment window runs out,
//! on RabbitMQ fixed-TTL delay queues.
//!
//! Where to look:
//! - [`topology`]: exchange/queue names and **the delay cascade**;
//! - [`consumer`]: what happens to each message (hold, re-schedule, park);
//! - [`cancel`] and [`store`]: **the cancel transaction**, outbox, stock release;
//! - [`retry`]: **the retry policy**; [`sweeper`]: the safety net;
//! - [`metrics`] and [`http`]: `/metrics`, `/healthz`, `/readyz`;
//! - [`message`]: the accepted message formats;
//! - [`parked`] and [`topology_check`]: operator tooling (`parked list|replay|purge`,
//!   `topology check`, wired in [`cli_ops`]);
//! - [`startup`]: wiring and reconnects; [`cli`]: the commands.

pub mod bench;
pub mod cancel;
pub mod cli;
pub mod cli_ops;
pub mod config;
pub mod consumer;
pub mod demo;
pub mod http;
pub mod inventory;
pub mod message;
pub mod metrics;
pub mod parked;
pub mod publisher;
pub mod retry;
pub mod shop;
pub mod shutdown;
pub mod startup;
pub mod store;
pub mod sweeper;
pub mod telemetry;
pub mod topology;
pub mod topology_check;
