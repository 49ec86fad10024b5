//! The end-to-end tests, one binary (one link instead of one per file):
//! every test gets its own RabbitMQ vhost and its own databases (the
//! shop's orders on PostgreSQL or MariaDB: [`common::TestEnv`]) and talks
//! to the real servers.

mod abandon;
mod acks;
mod adopt;
mod alerts;
mod bounds;
mod broker_faults;
mod broker_versions;
mod browser;
mod common;
mod console;
mod failures;
mod guarantees;
mod history;
mod http_limits;
mod kubernetes;
mod lanes;
mod layout_changes;
mod operations;
mod outbox;
mod partitions;
mod permanent_failures;
mod privileges;
mod process;
mod publishers;
mod safety_net;
mod secrets;
mod service;
mod store;
mod templates;
mod timers;
mod tls;
mod upgrade;
mod worked_configs;
mod zones;
