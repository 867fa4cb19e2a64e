//! The block registry: every block id there is, and what each can do (the
//! capability matrix), in one place.
//!
//! [`BlockKind`] lists the ids; [`BlockKind::spec`] is the matrix, one `match`
//! arm per block, so a new block does not compile until its capabilities are
//! stated. The typed parameters of each block are in [`crate::BlockParams`],
//! whose `kind` is an exhaustive `match` over the same enum.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Declares [`BlockKind`] with its ids once: the variants, [`BlockKind::ALL`]
/// and [`BlockKind::id`] come from the same list, so none can miss a block.
macro_rules! block_kinds {
    ($($(#[$doc:meta])* $variant:ident = $id:literal,)+) => {
        /// The type of a block: its id in a definition (`"type": "httpRequest"`).
        ///
        /// Serialized as the id. Ids the registry does not know (among them
        /// `mail`, `webhook`, `notification`, `audit`, `delay` and
        /// `schedule`, which do not exist: use `email`, `httpRequest`, …)
        /// are refused with [`UnknownBlockType`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum BlockKind {
            $($(#[$doc])* $variant,)+
        }

        impl BlockKind {
            /// Every block of the registry, triggers first.
            pub const ALL: &'static [BlockKind] = &[$(BlockKind::$variant,)+];

            /// The block's id, as written in a definition.
            #[must_use]
            pub const fn id(self) -> &'static str {
                match self {
                    $(BlockKind::$variant => $id,)+
                }
            }
        }
    };
}

block_kinds! {
    /// Trigger: started by a person (a "run" button); the input is what they
    /// submitted.
    ManualTrigger = "manualTrigger",
    /// Trigger: started through the tenant API; the input is the request body.
    ApiTrigger = "apiTrigger",
    /// Trigger: started by an application event on an entity (`row.created`
    /// on `order`, or a custom event); the input is the event payload.
    EventTrigger = "eventTrigger",
    /// Two-way branch on a [`crate::Condition`]: outputs `true` and `false`.
    If = "if",
    /// Many-way branch: the first case whose condition holds, else `default`.
    Switch = "switch",
    /// Sends a mail (inline text/HTML, or a named mail template).
    Email = "email",
    /// Calls an HTTP endpoint (the outbound and webhook-style block).
    HttpRequest = "httpRequest",
    /// Reads one row of an entity by id.
    RowGet = "rowGet",
    /// Creates a row of an entity.
    RowCreate = "rowCreate",
    /// Updates a row of an entity by id.
    RowUpdate = "rowUpdate",
    /// Deletes a row of an entity by id.
    RowDelete = "rowDelete",
    /// Pauses the run until someone answers (`input`) or time runs out
    /// (`timeout`).
    WaitForInput = "waitForInput",
    /// Writes a line to the execution log.
    Log = "log",
    /// Sets a workflow variable (`vars.<name>`).
    Variable = "variable",
    /// Runs user code: only the signed HTTP bridge can.
    Code = "code",
    /// Calls an AI model with a tenant credential: only the signed HTTP
    /// bridge can.
    AiAgent = "aiAgent",
}

/// Whether a block uses a tenant credential (an API key, a token) that the
/// executor must resolve by id before the block runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CredentialUse {
    /// Never: the block has no credential parameter.
    None,
    /// Only when its parameters name one (`httpRequest`'s `credentialId`,
    /// e.g. for an `Authorization` header).
    Optional,
    /// Always: its `credentialId` parameter is required (`aiAgent`).
    Required,
}

/// How a block's outputs (the labels its outgoing edges may carry) are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputShape {
    /// One output, [`labels::NEXT`].
    Next,
    /// [`labels::TRUE`] and [`labels::FALSE`] (`if`).
    TrueFalse,
    /// One output per case label, then [`labels::DEFAULT`] (`switch`).
    SwitchCases,
    /// [`labels::INPUT`], and [`labels::TIMEOUT`] when the block has a
    /// timeout (`waitForInput`).
    InputOrTimeout,
}

/// The output labels the registry itself defines. A `switch` adds its own
/// case labels.
pub mod labels {
    /// The single output of most blocks; an edge without a label means it.
    pub const NEXT: &str = "next";
    /// `if`: the condition holds.
    pub const TRUE: &str = "true";
    /// `if`: the condition does not hold.
    pub const FALSE: &str = "false";
    /// `switch`: no case matched.
    pub const DEFAULT: &str = "default";
    /// `waitForInput`: the answer arrived.
    pub const INPUT: &str = "input";
    /// `waitForInput`: the timeout passed first.
    pub const TIMEOUT: &str = "timeout";
}

/// What one block can do: a row of the capability matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockSpec {
    /// The block.
    pub kind: BlockKind,
    /// A trigger starts a workflow; a definition has exactly one, and no edge
    /// leads into it.
    pub is_trigger: bool,
    /// The native (in-worker) runner can execute it. Blocks that cannot
    /// (`code`, `aiAgent`) need the signed HTTP bridge.
    pub runs_natively: bool,
    /// Whether it uses a tenant credential.
    pub credentials: CredentialUse,
    /// Its outputs.
    pub outputs: OutputShape,
}

impl BlockSpec {
    /// True when the block cannot run without a credential
    /// ([`CredentialUse::Required`]).
    #[must_use]
    pub const fn needs_credentials(&self) -> bool {
        matches!(self.credentials, CredentialUse::Required)
    }
}

impl BlockKind {
    /// The block's row of the capability matrix.
    ///
    /// `waitForInput` runs natively: the native runner suspends the execution
    /// there and resumes it on `workflow.execution.continue.requested`.
    /// `httpRequest` may name a credential (optional); `aiAgent` must.
    #[must_use]
    pub const fn spec(self) -> BlockSpec {
        use CredentialUse as C;
        use OutputShape as O;
        let (is_trigger, runs_natively, credentials, outputs) = match self {
            Self::ManualTrigger | Self::ApiTrigger | Self::EventTrigger => {
                (true, true, C::None, O::Next)
            }
            Self::If => (false, true, C::None, O::TrueFalse),
            Self::Switch => (false, true, C::None, O::SwitchCases),
            Self::Email => (false, true, C::None, O::Next),
            Self::HttpRequest => (false, true, C::Optional, O::Next),
            Self::RowGet | Self::RowCreate | Self::RowUpdate | Self::RowDelete => {
                (false, true, C::None, O::Next)
            }
            Self::WaitForInput => (false, true, C::None, O::InputOrTimeout),
            Self::Log | Self::Variable => (false, true, C::None, O::Next),
            Self::Code => (false, false, C::None, O::Next),
            Self::AiAgent => (false, false, C::Required, O::Next),
        };
        BlockSpec {
            kind: self,
            is_trigger,
            runs_natively,
            credentials,
            outputs,
        }
    }

    /// Shorthand for `spec().is_trigger`.
    #[must_use]
    pub const fn is_trigger(self) -> bool {
        self.spec().is_trigger
    }

    /// Shorthand for `spec().runs_natively`.
    #[must_use]
    pub const fn runs_natively(self) -> bool {
        self.spec().runs_natively
    }

    /// Shorthand for `spec().needs_credentials()`.
    #[must_use]
    pub const fn needs_credentials(self) -> bool {
        self.spec().needs_credentials()
    }
}

/// A block type the registry does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown block type {name:?}")]
pub struct UnknownBlockType {
    /// The type as written.
    pub name: String,
}

impl FromStr for BlockKind {
    type Err = UnknownBlockType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|kind| kind.id() == s)
            .ok_or_else(|| UnknownBlockType { name: s.to_owned() })
    }
}

impl fmt::Display for BlockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

impl Serialize for BlockKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.id())
    }
}

impl<'de> Deserialize<'de> for BlockKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_parse_back() {
        for (i, kind) in BlockKind::ALL.iter().enumerate() {
            assert_eq!(kind.id().parse::<BlockKind>(), Ok(*kind));
            assert!(
                BlockKind::ALL[i + 1..].iter().all(|k| k.id() != kind.id()),
                "{kind} twice"
            );
            assert_eq!(kind.spec().kind, *kind);
        }
    }

    #[test]
    fn serde_uses_the_id() {
        let json = serde_json::to_string(&BlockKind::HttpRequest).unwrap();
        assert_eq!(json, "\"httpRequest\"");
        let back: BlockKind = serde_json::from_str("\"waitForInput\"").unwrap();
        assert_eq!(back, BlockKind::WaitForInput);
        let err = serde_json::from_str::<BlockKind>("\"mail\"").unwrap_err();
        assert!(
            err.to_string().contains("unknown block type \"mail\""),
            "{err}"
        );
    }

    #[test]
    fn triggers_come_first() {
        let first_action = BlockKind::ALL.iter().position(|k| !k.is_trigger()).unwrap();
        assert!(
            BlockKind::ALL[first_action..]
                .iter()
                .all(|k| !k.is_trigger())
        );
    }
}
