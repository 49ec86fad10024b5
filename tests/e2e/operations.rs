//! The operator commands, run as the real binary against a real broker and
//! database: `parked list|replay|purge` and `topology check`. Every test
//! runs with the shop's orders on PostgreSQL and on MariaDB
//! (`postgres::…`, `mariadb::…`).
//!
//! One command a module: [`parked`] (`parked list|replay|purge`),
//! [`topology_check`] (`topology check`), [`pending`] and [`orders`]
//! (`schedule`, `explain`); this file holds what they share and the
//! matrix.

use std::time::Duration;

use crate::common::{Dialect, TestEnv, declare_durable_queue, on_both_dialects, on_rabbitmq4};
use chrono::Utc;
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};
use order_timeout::RunningService;
use order_timeout::message::format_instant;
use order_timeout::ops::parked::ParkedJson;
use order_timeout::testing::metrics::Outcome;
use order_timeout::testing::topology::level_name;

mod orders;
mod parked;
mod pending;
mod topology_check;

const WAIT: Duration = Duration::from_secs(15);

/// Publishes a timeout for an order that has no row yet, due now.
async fn publish_for_unknown(env: &TestEnv, id: &str) {
    env.publish_raw(
        format!(
            r#"{{"order_id":"{id}","cancel_at":"{}"}}"#,
            format_instant(Utc::now())
        )
        .as_bytes(),
    )
    .await;
}

async fn wait_parked(env: &TestEnv, service: &RunningService, n: u64) {
    env.eventually(WAIT, &format!("{n} messages parked"), || async {
        // In the parked store, where the console and the commands read.
        service.metrics.count(Outcome::Parked) >= n && env.parked_kept().await == n
    })
    .await;
}

/// The messages of a successful `parked list --json`.
fn json_lines(out: &crate::common::CliOutput) -> Vec<ParkedJson> {
    assert_success(out);
    out.stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

fn assert_success(out: &crate::common::CliOutput) {
    assert_eq!(
        out.code,
        Some(0),
        "stdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
}

async fn delete_queue(channel: &Channel, name: &str) {
    channel
        .queue_delete(name.into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}

on_both_dialects!(
    in orders {
        explain_says_what_happened_and_what_comes_next,
        schedule_far_in_the_future_is_an_error_and_publishes_nothing,
    },
    in parked {
        list_shows_reasons_and_leaves_the_queue_as_it_was,
        replay_by_order_id_succeeds_once_the_cause_is_fixed,
        replay_all_republishes_everything_parked,
        purge_deletes_what_was_asked_and_nothing_else,
    },
    in topology_check {
        topology_check_reports_ok_and_then_every_difference,
        topology_check_warns_when_the_brokers_file_limit_is_too_low,
        a_parked_queue_from_before_the_delivery_limit_is_used_and_the_check_names_the_fix,
    },
    in pending {
        pending_shows_what_waits_by_due_window,
    },
);

// On RabbitMQ 4.x: parked messages listed hundreds of times (the store
// delivers none of them), `topology check`, and a parked queue declared
// without the delivery limit (4.x would give it its default of 20).
on_rabbitmq4!(
    in parked {
        list_shows_reasons_and_leaves_the_queue_as_it_was,
    },
    in topology_check {
        topology_check_reports_ok_and_then_every_difference,
        a_parked_queue_from_before_the_delivery_limit_is_used_and_the_check_names_the_fix,
    },
);
