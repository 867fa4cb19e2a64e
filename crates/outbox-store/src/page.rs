//! The console's listing of events: newest first along an index that
//! exists, a page at a time by keyset, and never more than a budget of
//! rows read for filters no index serves (the page then offers to search
//! further from the position reached).
//!
//! Which index a listing walks depends on its status filter
//! ([`PageOrder::of`]): FAILED and CANCELLED events along
//! `outbox_event_failed_created_at_idx` by `created_at`, DONE events along
//! `outbox_event_done_processed_at_idx` by `processed_at`, every other
//! selection along the primary key by id (the publisher's ids are UUIDv7,
//! time-ordered). No index was added for it: each one costs every insert.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::outbox_event;
use outbox_model::{OutboxEvent, OutboxStatus};
use tracing::instrument;
use uuid::Uuid;

use crate::Result;
use crate::select::EventFilter;

/// The order of a listing, and so the index it walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageOrder {
    /// Newest first by id, along the primary key (any status but only
    /// FAILED, CANCELLED or DONE). The publisher's ids are UUIDv7, so this
    /// is the order in which they were published (to the millisecond);
    /// rows written with other ids sort by id.
    Id,
    /// Newest first by `processed_at`, then id, along
    /// `outbox_event_done_processed_at_idx` (only DONE events).
    Processed,
    /// Newest first by `created_at`, then id, along
    /// `outbox_event_failed_created_at_idx` (only FAILED and CANCELLED
    /// events).
    Created,
}

impl PageOrder {
    /// The order a listing of `filter` follows: the one whose index holds
    /// exactly the statuses it asks for, else by id.
    #[must_use]
    pub fn of(filter: &EventFilter) -> Self {
        let failures = [OutboxStatus::Failed, OutboxStatus::Cancelled];
        if filter.statuses.is_empty() {
            Self::Id
        } else if filter.statuses.iter().all(|s| *s == OutboxStatus::Done) {
            Self::Processed
        } else if filter.statuses.iter().all(|s| failures.contains(s)) {
            Self::Created
        } else {
            Self::Id
        }
    }

    /// The statuses the order's index holds (`None`: every row).
    fn statuses(self) -> Option<Vec<OutboxStatus>> {
        match self {
            Self::Id => None,
            Self::Processed => Some(vec![OutboxStatus::Done]),
            Self::Created => Some(vec![OutboxStatus::Failed, OutboxStatus::Cancelled]),
        }
    }

    /// The rows the order's index holds.
    fn walk(self) -> outbox_event::BoxedQuery<'static, Pg> {
        let query = outbox_event::table.into_boxed::<Pg>();
        let query = match self.statuses() {
            Some(statuses) => query.filter(outbox_event::status.eq_any(statuses)),
            None => query,
        };
        self.keyed(query)
    }

    /// `query` without the rows that have no key in this order: a DONE row
    /// written without `processed_at` (the dispatcher always sets it) is
    /// listed among all events, not among the DONE ones.
    fn keyed(
        self,
        query: outbox_event::BoxedQuery<'static, Pg>,
    ) -> outbox_event::BoxedQuery<'static, Pg> {
        match self {
            Self::Processed => query.filter(outbox_event::processed_at.is_not_null()),
            Self::Id | Self::Created => query,
        }
    }
}

/// A position in a listing: the next page shows the rows after it. For
/// [`PageOrder::Id`] only the id counts; for the other orders `at` is the
/// row's `processed_at` or `created_at`. Written as `<id>` or
/// `<at in µs since the epoch>_<id>` ([`Display`](fmt::Display),
/// [`FromStr`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagePosition {
    /// The order's time of the position (none for [`PageOrder::Id`]).
    pub at: Option<DateTime<Utc>>,
    /// The id of the position.
    pub id: Uuid,
}

impl PagePosition {
    /// The position of `event` in a listing in `order`.
    #[must_use]
    pub fn of(order: PageOrder, event: &OutboxEvent) -> Self {
        let at = match order {
            PageOrder::Id => None,
            // A DONE row always has its processed_at; created_at otherwise.
            PageOrder::Processed => Some(event.processed_at.unwrap_or(event.created_at)),
            PageOrder::Created => Some(event.created_at),
        };
        Self { at, id: event.id }
    }

    /// Every row whose time is `at` or later has been searched: the next
    /// rows are those with an earlier time (nil is the smallest id).
    fn before(at: DateTime<Utc>) -> Self {
        Self {
            at: Some(at),
            id: Uuid::nil(),
        }
    }
}

impl fmt::Display for PagePosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some(at) => write!(f, "{}_{}", at.timestamp_micros(), self.id),
            None => write!(f, "{}", self.id),
        }
    }
}

/// A text that is not a [`PagePosition`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a page position (<id> or <µs>_<id>)")]
pub struct BadPagePosition(pub String);

impl FromStr for PagePosition {
    type Err = BadPagePosition;

    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        let bad = || BadPagePosition(text.to_owned());
        match text.split_once('_') {
            Some((micros, id)) => Ok(Self {
                at: Some(
                    micros
                        .parse()
                        .ok()
                        .and_then(DateTime::from_timestamp_micros)
                        .ok_or_else(bad)?,
                ),
                id: Uuid::parse_str(id).map_err(|_| bad())?,
            }),
            None => Ok(Self {
                at: None,
                id: Uuid::parse_str(text).map_err(|_| bad())?,
            }),
        }
    }
}

/// What follows a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageNext {
    /// The page is full: the next one starts after its last row.
    After(PagePosition),
    /// The budget of rows was read before the page filled: the rows up to
    /// this position were searched, and searching further starts there.
    SearchFurther(PagePosition),
}

impl PageNext {
    /// Where the next page starts.
    #[must_use]
    pub fn position(self) -> PagePosition {
        match self {
            Self::After(at) | Self::SearchFurther(at) => at,
        }
    }
}

/// One page of [`list_events_newest`].
#[derive(Debug, Clone, PartialEq)]
pub struct EventPage {
    /// The order of the rows.
    pub order: PageOrder,
    /// The rows, in that order.
    pub rows: Vec<OutboxEvent>,
    /// What follows (none: the listing ends here).
    pub next: Option<PageNext>,
}

/// How many rows a filter selects, as far as [`count_events_newest`]
/// looked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tally {
    /// Exactly this many.
    Exact(u64),
    /// More than this many (the cap).
    MoreThan(u64),
    /// This many among the newest `searched` rows of the listing's walk;
    /// older ones were not looked at.
    Among {
        /// The matching rows among them.
        matching: u64,
        /// The rows looked at.
        searched: u64,
    },
}

impl EventFilter {
    /// Whether an index other than the walk's finds the rows (one id, one
    /// dispatch key, one ordering key): then the work is bounded by them.
    fn is_selective(&self) -> bool {
        self.id.is_some() || self.dispatch_key.is_some() || self.ordering_key.is_some()
    }

    /// Whether the filter asks for more than the walk's index holds, so
    /// that rows read along it may not match.
    fn narrows(&self, order: PageOrder) -> bool {
        let statuses_differ = match order.statuses() {
            None => !self.statuses.is_empty(),
            Some(walked) => walked.iter().any(|s| !self.statuses.contains(s)),
        };
        let created_is_walked = order == PageOrder::Created;
        statuses_differ
            || self.type_prefix.is_some()
            || self.tenant.is_some()
            || (!created_is_walked
                && (self.created_after.is_some() || self.created_before.is_some()))
            || self.failed_after.is_some()
            || self.failed_before.is_some()
    }
}

/// `query` narrowed to the rows after `after` in `order`:
/// `t <= at AND (t < at OR id < after.id)`, whose first term is the
/// index's range condition and the second the tie-break within one time
/// (a nil id: every row of that time was shown).
fn after_position(
    query: outbox_event::BoxedQuery<'static, Pg>,
    order: PageOrder,
    after: PagePosition,
) -> outbox_event::BoxedQuery<'static, Pg> {
    match (order, after.at) {
        (PageOrder::Id, _) | (_, None) => query.filter(outbox_event::id.lt(after.id)),
        (PageOrder::Processed, Some(at)) => query.filter(
            outbox_event::processed_at.le(at).and(
                outbox_event::processed_at
                    .lt(at)
                    .or(outbox_event::id.lt(after.id).nullable()),
            ),
        ),
        (PageOrder::Created, Some(at)) => query.filter(
            outbox_event::created_at.le(at).and(
                outbox_event::created_at
                    .lt(at)
                    .or(outbox_event::id.lt(after.id)),
            ),
        ),
    }
}

/// The position `budget` rows along the walk after `after`, or `None`
/// when fewer rows are left: the window a bounded page searches ends
/// there. Counted by the order's key alone (the rows of the time at
/// `after` count as well, unless all of them were searched), so that
/// only the walk's index is read.
async fn budget_end(
    conn: &mut AsyncPgConnection,
    order: PageOrder,
    after: Option<PagePosition>,
    budget: i64,
) -> Result<Option<PagePosition>> {
    let mut walk = order.walk();
    if let Some(after) = after {
        let all_searched = after.id.is_nil();
        walk = match (order, after.at) {
            (PageOrder::Id, _) | (_, None) => walk.filter(outbox_event::id.lt(after.id)),
            (PageOrder::Processed, Some(at)) if all_searched => {
                walk.filter(outbox_event::processed_at.lt(at))
            }
            (PageOrder::Processed, Some(at)) => walk.filter(outbox_event::processed_at.le(at)),
            (PageOrder::Created, Some(at)) if all_searched => {
                walk.filter(outbox_event::created_at.lt(at))
            }
            (PageOrder::Created, Some(at)) => walk.filter(outbox_event::created_at.le(at)),
        };
    }
    let offset = budget.saturating_sub(1).max(0);
    Ok(match order {
        PageOrder::Id => walk
            .select(outbox_event::id)
            .order(outbox_event::id.desc())
            .offset(offset)
            .limit(1)
            .get_result::<Uuid>(conn)
            .await
            .optional()?
            .map(|id| PagePosition { at: None, id }),
        PageOrder::Processed => walk
            .select(outbox_event::processed_at)
            .order(outbox_event::processed_at.desc())
            .offset(offset)
            .limit(1)
            .get_result::<Option<DateTime<Utc>>>(conn)
            .await
            .optional()?
            .flatten()
            .map(PagePosition::before),
        PageOrder::Created => walk
            .select(outbox_event::created_at)
            .order(outbox_event::created_at.desc())
            .offset(offset)
            .limit(1)
            .get_result::<DateTime<Utc>>(conn)
            .await
            .optional()?
            .map(PagePosition::before),
    })
}

/// `query` narrowed to the window that ends at `end` (inclusive).
fn within(
    query: outbox_event::BoxedQuery<'static, Pg>,
    order: PageOrder,
    end: PagePosition,
) -> outbox_event::BoxedQuery<'static, Pg> {
    match (order, end.at) {
        (PageOrder::Id, _) | (_, None) => query.filter(outbox_event::id.ge(end.id)),
        (PageOrder::Processed, Some(at)) => query.filter(outbox_event::processed_at.ge(at)),
        (PageOrder::Created, Some(at)) => query.filter(outbox_event::created_at.ge(at)),
    }
}

/// `query` in `order`, newest first.
fn ordered(
    query: outbox_event::BoxedQuery<'static, Pg>,
    order: PageOrder,
) -> outbox_event::BoxedQuery<'static, Pg> {
    match order {
        PageOrder::Id => query.order(outbox_event::id.desc()),
        PageOrder::Processed => {
            query.order((outbox_event::processed_at.desc(), outbox_event::id.desc()))
        }
        PageOrder::Created => {
            query.order((outbox_event::created_at.desc(), outbox_event::id.desc()))
        }
    }
}

/// One page of the events `filter` selects, newest first in the order
/// [`PageOrder::of`] the filter picks, after `after` (none: from the
/// newest), at most `limit` rows.
///
/// The page walks the order's index. When the filter asks for more than
/// that index holds (a tenant, a type prefix, a status of another index,
/// …) and no other index finds the rows (an id, a dispatch key, an
/// ordering key), the page reads at most `budget` rows along the walk:
/// when they hold fewer than `limit` matching rows, the page ends with
/// [`PageNext::SearchFurther`] and the position reached, so that no page
/// reads the whole table. Pages that follow each other by
/// [`EventPage::next`] show every matching row once, none twice, rows
/// inserted meanwhile aside.
///
/// # Example
///
/// ```no_run
/// # async fn example(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), outbox_store::StoreError> {
/// use outbox_store::{EventFilter, PageNext, list_events_newest};
///
/// let acme = EventFilter { tenant: Some("acme".into()), ..EventFilter::default() };
/// let mut after = None;
/// loop {
///     let page = list_events_newest(conn, &acme, after, 50, 10_000).await?;
///     for event in &page.rows {
///         println!("{} {}", event.id, event.event_type);
///     }
///     match page.next {
///         Some(next) => after = Some(next.position()),
///         None => break,
///     }
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn list_events_newest(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    after: Option<PagePosition>,
    limit: i64,
    budget: i64,
) -> Result<EventPage> {
    let order = PageOrder::of(filter);
    let bounded = filter.narrows(order) && !filter.is_selective();
    let end = if bounded {
        budget_end(conn, order, after, budget).await?
    } else {
        None
    };
    let mut query = ordered(order.keyed(filter.query()), order);
    if let Some(after) = after {
        query = after_position(query, order, after);
    }
    if let Some(end) = end {
        query = within(query, order, end);
    }
    let rows: Vec<OutboxEvent> = query
        .limit(limit)
        .select(OutboxEvent::as_select())
        .load(conn)
        .await?;
    let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= limit;
    let next = match rows.last() {
        Some(last) if full => Some(PageNext::After(PagePosition::of(order, last))),
        _ => end.map(PageNext::SearchFurther),
    };
    Ok(EventPage { order, rows, next })
}

/// How many events `filter` selects, with bounded work: counted up to
/// `cap` along an index when the filter asks for no more than an index
/// holds ([`Tally::Exact`] or [`Tally::MoreThan`]); otherwise among the
/// newest `cap` rows of the listing's walk ([`Tally::Among`], or
/// [`Tally::Exact`] when the walk holds no more).
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn count_events_newest(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    cap: u64,
) -> Result<Tally> {
    let order = PageOrder::of(filter);
    if !filter.narrows(order) || filter.is_selective() {
        return Ok(
            match crate::select::count_events_up_to(conn, filter, cap).await? {
                Some(n) => Tally::Exact(n),
                None => Tally::MoreThan(cap),
            },
        );
    }
    let budget = i64::try_from(cap).unwrap_or(i64::MAX);
    let end = budget_end(conn, order, None, budget).await?;
    let mut query = order.keyed(filter.query());
    if let Some(end) = end {
        query = within(query, order, end);
    }
    let n: i64 = query.count().get_result(conn).await?;
    let matching = u64::try_from(n).unwrap_or(0);
    Ok(match end {
        Some(_) => Tally::Among {
            matching,
            searched: cap,
        },
        None => Tally::Exact(matching),
    })
}
