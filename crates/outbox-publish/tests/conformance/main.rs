//! One conformance suite, run against both publishers: the diesel one
//! (`OutboxTx`) and the sqlx one (`outbox_publish::sqlx`, feature `sqlx`).
//! Each case is written once against [`driver::Driver`] and runs as
//! `with_diesel::<case>` and `with_sqlx::<case>`, on a database of its own:
//! the same rows, outcomes and refusals from either driver.

#![cfg(feature = "sqlx")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly by design

mod cases;
mod driver;
mod refusals;

/// Each case, once per driver.
macro_rules! conformance {
    ($($case:ident),+ $(,)?) => {
        mod with_diesel {
            $(
                #[tokio::test]
                async fn $case() {
                    crate::cases::$case::<crate::driver::Diesel>().await;
                }
            )+
        }
        mod with_sqlx {
            $(
                #[tokio::test]
                async fn $case() {
                    crate::cases::$case::<crate::driver::Sqlx>().await;
                }
            )+
        }
    };
}

conformance!(
    published_rows_hold_every_column_given,
    a_repeated_dispatch_key_is_a_duplicate_and_writes_one_row,
    every_refusal_is_typed_and_writes_nothing_alone_or_in_a_batch,
    a_rolled_back_transaction_leaves_neither_business_row_nor_event,
    a_batch_writes_in_order_and_reports_duplicates,
    a_typed_event_is_written_with_its_declared_type_and_refused_by_name,
    a_routed_publish_refuses_an_unrouted_type_before_any_sql,
    ordered_events_are_numbered_within_their_key_in_written_order,
);
