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
//! pipeline             consumer → batcher → cancel → finish; schedule, retry,
//!                      park; sweeper, watch
//!    │
//! store, broker,       the SQL dialects; topology, cascade, lanes, headers, publisher;
//! inventory, message,  the gRPC client; the accepted message forms;
//! observe              metrics, /metrics /healthz /readyz, logs
//!    │
//! settings, shutdown,  configuration and credentials; the shutdown signal;
//! tls                  the crypto provider and the PEM file checks
//! ```
//!
//! Where to look:
//! - **the entry point**: `src/main.rs` calls [`cli::main`]; `serve` builds
//!   a [`Service`] (`app/mod.rs`: build/run and the reconnect loop;
//!   `app/session.rs`: one broker session);
//! - **the delay cascade**: `broker/cascade.rs` (the arithmetic) and
//!   `broker/topology.rs` (the queues and bindings it addresses); **lanes**
//!   (one fixed-TTL hop for a shared payment window) and the choice between
//!   a lane and the cascade: `broker/lanes.rs`;
//! - **timers**: `settings/timers.rs` turns `[orders]` (the default timer,
//!   `cancel_unpaid`) and each `[[timers]]` into one list of `Timer`s; the
//!   store is built once per timer (`store::Stores`), and every step below
//!   works on one timer's rows; `pipeline/watch.rs` schedules the rows of a
//!   timer nobody publishes for;
//! - **the cancel transaction**, written once for both dialects:
//!   `store/cancel.rs` (`SELECT … FOR UPDATE SKIP LOCKED`, conditional
//!   `UPDATE`, the rows it flipped read back, their effects), behind `store/mod.rs`'s `OrderStore`; what a row means in either:
//!   `store/state.rs`; the steps around it: `pipeline/cancel.rs` and
//!   `pipeline/finish.rs` (outbox: release stock, publish, mark, ack);
//! - **the SQL of the outbox** (and of the watch marks), written once for
//!   both dialects over their vocabulary: `store/outbox.rs`;
//! - **the retry policy**: `pipeline/retry.rs` (pure, at the bottom of the
//!   pipeline), applied by `fail` (`pipeline/ending.rs`, one delivery
//!   per order: the ending `Ending::Fail`); what a failure is and whether
//!   waiting can fix it: `pipeline/failure.rs`; the sweeper (safety net):
//!   `pipeline/sweeper.rs`;
//! - **the parked format** (headers written, read back, replayed):
//!   `broker/parked.rs`; every `x-*` header: `broker/headers.rs`;
//! - what happens to each message: `pipeline/consumer.rs`; what an order's
//!   state means, one pure function: `pipeline/verdict.rs`; the ways a job
//!   ends, carried out in one place, top to bottom: `pipeline/ending.rs`
//!   (`Worker::end`: ack, requeue, hold, back through the delay store,
//!   retried, parked, and the patient publish they share); why a message
//!   is parked and its record: `pipeline/park.rs`; what the steps share:
//!   `pipeline/context.rs`;
//! - **silent peers** (`[liveness]`, `settings/liveness.rs`): the broker
//!   node to try and the heartbeat asked for, `broker/nodes.rs`; a publish
//!   confirm bounded, `broker/publisher.rs`; every store operation bounded
//!   and its connection closed when it ran out, `store/bounded.rs`; the
//!   inventory's HTTP/2 keep-alive, `inventory.rs`;
//! - [`message`]: the accepted message formats and the park reasons;
//! - `observe/`: metrics (and the pending gauges), `/metrics` `/healthz`
//!   `/readyz`, logs;
//! - [`ops`]: `parked list|replay|purge`, `pending`, `topology check` as a
//!   library, and the web console (`ops/console/`); [`cli`]: one file per
//!   command;
//! - **upgrades**: `store/releases.rs` (what a migration keeps for the
//!   previous release until `migrate --contract`), `broker/layouts.rs` (the
//!   layouts declared on a vhost, for `ops/leftovers.rs`);
//! - [`shutdown`]: graceful shutdown as a small explicit type.
//!
//! # Public API
//!
//! What a deployment or an embedding program uses: [`settings`] (and
//! [`Settings`]), [`message`] (the contract), [`cli`], [`ops`],
//! [`shutdown`], and [`Service`] / [`RunningService`] / [`run`]. The
//! plumbing (`app`, `broker`, `store`, `observe`, `inventory`, `tls`) and
//! the pipeline are private modules. Beyond the public API, `testing`
//! (`src/testing.rs`) is the one list of what the tools crate and the
//! integration tests reach (grouped re-exports, each group saying why),
//! with no promise of stability: an item it re-exports is `pub` in its
//! private module, and the plumbing's other items are `pub(crate)` (but
//! for the types those items' signatures name), which `unreachable_pub`
//! checks. No feature changes what is compiled: the production build is
//! the only build, and `unreachable_pub` and `dead_code` guard it
//! (`scripts/test.sh` also lints it on its own, `-p order-timeout --bins
//! --lib`).
//!
//! The demo, the bench, the reference inventory server and shop schema live
//! in the `order-timeout-tools` crate (`tools/`), which depends on this one;
//! this crate never links it.

#![warn(missing_docs, unreachable_pub)]
// Long functions become named steps (threshold in clippy.toml).
#![warn(clippy::too_many_lines)]

// The public API: what a deployment configures, the message contract, the
// command line, the operator tooling, and the service itself.
pub mod cli;
pub mod message;
pub mod ops;
pub mod settings;
pub mod shutdown;

pub use app::{RunningService, Service, run};
pub use settings::Settings;

// What the tools crate and the integration tests use beyond that: not a
// stable API (see the module).
#[doc(hidden)]
pub mod testing;

// The plumbing: private to the crate. What the tools crate and the
// integration tests use of it is re-exported by `testing`, and only that.
mod app;
mod broker;
mod inventory;
mod observe;
mod store;
mod tls;

mod pipeline;
