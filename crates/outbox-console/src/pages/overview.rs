//! The overview: events by status and queue, the oldest due event, the
//! queues (dead jobs, workers) and the alerts, updated live over SSE.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use maud::{Markup, html};
use outbox_model::OutboxStatus;
use tokio::sync::Mutex;

use super::{Viewer, layout};
use crate::figures::{Figures, age, grouped, shown};
use crate::{Console, ConsoleError};

/// How often the live overview sends new figures.
pub const LIVE_EVERY: Duration = Duration::from_secs(2);

pub(crate) async fn page(
    State(console): State<Console>,
    viewer: Viewer,
) -> Result<Response, ConsoleError> {
    let figures = Figures::read(&console).await?;
    Ok(layout(&viewer, "Overview", body(&viewer, &figures)).into_response())
}

fn tile(label: &str, key: &str, value: String) -> Markup {
    html! {
        div.tile { span.label { (label) } span.value data-live=(key) { (value) } }
    }
}

fn body(viewer: &Viewer, figures: &Figures) -> Markup {
    let base = &viewer.base;
    let alerts = figures.alerts();
    html! {
        section.live data-live-url=(base.to("/live")) {
            p.muted { "Live: " span data-live-stamp { "connecting…" } }
        }
        section.tiles {
            @for status in OutboxStatus::ALL {
                a.tile-link href=(format!("{}?status={status}", base.to("/events"))) {
                    (tile(status.as_str(), &format!("total:{status}"), shown(figures.total(status))))
                }
            }
            (tile("due now", "due", grouped(figures.pending.due)))
            (tile("overdue (> 60 s)", "overdue", grouped(figures.pending.overdue)))
            (tile("oldest due", "oldest", age(figures.pending.oldest_due_age_secs)))
            @if let Some(dead) = figures.dead() { (tile("dead jobs", "dead", grouped(dead))) }
            @if let Some(workers) = figures.workers() { (tile("workers", "workers", grouped(workers))) }
        }
        section #alerts {
            h2 { "Alerts (" span data-live="alerts" { (alerts.len()) } ")" }
            @if alerts.is_empty() {
                p.ok { "None for these figures (the pending alert of outbox stats; the queues' and unrouted events' alerts of outbox health)." }
            } @else {
                ul.alerts { @for alert in &alerts { li { (alert) } } }
            }
        }
        section {
            h2 { "Events by status and queue" }
            @if figures.done.estimated {
                p.muted #estimated { "DONE events are estimated (\"about\") from the table's statistics, so that this page costs the same with millions of them; the other statuses are counted exactly." }
            }
            table #by-status {
                thead { tr { th { "status" } th { "queue" } th.num { "events" } } }
                tbody {
                    @for count in &figures.counts {
                        tr {
                            td { a href=(format!("{}?status={}", base.to("/events"), count.status)) { (count.status) } }
                            td { (count.queue) }
                            td.num data-live=(format!("count:{}:{}", count.status, count.queue)) { (grouped(count.n)) }
                        }
                    }
                    tr {
                        td { a href=(format!("{}?status=DONE", base.to("/events"))) { "DONE" } }
                        td.muted { "(every queue)" }
                        td.num #done-count data-live="total:DONE" { (shown(figures.done)) }
                    }
                }
            }
        }
        @if let Some(queues) = &figures.queues {
            section {
                h2 { "Queues" }
                table #queues {
                    thead { tr {
                        th { "queue" } th.num { "backlog" } th.num { "due" } th.num { "running" }
                        th.num { "dead" } th.num { "workers" } th.num { "stalled" } th { "alerts" }
                    } }
                    tbody {
                        @for queue in queues {
                            tr {
                                td { (queue.queue) }
                                td.num { (grouped(queue.stats.backlog)) }
                                td.num { (grouped(queue.stats.due)) }
                                td.num { (grouped(queue.stats.running)) }
                                td.num {
                                    @if queue.stats.dead > 0 {
                                        a.dead-link href=(base.to(&format!("/queues/{}/dead", queue.queue))) { (grouped(queue.stats.dead)) }
                                    } @else { (grouped(queue.stats.dead)) }
                                }
                                td.num { (grouped(queue.stats.workers)) }
                                td.num { (grouped(queue.stats.stalled_workers)) }
                                td { (queue.alerts.join("; ")) }
                            }
                        }
                    }
                }
            }
        } @else {
            p.muted { "Queues: this console was not given Redis, so backlogs, dead jobs and workers are not shown." }
        }
    }
}

/// The live figures of the last read, when it was made and how long it
/// took (an error as the page shows it), shared by every open overview.
pub(crate) type LiveCache = Arc<Mutex<Option<LastRead>>>;

/// One read of the live figures.
pub(crate) struct LastRead {
    at: Instant,
    took: Duration,
    figures: Result<LiveFigures, String>,
}

/// How long a read that took `took` is shared before the next: at least
/// [`LIVE_EVERY`], and ten times the read, so that watching the overview
/// never keeps the database busy more than a tenth of the time, whatever
/// the read costs.
fn shared_for(took: Duration) -> Duration {
    LIVE_EVERY.max(took.saturating_mul(10))
}

/// The live figures: `data-live` key → text.
type LiveFigures = BTreeMap<String, String>;

/// The overview's live figures, read at most once per [`shared_for`] the
/// last read's duration, whatever the number of open overviews: the first
/// stream to find the last read older than that reads again, the others
/// wait for it and share its result.
async fn live_figures(console: &Console) -> Result<LiveFigures, String> {
    let mut cached = console.inner.live.lock().await;
    if let Some(last) = cached.as_ref()
        && last.at.elapsed() < shared_for(last.took)
    {
        return last.figures.clone();
    }
    let started = Instant::now();
    let figures = Figures::read(console)
        .await
        .map(|figures| figures.live())
        .map_err(|e| outbox_queue::redact_urls_in(&e.to_string()));
    *cached = Some(LastRead {
        at: Instant::now(),
        took: started.elapsed(),
        figures: figures.clone(),
    });
    figures
}

/// `/live`: the overview's numbers every [`LIVE_EVERY`], as `figures`
/// events (a JSON object from `data-live` key to text); an `error` event
/// when they cannot be read.
pub(crate) async fn live(
    State(console): State<Console>,
    viewer: Viewer,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let session = viewer.session;
    let ticks = stream::unfold((console, true), move |(console, first)| {
        let session = session.clone();
        async move {
            if !first {
                tokio::select! {
                    () = tokio::time::sleep(LIVE_EVERY) => {}
                    () = console.inner.stop.cancelled() => return None,
                }
            }
            // A signed-out or expired session gets no more figures.
            if let Some(id) = &session
                && console.inner.sessions.identity(id).is_none()
            {
                return None;
            }
            let event = match live_figures(&console).await {
                Ok(figures) => Event::default()
                    .event("figures")
                    .json_data(figures)
                    .unwrap_or_else(|_| Event::default().event("error")),
                Err(e) => Event::default().event("error").data(e),
            };
            Some((Ok(event), (console, false)))
        }
    });
    Sse::new(ticks).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{LIVE_EVERY, shared_for};

    #[test]
    fn a_read_is_shared_for_two_seconds_or_ten_times_its_duration_whichever_is_longer() {
        assert_eq!(shared_for(Duration::from_millis(5)), LIVE_EVERY);
        assert_eq!(shared_for(Duration::from_millis(200)), LIVE_EVERY);
        assert_eq!(
            shared_for(Duration::from_millis(500)),
            Duration::from_secs(5)
        );
    }
}
