//! What the tools crate and the integration tests use beyond the public
//! API: the one place that lists it.
//!
//! The tools crate (`order-timeout-tools`: the demo, the bench, the
//! partition and crash measurements, the reference inventory server and
//! shop schema) and the end-to-end tests (`tests/e2e`) play the shop and
//! the order service around a running [`Service`](crate::Service), and
//! look at what it declared, published and wrote. For that they need a few
//! pieces of the plumbing, which is otherwise private: they are
//! re-exported here, in groups, each saying why callers need it, and
//! nothing else of the plumbing is reachable from outside the crate. An
//! item re-exported here is `pub` in its private module; every other item
//! there is `pub(crate)`.
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

/// What a running service counted ([`RunningService::metrics`]), which
/// the tests wait on and assert against.
///
/// [`RunningService::metrics`]: crate::RunningService::metrics
pub use crate::observe::metrics::{Metrics, Outcome, SweepResult};

/// Connecting to the broker, declaring the service's topology, and
/// publishing timers the way an order service does (confirmed, to the
/// entry exchange): the tools and the tests prepare a vhost, load it and
/// count its queues around a running service. `Acks` is the service's
/// way of settling deliveries, which the acknowledgement test measures on
/// its own.
pub use crate::broker::{
    acks::Acks,
    connect_amqp, declare_topology, peek_queue,
    publisher::{PublishError, Publisher, TimerEvent},
};

/// The names and shapes of what the service declares on a vhost (the
/// topology, the delay cascade's levels and routes, the lanes) and the
/// `x-*` headers it writes: the tests publish to, bind to, read and break
/// these objects and check what arrived where; the bench loads them.
pub use crate::broker::{
    cascade::{cascade_route, level_name, shard_for, shard_level_name},
    headers::{header_int, header_str},
    lanes::lane_name,
    topology::{
        BindingDestination, CANCELLED_ROUTING_KEY, DELIVERY_LIMIT, DUE_QUEUE, ENTRY_EXCHANGE,
        EVENTS_EXCHANGE, Layout, PARKED_QUEUE, READY_EXCHANGE, SCHEDULE_ROUTING_KEY, TopologyError,
        binding_specs, exchange_specs, lane_entry_key, queue_specs,
    },
};

/// The store of a timer connected outside a service, its operations and
/// what they return, and the service's own tables: the store tests call
/// the operations directly; the shop, the bench and the tests migrate and
/// connect with the service's own connect options (the TLS parameters of
/// `DATABASE_URL` included); the explain tests ask the database for the
/// plans of statements as the service runs them.
pub use crate::store::{
    Cancellation, Dialect, HistoryCursor, NextAttempt, OrderItem, OrderState, OrderStore,
    OutboxFailure, Page, PoolSettings, RowCursor, ShopSchema, Store, StoreError, connect_lazy,
    connect_timer, history_statement_for_explain, max_batch_ids, migrate, mysql_options,
    pg_options, stale_statement_for_explain,
};

/// The service's inventory client: the reference inventory server's
/// tests and the service tests call the inventory as the service does.
pub use crate::inventory::InventoryClient;
