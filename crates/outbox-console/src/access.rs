//! Who may use the console: roles, identities, the tokens of
//! `OUTBOX_CONSOLE_TOKENS` and the application's own hook.

use std::fmt;
use std::sync::Arc;

use axum::http::request::Parts;
use sha2::{Digest, Sha256};

/// What an identity may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Sees every page; every action is refused (403).
    Reader,
    /// Sees every page and may act (requeue).
    Operator,
}

impl Role {
    /// `reader` or `operator`, as written in `OUTBOX_CONSOLE_TOKENS`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Reader => "reader",
            Self::Operator => "operator",
        }
    }

    fn parse(raw: &str) -> Option<Self> {
        match raw {
            "reader" => Some(Self::Reader),
            "operator" => Some(Self::Operator),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Someone the console let in: a name (recorded as the actor of what they
/// do) and a role.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// Who: the token's name, or the application's user.
    pub name: String,
    /// What they may do.
    pub role: Role,
}

impl Identity {
    /// An identity named `name` with `role`.
    #[must_use]
    pub fn new(name: impl Into<String>, role: Role) -> Self {
        Self {
            name: name.into(),
            role,
        }
    }

    /// What the history records as who asked: `console:<name> (<role>)`.
    #[must_use]
    pub fn actor(&self) -> String {
        format!("console:{} ({})", self.name, self.role)
    }
}

/// The embedding application's authentication: maps a request (its
/// headers, its extensions set by the application's own middleware) to an
/// identity, or `None` to leave it to the console's tokens. Any
/// `Fn(&Parts) -> Option<Identity>` is one.
///
/// ```
/// use outbox_console::{Identity, Role};
/// // Every request the application's middleware marked as an admin's.
/// let hook = |parts: &axum::http::request::Parts| {
///     parts.headers.get("x-admin-user")
///         .and_then(|v| v.to_str().ok())
///         .map(|user| Identity::new(user, Role::Operator))
/// };
/// # fn takes(_: impl outbox_console::Authorize) {}
/// takes(hook);
/// ```
pub trait Authorize: Send + Sync + 'static {
    /// Who sent `request`, if the application knows.
    fn authorize(&self, request: &Parts) -> Option<Identity>;
}

impl<F> Authorize for F
where
    F: Fn(&Parts) -> Option<Identity> + Send + Sync + 'static,
{
    fn authorize(&self, request: &Parts) -> Option<Identity> {
        self(request)
    }
}

/// A role that is not one, as an error may repeat it: quoted when it is a
/// short word (`"admin"`), else not at all, since it may be a token.
fn shown_role(role: &str) -> String {
    if role.len() <= 12 && role.chars().all(|c| c.is_ascii_alphabetic()) {
        format!("{role:?}")
    } else {
        "given (not shown: it may be a token)".to_owned()
    }
}

/// The shortest token accepted: shorter ones are guessed too easily.
pub const MIN_TOKEN_LEN: usize = 16;

/// Why `OUTBOX_CONSOLE_TOKENS` was refused. No message repeats a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// An entry is not `[name=]role:token`.
    #[error("entry {entry} is not [name=]role:token")]
    Form {
        /// Its position, from 1.
        entry: usize,
    },
    /// The role is neither `reader` nor `operator`.
    #[error("entry {entry}: the role {role} is neither reader nor operator")]
    Role {
        /// Its position, from 1.
        entry: usize,
        /// The role given, quoted, when it is a short word; otherwise a
        /// note that it is not shown (an entry written the wrong way round,
        /// `token:role`, has its token where the role should be).
        role: String,
    },
    /// The token is shorter than [`MIN_TOKEN_LEN`].
    #[error("entry {entry}: a token must be at least {MIN_TOKEN_LEN} characters long")]
    Short {
        /// Its position, from 1.
        entry: usize,
    },
    /// Two entries have the same token.
    #[error("entries {first} and {second} have the same token")]
    Repeated {
        /// The first.
        first: usize,
        /// The second.
        second: usize,
    },
}

/// The tokens that let people in, each with a name and a role. Only their
/// SHA-256 digests are kept; `Debug` shows names and roles.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Arc<Vec<(Identity, [u8; 32])>>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|(who, _)| who))
            .finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Parses `OUTBOX_CONSOLE_TOKENS`: comma-separated `[name=]role:token`
    /// entries (`ana=operator:…,reader:…`); the name defaults to the role.
    /// Spaces around entries are ignored; an empty text gives no tokens.
    ///
    /// # Errors
    ///
    /// The first [`TokenError`]; the message names the entry by position,
    /// never by its token.
    pub fn parse(raw: &str) -> Result<Self, TokenError> {
        let mut entries: Vec<(Identity, [u8; 32])> = Vec::new();
        for (i, entry) in raw.split(',').map(str::trim).enumerate() {
            let entry_no = i + 1;
            if entry.is_empty() {
                continue;
            }
            let (who, token) = entry
                .split_once(':')
                .ok_or(TokenError::Form { entry: entry_no })?;
            // The sign-in form trims what is typed: a token kept with the
            // space after its colon (`operator: token`) could never sign in.
            let token = token.trim();
            let (name, role) = who.split_once('=').unwrap_or((who, who));
            let role = Role::parse(role.trim()).ok_or_else(|| TokenError::Role {
                entry: entry_no,
                role: shown_role(role.trim()),
            })?;
            let name = name.trim();
            if name.is_empty() {
                return Err(TokenError::Form { entry: entry_no });
            }
            if token.chars().count() < MIN_TOKEN_LEN {
                return Err(TokenError::Short { entry: entry_no });
            }
            let hash = digest(token);
            if let Some(first) = entries.iter().position(|(_, h)| *h == hash) {
                return Err(TokenError::Repeated {
                    first: first + 1,
                    second: entry_no,
                });
            }
            entries.push((Identity::new(name, role), hash));
        }
        Ok(Self {
            entries: Arc::new(entries),
        })
    }

    /// True when there are no tokens.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The identity `token` stands for. Digests are compared, so the time
    /// taken says nothing about how much of a token was right.
    #[must_use]
    pub fn identify(&self, token: &str) -> Option<Identity> {
        let hash = digest(token);
        self.entries
            .iter()
            .find(|(_, h)| *h == hash)
            .map(|(who, _)| who.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_with_and_without_names() {
        let tokens =
            Tokens::parse(" ana=operator:0123456789abcdef , reader:fedcba9876543210 ").unwrap();
        assert_eq!(
            tokens.identify("0123456789abcdef"),
            Some(Identity::new("ana", Role::Operator))
        );
        assert_eq!(
            tokens.identify("fedcba9876543210"),
            Some(Identity::new("reader", Role::Reader))
        );
        assert_eq!(tokens.identify("0123456789abcdeF"), None);
        assert!(Tokens::parse("").unwrap().is_empty());
    }

    #[test]
    fn a_token_written_with_spaces_around_it_signs_in_as_typed() {
        let tokens = Tokens::parse("ana=operator: 0123456789abcdef ").unwrap();
        assert!(tokens.identify("0123456789abcdef").is_some());
    }

    #[test]
    fn bad_entries_are_named_by_position_never_by_token() {
        let cases = [
            ("reader", TokenError::Form { entry: 1 }),
            (
                "reader:0123456789abcdef,admin:0123456789abcdeX",
                TokenError::Role {
                    entry: 2,
                    role: "\"admin\"".into(),
                },
            ),
            (
                "0123456789abcdef:operator",
                TokenError::Role {
                    entry: 1,
                    role: "given (not shown: it may be a token)".into(),
                },
            ),
            ("operator:short-token", TokenError::Short { entry: 1 }),
            (
                "reader:0123456789abcdef,operator:0123456789abcdef",
                TokenError::Repeated {
                    first: 1,
                    second: 2,
                },
            ),
            ("=reader:0123456789abcdef", TokenError::Form { entry: 1 }),
        ];
        for (raw, expected) in cases {
            let refused = Tokens::parse(raw).unwrap_err();
            assert_eq!(refused, expected, "{raw}");
            assert!(!refused.to_string().contains("0123456789abcdef"));
        }
    }

    #[test]
    fn debug_output_shows_names_and_roles_only() {
        let tokens = Tokens::parse("ana=operator:0123456789abcdef").unwrap();
        let shown = format!("{tokens:?}");
        assert!(shown.contains("ana") && !shown.contains("0123456789abcdef"));
    }
}
