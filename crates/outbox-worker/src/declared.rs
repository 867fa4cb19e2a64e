//! Event types an application declares ([`crate::WorkerBuilder::typed`],
//! [`crate::WorkerBuilder::declare`]), checked against the routing table
//! at start: one that no rule matches stops the worker with its name,
//! instead of each such event becoming a FAILED ("unrouted") row later.

use outbox_dispatch::Router;

/// Event types the application declared that no routing rule matches: the
/// dispatcher would mark every such event FAILED. Stops start-up (exit
/// code 2, as a configuration error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no routing rule matches the event type(s) the application declares: {}; every such event would be marked FAILED (unrouted). Add a rule (WorkerBuilder::route, OUTBOX_ROUTES_FILE) or register its typed handler with WorkerBuilder::typed",
    .event_types.join(", ")
)]
pub struct UnroutedEventTypes {
    /// The unrouted event types, sorted, each once.
    pub event_types: Vec<String>,
}

/// The declared event types `router` routes nowhere.
///
/// # Errors
///
/// [`UnroutedEventTypes`] listing them, when there is any.
pub(crate) fn check(declared: &[&str], router: &Router) -> Result<(), UnroutedEventTypes> {
    let mut event_types: Vec<String> = declared
        .iter()
        .filter(|event_type| router.route(event_type).is_none())
        .map(|event_type| (*event_type).to_owned())
        .collect();
    event_types.sort_unstable();
    event_types.dedup();
    if event_types.is_empty() {
        Ok(())
    } else {
        Err(UnroutedEventTypes { event_types })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_declared_types_no_rule_matches_are_reported_sorted_and_once() {
        let router = Router::empty()
            .with_rule("billing.", "outbox.notification")
            .and_then(|r| r.with_rule("orders.order.created", "app.orders"))
            .unwrap();
        let cases: [(&[&str], Option<&[&str]>); 4] = [
            (&[], None),
            (&["billing.invoice.paid", "orders.order.created"], None),
            (
                &[
                    "orders.order.shipped",
                    "billing.invoice.paid",
                    "crm.lead.won",
                ],
                Some(&["crm.lead.won", "orders.order.shipped"]),
            ),
            (&["crm.lead.won", "crm.lead.won"], Some(&["crm.lead.won"])),
        ];
        for (declared, unrouted) in cases {
            let expected = unrouted.map(|types| UnroutedEventTypes {
                event_types: types.iter().map(|t| (*t).to_owned()).collect(),
            });
            assert_eq!(check(declared, &router).err(), expected, "{declared:?}");
        }
    }

    #[test]
    fn the_error_names_every_unrouted_type() {
        let error = UnroutedEventTypes {
            event_types: vec!["crm.lead.won".into(), "orders.order.shipped".into()],
        };
        assert!(
            error
                .to_string()
                .starts_with("no routing rule matches the event type(s) the application declares: crm.lead.won, orders.order.shipped;"),
            "{error}"
        );
    }
}
