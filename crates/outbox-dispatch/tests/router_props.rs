//! Property tests of the routing table: `Router::route` answers for any
//! string, the longest matching prefix wins (checked against a brute-force
//! search over the rules as they were added), `with_rule` accepts exactly
//! the documented prefixes (and whole event types) and queue names, and the standard table routes
//! as the contract says.

use std::collections::BTreeMap;

use outbox_dispatch::{RouteError, Router};
use outbox_model::EventType;
use proptest::prelude::*;

/// The contract's routing table, written out here rather than read from the
/// crate: prefix → queue.
const CONTRACT: [(&str, &str); 14] = [
    ("tenant.subscription.", "outbox.notification"),
    ("mail.", "outbox.mail"),
    ("webhook.", "outbox.webhook"),
    ("notification.", "outbox.notification"),
    ("audit.", "outbox.audit"),
    ("workflow.", "outbox.workflow"),
    ("search.index.", "outbox.search-index"),
    ("rag.index.", "outbox.rag-index"),
    ("ai.cost.", "outbox.ai-cost"),
    ("marketing.lead.", "outbox.marketing"),
    ("form.submission.", "outbox.form-submission-route"),
    ("billing.", "outbox.notification"),
    ("plugin.hook.", "outbox.plugin-hook"),
    ("plugin.capability-use.", "outbox.plugin-capability-use"),
];

fn contract_rules() -> Vec<(String, String)> {
    CONTRACT
        .iter()
        .map(|(prefix, queue)| ((*prefix).to_owned(), (*queue).to_owned()))
        .collect()
}

/// The brute-force answer: among all rules whose prefix starts
/// `event_type` (or whose whole event type is it), the queue of the
/// longest one.
fn reference_route(rules: &[(String, String)], event_type: &str) -> Option<String> {
    let mut best: Option<&(String, String)> = None;
    for rule in rules {
        let matches = if rule.0.ends_with('.') {
            event_type.starts_with(rule.0.as_str())
        } else {
            event_type == rule.0
        };
        if matches && best.is_none_or(|b| rule.0.len() > b.0.len()) {
            best = Some(rule);
        }
    }
    best.map(|(_, queue)| queue.clone())
}

/// A segment as the documentation defines it: `[a-z][a-z0-9-]*`.
fn is_segment(text: &str) -> bool {
    let mut bytes = text.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// "One or more event-type segments followed by a dot", or "a whole
/// event type".
fn is_valid_prefix(prefix: &str) -> bool {
    match prefix.strip_suffix('.') {
        Some(body) => body.split('.').all(is_segment),
        None => EventType::parse(prefix).is_ok(),
    }
}

/// "Two or more dot-separated lowercase segments of [a-z0-9-]", at most 200
/// bytes.
fn is_valid_queue(queue: &str) -> bool {
    queue.len() <= 200 && queue.split('.').count() >= 2 && queue.split('.').all(is_segment)
}

/// Segments that overlap on purpose (`a` starts `ab` and `a-b`), plus words
/// of the contract table and near misses of them.
fn word() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "a",
        "b",
        "ab",
        "a-b",
        "x1",
        "mail",
        "mailbox",
        "tenant",
        "subscription",
        "search",
        "index",
        "plugin",
        "hook",
        "capability-use",
        "capability",
        "billing",
        "ai",
        "cost",
        "form",
        "submission",
    ])
    .prop_map(str::to_owned)
}

/// A valid routing prefix over [`word`]: one to three segments and a dot.
fn prefix() -> impl Strategy<Value = String> {
    prop::collection::vec(word(), 1..=3).prop_map(|segments| segments.join(".") + ".")
}

/// A valid queue name, occasionally long.
fn queue() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9-]{0,6}\\.[a-z][a-z0-9-]{0,6}",
        "q\\.[a-z]{1,150}",
    ]
}

/// Strings to route: event types over [`word`] (valid or not), prefixes
/// with a piece cut off or added, and anything at all.
fn event_type_like() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(word(), 0..=5).prop_map(|segments| segments.join(".")),
        2 => (prefix(), "[a-z.]{0,3}|\\PC{0,3}").prop_map(|(prefix, tail)| prefix + &tail),
        1 => (prefix(), any::<prop::sample::Index>()).prop_map(|(prefix, at)| {
            let cut = at.index(prefix.len() + 1);
            prefix[..cut].to_owned()
        }),
        1 => any::<String>(),
        1 => "\\PC{0,40}",
    ]
}

/// Adds `rules` one by one as an application would, checking every answer
/// of `with_rule` on valid input: accepted, or a collision that names the
/// rule holding the prefix and leaves the table as it was. Returns the
/// table and the rules it holds, in the order they were accepted.
fn build(
    mut router: Router,
    mut held: Vec<(String, String)>,
    rules: &[(String, String)],
) -> Result<(Router, Vec<(String, String)>), TestCaseError> {
    for (prefix, queue) in rules {
        let existing = held
            .iter()
            .find(|(p, _)| p == prefix)
            .map(|(_, q)| q.clone());
        match (router.clone().with_rule(prefix, queue), existing) {
            (Ok(extended), None) => {
                router = extended;
                held.push((prefix.clone(), queue.clone()));
            }
            (
                Err(RouteError::Collision {
                    prefix: p,
                    existing: e,
                    queue: q,
                }),
                Some(existing),
            ) => {
                prop_assert_eq!((&p, &e, &q), (prefix, &existing, queue));
            }
            (answer, existing) => {
                return Err(TestCaseError::fail(format!(
                    "with_rule({prefix:?}, {queue:?}) gave {answer:?}; rule held: {existing:?}"
                )));
            }
        }
    }
    Ok((router, held))
}

/// The table's views match the rules it holds.
fn check_views(router: &Router, held: &[(String, String)]) -> Result<(), TestCaseError> {
    let expected: BTreeMap<&str, &str> =
        held.iter().map(|(p, q)| (p.as_str(), q.as_str())).collect();
    prop_assert_eq!(router.rules(), expected);
    let mut queues: Vec<&str> = held.iter().map(|(_, q)| q.as_str()).collect();
    queues.sort_unstable();
    queues.dedup();
    prop_assert_eq!(router.queues(), queues);
    Ok(())
}

/// Every string routes as the brute force says: the `event_types` as they
/// are, and each of the `tails` after the prefix of a rule the table holds
/// (where a longer rule may take over).
fn check_routes(
    router: &Router,
    held: &[(String, String)],
    event_types: &[String],
    tails: &[(prop::sample::Index, String)],
) -> Result<(), TestCaseError> {
    let after_prefixes = tails.iter().filter(|_| !held.is_empty()).map(|(at, tail)| {
        let (prefix, _) = &held[at.index(held.len())];
        format!("{prefix}{tail}")
    });
    for event_type in event_types.iter().cloned().chain(after_prefixes) {
        prop_assert_eq!(
            router.route(&event_type).map(str::to_owned),
            reference_route(held, &event_type),
            "{:?} with rules {:?}",
            event_type,
            held
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any table built from overlapping prefixes routes any string to the
    /// queue of its longest matching prefix, or nowhere.
    #[test]
    fn longest_prefix_wins(
        rules in prop::collection::vec((prefix(), queue()), 0..12),
        event_types in prop::collection::vec(event_type_like(), 1..24),
        tails in prop::collection::vec((any::<prop::sample::Index>(), event_type_like()), 1..12),
    ) {
        let (router, held) = build(Router::empty(), Vec::new(), &rules)?;
        check_views(&router, &held)?;
        check_routes(&router, &held, &event_types, &tails)?;
    }

    /// The standard table extended by an application: contract rules keep
    /// their prefixes (collisions are refused), longer prefixes win.
    #[test]
    fn extended_standard_table_routes_by_longest_prefix(
        rules in prop::collection::vec((prefix(), queue()), 0..8),
        event_types in prop::collection::vec(event_type_like(), 1..24),
        tails in prop::collection::vec((any::<prop::sample::Index>(), event_type_like()), 1..12),
    ) {
        let (router, held) = build(outbox_catalog::standard_router().unwrap(), contract_rules(), &rules)?;
        check_views(&router, &held)?;
        check_routes(&router, &held, &event_types, &tails)?;
    }

    /// The standard table routes every string by the contract; a valid event
    /// type that starts with a contract prefix goes to that prefix's queue.
    #[test]
    fn standard_table_routes_by_the_contract(
        which in 0..CONTRACT.len(),
        tail in prop::collection::vec("[a-z][a-z0-9-]{0,10}", 1..=4),
        other in event_type_like(),
    ) {
        let router = outbox_catalog::standard_router().unwrap();
        check_views(&router, &contract_rules())?;

        let (prefix, queue) = CONTRACT[which];
        // Enough segments after the prefix to make a valid event type.
        let mut tail = tail;
        while prefix.matches('.').count() + tail.len() < 3 {
            tail.push("verb".to_owned());
        }
        let event_type = format!("{prefix}{}", tail.join("."));
        prop_assert!(EventType::parse(event_type.as_str()).is_ok(), "{:?}", event_type);
        prop_assert_eq!(router.route(&event_type), Some(queue), "{:?}", event_type);

        prop_assert_eq!(
            router.route(&other).map(str::to_owned),
            reference_route(&contract_rules(), &other),
            "{:?}", other
        );
        prop_assert_eq!(router.rules().len(), contract_rules().len());
    }

    /// `with_rule` on any strings: accepts exactly a valid prefix with a
    /// valid queue; refuses the prefix first, then the queue, then a
    /// collision.
    #[test]
    fn with_rule_accepts_exactly_the_documented_names(
        prefix in prop_oneof![3 => prefix(), 1 => "[a-z0-9A-Z._-]{0,8}", 1 => any::<String>()],
        queue in prop_oneof![
            2 => queue(),
            1 => "[a-z0-9A-Z. -]{0,12}",
            // 198 to 201 bytes, around the 200-byte limit.
            2 => "[a-z]\\.[a-z]{196,199}",
            1 => any::<String>(),
        ],
    ) {
        let standard: BTreeMap<&str, &str> = CONTRACT.into_iter().collect();
        let expected = if !is_valid_prefix(&prefix) {
            Err(RouteError::InvalidPrefix(prefix.clone()))
        } else if !is_valid_queue(&queue) {
            Err(RouteError::InvalidQueue(queue.clone()))
        } else if let Some(existing) = standard.get(prefix.as_str()) {
            Err(RouteError::Collision {
                prefix: prefix.clone(),
                existing: (*existing).to_owned(),
                queue: queue.clone(),
            })
        } else {
            Ok(())
        };
        let answer = outbox_catalog::standard_router().unwrap().with_rule(&prefix, &queue);
        prop_assert_eq!(answer.as_ref().map(|_| ()).map_err(Clone::clone), expected);
        if let Ok(router) = answer {
            let routed = if prefix.ends_with('.') { format!("{prefix}x.y") } else { prefix.clone() };
            prop_assert_eq!(router.route(&routed), Some(queue.as_str()));
        }
    }
}
