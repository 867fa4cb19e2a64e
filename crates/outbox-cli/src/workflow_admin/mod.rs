//! `outbox workflow validate | save | publish | versions | start | answer |
//! cancel`: workflows without Rust. One module per command, each its
//! arguments, the call into `outbox_workflow_store::admin` (or
//! `store::cancel_execution`) that does the work, and its rendering; what
//! they share is here: reading `--input`, and the exit status of a refusal.
//!
//! Exit codes: 0 done; 1 refused, nothing written (an invalid definition,
//! no such workflow or execution, a run not waiting or already finished,
//! an answer already given); 2 a usage error, an unreadable file, or the
//! database failing.

pub mod answer;
pub mod cancel;
pub mod publish;
pub mod save;
pub mod start;
pub mod validate;
pub mod versions;

use anyhow::Context as _;
use clap::Args;
use outbox_workflow_store::admin::{AdminError, DocumentSource};
use serde_json::{Value, json};

use crate::{ExitStatus, Failure};

/// `--input` / `--input-file` of `start` and `answer`.
#[derive(Debug, Args)]
pub struct InputArgs {
    /// The run's input (start) or the answer (answer): JSON text. Default `{}`.
    #[arg(long, value_name = "JSON", value_parser = json_text, conflicts_with = "input_file")]
    input: Option<Value>,
    /// As --input, read from a file (`-`: standard input).
    #[arg(long, value_name = "FILE|-")]
    input_file: Option<String>,
}

impl InputArgs {
    /// The input given, or `{}`.
    fn value(&self) -> Result<Value, Failure> {
        if let Some(value) = &self.input {
            return Ok(value.clone());
        }
        let Some(file) = &self.input_file else {
            return Ok(json!({}));
        };
        let source = DocumentSource::from(file.as_str());
        let text = source.read()?;
        Ok(serde_json::from_str(&text)
            .with_context(|| format!("--input-file {source} is not JSON"))?)
    }
}

/// Parses a flag's JSON text; clap names the flag when this fails.
fn json_text(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))
}

/// A refusal exits 1 (nothing was written); anything else 2.
fn failure(error: AdminError) -> Failure {
    Failure {
        status: if error.is_refusal() {
            ExitStatus::Alert
        } else {
            ExitStatus::Error
        },
        error: error.into(),
    }
}
