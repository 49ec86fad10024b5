//! The end-to-end tests, one binary (one link instead of one per file):
//! every test gets its own RabbitMQ vhost and PostgreSQL database
//! ([`common::TestEnv`]) and talks to the real servers.

mod adopt;
mod broker_faults;
mod common;
mod failures;
mod operations;
mod process;
mod service;
mod store;
mod tls;
