//! The bridge's HTTP side: [`router`] with the signed endpoints, and
//! [`execute_trigger`], the one place that creates and runs an execution
//! in a single step (a stream run).

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::workflow_bridge_request;
use outbox_pg::PgPool;
use outbox_trace::{TRACEPARENT_HEADER, TRACESTATE_HEADER, TraceContext};
use outbox_workflow_runner::{BlockProgress, RunError, RunOutcome, Runner};
use outbox_workflow_store::{self as store, NewExecution, StoreError, TriggerKind};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tracing::Instrument;
use uuid::Uuid;

use crate::signing::{
    BridgeSecret, REQUEST_ID_HEADER, SIGNATURE_HEADER, SIGNATURE_WINDOW, SignedRequest,
    TIMESTAMP_HEADER, verify_request,
};
use crate::wire::{
    CONTINUE_PATH, ContinueRequest, ErrorBody, OutcomeBody, RUN_PATH, RunRequest, STREAM_PATH,
    StreamRequest,
};

/// Default of `WORKFLOW_BRIDGE_ADDR`: loopback only.
pub const DEFAULT_BRIDGE_ADDR: &str = "127.0.0.1:8787";

/// `WORKFLOW_BRIDGE_ADDR`: where the bridge's process serves [`router`].
pub const WORKFLOW_BRIDGE_ADDR: outbox_env::Text = outbox_env::Text {
    name: "WORKFLOW_BRIDGE_ADDR",
    default: DEFAULT_BRIDGE_ADDR,
    form: "host:port",
    meaning: "where the bridge serves its signed endpoints, /healthz, /readyz and /metrics (loopback only by default)",
};

/// What the bridge's endpoints share. Cheap to clone.
#[derive(Clone)]
pub struct BridgeState {
    pool: PgPool,
    runner: Runner,
    secrets: Arc<Vec<BridgeSecret>>,
}

impl BridgeState {
    /// Endpoints that run executions on `pool` with `runner` (built for the
    /// bridge: it runs every block), accepting requests signed with one of
    /// `secrets` (the current one first; the previous one during a
    /// rotation).
    #[must_use]
    pub fn new(pool: PgPool, runner: Runner, secrets: Vec<BridgeSecret>) -> Self {
        Self {
            pool,
            runner,
            secrets: Arc::new(secrets),
        }
    }
}

impl std::fmt::Debug for BridgeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeState")
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

/// The signed endpoints: [`RUN_PATH`], [`CONTINUE_PATH`] and
/// [`STREAM_PATH`]. Every request must carry a valid signature made within
/// [`SIGNATURE_WINDOW`] and a request id never seen before.
///
/// Each request is handled in an `outbox.bridge.request` span that
/// continues the trace of the request's W3C `traceparent` (and
/// `tracestate`) headers, as the worker's bridge client sends them: a child
/// of the worker's job span, so that the blocks the bridge runs (their
/// `outbox.http.request` spans, the `traceparent` of their calls) are in the
/// event's trace. A request without valid headers starts a new trace.
pub fn router(state: BridgeState) -> Router {
    Router::new()
        .route(RUN_PATH, post(run))
        .route(CONTINUE_PATH, post(continue_run))
        .route(STREAM_PATH, post(stream))
        .with_state(state)
}

/// An error answer, with its status.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let endpoint_status = self.0;
        if endpoint_status.is_server_error() {
            tracing::error!(status = %endpoint_status, error = %self.1, "bridge request failed");
        } else {
            tracing::warn!(status = %endpoint_status, error = %self.1, "bridge request refused");
        }
        metrics::counter!("workflow_bridge_refusals_total", "status" => endpoint_status.as_str().to_owned())
            .increment(1);
        (endpoint_status, axum::Json(ErrorBody { error: self.1 })).into_response()
    }
}

impl From<RunError> for Refusal {
    fn from(error: RunError) -> Self {
        match &error {
            RunError::ExecutionNotFound { .. } => Self(StatusCode::NOT_FOUND, error.to_string()),
            _ if error.is_transient() => Self(StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
            _ => Self(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
        }
    }
}

impl From<StoreError> for Refusal {
    fn from(error: StoreError) -> Self {
        match &error {
            StoreError::WorkflowNotFound { .. } => Self(StatusCode::NOT_FOUND, error.to_string()),
            StoreError::Database(_) => Self(StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
            _ => Self(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
        }
    }
}

fn unavailable(error: impl std::fmt::Display) -> Refusal {
    Refusal(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("database error: {error}"),
    )
}

/// Checks the signature and records the request id (a replay is refused);
/// then parses the body.
async fn accept<T: serde::de::DeserializeOwned>(
    state: &BridgeState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, Refusal> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let request = SignedRequest {
        request_id: header(REQUEST_ID_HEADER),
        timestamp: header(TIMESTAMP_HEADER),
        signature: header(SIGNATURE_HEADER),
        body,
    };
    let now = chrono::Utc::now().timestamp();
    let request_id = verify_request(&state.secrets, request, now)
        .map_err(|e| Refusal(StatusCode::UNAUTHORIZED, e.to_string()))?;
    let mut conn = state.pool.get().await.map_err(unavailable)?;
    let inserted = diesel::insert_into(workflow_bridge_request::table)
        .values(workflow_bridge_request::request_id.eq(request_id))
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await
        .map_err(unavailable)?;
    if inserted == 0 {
        return Err(Refusal(
            StatusCode::CONFLICT,
            format!("request {request_id} was already received; a replay is refused"),
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| Refusal(StatusCode::BAD_REQUEST, format!("invalid body: {e}")))
}

/// Deletes the request ids older than twice the signature window (a
/// request that old is refused by its timestamp anyway); how many.
///
/// # Errors
///
/// The database's.
pub async fn prune_request_ids(
    conn: &mut AsyncPgConnection,
) -> Result<usize, diesel::result::Error> {
    let horizon = chrono::Utc::now()
        - chrono::Duration::from_std(SIGNATURE_WINDOW * 2).unwrap_or(chrono::Duration::minutes(10));
    diesel::delete(workflow_bridge_request::table)
        .filter(workflow_bridge_request::received_at.lt(horizon))
        .execute(conn)
        .await
}

/// The execution must exist and belong to `tenant_id`.
async fn owned(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    execution_id: Uuid,
) -> Result<(), Refusal> {
    match store::get_execution(conn, execution_id).await? {
        Some(execution) if execution.tenant_id == tenant_id => Ok(()),
        _ => Err(Refusal(
            StatusCode::NOT_FOUND,
            format!("tenant {tenant_id} has no execution {execution_id}"),
        )),
    }
}

fn outcome(endpoint: &'static str, execution_id: Uuid, outcome: &RunOutcome) -> Response {
    tracing::info!(execution = %execution_id, endpoint, outcome = ?outcome, "bridge advanced the execution");
    metrics::counter!("workflow_bridge_requests_total", "endpoint" => endpoint).increment(1);
    axum::Json(OutcomeBody::from(outcome)).into_response()
}

/// The trace context of a request's `traceparent` and `tracestate`
/// headers; `None` without a valid `traceparent`.
fn carried_trace(headers: &HeaderMap) -> Option<TraceContext> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    TraceContext::parse(header(TRACEPARENT_HEADER)?, header(TRACESTATE_HEADER))
}

/// Handles a request of `endpoint` in its `outbox.bridge.request` span, a
/// child of the context the request carries (see [`router`]). Where the
/// span has no OpenTelemetry identity (no layer), the carried context is
/// passed on as it is, to the calls the blocks make.
async fn traced(
    endpoint: &'static str,
    headers: &HeaderMap,
    handle: impl Future<Output = Result<Response, Refusal>>,
) -> Response {
    let span = tracing::info_span!(
        "outbox.bridge.request",
        otel.kind = "server",
        endpoint,
        tenant_id = tracing::field::Empty,
        execution_id = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let trace = outbox_trace::continue_trace(&span, carried_trace(headers).as_ref());
    if let Some(trace) = &trace {
        span.record("trace_id", trace.trace_id());
    }
    // The refusal is logged (and becomes a response) inside the span.
    let response = outbox_trace::within(
        async { handle.await.unwrap_or_else(IntoResponse::into_response) }.instrument(span.clone()),
        trace.as_ref(),
    )
    .await;
    span.record("http.response.status_code", response.status().as_u16());
    if response.status().is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}

/// Names the request's tenant and execution in the current span.
fn record_execution(tenant_id: &str, execution_id: Uuid) {
    let span = tracing::Span::current();
    span.record("tenant_id", tenant_id);
    span.record("execution_id", tracing::field::display(execution_id));
}

async fn run(State(state): State<BridgeState>, headers: HeaderMap, body: Bytes) -> Response {
    traced("run", &headers, run_signed(state, &headers, body)).await
}

async fn run_signed(
    state: BridgeState,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, Refusal> {
    let request: RunRequest = accept(&state, headers, &body).await?;
    record_execution(&request.tenant_id, request.execution_id);
    let mut conn = state.pool.get().await.map_err(unavailable)?;
    owned(&mut conn, &request.tenant_id, request.execution_id).await?;
    let result = state.runner.run(&mut conn, request.execution_id).await?;
    Ok(outcome("run", request.execution_id, &result))
}

async fn continue_run(
    State(state): State<BridgeState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    traced("continue", &headers, continue_signed(state, &headers, body)).await
}

async fn continue_signed(
    state: BridgeState,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, Refusal> {
    let request: ContinueRequest = accept(&state, headers, &body).await?;
    record_execution(&request.tenant_id, request.execution_id);
    let mut conn = state.pool.get().await.map_err(unavailable)?;
    owned(&mut conn, &request.tenant_id, request.execution_id).await?;
    let result = state
        .runner
        .resume(
            &mut conn,
            request.execution_id,
            &request.waiting_block,
            request.kind,
            &request.input,
        )
        .await?;
    Ok(outcome("continue", request.execution_id, &result))
}

/// What a stream run reports, in order: `started`, a `block` per block
/// run, and `ended`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "event"
)]
#[non_exhaustive]
pub enum StreamEvent {
    /// The execution exists and runs.
    Started {
        /// Its id.
        execution_id: Uuid,
    },
    /// A block ran (its result committed).
    Block {
        /// The block's id.
        block_id: String,
        /// Its type.
        #[serde(rename = "type")]
        kind: String,
        /// `success`, `error` or `waiting`.
        status: String,
        /// Its output (`success`).
        #[serde(skip_serializing_if = "Option::is_none")]
        output: Option<Value>,
        /// Why it failed (`error`).
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The call ended: the execution finished, or waits for input (its
    /// continuation goes through the outbox like any other).
    Ended {
        /// The execution's status.
        status: String,
        /// The block it waits in.
        #[serde(skip_serializing_if = "Option::is_none")]
        waiting_block: Option<String>,
        /// The execution's error.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

impl StreamEvent {
    /// The SSE event name: `started`, `block` or `ended`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Started { .. } => "started",
            Self::Block { .. } => "block",
            Self::Ended { .. } => "ended",
        }
    }
}

impl From<BlockProgress> for StreamEvent {
    fn from(progress: BlockProgress) -> Self {
        Self::Block {
            block_id: progress.block_id,
            kind: progress.kind.to_string(),
            status: progress.status.as_str().to_owned(),
            output: progress.output,
            error: progress.error,
        }
    }
}

/// Why a stream run could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TriggerError {
    /// The pool gave no connection.
    #[error("database error: {0}")]
    Pool(String),
    /// The execution could not be created.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The run failed (database).
    #[error(transparent)]
    Run(#[from] RunError),
}

/// Creates a `queued` stream execution of the tenant's workflow and runs
/// it in this process (taking its lease first), sending [`StreamEvent`]s
/// to `events` as it goes; the outcome.
///
/// Nothing is queued for it: a bridge that stops mid-run leaves the
/// execution `running` (or `queued`, stopped before taking it), and once
/// its lease expires (never taken: once unchanged for the lease) the
/// workers' sweep
/// ([`outbox_workflow_store::sweep`]) resumes it through the outbox (its
/// stream is gone). Everything after a `waitForInput` goes through
/// `workflow.execution.continue.requested` like any run. Only the bridge
/// may call this.
///
/// # Errors
///
/// [`TriggerError`]; the events then end without `ended` when the
/// execution was never created.
pub(crate) async fn execute_trigger(
    pool: &PgPool,
    runner: &Runner,
    request: &StreamRequest,
    events: UnboundedSender<StreamEvent>,
) -> Result<RunOutcome, TriggerError> {
    let mut conn = pool
        .get()
        .await
        .map_err(|e| TriggerError::Pool(e.to_string()))?;
    let new = NewExecution {
        tenant_id: &request.tenant_id,
        workflow_id: request.workflow_id,
        trigger_kind: TriggerKind::Stream,
        input: &request.input,
        trigger_event_id: None,
        // Started by a signed request, not by a workflow's own row event.
        allow_external_callouts: true,
    };
    let execution =
        store::create_execution(&mut conn, &new)
            .await?
            .ok_or(StoreError::WorkflowNotFound {
                workflow_id: request.workflow_id,
            })?;
    let _ = events.send(StreamEvent::Started {
        execution_id: execution.id,
    });
    let (progress, mut received) = unbounded_channel::<BlockProgress>();
    let forward = {
        let events = events.clone();
        tokio::spawn(async move {
            while let Some(block) = received.recv().await {
                let _ = events.send(StreamEvent::from(block));
            }
        })
    };
    let observed = runner.clone().with_progress(progress);
    let result = observed.run(&mut conn, execution.id).await;
    // Every block event before `ended`.
    drop(observed);
    let _ = forward.await;
    let outcome = result?;
    let ended = store::get_execution(&mut conn, execution.id).await?;
    let _ = events.send(StreamEvent::Ended {
        status: ended
            .as_ref()
            .map_or_else(String::new, |e| e.status.as_str().to_owned()),
        waiting_block: ended.as_ref().and_then(|e| e.waiting_block.clone()),
        error: ended.and_then(|e| e.error),
    });
    Ok(outcome)
}

async fn stream(State(state): State<BridgeState>, headers: HeaderMap, body: Bytes) -> Response {
    traced("stream", &headers, stream_signed(state, &headers, body)).await
}

async fn stream_signed(
    state: BridgeState,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, Refusal> {
    let request: StreamRequest = accept(&state, headers, &body).await?;
    tracing::Span::current().record("tenant_id", request.tenant_id.as_str());
    // The workflow must exist for the tenant before the stream starts, so
    // that a wrong id is a 404 rather than an empty stream.
    {
        let mut conn = state.pool.get().await.map_err(unavailable)?;
        let found: i64 = outbox_model::schema::workflow::table
            .filter(outbox_model::schema::workflow::id.eq(request.workflow_id))
            .filter(outbox_model::schema::workflow::tenant_id.eq(&request.tenant_id))
            .count()
            .get_result(&mut conn)
            .await
            .map_err(unavailable)?;
        if found == 0 {
            return Err(StoreError::WorkflowNotFound {
                workflow_id: request.workflow_id,
            }
            .into());
        }
    }
    metrics::counter!("workflow_bridge_requests_total", "endpoint" => "stream").increment(1);
    let (events, mut received) = unbounded_channel::<StreamEvent>();
    // The run outlives the response: it stays in the request's span (which
    // ends with it) and its trace.
    let run = async move {
        if let Err(error) = execute_trigger(&state.pool, &state.runner, &request, events).await {
            tracing::error!(workflow = %request.workflow_id, error = %error, "stream run failed");
        }
    };
    tokio::spawn(outbox_trace::within(
        run.instrument(tracing::Span::current()),
        None,
    ));
    let stream = futures::stream::poll_fn(move |cx| {
        received.poll_recv(cx).map(|event| {
            event.map(|event| {
                let data = serde_json::to_string(&event)
                    .unwrap_or_else(|e| json!({ "error": e.to_string() }).to_string());
                Ok::<_, Infallible>(Event::default().event(event.name()).data(data))
            })
        })
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
