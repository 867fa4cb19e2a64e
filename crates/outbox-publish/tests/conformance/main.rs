//! One conformance suite, run against both publishers: the diesel one
//! (`OutboxTx`) and the sqlx one (`outbox_publish::sqlx`, feature `sqlx`).
//! Each case is written once against [`driver::Driver`] and runs as
//! `with_diesel::<case>` and `with_sqlx::<case>`, on a database of its own:
//! the same rows, outcomes and refusals from either driver.

#![cfg(feature = "sqlx")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly by design

mod cases;
mod changes;
mod driver;
mod refusals;
mod windows;

/// Each case, once per driver.
macro_rules! conformance {
    ($($case:ident),+ $(,)?) => {
        mod with_diesel {
            $(
                #[tokio::test]
                async fn $case() {
                    crate::$case::<crate::driver::Diesel>().await;
                }
            )+
        }
        mod with_sqlx {
            $(
                #[tokio::test]
                async fn $case() {
                    crate::$case::<crate::driver::Sqlx>().await;
                }
            )+
        }
    };
}

use cases::*;
use changes::*;
use windows::*;

conformance!(
    published_rows_hold_every_column_given,
    a_repeated_dispatch_key_is_a_duplicate_and_writes_one_row,
    every_refusal_is_typed_and_writes_nothing_alone_or_in_a_batch,
    a_rolled_back_transaction_leaves_neither_business_row_nor_event,
    a_batch_writes_in_order_and_reports_duplicates,
    a_typed_event_is_written_with_its_declared_type_and_refused_by_name,
    a_routed_publish_refuses_an_unrouted_type_before_any_sql,
    cancel_by_id_or_key_cancels_and_records_history,
    a_rolled_back_cancel_or_reschedule_leaves_the_row_untouched,
    cancel_refusals_are_typed_and_leave_the_transaction_usable,
    reschedule_moves_a_pending_event_and_refuses_a_processing_one,
    reschedule_writes_a_history_entry_with_the_reason_and_the_previous_due_time,
    a_rolled_back_reschedule_leaves_neither_the_new_time_nor_a_history_entry,
    while_pending_frees_the_key_once_the_holder_leaves_pending,
    a_timed_window_frees_the_key_once_it_has_passed,
    without_a_window_the_key_is_held_until_the_row_is_deleted,
    replace_updates_a_pending_holder_and_not_a_done_one,
    replace_with_while_pending_writes_a_new_event_after_hand_off,
    a_batch_with_replace_events_replaces_in_order,
    a_priority_is_stored_as_given_and_an_out_of_range_one_is_refused_by_type,
    ordered_events_are_numbered_within_their_key_in_written_order,
);
