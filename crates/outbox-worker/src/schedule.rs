//! Periodic events: a [`Schedule`] (a cron expression with seconds, in a
//! named time zone) and the event it publishes at each tick, declared on
//! the worker ([`crate::WorkerBuilder::schedule`]) or in the routes file
//! (`[[schedule]]` tables, see [`schedules_from_file`]).
//!
//! What is decided here is pure: which ticks a schedule has, which of them
//! were missed while no worker ran and what [`Missed`] does with them, and
//! the dispatch key of a tick. The runner (`runner`) sleeps until each
//! tick and publishes it; the schedule's row in `outbox_schedule`
//! (`outbox_store::advance_schedule`) decides which of several workers
//! publishes a tick, so each tick is published once however many run it.

mod file;
pub(crate) mod runner;

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, FixedOffset, Offset, SecondsFormat, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use outbox_publish::{Dedupe, NewOutboxEvent, PublishError};

pub use file::schedules_from_file;

/// The longest schedule name: it is a metric label, a log field and part
/// of the tick's dispatch key.
pub const MAX_SCHEDULE_NAME_LEN: usize = 100;

/// Missed ticks counted at most, for the log and the `skipped` counter,
/// when a schedule starts after a long time without any worker.
pub(crate) const MISSED_COUNT_LIMIT: u64 = 10_000;

/// The step in which a tick search looks for a change of the zone's UTC
/// offset: shorter than any zone keeps one offset (changes are months
/// apart), so a step holds at most one change.
const OFFSET_STEP: TimeDelta = TimeDelta::hours(12);

/// Stretches of one UTC offset a tick search passes at most before it
/// gives up (a cron expression whose ticks all fall in skipped local
/// times).
const STRETCH_LIMIT: usize = 1_000;

/// What a schedule does with the ticks that passed while no worker ran it
/// (every worker down, or none deployed with it), found at a worker's
/// start. A schedule's very first start publishes nothing for the past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missed {
    /// Publish none of them (the default); they are counted as `skipped`.
    #[default]
    Skip,
    /// Publish only the latest of them, once; the others are `skipped`.
    PublishLast,
}

impl Missed {
    /// As the routes file writes it: `skip` or `publish-last`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::PublishLast => "publish-last",
        }
    }
}

impl FromStr for Missed {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "skip" => Ok(Self::Skip),
            "publish-last" => Ok(Self::PublishLast),
            other => Err(other.to_owned()),
        }
    }
}

/// Why a schedule (or the routes file's `[[schedule]]` tables) was refused;
/// each names the schedule and what was wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The name is empty, too long or has a character other than ASCII
    /// letters, digits, `.`, `_` and `-`.
    #[error("schedule name {name:?} {problem}")]
    Name {
        /// The name given.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The cron expression does not parse.
    #[error(
        "schedule {name}: cron {cron:?} is invalid: {reason} (six or seven fields: seconds minutes hours day-of-month month day-of-week [year])"
    )]
    Cron {
        /// The schedule.
        name: String,
        /// The expression given.
        cron: String,
        /// The parser's message.
        reason: String,
    },
    /// The cron expression parses but has no tick after now.
    #[error("schedule {name}: cron {cron:?} has no tick after now")]
    NoTicks {
        /// The schedule.
        name: String,
        /// The expression given.
        cron: String,
    },
    /// The time zone is not an IANA name.
    #[error(
        "schedule {name}: unknown time zone {zone:?} (an IANA name such as Europe/Berlin, or UTC)"
    )]
    Zone {
        /// The schedule.
        name: String,
        /// The zone given.
        zone: String,
    },
    /// The event sets a dedupe window or replace mode: a schedule gives
    /// each tick its own dispatch key, kept until its row is deleted, so
    /// that a tick is published once however many workers run.
    #[error(
        "schedule {name}: the event sets a dedupe window or replace mode, but a schedule gives each tick a dispatch key of its own, kept until the row is deleted, so that each tick is published once: leave both unset"
    )]
    KeySettings {
        /// The schedule.
        name: String,
    },
    /// The event breaks a rule of the publisher.
    #[error("schedule {name}: the event is refused: {source}")]
    Event {
        /// The schedule.
        name: String,
        /// The publisher's refusal.
        source: Arc<PublishError>,
    },
    /// `missed` is neither `skip` nor `publish-last`.
    #[error("schedule {name}: missed = {value:?} is neither \"skip\" nor \"publish-last\"")]
    Missed {
        /// The schedule.
        name: String,
        /// The value given.
        value: String,
    },
    /// Two schedules have one name (in code, in the routes file, or one in
    /// each).
    #[error("two schedules are named {name}")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// The routes file is not TOML.
    #[error("the routes file is not TOML: {0}")]
    Parse(String),
    /// The routes file's `[[schedule]]` tables are not of the expected form.
    #[error("schedule #{index}: {problem}")]
    File {
        /// The table's position among the file's `[[schedule]]` tables, from 1.
        index: usize,
        /// What is wrong (a missing or unknown key, a value of another type).
        problem: String,
    },
}

/// A periodic event: at every tick of `cron` in `zone`, the event is
/// published once (with the dispatch key `schedule:<name>:<tick>`, the
/// tick in RFC 3339 UTC, and the tick as its `scheduled_at`), whatever the
/// number of workers that run the schedule.
///
/// ```
/// use outbox_publish::NewOutboxEvent;
/// use outbox_worker::{Missed, Schedule};
///
/// let nightly = Schedule::new(
///     "nightly-report",
///     "0 0 3 * * *",
///     "Europe/Berlin",
///     NewOutboxEvent::new("acme", "reports.nightly.due", serde_json::json!({ "kind": "daily" })),
/// )?
/// .missed(Missed::PublishLast);
/// assert_eq!(nightly.name(), "nightly-report");
///
/// let refused = Schedule::new(
///     "nightly-report",
///     "0 0 3 * *",
///     "Europe/Berlin",
///     NewOutboxEvent::new("acme", "reports.nightly.due", serde_json::json!({})),
/// );
/// assert!(refused.unwrap_err().to_string().starts_with("schedule nightly-report: cron \"0 0 3 * *\" is invalid"));
/// # Ok::<(), outbox_worker::ScheduleError>(())
/// ```
#[derive(Clone)]
pub struct Schedule {
    name: String,
    cron: cron::Schedule,
    zone: Tz,
    event: NewOutboxEvent,
    missed: Missed,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("cron", &self.cron.source())
            .field("zone", &self.zone.name())
            .field("event_type", &self.event.event_type)
            .field("tenant_id", &self.event.tenant_id)
            .field("missed", &self.missed)
            .finish_non_exhaustive()
    }
}

impl Schedule {
    /// The schedule `name` (ASCII letters, digits, `.`, `_`, `-`; at most
    /// [`MAX_SCHEDULE_NAME_LEN`] bytes) publishing `event` at each tick of
    /// `cron` (six fields, seconds first, or seven with the year, e.g.
    /// `0 0 3 * * *` for 03:00:00 every day) in the IANA time zone `zone`
    /// (e.g. `Europe/Berlin`, `UTC`). Missed ticks are skipped
    /// ([`Schedule::missed`] changes that). The event's dispatch key and
    /// `scheduled_at` are set at each tick; any given here are replaced.
    ///
    /// In a zone with daylight saving time, a local time that occurs twice
    /// (the autumn hour) ticks twice, an hour apart, and one that does not
    /// occur (the spring hour) does not tick: a tick is an instant whose
    /// local time the expression matches.
    ///
    /// # Errors
    ///
    /// A [`ScheduleError`] naming the schedule: a bad name, cron expression
    /// or zone, a cron expression without a tick after now, an event with a
    /// dedupe window or replace mode, or an event the publisher refuses.
    pub fn new(
        name: impl Into<String>,
        cron: &str,
        zone: &str,
        event: NewOutboxEvent,
    ) -> Result<Self, ScheduleError> {
        let name = name.into();
        check_name(&name)?;
        let parsed = cron::Schedule::from_str(cron).map_err(|e| ScheduleError::Cron {
            name: name.clone(),
            cron: cron.to_owned(),
            reason: e.to_string(),
        })?;
        let zone = Tz::from_str(zone).map_err(|_| ScheduleError::Zone {
            name: name.clone(),
            zone: zone.to_owned(),
        })?;
        if event.dedupe != Dedupe::default() || event.replace_pending {
            return Err(ScheduleError::KeySettings { name });
        }
        let event = NewOutboxEvent {
            dispatch_key: None,
            scheduled_at: None,
            ..event
        };
        if let Err(source) = event.validate() {
            return Err(ScheduleError::Event {
                name,
                source: Arc::new(source),
            });
        }
        let schedule = Self {
            name,
            cron: parsed,
            zone,
            event,
            missed: Missed::default(),
        };
        if schedule.next_after(Utc::now()).is_none() {
            return Err(ScheduleError::NoTicks {
                name: schedule.name,
                cron: cron.to_owned(),
            });
        }
        Ok(schedule)
    }

    /// What to do with ticks missed while no worker ran ([`Missed::Skip`]
    /// by default).
    #[must_use]
    pub fn missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// The schedule's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cron expression, as given.
    #[must_use]
    pub fn cron(&self) -> &str {
        self.cron.source()
    }

    /// The time zone's IANA name.
    #[must_use]
    pub fn zone(&self) -> &str {
        self.zone.name()
    }

    /// The event published at each tick (without its dispatch key and
    /// `scheduled_at`, which each tick sets).
    #[must_use]
    pub fn event(&self) -> &NewOutboxEvent {
        &self.event
    }

    /// What the schedule does with missed ticks.
    #[must_use]
    pub fn missed_ticks(&self) -> Missed {
        self.missed
    }

    /// The first tick strictly after `t`.
    ///
    /// Ticks are instants: where the zone's clock goes back, a local time
    /// matched in both passes is two ticks, an hour apart, and the ticks
    /// come in the order of time, not of the local clock.
    #[must_use]
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Within one stretch of a single UTC offset the local clock runs
        // with time, so the cron search is done in that offset; a tick it
        // finds past the stretch's end is not one, and the search goes on
        // from the end in the next stretch's offset.
        let mut after = t;
        let mut since = t;
        let mut offset = self.offset_at(t);
        for _ in 0..STRETCH_LIMIT {
            let tick = self
                .cron
                .after(&after.with_timezone(&offset))
                .next()?
                .with_timezone(&Utc);
            match self.offset_change(since, tick, offset) {
                None => return Some(tick),
                Some(change) => {
                    // Strictly after the second before the change: from
                    // the change itself.
                    after = change - TimeDelta::seconds(1);
                    since = change;
                    offset = self.offset_at(change);
                }
            }
        }
        None
    }

    /// The latest tick at or before `t`.
    #[must_use]
    pub fn latest_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // The cron crate looks strictly before a whole second: start from
        // the second after `t`'s own.
        let whole = t - TimeDelta::nanoseconds(i64::from(t.timestamp_subsec_nanos()));
        let mut before = whole + TimeDelta::seconds(1);
        let mut until = t;
        let mut offset = self.offset_at(t);
        for _ in 0..STRETCH_LIMIT {
            let tick = self
                .cron
                .after(&before.with_timezone(&offset))
                .next_back()?
                .with_timezone(&Utc);
            match self.stretch_start(tick, until, offset) {
                None => return Some(tick),
                Some(start) => {
                    // Strictly before the stretch that `offset` covers.
                    before = start;
                    until = start - TimeDelta::seconds(1);
                    offset = self.offset_at(until);
                }
            }
        }
        None
    }

    /// The zone's UTC offset at `t`.
    fn offset_at(&self, t: DateTime<Utc>) -> FixedOffset {
        self.zone.offset_from_utc_datetime(&t.naive_utc()).fix()
    }

    /// The first whole second in (`from`, `to`] at which the zone's offset
    /// is not `offset` (the offset at `from`); `None` when it keeps
    /// `offset` throughout.
    fn offset_change(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        offset: FixedOffset,
    ) -> Option<DateTime<Utc>> {
        let mut low = from;
        while low < to {
            let high = (low + OFFSET_STEP).min(to);
            if self.offset_at(high) != offset {
                return Some(self.first_second_off(low, high));
            }
            low = high;
        }
        None
    }

    /// The first whole second of the stretch of `offset` (the offset at
    /// `to`) that holds `to`, when that stretch starts after `from`;
    /// `None` when the zone keeps `offset` throughout [`from`, `to`].
    fn stretch_start(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        offset: FixedOffset,
    ) -> Option<DateTime<Utc>> {
        let mut high = to;
        while high > from {
            let low = (high - OFFSET_STEP).max(from);
            if self.offset_at(low) != offset {
                return Some(self.first_second_off(low, high));
            }
            high = low;
        }
        None
    }

    /// The first whole second after `low`, at or before `high`, whose
    /// offset is not `low`'s, found by halving (one change between them:
    /// [`OFFSET_STEP`] is shorter than any zone keeps an offset).
    fn first_second_off(&self, low: DateTime<Utc>, high: DateTime<Utc>) -> DateTime<Utc> {
        let offset = self.offset_at(low);
        let mut low = low.timestamp();
        let mut high = high.timestamp() + i64::from(high.timestamp_subsec_nanos() > 0);
        while high - low > 1 {
            let middle = low + (high - low) / 2;
            let at = DateTime::from_timestamp(middle, 0).unwrap_or_default();
            if self.offset_at(at) == offset {
                low = middle;
            } else {
                high = middle;
            }
        }
        DateTime::from_timestamp(high, 0).unwrap_or_default()
    }

    /// The event of `tick`: the schedule's event with the tick's dispatch
    /// key ([`Schedule::dispatch_key`]) and the tick as `scheduled_at`.
    #[must_use]
    pub fn event_at(&self, tick: DateTime<Utc>) -> NewOutboxEvent {
        self.event
            .clone()
            .dispatch_key(self.dispatch_key(tick))
            .scheduled_at(tick)
    }

    /// `schedule:<name>:<tick as RFC 3339 UTC>`, e.g.
    /// `schedule:nightly-report:2026-12-05T02:00:00Z`.
    #[must_use]
    pub fn dispatch_key(&self, tick: DateTime<Utc>) -> String {
        format!(
            "schedule:{}:{}",
            self.name,
            tick.to_rfc3339_opts(SecondsFormat::AutoSi, true)
        )
    }

    /// What a worker starting at `now` does about the past, given the
    /// schedule's row (`last`: its newest settled tick, `None` before the
    /// schedule's first start).
    #[must_use]
    pub(crate) fn plan_start(&self, last: Option<DateTime<Utc>>, now: DateTime<Utc>) -> StartPlan {
        let Some(last) = last else {
            return StartPlan {
                anchor: true,
                publish: None,
                skipped: 0,
            };
        };
        let mut missed = 0;
        let mut cursor = last;
        while missed < MISSED_COUNT_LIMIT
            && let Some(tick) = self.next_after(cursor)
            && tick <= now
        {
            missed += 1;
            cursor = tick;
        }
        let publish = match self.missed {
            Missed::PublishLast if missed > 0 => self.latest_at_or_before(now),
            _ => None,
        };
        StartPlan {
            anchor: false,
            publish,
            skipped: missed - u64::from(publish.is_some()),
        }
    }
}

/// What a worker does about a schedule's past when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StartPlan {
    /// The schedule has no row: write one at the start time, so that the
    /// ticks before it are never taken as missed.
    pub anchor: bool,
    /// The missed tick to publish now ([`Missed::PublishLast`]).
    pub publish: Option<DateTime<Utc>>,
    /// The missed ticks passed over (at most [`MISSED_COUNT_LIMIT`]).
    pub skipped: u64,
}

/// Refuses a name that is empty, too long or not of ASCII letters, digits,
/// `.`, `_` and `-`.
fn check_name(name: &str) -> Result<(), ScheduleError> {
    let problem = if name.is_empty() {
        "is empty".to_owned()
    } else if name.len() > MAX_SCHEDULE_NAME_LEN {
        format!("is longer than {MAX_SCHEDULE_NAME_LEN} bytes")
    } else if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        format!("has {c:?}; only ASCII letters, digits, '.', '_' and '-' are allowed")
    } else {
        return Ok(());
    };
    Err(ScheduleError::Name {
        name: name.to_owned(),
        problem,
    })
}

/// `first` then `second`, refusing a name that occurs twice.
///
/// # Errors
///
/// [`ScheduleError::Duplicate`] for the first repeated name.
pub(crate) fn merge(
    first: &[Schedule],
    second: &[Schedule],
) -> Result<Vec<Schedule>, ScheduleError> {
    let mut names = BTreeSet::new();
    first
        .iter()
        .chain(second)
        .map(|schedule| {
            if names.insert(schedule.name.as_str()) {
                Ok(schedule.clone())
            } else {
                Err(ScheduleError::Duplicate {
                    name: schedule.name.clone(),
                })
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "schedule/tests.rs"]
mod tests;
