//! The events no routing rule matched, for `outbox health`: those waiting
//! for a route (within `OUTBOX_UNROUTED_GRACE_SECONDS`) and those `FAILED
//! (unrouted)`, which a dispatcher with a route for their type requeues on
//! its own.

use outbox_store::UnroutedType;
use serde::Serialize;

/// The unrouted events by type, and the alerts they raise.
#[derive(Debug, Serialize)]
pub(crate) struct Unrouted {
    /// Per event type: waiting and failed.
    pub(crate) by_type: Vec<ByType>,
    /// One per type with `FAILED (unrouted)` events.
    pub(crate) alerts: Vec<String>,
}

/// The events of one type that no route matched.
#[derive(Debug, Serialize)]
pub(crate) struct ByType {
    pub(crate) event_type: String,
    pub(crate) waiting: i64,
    pub(crate) failed: i64,
}

impl Unrouted {
    /// Waiting events are expected during a rolling deploy: no alert. A
    /// `FAILED (unrouted)` event outlived its grace period: no running
    /// dispatcher has a route for its type.
    pub(crate) fn from_types(types: Vec<UnroutedType>) -> Self {
        let alerts = types
            .iter()
            .filter(|t| t.failed > 0)
            .map(|t| {
                format!(
                    "{} event(s) of type {} FAILED (unrouted): no dispatcher has a route for it; add one (they are then handed off on their own)",
                    t.failed, t.event_type
                )
            })
            .collect();
        let by_type = types
            .into_iter()
            .map(|t| ByType {
                event_type: t.event_type,
                waiting: t.waiting,
                failed: t.failed,
            })
            .collect();
        Self { by_type, alerts }
    }
}

/// Prints the table (nothing when no event is unrouted) and the alerts.
pub(crate) fn print(unrouted: &Unrouted) {
    if unrouted.by_type.is_empty() {
        println!("events without a route: none");
        return;
    }
    println!(
        "{:<48} {:>8} {:>8}",
        "EVENT TYPE WITHOUT A ROUTE", "WAITING", "FAILED"
    );
    for t in &unrouted.by_type {
        println!("{:<48} {:>8} {:>8}", t.event_type, t.waiting, t.failed);
    }
    for alert in &unrouted.alerts {
        println!("ALERT: {alert}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(event_type: &str, waiting: i64, failed: i64) -> UnroutedType {
        UnroutedType {
            event_type: event_type.to_owned(),
            waiting,
            failed,
        }
    }

    #[test]
    fn only_failed_unrouted_events_raise_an_alert_naming_their_type() {
        let unrouted = Unrouted::from_types(vec![t("reports.a.b", 3, 0), t("legacy.c.d", 1, 2)]);
        assert_eq!(unrouted.by_type.len(), 2);
        assert_eq!(unrouted.alerts.len(), 1, "{:?}", unrouted.alerts);
        assert!(
            unrouted.alerts[0].starts_with("2 event(s) of type legacy.c.d FAILED (unrouted)"),
            "{}",
            unrouted.alerts[0]
        );
    }
}
