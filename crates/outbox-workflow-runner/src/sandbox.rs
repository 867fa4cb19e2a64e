//! [`CodeSandbox`]: how a bridge runner runs a `code` block's script.
//!
//! The runner does not embed a JavaScript engine: a runner made
//! [`with_bridge_blocks`](crate::Runner::with_bridge_blocks) is handed one.
//! `outbox-workflow-sandbox` provides it (QuickJS); only `outbox-worker`,
//! the crate of the `workflow-bridge` binary, depends on it, so the
//! workflow subscriber and the CLI do not compile the engine.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use outbox_workflow_model::CodeParams;
use serde_json::Value;

/// The future of [`CodeSandbox::run`]: the script's output, or why it
/// failed (recorded as the block's error).
pub type CodeRun<'a> = Pin<Box<dyn Future<Output = Result<Value, String>> + Send + 'a>>;

/// Runs `code` blocks' scripts for a bridge runner.
pub trait CodeSandbox: fmt::Debug + Send + Sync {
    /// The longest one script may run: the block's claim covers it, so no
    /// other holder takes the run while the script may still be running.
    fn time_limit(&self) -> Duration;

    /// Runs `params`' script with the execution context `ctx` (`input`,
    /// `vars`, `blocks`) as its input.
    fn run<'a>(&'a self, params: &'a CodeParams, ctx: &'a Value) -> CodeRun<'a>;
}
