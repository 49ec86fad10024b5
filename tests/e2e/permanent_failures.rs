//! Failures that waiting cannot fix, and a broker that refuses work:
//! parked at once with the reason (and only the order they belong to),
//! publishes that back off instead of spinning, deliveries near the
//! queue's delivery limit, and header values at the edges. Against the
//! real RabbitMQ, PostgreSQL and MariaDB: the service-level tests run with
//! the shop's orders on either (`postgres::…`, `mariadb::…`).
//!
//! One concept a module: [`parked`] (one order's failure parks only it),
//! [`refused`] (publishes the broker refuses), [`poison`] (deliveries near
//! the delivery limit, headers at the edges) and [`errors`] (how database
//! errors are filed); this file holds what they share and the matrix.

use std::time::Duration;

use crate::common::{
    Dialect, RuleInventory, STOCK, TestEnv, on_both_dialects, on_rabbitmq4, ready,
};
use crate::store::mysql_base;
use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable};
use order_timeout::settings::SecretUrl;
use order_timeout::shutdown::Shutdown;
use order_timeout::testing::broker::{header_int, header_str};
use order_timeout::testing::metrics::Outcome;
use order_timeout::testing::store::StoreError;
use order_timeout::testing::topology::{
    BindingDestination, DELIVERY_LIMIT, cascade_route, shard_level_name,
};
use order_timeout_tools::scratch;
use tonic::Status;

mod errors;
mod parked;
mod poison;
mod refused;

/// Generous lateness bound for "on time" on a busy 2-core machine.
fn late_ok() -> chrono::Duration {
    chrono::Duration::seconds(3)
}

/// `(kind, error, attempts, body)` of every parked message, taken off the
/// parked queue.
async fn parked(env: &TestEnv) -> Vec<(String, String, i64, Vec<u8>)> {
    env.drain_parked()
        .await
        .into_iter()
        .map(|msg| {
            let headers = msg.properties.headers().clone().unwrap_or_default();
            let h = headers.inner();
            (
                header_str(h.get("x-error-kind")).unwrap_or_default(),
                header_str(h.get("x-error")).unwrap_or_default(),
                h.get("x-attempts").and_then(header_int).unwrap_or(0),
                msg.body.clone(),
            )
        })
        .collect()
}

/// Publishes `body` on the test's confirm channel to `exchange` with
/// `routing_key` and `headers`; panics unless the broker confirms it.
async fn publish_with(
    env: &TestEnv,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    headers: FieldTable,
) {
    let confirm = env
        .channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into())
                .with_headers(headers),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack(), "{exchange} {routing_key}");
}

on_both_dialects!(
    in parked {
        an_inventory_refusing_one_order_parks_it_after_one_attempt_and_releases_the_others,
        an_also_statement_failing_for_one_order_parks_only_that_order,
    },
    in refused {
        publishes_the_broker_refuses_back_off_instead_of_spinning,
        a_refused_re_schedule_takes_another_route_by_the_time_left,
        a_re_schedule_refused_until_the_hold_window_is_held,
    },
    in poison {
        a_delivery_near_the_delivery_limit_is_parked_before_the_broker_drops_it,
        header_values_at_the_edges_neither_panic_nor_reset_the_attempts,
        a_senders_failure_history_is_not_believed,
    },
);

// On RabbitMQ 4.x: the poison checks (a delivery near the delivery limit,
// an order the inventory refuses, header values at the edges) and
// publishes the broker refuses (`reject-publish`).
on_rabbitmq4!(
    in poison {
        a_delivery_near_the_delivery_limit_is_parked_before_the_broker_drops_it,
        header_values_at_the_edges_neither_panic_nor_reset_the_attempts,
        a_senders_failure_history_is_not_believed,
    },
    in parked {
        an_inventory_refusing_one_order_parks_it_after_one_attempt_and_releases_the_others,
    },
    in refused {
        publishes_the_broker_refuses_back_off_instead_of_spinning,
    },
);
