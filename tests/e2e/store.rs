//! The store suite: every state the cancel transaction can report, and the
//! outbox, sweeper and migration operations, written once against the
//! [`OrderStore`] interface and run for every SQL dialect (the test
//! matrix below: `store::postgres::…`, `store::mysql::…`), one concept a
//! module: the cancel's states ([`states`]), the operations around it
//! ([`upkeep`]), id columns, failures, abandoned rows, scans, bindings,
//! locks, effects and other timers.
//!
//! A [`Fixture`] ([`fixture`]) is a fresh database of its dialect with the
//! service's migrations and the reference shop schema, plus the few
//! statements the cases need to put an order row into a state (as the shop
//! would).

use std::time::Duration;

use chrono::{DateTime, Utc};
use order_timeout::message::OrderId;
use order_timeout::settings::{self, SecretUrl};
use order_timeout::testing::store::{
    Cancellation, Dialect, OrderState, OrderStore, ShopSchema, Store,
};
use order_timeout_tools::scratch;
use order_timeout_tools::shop::ShopDb;
use sqlx::MySqlPool;

use crate::common::{ShopTx, matrix, on_shop};

mod abandon;
mod bindings;
mod effects;
mod failures;
mod fixture;
mod id_columns;
mod locks;
mod scans;
mod states;
mod timers;
mod upkeep;

use fixture::Fixture;
pub(crate) use fixture::{mysql_base, mysql_pool};

const REASON: &str = "payment timeout";
const LEASE: Duration = Duration::from_secs(15);

fn id(s: &str) -> OrderId {
    OrderId::parse(s).unwrap()
}

fn secs(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

/// `cancel_due` for one order.
async fn state_of(store: &dyn OrderStore, order: &str, lease: Duration) -> OrderState {
    let states = store.cancel_due(&[id(order)], lease).await.unwrap();
    assert_eq!(states.len(), 1, "{states:?}");
    assert_eq!(states[0].0.as_str(), order);
    states[0].1.clone()
}

fn cancellation(state: OrderState) -> Cancellation {
    match state {
        OrderState::Cancelled(c) => c,
        other => panic!("expected Cancelled, got {other:?}"),
    }
}

// Every case, as a test against a fresh [`Fixture`] of each dialect.
matrix! {
    pass: fixture,
    cells: [postgres(Postgres, Rabbitmq3), mysql(MySql, Rabbitmq3)],
    cases: [
        in states with [tokio::test] {
            unknown_order_is_reported_unknown,
            paid_order_is_left_alone,
            order_not_yet_due_is_not_cancelled,
            overdue_order_is_cancelled_just_now_with_the_lease,
            a_live_lease_is_reported_as_leased_elsewhere,
            an_earlier_cancellation_with_work_pending_is_taken_over,
            finished_work_is_reported_done_and_marks_are_idempotent,
            an_order_cancelled_by_someone_else_is_not_ours,
            a_payment_committing_during_the_cancel_wins,
            the_cancellation_is_timed_after_the_row_lock,
            a_batch_reports_every_order_once,
            items_are_read_per_order,
            one_cancel_transaction_carries_the_most_ids_its_dialect_allows,
        },
        in upkeep with [tokio::test] {
            the_sweeper_finds_overdue_orders_oldest_first,
            the_sweeper_finds_stale_outbox_work_without_a_live_lease,
            the_stale_outbox_scan_reads_an_index_of_the_pending_rows,
            failing_outbox_rows_wait_their_backoff_and_given_up_ones_are_left,
            retention_deletes_only_finished_rows_past_it,
            prepare_says_to_run_migrate_without_the_services_tables,
            the_report_names_the_tables_nothing_vacuums,
            ping_answers,
            migrate_creates_only_the_services_tables_and_leaves_the_shops_alone,
        },
        in id_columns {
            ids_are_compared_exactly_in_every_id_column_type,
        },
        in failures {
            a_flip_failing_for_one_row_fails_only_that_order,
        },
        in abandon {
            a_missing_table_is_no_rows_fault,
            a_lone_order_failing_for_its_row_fails_alone,
            a_failure_meeting_every_order_is_no_rows_fault,
            deadlines_that_are_no_time_are_never_due_and_never_panic,
            rows_set_aside_are_tried_again_later_and_when_asked,
            integer_deadlines_are_refused_as_times_and_work_with_their_unit,
            a_widened_id_column_is_read_again_without_a_restart,
            an_unknown_time_zone_is_refused_naming_the_key,
            negative_and_zero_epochs_are_instants_due_long_ago,
        },
        in scans {
            scans_read_past_rows_that_are_no_orders,
            the_sweepers_scan_leaves_out_reopened_and_set_aside_rows,
            pruning_goes_through_the_marks_a_page_at_a_time,
            the_history_pages_a_range_of_its_index,
        },
        in bindings {
            parameters_bind_in_every_form_on_every_connection,
            a_misplaced_or_unbindable_parameter_is_refused_at_the_check,
            codes_one_in_the_status_columns_comparison_are_refused,
        },
        in locks {
            a_held_row_delays_only_its_own_order,
            a_held_row_that_the_holder_pays_is_never_cancelled,
            a_lock_the_cancel_cannot_skip_reports_the_order_held,
            a_held_row_an_also_statement_writes_delays_only_its_own_order,
            a_slow_guard_times_out_as_a_transient_error,
            a_cancel_committed_meanwhile_is_never_reported_left_alone,
            also_statements_writing_the_same_rows_take_them_in_one_order,
        },
        in effects {
            effects_follow_the_flip_while_another_session_flips_the_guard,
            effects_follow_the_flip_while_another_session_moves_the_deadline,
        },
        in timers::flips {
            a_timer_flips_only_due_rows_in_its_from_status,
            a_timers_batch_never_flips_a_row_it_was_not_asked_about,
            a_row_back_in_its_from_status_is_not_flipped_again,
        },
        in timers::held {
            a_held_row_delays_only_itself_for_a_timer,
            a_held_row_the_holder_moves_on_is_never_flipped_by_the_timer,
        },
        in timers::races {
            effects_follow_a_timers_flip_while_another_session_moves_rows_out_of_its_from_status,
            effects_follow_a_timers_flip_while_another_session_flips_the_guard_column,
        },
    ],
}
