//! The events: the CLI's filters (status, type prefix, tenant, creation
//! time, id, dispatch key, ordering key), newest first along an index, a
//! page at a time by keyset (`outbox_store::list_events_newest`).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, NaiveDateTime, Utc};
use maud::{Markup, html};
use outbox_model::{OutboxEvent, OutboxStatus};
use outbox_store::{EventFilter, PageNext, PageOrder, PagePosition, Tally};
use serde::Deserialize;
use uuid::Uuid;

use super::{Viewer, layout};
use crate::figures::grouped;
use crate::{Console, ConsoleError};

/// Rows per page.
pub const PAGE_SIZE: i64 = 50;

/// The events page counts the matching rows up to this many, and says
/// "more than" past it; a filter no index serves is counted among this
/// many of the newest rows: its work stays bounded on a large table.
const COUNT_CAP: u64 = 10_000;

/// A page whose filters no index serves reads at most this many rows
/// along its index, then offers to search further.
pub const SEARCH_BUDGET: i64 = 10_000;

/// The filter form's fields, as the query string carries them (an empty
/// field is no filter).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Filters {
    #[serde(default)]
    status: String,
    #[serde(default)]
    type_prefix: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    created_after: String,
    #[serde(default)]
    created_before: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    dispatch_key: String,
    #[serde(default)]
    ordering_key: String,
    /// Where the page starts: the position of the row before
    /// (`outbox_store::PagePosition`: `<id>`, or `<µs>_<id>`).
    #[serde(default)]
    after: String,
    /// How many events a requeue of the matching ones just requeued.
    #[serde(default)]
    requeued: String,
    /// Of those, how many DONE events it replayed.
    #[serde(default)]
    replayed: String,
    /// How many events a cancel of the matching ones just cancelled.
    #[serde(default)]
    cancelled: String,
}

fn given(field: &str) -> Option<String> {
    let field = field.trim();
    (!field.is_empty()).then(|| field.to_owned())
}

/// RFC 3339, or a form's `datetime-local` value (taken as UTC).
fn parse_time(name: &str, raw: &str) -> Result<Option<DateTime<Utc>>, String> {
    let Some(raw) = given(raw) else {
        return Ok(None);
    };
    if let Ok(at) = DateTime::parse_from_rfc3339(&raw) {
        return Ok(Some(at.with_timezone(&Utc)));
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(&raw, format).ok())
        .map(|at| Some(at.and_utc()))
        .ok_or_else(|| format!("{name}: {raw:?} is not a time (2026-12-05T10:00 or RFC 3339)"))
}

impl Filters {
    /// The store's filter, or what is wrong with a field.
    pub(crate) fn selection(&self) -> Result<EventFilter, String> {
        let statuses = match given(&self.status) {
            Some(status) => vec![status.parse::<OutboxStatus>().map_err(|e| e.to_string())?],
            None => Vec::new(),
        };
        let id = match given(&self.id) {
            Some(id) => {
                Some(Uuid::parse_str(&id).map_err(|_| format!("id: {id:?} is not a UUID"))?)
            }
            None => None,
        };
        Ok(EventFilter {
            statuses,
            type_prefix: given(&self.type_prefix),
            tenant: given(&self.tenant),
            created_after: parse_time("created after", &self.created_after)?,
            created_before: parse_time("created before", &self.created_before)?,
            id,
            dispatch_key: given(&self.dispatch_key),
            ordering_key: given(&self.ordering_key),
            ..EventFilter::default()
        })
    }

    fn after(&self) -> Result<Option<PagePosition>, String> {
        given(&self.after)
            .map(|after| after.parse().map_err(|e| format!("after: {e}")))
            .transpose()
    }

    /// The filter fields by name, as the form sends them.
    fn fields(&self) -> [(&'static str, &str); 8] {
        [
            ("status", self.status.as_str()),
            ("type_prefix", self.type_prefix.as_str()),
            ("tenant", self.tenant.as_str()),
            ("created_after", self.created_after.as_str()),
            ("created_before", self.created_before.as_str()),
            ("id", self.id.as_str()),
            ("dispatch_key", self.dispatch_key.as_str()),
            ("ordering_key", self.ordering_key.as_str()),
        ]
    }

    /// The query string of the filters (no page position).
    pub(crate) fn query(&self) -> String {
        self.fields()
            .iter()
            .filter(|(_, value)| !value.trim().is_empty())
            .map(|(name, value)| format!("{name}={}", encode(value.trim())))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// The filters as hidden fields of a form that acts on what they select.
    pub(crate) fn hidden(&self) -> Markup {
        html! {
            @for (name, value) in self.fields() {
                @if !value.trim().is_empty() { input type="hidden" name=(name) value=(value.trim()); }
            }
        }
    }

    /// The query string of these filters with the page starting at `position`.
    fn next_page(&self, position: PagePosition) -> String {
        let mut query: Vec<String> = Some(self.query())
            .filter(|q| !q.is_empty())
            .into_iter()
            .collect();
        query.push(format!("after={}", encode(&position.to_string())));
        query.join("&")
    }
}

/// What the page says of its order.
fn order_note(order: PageOrder) -> &'static str {
    match order {
        PageOrder::Id => {
            "Newest first by id: the order of publication (the publisher's ids are time-ordered)."
        }
        PageOrder::Processed => "Newest first by hand-off time (processed_at).",
        PageOrder::Created => "Newest first by creation time.",
    }
}

/// `text` percent-encoded for a query string (all but the unreserved characters).
pub(crate) fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) async fn page(
    State(console): State<Console>,
    viewer: Viewer,
    Query(filters): Query<Filters>,
) -> Result<Response, ConsoleError> {
    let (selection, after) = match filters.selection().and_then(|s| Ok((s, filters.after()?))) {
        Ok(parsed) => parsed,
        Err(problem) => {
            let body = html! { (form(&viewer, &filters)) p.refused #filter-problem { (problem) } };
            return Ok((StatusCode::BAD_REQUEST, layout(&viewer, "Events", body)).into_response());
        }
    };
    let mut conn = console.conn().await?;
    let page =
        outbox_store::list_events_newest(&mut conn, &selection, after, PAGE_SIZE, SEARCH_BUDGET)
            .await?;
    let matching = outbox_store::count_events_newest(&mut conn, &selection, COUNT_CAP).await?;
    let next_link = |next: PageNext| {
        format!(
            "{}?{}",
            viewer.base.to("/events"),
            filters.next_page(next.position())
        )
    };
    let requeue_link = format!("{}?{}", viewer.base.to("/events/requeue"), filters.query());
    let cancel_link = format!("{}?{}", viewer.base.to("/events/cancel"), filters.query());
    let body = html! {
        (form(&viewer, &filters))
        @if let Ok(n) = filters.requeued.parse::<u64>() {
            p.ok #done {
                "Requeued " (grouped(n)) " event(s)"
                @if let Ok(r) = filters.replayed.parse::<u64>() { @if r > 0 { ", replayed " (grouped(r)) " of them" } }
                "."
            }
        }
        @if let Ok(n) = filters.cancelled.parse::<u64>() { p.ok #cancelled { "Cancelled " (grouped(n)) " event(s)." } }
        @if matching != Tally::Exact(0) {
            p {
                a.button #requeue-matching href=(requeue_link) { "Requeue the matching events…" }
                @if !filters.query().is_empty() {
                    " " a.button #cancel-matching href=(cancel_link) { "Cancel the matching events…" }
                }
            }
        }
        p #matching {
            @match matching {
                Tally::Exact(n) => { (grouped(n)) " matching event(s)" }
                Tally::MoreThan(cap) => { "More than " (grouped(cap)) " matching events" }
                Tally::Among { matching, searched } => {
                    (grouped(matching)) " matching event(s) among the newest " (grouped(searched))
                    " (the filters are checked row by row; older events were not counted)"
                }
            }
            @if after.is_some() { ", this page after the ones before" }
        }
        p #order { (order_note(page.order)) }
        (table(&viewer, page.order, &page.rows))
        @match page.next {
            Some(next @ PageNext::After(_)) => {
                p { a #next-page href=(next_link(next)) { "Next page →" } }
            }
            Some(next @ PageNext::SearchFurther(_)) => {
                p #searched {
                    "No more matching events among the " (grouped(SEARCH_BUDGET)) " searched for this page. "
                    a #search-further href=(next_link(next)) { "Search further →" }
                }
            }
            None => {}
        }
    };
    Ok(layout(&viewer, "Events", body).into_response())
}

fn form(viewer: &Viewer, filters: &Filters) -> Markup {
    html! {
        form.filters #filters method="get" action=(viewer.base.to("/events")) {
            label { "status "
                select name="status" {
                    option value="" { "any" }
                    @for status in OutboxStatus::ALL {
                        option value=(status.as_str()) selected[filters.status.eq_ignore_ascii_case(status.as_str())] { (status.as_str()) }
                    }
                }
            }
            label { "type prefix " input name="type_prefix" value=(filters.type_prefix) placeholder="webhook.order."; }
            label { "tenant " input name="tenant" value=(filters.tenant); }
            label { "created after " input name="created_after" value=(filters.created_after) placeholder="2026-12-05T10:00"; }
            label { "created before " input name="created_before" value=(filters.created_before); }
            label { "id " input name="id" value=(filters.id); }
            label { "dispatch key " input name="dispatch_key" value=(filters.dispatch_key); }
            label { "ordering key " input name="ordering_key" value=(filters.ordering_key); }
            button #apply type="submit" { "Filter" }
        }
    }
}

fn table(viewer: &Viewer, order: PageOrder, rows: &[OutboxEvent]) -> Markup {
    let handed_off = order == PageOrder::Processed;
    let time = |at: Option<DateTime<Utc>>| {
        at.map_or_else(
            || "-".to_owned(),
            |at| at.format("%Y-%m-%d %H:%M:%S").to_string(),
        )
    };
    html! {
        table #events {
            thead { tr {
                th { "created (UTC)" } @if handed_off { th { "handed off (UTC)" } } th { "id" } th { "status" } th { "tenant" }
                th { "event type" } th.num { "retries" } th { "queue / last error" }
            } }
            tbody {
                @for row in rows {
                    tr {
                        td { (time(Some(row.created_at))) }
                        @if handed_off { td { (time(row.processed_at)) } }
                        td { a.event-link href=(viewer.base.to(&format!("/events/{}", row.id))) { (row.id.to_string()) } }
                        td { span class=(format!("status {}", row.status)) { (row.status.as_str()) } }
                        td { (row.tenant_id) }
                        td { (row.event_type) }
                        td.num { (row.retries) }
                        td {
                            (row.last_error.as_deref().map(outbox_queue::redact_urls_in)
                                .or_else(|| row.target_queue.clone())
                                .unwrap_or_else(|| "-".to_owned()))
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_fields_become_the_stores_filter_and_wrong_ones_are_named() {
        let filters = Filters {
            status: "failed".into(),
            created_after: "2026-12-05T10:00".into(),
            tenant: "  ".into(),
            ..Filters::default()
        };
        let selection = filters.selection().unwrap();
        assert_eq!(selection.statuses, [OutboxStatus::Failed]);
        assert_eq!(
            selection.created_after.map(|t| t.to_rfc3339()),
            Some("2026-12-05T10:00:00+00:00".into())
        );
        assert_eq!(selection.tenant, None);
        let wrong = Filters {
            id: "42".into(),
            ..Filters::default()
        };
        assert!(wrong.selection().unwrap_err().contains("not a UUID"));
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }
}
