//! What the tools crate and the integration tests use beyond the public
//! API: six entry points, one per thing they do around a running
//! [`Service`](crate::Service).
//!
//! The tools crate (`order-timeout-tools`: the demo, the bench, the
//! partition and crash measurements, the reference inventory server and
//! shop schema) and the end-to-end tests (`tests/e2e`) play the shop and
//! the order service around the service, and look at what it declared,
//! published and wrote. For that they need a few pieces of the plumbing,
//! which is otherwise private. They reach them through:
//!
//! - [`init_process`]: start a tool's process as the service starts its
//!   own;
//! - [`broker`]: connect, declare the topology, publish timers, settle and
//!   peek at deliveries, read the service's headers;
//! - [`topology`]: the names and shapes of what the service declares on a
//!   vhost;
//! - [`store`]: a timer's store outside a service, its operations and the
//!   service's own tables;
//! - [`metrics`]: what a running service counted;
//! - [`InventoryClient`]: the inventory as the service calls it.
//!
//! Each item of these modules is `pub` in its private module and
//! re-exported here only; every other item there is `pub(crate)`, so
//! nothing else of the plumbing is reachable from outside the crate.
//!
//! **No stability promise**: this changes with the service, whenever the
//! tools or the tests need something else. A deployment or an embedding
//! program never needs it (the public API is the crate root's). It is
//! always compiled, like everything else (there is no feature): the
//! production build is the one linted, and `unreachable_pub` and
//! `dead_code` hold for it.

/// Starts a tool's process as the service's `main` starts its own: ring
/// as the process-wide rustls provider, then the log subscriber
/// (`default_log_filter` when `RUST_LOG` is unset).
pub fn init_process(default_log_filter: &str) {
    crate::tls::install_crypto_provider();
    crate::observe::telemetry::init(default_log_filter);
}

/// Talking to the broker as the service and the order service do:
/// connecting (the service's dialer, every node of the URL), declaring
/// the service's topology on a vhost, publishing timers confirmed to the
/// entry exchange, peeking at a queue, and reading the `x-*` headers the
/// service writes. `Acks` is the service's way of settling deliveries,
/// which the acknowledgement test measures on its own.
pub mod broker {
    pub use crate::broker::{
        acks::Acks,
        connect_amqp, declare_topology,
        headers::{header_int, header_str},
        peek_queue,
        publisher::{PublishError, Publisher, TimerEvent},
        topology::TopologyError,
    };
}

/// The names and shapes of what the service declares on a vhost (its
/// exchanges and queues, the delay cascade's levels and routes, the lanes):
/// the tests publish to, bind to, read and break these objects and check
/// what arrived where; the bench loads them.
pub mod topology {
    pub use crate::broker::{
        cascade::{cascade_route, level_name, shard_for, shard_level_name},
        lanes::lane_name,
        topology::{
            BindingDestination, CANCELLED_ROUTING_KEY, DELIVERY_LIMIT, DUE_QUEUE, ENTRY_EXCHANGE,
            EVENTS_EXCHANGE, Layout, PARKED_QUEUE, READY_EXCHANGE, SCHEDULE_ROUTING_KEY,
            binding_specs, exchange_specs, lane_entry_key, queue_specs,
        },
    };
}

/// The store of a timer connected outside a service, its operations and
/// what they return, and the service's own tables: the store tests call
/// the operations directly; the shop, the bench and the tests migrate and
/// connect with the service's own connect options (the TLS parameters of
/// `DATABASE_URL` included); the explain tests ask the database for the
/// plans of statements as the service runs them.
pub mod store {
    pub use crate::store::{
        Cancellation, Dialect, HistoryCursor, NextAttempt, OrderItem, OrderState, OrderStore,
        OutboxFailure, Page, PoolSettings, RowCursor, ShopSchema, Store, StoreError, connect_lazy,
        connect_timer, history_statement_for_explain, max_batch_ids, migrate, mysql_options,
        pg_options, stale_statement_for_explain,
    };
}

/// What a running service counted ([`RunningService::metrics`]), which
/// the tests wait on and assert against; read-only from outside.
///
/// [`RunningService::metrics`]: crate::RunningService::metrics
pub mod metrics {
    pub use crate::observe::metrics::{Metrics, Outcome, SweepResult};
}

/// The service's inventory client: the reference inventory server's
/// tests and the service tests call the inventory as the service does.
pub use crate::inventory::InventoryClient;
