//! Parameters of the blocks only the signed HTTP bridge runs: `code` and
//! `aiAgent`.

use serde::{Deserialize, Serialize};

use super::{ParamError, Params, ensure};
use crate::{TextTemplate, VarPath};

/// The largest `code` source: 64 KiB.
pub const MAX_CODE_SOURCE_BYTES: usize = 64 * 1024;

/// The language of a `code` block: only `javascript` (what the sandbox,
/// `outbox-workflow-sandbox`, runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CodeLanguage {
    /// `javascript`.
    Javascript,
}

/// `code`: user JavaScript, run by the bridge's runner in its sandbox
/// (`outbox-workflow-sandbox`) with the execution context as input. Output: what
/// the code returns. Never native.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CodeParams {
    /// The language.
    pub language: CodeLanguage,
    /// The source: not empty, at most [`MAX_CODE_SOURCE_BYTES`].
    pub source: String,
}

impl Params for CodeParams {
    fn check(&self) -> Result<(), ParamError> {
        ensure(!self.source.trim().is_empty(), "source", "empty source")?;
        ensure(
            self.source.len() <= MAX_CODE_SOURCE_BYTES,
            "source",
            format!(
                "{} bytes; at most {MAX_CODE_SOURCE_BYTES} are allowed",
                self.source.len()
            ),
        )
    }
}

/// `aiAgent`: asks an AI model, with the tenant's credential for the
/// provider. Output: the model's answer. Never native; always needs its
/// credential.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AiAgentParams {
    /// The tenant credential of the model provider, by id.
    pub credential_id: String,
    /// The model, as the provider names it.
    pub model: String,
    /// The user prompt.
    pub prompt: TextTemplate,
    /// The system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<TextTemplate>,
    /// The most tokens to generate; the provider's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

impl Params for AiAgentParams {
    fn check(&self) -> Result<(), ParamError> {
        ensure(
            !self.credential_id.trim().is_empty(),
            "credentialId",
            "empty credential id",
        )?;
        ensure(!self.model.trim().is_empty(), "model", "empty model name")?;
        ensure(
            self.max_tokens != Some(0),
            "maxTokens",
            "must be at least 1",
        )
    }

    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        out.extend(self.prompt.placeholders());
        out.extend(self.system.iter().flat_map(TextTemplate::placeholders));
    }
}
