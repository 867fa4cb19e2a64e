//! [`Priority`]: which due events are claimed and fetched first.

use std::fmt;

use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types::SmallInt;
use serde::{Deserialize, Serialize};

/// The priority of an event: among due events a higher one is claimed
/// first by the dispatcher, and its job is fetched first by the workers of
/// its queue. Five levels, from [`Priority::LOWEST`] (-2, bulk) through
/// [`Priority::NORMAL`] (0, the default) to [`Priority::HIGHEST`] (2).
/// Stored in `outbox_event.priority` (`smallint`, with a CHECK of the same
/// range, so a plain-SQL producer cannot store another value either).
///
/// Priority orders due events only: an event scheduled for later waits for
/// its time whatever its priority, and events of one level keep their due
/// order.
///
/// # Example
///
/// ```
/// use outbox_model::{Priority, PriorityOutOfRange};
///
/// assert_eq!(Priority::try_from(2), Ok(Priority::HIGHEST));
/// assert_eq!(Priority::default(), Priority::NORMAL);
/// assert!(Priority::HIGH > Priority::NORMAL);
/// assert_eq!(Priority::try_from(3), Err(PriorityOutOfRange { value: 3 }));
/// assert_eq!(
///     Priority::try_from(-3).unwrap_err().to_string(),
///     "priority -3 is out of range: a priority is from -2 (lowest) to 2 (highest)"
/// );
/// ```
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    AsExpression,
    FromSqlRow,
    Serialize,
    Deserialize,
)]
#[diesel(sql_type = SmallInt)]
#[serde(try_from = "i16", into = "i16")]
pub struct Priority(i16);

impl Priority {
    /// -2: bulk work that may wait behind everything else (newsletters).
    pub const LOWEST: Self = Self(-2);
    /// -1: below normal.
    pub const LOW: Self = Self(-1);
    /// 0: the default.
    pub const NORMAL: Self = Self(0);
    /// 1: ahead of normal.
    pub const HIGH: Self = Self(1);
    /// 2: ahead of everything (a password-reset mail).
    pub const HIGHEST: Self = Self(2);

    /// Every level, highest first: the order the claim and the workers'
    /// fetch take them in.
    pub const ALL: [Self; 5] = [
        Self::HIGHEST,
        Self::HIGH,
        Self::NORMAL,
        Self::LOW,
        Self::LOWEST,
    ];

    /// The stored value, -2 to 2.
    #[must_use]
    pub const fn get(self) -> i16 {
        self.0
    }

    /// True for [`Priority::NORMAL`], the level every event has unless its
    /// producer sets another.
    #[must_use]
    pub const fn is_normal(self) -> bool {
        self.0 == 0
    }
}

/// A priority outside the five levels: the value given, refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "priority {value} is out of range: a priority is from {} (lowest) to {} (highest)",
    Priority::LOWEST.0,
    Priority::HIGHEST.0
)]
pub struct PriorityOutOfRange {
    /// The value refused.
    pub value: i16,
}

impl TryFrom<i16> for Priority {
    type Error = PriorityOutOfRange;

    fn try_from(value: i16) -> Result<Self, Self::Error> {
        if (Self::LOWEST.0..=Self::HIGHEST.0).contains(&value) {
            Ok(Self(value))
        } else {
            Err(PriorityOutOfRange { value })
        }
    }
}

impl From<Priority> for i16 {
    fn from(priority: Priority) -> Self {
        priority.0
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl ToSql<SmallInt, Pg> for Priority {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        <i16 as ToSql<SmallInt, Pg>>::to_sql(&self.0, out)
    }
}

impl FromSql<SmallInt, Pg> for Priority {
    fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<Self> {
        let value = <i16 as FromSql<SmallInt, Pg>>::from_sql(bytes)?;
        Ok(Self::try_from(value)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_the_five_levels_are_accepted() {
        let accepted: Vec<i16> = (i16::MIN..=i16::MAX)
            .filter(|v| Priority::try_from(*v).is_ok())
            .collect();
        assert_eq!(accepted, vec![-2, -1, 0, 1, 2]);
        let mut all = Priority::ALL.map(Priority::get).to_vec();
        all.reverse();
        assert_eq!(all, accepted);
    }

    #[test]
    fn the_envelope_form_is_the_number_and_refuses_other_numbers() {
        assert_eq!(serde_json::to_string(&Priority::HIGH).unwrap(), "1");
        assert_eq!(
            serde_json::from_str::<Priority>("-2").unwrap(),
            Priority::LOWEST
        );
        let refused = serde_json::from_str::<Priority>("7").unwrap_err();
        assert!(refused.to_string().contains("priority 7 is out of range"));
    }
}
