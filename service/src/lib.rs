//! order-timeout: cancels unpaid orders when their payment window runs out,
//! on RabbitMQ fixed-TTL delay queues.
//!
//! # Layout
//!
//! Dependencies point one way, top to bottom:
//!
//! ```text
//! cli, ops, app        the commands, operator tooling, wiring and reconnects
//!    │
//! pipeline             consumer → batcher → cancel → finish; retry; sweeper
//!    │
//! store, broker,       the SQL dialects; topology, cascade, headers, publisher;
//! inventory, message,  the gRPC client; the accepted message forms;
//! observe              metrics, /metrics /healthz /readyz, logs
//!    │
//! settings, shutdown,  configuration and credentials; the shutdown signal;
//! tls                  the crypto provider and the PEM file checks
//! ```
//!
//! Where to look:
//! - **the delay cascade**: [`broker::cascade`] (the arithmetic) and
//!   [`broker::topology`] (the queues and bindings it addresses);
//! - **the cancel transaction**: [`store::OrderStore::cancel_due`], its SQL
//!   in `store/postgres.rs`, and the steps around it in `pipeline/cancel.rs`
//!   and `pipeline/finish.rs` (outbox: release stock, publish, mark, ack);
//! - **the retry policy**: `pipeline/retry.rs`, applied by `Job::fail` in
//!   `pipeline/job.rs`; the sweeper (safety net) in `pipeline/sweeper.rs`;
//! - what happens to each message: `pipeline/consumer.rs`;
//! - [`message`]: the accepted message formats and the park reasons;
//! - [`broker::headers`]: every `x-*` header, defined once;
//! - [`observe`]: metrics, health endpoints, logs;
//! - [`ops`] and [`cli`]: `parked list|replay|purge`, `topology check`,
//!   `migrate`, `serve`, `schedule`;
//! - [`app`]: build/run, one broker session; [`shutdown`]: graceful
//!   shutdown as a small explicit type.
//!
//! The demo, the bench, the reference inventory server and shop schema live
//! in the `order-timeout-tools` crate (`tools/`), which depends on this one;
//! this crate never links it.

#![warn(missing_docs, unreachable_pub)]

pub mod app;
pub mod broker;
pub mod cli;
pub mod inventory;
pub mod message;
pub mod observe;
pub mod ops;
mod pipeline;
pub mod settings;
pub mod shutdown;
pub mod store;
pub mod tls;
