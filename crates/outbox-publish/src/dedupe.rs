//! [`Dedupe`]: how long an event's dispatch key keeps out a second event
//! with the same key.

use std::time::Duration;

use diesel::pg::data_types::PgInterval;

/// The longest [`Dedupe::For`] window: 100 years (of 365 days). Longer
/// windows are refused with
/// [`PublishError::DedupeWindowOutOfRange`](crate::PublishError::DedupeWindowOutOfRange);
/// use [`Dedupe::UntilDeleted`] for a key that never frees by time.
pub const MAX_DEDUPE_WINDOW: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// How long an event's dispatch key deduplicates: while it holds the key,
/// a second event with the same key is not written
/// ([`PublishOutcome::Duplicate`](crate::PublishOutcome::Duplicate)); once
/// the window has passed, the next event with the key is written
/// ([`PublishOutcome::Published`](crate::PublishOutcome::Published)) and
/// takes the key over. The old row stays, with the key moved to its
/// `released_dispatch_key` column.
///
/// The window is checked when the next event with the key is inserted, by
/// the table's trigger, so plain-SQL producers get it too (they set the
/// columns `dedupe_for` and `dedupe_while_pending` themselves). Whatever
/// the window, retention's deletion of a DONE row frees its key.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use outbox_publish::{Dedupe, NewOutboxEvent};
///
/// // At most one reminder an hour per cart.
/// let reminder = NewOutboxEvent::new("t1", "mail.cart.reminder", serde_json::json!({"cart": 7}))
///     .dispatch_key("cart-7-reminder")
///     .dedupe(Dedupe::For(Duration::from_secs(3600)));
/// assert!(reminder.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Dedupe {
    /// The key is held while the row exists: until retention deletes the
    /// DONE row (FAILED and CANCELLED rows are kept, and keep their key).
    /// The default, and the behaviour of events published without a
    /// window.
    #[default]
    UntilDeleted,
    /// The key is held while the event is PENDING or PROCESSING: once it
    /// has been handed off (DONE), dead-lettered (FAILED) or cancelled, the
    /// next event with the key is written.
    WhilePending,
    /// The key is held for this long from the event's `created_at` (its
    /// transaction's start), or until the row is deleted, whichever comes
    /// first. More than zero, at most [`MAX_DEDUPE_WINDOW`].
    For(Duration),
}

impl Dedupe {
    /// The row's `dedupe_for` and `dedupe_while_pending` columns; `None`
    /// when the window is out of range.
    pub(crate) fn columns(self) -> Option<(Option<PgInterval>, bool)> {
        match self {
            Self::UntilDeleted => Some((None, false)),
            Self::WhilePending => Some((None, true)),
            Self::For(window) if window.is_zero() || window > MAX_DEDUPE_WINDOW => None,
            Self::For(window) => {
                let micros = i64::try_from(window.as_micros()).ok()?;
                // Below one microsecond rounds up: the window is never empty.
                Some((Some(PgInterval::from_microseconds(micros.max(1))), false))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_window_sets_its_columns_and_out_of_range_windows_set_none() {
        let cases = [
            (Dedupe::UntilDeleted, Some((None, false))),
            (Dedupe::WhilePending, Some((None, true))),
            (
                Dedupe::For(Duration::from_secs(90)),
                Some((Some(PgInterval::from_microseconds(90_000_000)), false)),
            ),
            (
                Dedupe::For(Duration::from_nanos(1)),
                Some((Some(PgInterval::from_microseconds(1)), false)),
            ),
            (Dedupe::For(Duration::ZERO), None),
            (
                Dedupe::For(MAX_DEDUPE_WINDOW + Duration::from_secs(1)),
                None,
            ),
        ];
        for (window, columns) in cases {
            assert_eq!(window.columns(), columns, "{window:?}");
        }
        assert!(Dedupe::For(MAX_DEDUPE_WINDOW).columns().is_some());
    }

    #[test]
    fn the_longest_window_is_one_hundred_years_of_365_days() {
        assert_eq!(MAX_DEDUPE_WINDOW.as_secs(), 3_153_600_000);
        let century = Duration::from_secs(36_500 * 86_400);
        assert!(Dedupe::For(century).columns().is_some());
        assert_eq!(
            Dedupe::For(century + Duration::from_secs(1)).columns(),
            None
        );
    }
}
