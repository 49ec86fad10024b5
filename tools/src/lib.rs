//! order-timeout-tools: everything production never runs.
//!
//! - [`shop`]: the reference shop schema and the order service's part
//!   (create, stock, pay orders);
//! - [`inventory`]: the reference gRPC inventory server and the shop's
//!   client of it;
//! - [`demo`]: the product end to end on local servers;
//! - [`bench`](mod@bench): load generation and measurement (docs/BENCHMARKS.md);
//! - [`scratch`]: a fresh vhost and database per bench or test run, the
//!   vhosts made through [`broker_admin`];
//! - [`private_broker`]: private RabbitMQ nodes and clusters for the
//!   broker-fault tests;
//! - [`netns`]: network namespaces with links a test cuts (real silence),
//!   [`private_pg`] a PostgreSQL behind one, and [`partition`] the runs
//!   that cut the broker, the database or the inventory off and measure;
//! - [`measure`]: measurements against private or scratch servers that
//!   were ignored tests (a broker crash's levers, the sweeper's lateness
//!   behind rows it leaves alone);
//! - [`cli`]: the `order-timeout-tools` command line.
//!
//! Depends on the `order-timeout` crate; that crate never depends on this
//! one (its end-to-end tests use it as a dev-dependency to play the shop).

#![warn(missing_docs)]
// Long functions become named steps (threshold in tools/clippy.toml).
#![warn(clippy::too_many_lines)]

pub mod bench;
pub mod broker_admin;
pub mod cli;
pub mod demo;
pub mod inventory;
pub mod measure;
pub mod netns;
pub mod partition;
pub mod private_broker;
pub mod private_mariadb;
pub mod private_pg;
pub mod scratch;
pub mod shop;
