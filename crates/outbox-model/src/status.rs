//! [`OutboxStatus`]: the life cycle of an outbox row.

use std::fmt;
use std::io::Write;
use std::str::FromStr;

use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, IsNull, Output, ToSql};
use diesel::sql_types::Text;
use serde::{Deserialize, Serialize};

/// Where an outbox row stands. Stored as upper-case text with a CHECK
/// constraint (see the migrations), mapped to this enum by diesel.
///
/// ```text
/// PENDING ──claim──▶ PROCESSING ──hand-off──▶ DONE
///    ▲                   │ │
///    └──retry (backoff)──┘ └──no route / retries exhausted──▶ FAILED
/// CANCELLED: set by an operator or producer; never claimed.
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, AsExpression, FromSqlRow, Serialize, Deserialize,
)]
#[diesel(sql_type = Text)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OutboxStatus {
    /// Waiting to be claimed once `scheduled_at` has passed.
    Pending,
    /// Claimed by a dispatcher whose lease runs to `locked_until`.
    Processing,
    /// Handed off to its queue (not: processed by the subscriber).
    Done,
    /// Dead-lettered: unroutable, or out of retries. Kept for operators.
    Failed,
    /// Withdrawn; never dispatched. Kept for audit.
    Cancelled,
}

impl OutboxStatus {
    /// Every status, in life-cycle order.
    pub const ALL: [OutboxStatus; 5] = [
        Self::Pending,
        Self::Processing,
        Self::Done,
        Self::Failed,
        Self::Cancelled,
    ];

    /// The statuses a cancel changes, by an operator (`outbox cancel`) or
    /// by code (`outbox_publish::cancel`): a PENDING row (not yet claimed)
    /// and a FAILED one (dead-lettered). A PROCESSING row is held by a
    /// dispatcher handing it off right now, a DONE row was handed off
    /// already, a CANCELLED row already is.
    ///
    /// ```
    /// use outbox_model::OutboxStatus;
    /// assert!(OutboxStatus::CANCELLABLE.contains(&OutboxStatus::Failed));
    /// assert!(!OutboxStatus::CANCELLABLE.contains(&OutboxStatus::Processing));
    /// ```
    pub const CANCELLABLE: [OutboxStatus; 2] = [Self::Pending, Self::Failed];

    /// The text stored in the `status` column.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Processing => "PROCESSING",
            Self::Done => "DONE",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
        }
    }
}

/// A status text that is none of the five statuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown outbox status {0:?}; expected one of PENDING, PROCESSING, DONE, FAILED, CANCELLED"
)]
pub struct UnknownStatus(pub String);

impl FromStr for OutboxStatus {
    type Err = UnknownStatus;

    /// Parses the stored text; case-insensitive for operator convenience.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

impl fmt::Display for OutboxStatus {
    /// The stored text; honours width and alignment (`{:<10}`), so tables
    /// of rows line up.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl ToSql<Text, Pg> for OutboxStatus {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        out.write_all(self.as_str().as_bytes())?;
        Ok(IsNull::No)
    }
}

impl FromSql<Text, Pg> for OutboxStatus {
    fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<Self> {
        let text = std::str::from_utf8(bytes.as_bytes())?;
        Ok(text.parse()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_in_a_table_column_is_padded_to_its_width() {
        assert_eq!(format!("{:<10}|", OutboxStatus::Pending), "PENDING   |");
        assert_eq!(format!("{:>6}|", OutboxStatus::Done), "  DONE|");
        assert_eq!(OutboxStatus::Failed.to_string(), "FAILED");
    }

    #[test]
    fn round_trips_text() {
        for status in OutboxStatus::ALL {
            assert_eq!(status.as_str().parse::<OutboxStatus>(), Ok(status));
            assert_eq!(status.to_string(), status.as_str());
        }
        assert_eq!("failed".parse::<OutboxStatus>(), Ok(OutboxStatus::Failed));
        assert_eq!(
            "LOST".parse::<OutboxStatus>(),
            Err(UnknownStatus("LOST".into()))
        );
    }
}
