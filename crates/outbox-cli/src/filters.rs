//! Row selection shared by `list` and `requeue`.

use chrono::{DateTime, Duration, Utc};
use clap::Args;
use diesel::pg::Pg;
use diesel::prelude::*;
use outbox_model::OutboxStatus;
use outbox_model::schema::outbox_event;

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
    /// FAILED rows whose last attempt was at or after this time (RFC 3339 or an age).
    #[arg(long, value_parser = parse_time)]
    pub failed_after: Option<DateTime<Utc>>,
    /// FAILED rows whose last attempt was before this time.
    #[arg(long, value_parser = parse_time)]
    pub failed_before: Option<DateTime<Utc>>,
    /// At most this many rows, oldest first.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub limit: i64,
}

/// Parses a status, case-insensitively.
///
/// # Errors
///
/// The list of valid statuses.
pub fn parse_status(raw: &str) -> Result<OutboxStatus, String> {
    raw.parse::<OutboxStatus>().map_err(|e| e.to_string())
}

/// Parses RFC 3339, or an age like `30s`, `90m`, `6h`, `7d` (that long ago).
///
/// # Errors
///
/// What was expected.
pub fn parse_time(raw: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(raw) {
        return Ok(at.with_timezone(&Utc));
    }
    let raw = raw.trim();
    let (number, unit) = raw.split_at(raw.len().saturating_sub(1));
    let amount: i64 = number.parse().map_err(|_| {
        format!("{raw:?} is neither RFC 3339 (2026-11-29T10:00:00Z) nor an age (30s, 90m, 6h, 7d)")
    })?;
    let age = match unit {
        "s" => Duration::seconds(amount),
        "m" => Duration::minutes(amount),
        "h" => Duration::hours(amount),
        "d" => Duration::days(amount),
        _ => return Err(format!("{raw:?}: the unit must be s, m, h or d")),
    };
    Ok(Utc::now() - age)
}

fn like_escape(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
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

    /// The filtered query, oldest first, limited. Every value is a bind
    /// parameter: quotes and semicolons in filters are just text.
    pub fn query(&self) -> outbox_event::BoxedQuery<'static, Pg> {
        let mut query = outbox_event::table.into_boxed::<Pg>();
        if !self.statuses.is_empty() {
            query = query.filter(outbox_event::status.eq_any(self.statuses.clone()));
        }
        if let Some(prefix) = &self.type_prefix {
            query = query.filter(
                outbox_event::event_type
                    .like(format!("{}%", like_escape(prefix)))
                    .escape('\\'),
            );
        }
        if let Some(tenant) = &self.tenant {
            query = query.filter(outbox_event::tenant_id.eq(tenant.clone()));
        }
        if let Some(at) = self.created_after {
            query = query.filter(outbox_event::created_at.ge(at));
        }
        if let Some(at) = self.created_before {
            query = query.filter(outbox_event::created_at.lt(at));
        }
        if self.failed_after.is_some() || self.failed_before.is_some() {
            query = query.filter(outbox_event::status.eq(OutboxStatus::Failed));
        }
        // A FAILED row's scheduled_at is the time of its last attempt.
        if let Some(at) = self.failed_after {
            query = query.filter(outbox_event::scheduled_at.ge(at));
        }
        if let Some(at) = self.failed_before {
            query = query.filter(outbox_event::scheduled_at.lt(at));
        }
        query
            .order((outbox_event::created_at, outbox_event::id))
            .limit(self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_rfc3339_or_ages() {
        assert_eq!(
            parse_time("2026-11-29T10:00:00Z").unwrap().to_rfc3339(),
            "2026-11-29T10:00:00+00:00"
        );
        let six_hours_ago = parse_time("6h").unwrap();
        assert!(
            (Utc::now() - six_hours_ago - Duration::hours(6))
                .num_seconds()
                .abs()
                < 5
        );
        assert!(parse_time("yesterday").unwrap_err().contains("RFC 3339"));
        assert!(parse_time("5y").unwrap_err().contains("unit"));
    }

    #[test]
    fn like_wildcards_are_escaped() {
        assert_eq!(like_escape("a_b%c\\"), "a\\_b\\%c\\\\");
    }
}
