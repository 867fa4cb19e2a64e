//! Routing rules from a TOML file, added to the routing table without
//! code ([`Router::with_routes_file`]). The binaries read the file named by
//! `OUTBOX_ROUTES_FILE` once at start and refuse to start on any error, as
//! for a rule added in code.
//!
//! ```toml
//! [[route]]
//! prefix = "orders."
//! queue = "app.orders"
//! ```
//!
//! The same file may hold `[[schedule]]` tables (periodic events), which
//! the worker reads; this reader passes over them.

use serde::Deserialize;

use crate::{RouteError, Router};

/// `OUTBOX_ROUTES_FILE`: the file of [`Router::with_routes_file`].
pub const OUTBOX_ROUTES_FILE: outbox_env::Text = outbox_env::Text {
    name: "OUTBOX_ROUTES_FILE",
    default: "unset (the standard table only)",
    form: "a path to a TOML file of [[route]] tables (prefix, queue) and [[schedule]] tables (name, cron, zone, tenant, event_type, payload, missed)",
    meaning: "routing rules added to the standard table, and periodic events, validated at start",
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutesFile {
    #[serde(default)]
    route: Vec<Rule>,
    /// Periodic events (`[[schedule]]` tables), read and checked by the
    /// worker (`outbox_worker::schedules_from_file`), not here.
    #[serde(default, rename = "schedule")]
    _schedules: Vec<toml::Table>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    prefix: String,
    queue: String,
}

/// Why a routes file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RoutesFileError {
    /// The text is not TOML of the expected form (`[[route]]` tables with
    /// `prefix` and `queue`, nothing else).
    #[error("not a routes file: {0}")]
    Parse(String),
    /// A rule is refused as [`Router::with_rule`] refuses it.
    #[error("route #{index}: {source}")]
    Rule {
        /// The rule's position in the file, from 1.
        index: usize,
        /// Why it is refused (it names the prefix or queue).
        source: Box<RouteError>,
    },
}

impl Router {
    /// This table plus the rules of the routes file `text`, validated like
    /// [`Router::with_rule`] (a prefix already taken, by the standard table
    /// or an earlier rule of the file, is refused).
    ///
    /// # Errors
    ///
    /// [`RoutesFileError::Parse`] for text of another form,
    /// [`RoutesFileError::Rule`] for the first refused rule.
    pub fn with_routes_file(self, text: &str) -> Result<Self, RoutesFileError> {
        let file: RoutesFile =
            toml::from_str(text).map_err(|e| RoutesFileError::Parse(e.message().to_owned()))?;
        file.route
            .into_iter()
            .enumerate()
            .try_fold(self, |router, (i, rule)| {
                router
                    .with_rule(&rule.prefix, &rule.queue)
                    .map_err(|source| RoutesFileError::Rule {
                        index: i + 1,
                        source: Box::new(source),
                    })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rules of the contract's table.
    fn base() -> Router {
        Router::empty()
            .with_rule("mail.", "outbox.mail")
            .and_then(|router| router.with_rule("search.index.", "outbox.search-index"))
            .unwrap()
    }

    #[test]
    fn a_routes_file_adds_rules_and_is_validated_like_code() {
        let router = base()
            .with_routes_file(
                "[[route]]\nprefix = \"orders.\"\nqueue = \"app.orders\"\n\n[[route]]\nprefix = \"search.index.product.\"\nqueue = \"app.products\"\n",
            )
            .unwrap();
        assert_eq!(router.route("orders.order.shipped"), Some("app.orders"));
        assert_eq!(
            router.route("search.index.product.updated"),
            Some("app.products")
        );
        assert_eq!(router.route("mail.user.welcome"), Some("outbox.mail"));
        assert_eq!(base().with_routes_file(""), Ok(base()));
        assert_eq!(
            base().with_routes_file("[[schedule]]\nname = \"n\"\ncron = \"* * * * * *\"\n"),
            Ok(base())
        );

        let taken = base()
            .with_routes_file("[[route]]\nprefix = \"mail.\"\nqueue = \"app.mail\"\n")
            .unwrap_err();
        assert!(
            matches!(&taken, RoutesFileError::Rule { index: 1, source } if matches!(**source, RouteError::Collision { .. })),
            "{taken}"
        );
        for bad in [
            "[[route]]\nprefix = \"orders\"\nqueue = \"app.orders\"\n",
            "[[route]]\nprefix = \"orders.\"\nqueue = \"orders\"\n",
        ] {
            assert!(
                matches!(
                    base().with_routes_file(bad),
                    Err(RoutesFileError::Rule { .. })
                ),
                "{bad}"
            );
        }
        for bad in [
            "[[route]]\nprefix = \"orders.\"\n",
            "[[route]]\nprefix = \"orders.\"\nqueue = \"app.orders\"\nweight = 2\n",
            "route = 1",
            "not toml at all",
        ] {
            assert!(
                matches!(base().with_routes_file(bad), Err(RoutesFileError::Parse(_))),
                "{bad}"
            );
        }
    }
}
