//! The signed internal bridge: an HTTP service that runs executions with a
//! runner able to run every block, including those the native runner
//! cannot (`code`); and the [`executor`], which chooses whether a run goes
//! to the native runner or to the bridge.
//!
//! - [`signing`]: HMAC-SHA256 over request id, timestamp and body; a
//!   five-minute window; constant-time comparison. A replayed request id is
//!   refused (the ids are kept in `workflow_bridge_request`).
//! - [`router`]: `POST /v1/executions/run` and `/v1/executions/continue`
//!   (what a worker in `http` or `hybrid` mode sends instead of running
//!   natively; the answer is the outcome), and `/v1/executions/stream`, a
//!   stream run answered with server-sent events.
//! - `execute_trigger`: the one entry point that creates and runs an
//!   execution in one step, without the outbox. It is private to this
//!   crate: only the stream route calls it.
//! - [`BridgeClient`]: the workers' side.
//! - [`executor`] chooses where a run goes (`native`, `hybrid`, `http`);
//!   the `outbox.workflow` subscriber calls it.
//!
//! Requests carry the W3C trace context of the worker's job span
//! (`traceparent`, `tracestate`), and the bridge handles each in a span
//! that continues it, so a run on the bridge stays in its event's trace.
//!
//! The `workflow-bridge` binary serves the router with health, metrics and
//! graceful shutdown; `docs/workflows/running.md` ("Executors and the bridge")
//! describes deployment and key rotation.
//!
//! This crate does not embed the code sandbox: the bridge's binary gives
//! [`BridgeState`] a runner made with one, so the workflow subscriber,
//! which depends on this crate for the client and the executor, does not
//! compile QuickJS.
//! Definitions, the store and the runner are the other workflow crates'.

mod client;
pub mod executor;
mod server;
pub mod signing;
pub mod wire;

pub use client::{BRIDGE_CALL_TIMEOUT, BridgeCallError, BridgeClient, BridgeUrlError};
pub use server::{
    BridgeState, DEFAULT_BRIDGE_ADDR, StreamEvent, TriggerError, WORKFLOW_BRIDGE_ADDR,
    prune_request_ids, router,
};
pub use signing::{
    BridgeSecret, SignatureError, WORKFLOW_BRIDGE_PREVIOUS_SECRET, WORKFLOW_BRIDGE_SECRET,
    WeakSecret,
};
