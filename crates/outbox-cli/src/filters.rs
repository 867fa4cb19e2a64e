//! Row selection shared by `list` and `requeue`: the filter flags, their
//! parsers, and the store filter they stand for; and the parser of lengths of time
//! (`15m`) that ages and `health --stuck-after` share.
//!
//! Every parser returns a [`FilterValueError`]; clap reports it with the
//! flag's name and exits with code 2. No value, however long or strange,
//! makes a parser panic (see the property tests below).

use chrono::{DateTime, TimeDelta, Utc};
use clap::Args;
use diesel_async::AsyncPgConnection;
use outbox_model::{OutboxEvent, OutboxStatus, UnknownStatus};
use outbox_store::{EventFilter, StoreError};

/// Which rows a command works on.
#[derive(Debug, Clone, Args, Default)]
pub struct Filters {
    /// Only rows with this status (repeatable): pending, processing, done, failed, cancelled.
    #[arg(long = "status", value_parser = parse_status)]
    pub statuses: Vec<OutboxStatus>,
    /// Only event types starting with this text (e.g. `webhook.order.`).
    #[arg(long)]
    pub type_prefix: Option<String>,
    /// Only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Created at or after: RFC 3339 (`2026-11-29T10:00:00Z`) or an age (`90m`, `6h`, `7d`).
    #[arg(long, value_parser = parse_time)]
    pub created_after: Option<DateTime<Utc>>,
    /// Created before: RFC 3339 or an age.
    #[arg(long, value_parser = parse_time)]
    pub created_before: Option<DateTime<Utc>>,
    /// FAILED rows that went FAILED (failed_at) at or after this time: RFC 3339 or an age.
    #[arg(long, value_parser = parse_time)]
    pub failed_after: Option<DateTime<Utc>>,
    /// FAILED rows that went FAILED (failed_at) before this time: RFC 3339 or an age.
    #[arg(long, value_parser = parse_time)]
    pub failed_before: Option<DateTime<Utc>>,
}

/// Why a filter value was refused. clap prints it after the flag's name
/// (`invalid value '5é' for '--created-after <CREATED_AFTER>': …`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FilterValueError {
    /// Not one of the five statuses.
    #[error(transparent)]
    Status(#[from] UnknownStatus),
    /// Neither RFC 3339 nor `<whole number><unit>`.
    #[error("{0:?} is neither RFC 3339 (2026-11-29T10:00:00Z) nor an age (30s, 90m, 6h, 7d)")]
    NotATime(String),
    /// Not `<whole number><unit>` where only a length of time is accepted.
    #[error("{0:?} is not a length of time (30s, 90m, 6h, 7d)")]
    NotAnAge(String),
    /// An age whose unit is not s, m, h or d.
    #[error("{0:?}: the unit of an age must be s, m, h or d")]
    UnknownUnit(String),
    /// An age so large that the time it names, or the span itself, cannot
    /// be represented.
    #[error("{0:?} is longer than a date or a time span can go")]
    AgeOutOfRange(String),
}

/// Parses a status, case-insensitively.
///
/// # Errors
///
/// [`FilterValueError::Status`], listing the valid statuses.
pub fn parse_status(raw: &str) -> Result<OutboxStatus, FilterValueError> {
    Ok(raw.parse::<OutboxStatus>()?)
}

/// Parses RFC 3339, or an age like `30s`, `90m`, `6h`, `7d` (that long ago).
///
/// # Errors
///
/// What was expected, or that the age is out of range.
pub fn parse_time(raw: &str) -> Result<DateTime<Utc>, FilterValueError> {
    parse_time_at(raw, Utc::now())
}

/// [`parse_time`] with ages counted back from `now`.
///
/// # Errors
///
/// As [`parse_time`].
pub fn parse_time_at(raw: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, FilterValueError> {
    if let Ok(at) = DateTime::parse_from_rfc3339(raw) {
        return Ok(at.with_timezone(&Utc));
    }
    let age = parse_age(raw).map_err(|e| match e {
        FilterValueError::NotAnAge(_) => FilterValueError::NotATime(raw.to_owned()),
        other => other,
    })?;
    now.checked_sub_signed(age)
        .ok_or_else(|| FilterValueError::AgeOutOfRange(raw.to_owned()))
}

/// Parses a length of time: `<whole number><unit>`, the unit `s`, `m`, `h`
/// or `d` (`30s`, `90m`, `6h`, `7d`); surrounding spaces are ignored. The
/// ages of [`parse_time`] and the thresholds of `health` are written so.
///
/// # Errors
///
/// [`FilterValueError::NotAnAge`], [`FilterValueError::UnknownUnit`], or
/// [`FilterValueError::AgeOutOfRange`] for a number no time span holds.
pub fn parse_age(raw: &str) -> Result<TimeDelta, FilterValueError> {
    let trimmed = raw.trim();
    // The unit is the last character, which need not be one byte long.
    let Some((split, unit)) = trimmed.char_indices().next_back() else {
        return Err(FilterValueError::NotAnAge(raw.to_owned()));
    };
    let number = &trimmed[..split];
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(FilterValueError::NotAnAge(raw.to_owned()));
    }
    let span = |of: fn(i64) -> Option<TimeDelta>| {
        number
            .parse::<i64>()
            .ok()
            .and_then(of)
            .ok_or_else(|| FilterValueError::AgeOutOfRange(raw.to_owned()))
    };
    match unit {
        's' => span(TimeDelta::try_seconds),
        'm' => span(TimeDelta::try_minutes),
        'h' => span(TimeDelta::try_hours),
        'd' => span(TimeDelta::try_days),
        _ => Err(FilterValueError::UnknownUnit(raw.to_owned())),
    }
}

/// [`parse_age`] as a [`std::time::Duration`] (for thresholds such as
/// `health --stuck-after`).
///
/// # Errors
///
/// As [`parse_age`].
pub fn parse_duration(raw: &str) -> Result<std::time::Duration, FilterValueError> {
    // A span of digits is never negative; to_std fails on nothing else.
    parse_age(raw)?
        .to_std()
        .map_err(|_| FilterValueError::AgeOutOfRange(raw.to_owned()))
}

impl Filters {
    /// True when no filter narrows the selection.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.statuses.is_empty()
            && self.type_prefix.is_none()
            && self.tenant.is_none()
            && self.created_after.is_none()
            && self.created_before.is_none()
            && self.failed_after.is_none()
            && self.failed_before.is_none()
    }

    /// The store's filter for these flags. Every value becomes a bind
    /// parameter: quotes and semicolons in filters are just text.
    #[must_use]
    pub fn selection(&self) -> EventFilter {
        EventFilter {
            statuses: self.statuses.clone(),
            type_prefix: self.type_prefix.clone(),
            tenant: self.tenant.clone(),
            created_after: self.created_after,
            created_before: self.created_before,
            failed_after: self.failed_after,
            failed_before: self.failed_before,
            ..EventFilter::default()
        }
    }

    /// How many rows match.
    ///
    /// # Errors
    ///
    /// When Postgres fails.
    pub async fn count(&self, conn: &mut AsyncPgConnection) -> Result<u64, StoreError> {
        outbox_store::count_events(conn, &self.selection()).await
    }

    /// The first `limit` matching rows, oldest first (the order of `list`).
    ///
    /// # Errors
    ///
    /// When Postgres fails.
    pub async fn oldest_first(
        &self,
        conn: &mut AsyncPgConnection,
        limit: i64,
    ) -> Result<Vec<OutboxEvent>, StoreError> {
        outbox_store::list_events(conn, &self.selection(), limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn now() -> DateTime<Utc> {
        parse_time("2026-11-29T10:00:00Z").unwrap()
    }

    #[test]
    fn times_parse_as_rfc3339_or_ages() {
        assert_eq!(
            parse_time("2026-11-29T10:00:00Z").unwrap().to_rfc3339(),
            "2026-11-29T10:00:00+00:00"
        );
        assert_eq!(
            parse_time_at("6h", now()).unwrap().to_rfc3339(),
            "2026-11-29T04:00:00+00:00"
        );
        assert_eq!(
            parse_time_at(" 90m ", now()).unwrap().to_rfc3339(),
            "2026-11-29T08:30:00+00:00"
        );
        assert!(matches!(
            parse_time("yesterday"),
            Err(FilterValueError::NotATime(_))
        ));
        assert!(
            parse_time("yesterday")
                .unwrap_err()
                .to_string()
                .contains("RFC 3339")
        );
        assert_eq!(
            parse_time("5y"),
            Err(FilterValueError::UnknownUnit("5y".into()))
        );
    }

    #[test]
    fn values_that_used_to_panic_are_errors() {
        assert_eq!(
            parse_time("5é"),
            Err(FilterValueError::UnknownUnit("5é".into()))
        );
        assert_eq!(
            parse_time("99999999999999d"),
            Err(FilterValueError::AgeOutOfRange("99999999999999d".into()))
        );
        assert_eq!(
            parse_time("99999999999999999999999s"),
            Err(FilterValueError::AgeOutOfRange(
                "99999999999999999999999s".into()
            ))
        );
        for raw in ["", " ", "é", "d", "-5h", "+5h", "5 h", "٥h", "5.5h"] {
            assert!(
                matches!(parse_time(raw), Err(FilterValueError::NotATime(_))),
                "{raw:?}: {:?}",
                parse_time(raw)
            );
        }
        assert!(matches!(
            parse_status("FAİLED"),
            Err(FilterValueError::Status(_))
        ));
    }

    #[test]
    fn durations_are_whole_numbers_with_a_unit() {
        use std::time::Duration;
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration(" 2h "), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        for raw in ["soon", "", "-5m", "1.5h", "2026-11-29T10:00:00Z"] {
            assert_eq!(
                parse_duration(raw),
                Err(FilterValueError::NotAnAge(raw.into())),
                "{raw:?}"
            );
        }
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .to_string()
                .contains("length of time")
        );
        assert_eq!(
            parse_duration("5y"),
            Err(FilterValueError::UnknownUnit("5y".into()))
        );
        assert_eq!(
            parse_duration("99999999999999999999999s"),
            Err(FilterValueError::AgeOutOfRange(
                "99999999999999999999999s".into()
            ))
        );
    }

    /// Strings a user could type, weighted towards what parsers trip on:
    /// anything at all, non-ASCII, digits with any trailing character, and
    /// numbers far beyond every integer type.
    fn nasty() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "\\PC{0,40}",
            "[0-9]{0,40}\\PC?",
            "[+-]?[0-9]{1,30}[smhdé ]",
            (any::<u64>(), "[smhd]").prop_map(|(n, unit)| format!("{n}{unit}")),
            (any::<i64>(), "[smhd]").prop_map(|(n, unit)| format!("{n}{unit}")),
            "[0-9+-]{1,7}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,12})?(Z|[+-][0-9]{2}:[0-9]{2})",
        ]
    }

    proptest! {
        #[test]
        fn parse_time_never_panics(raw in nasty()) {
            // Returning at all is the property; an age is never in the future.
            if let Ok(at) = parse_time_at(&raw, now()) {
                let rfc3339 = DateTime::parse_from_rfc3339(&raw).is_ok();
                prop_assert!(rfc3339 || at <= now(), "{raw:?} gave {at}");
            }
        }

        #[test]
        fn parse_duration_never_panics(raw in nasty()) {
            let _ = parse_duration(&raw);
        }

        #[test]
        fn parse_status_never_panics(raw in nasty()) {
            if let Ok(status) = parse_status(&raw) {
                prop_assert!(status.as_str().eq_ignore_ascii_case(&raw));
            }
        }
    }
}
