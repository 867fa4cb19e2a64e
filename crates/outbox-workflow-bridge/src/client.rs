//! [`BridgeClient`]: how a worker hands an execution to the bridge.

use std::time::Duration;

use outbox_trace::TraceContext;
use outbox_workflow_model::events::ContinueKind;
use outbox_workflow_runner::RunOutcome;
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::signing::{BridgeSecret, REQUEST_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use crate::wire::{CONTINUE_PATH, ContinueRequest, ErrorBody, OutcomeBody, RUN_PATH, RunRequest};

/// How long a worker waits for the bridge to run an execution: a run over
/// the bridge answers when it ends or waits.
pub const BRIDGE_CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// A bridge URL that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BridgeUrlError {
    /// Not an `http` or `https` URL.
    #[error("{url:?} is not an http(s) URL: {reason}")]
    Invalid {
        /// The URL as given.
        url: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client cannot be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// A bridge call that did not produce an outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BridgeCallError {
    /// No answer: connection refused, reset, timed out.
    #[error("the bridge at {url} did not answer: {reason}")]
    Unreachable {
        /// The bridge's URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The bridge refused the request.
    #[error("the bridge refused the request ({status}): {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The bridge's reason.
        message: String,
    },
    /// The answer is not an outcome.
    #[error("the bridge's answer is not an outcome: {0}")]
    BadResponse(String),
}

impl BridgeCallError {
    /// Whether trying again later may succeed: an unreachable bridge, a
    /// 5xx, and a refused signature (the secret may be mid-rotation); not a
    /// request the bridge found wrong (400, 404).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable { .. } => true,
            Self::Refused { status, .. } => *status >= 500 || *status == 401 || *status == 409,
            Self::BadResponse(_) => false,
        }
    }
}

/// Signs and sends requests to the bridge. Cheap to clone.
#[derive(Debug, Clone)]
pub struct BridgeClient {
    http: reqwest::Client,
    base: url::Url,
    secret: BridgeSecret,
}

impl BridgeClient {
    /// A client of the bridge at `base_url` signing with `secret`.
    ///
    /// # Errors
    ///
    /// [`BridgeUrlError`] when the URL is not http(s) or the client cannot
    /// be built.
    pub fn new(base_url: &str, secret: BridgeSecret) -> Result<Self, BridgeUrlError> {
        let invalid = |reason: String| BridgeUrlError::Invalid {
            url: base_url.to_owned(),
            reason,
        };
        let base = url::Url::parse(base_url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
            return Err(invalid("expected http://host[:port] or https://…".into()));
        }
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(BRIDGE_CALL_TIMEOUT)
            .build()?;
        Ok(Self { http, base, secret })
    }

    /// The bridge's base URL.
    #[must_use]
    pub fn url(&self) -> &url::Url {
        &self.base
    }

    /// Sends `body` to `path`, signed with a fresh request id and the
    /// current time; the raw response (a stream run reads it as events).
    ///
    /// The request carries the W3C `traceparent` (and `tracestate`) of the
    /// current span (a worker's `outbox.job`), or of the context passed on
    /// when the process has no OpenTelemetry layer, so that the bridge
    /// continues the trace (see [`TraceContext::current`]).
    ///
    /// # Errors
    ///
    /// [`BridgeCallError::Unreachable`] when no response arrives.
    pub async fn post(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<reqwest::Response, BridgeCallError> {
        let url = self
            .base
            .join(path)
            .map_err(|e| BridgeCallError::Unreachable {
                url: self.base.to_string(),
                reason: e.to_string(),
            })?;
        let body =
            serde_json::to_vec(body).map_err(|e| BridgeCallError::BadResponse(e.to_string()))?;
        let request_id = Uuid::new_v4().to_string();
        let timestamp = chrono::Utc::now().timestamp();
        let signature = self.secret.sign(&request_id, timestamp, &body);
        let request = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(REQUEST_ID_HEADER, request_id)
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(SIGNATURE_HEADER, signature);
        let request = match TraceContext::current() {
            Some(trace) => trace.headers().fold(request, |request, (name, value)| {
                request.header(name, value)
            }),
            None => request,
        };
        request
            .body(body)
            .send()
            .await
            .map_err(|e| BridgeCallError::Unreachable {
                url: self.base.to_string(),
                reason: e.to_string(),
            })
    }

    async fn outcome(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<RunOutcome, BridgeCallError> {
        let response = self.post(path, body).await?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| BridgeCallError::Unreachable {
                url: self.base.to_string(),
                reason: e.to_string(),
            })?;
        if !status.is_success() {
            let message = serde_json::from_str::<ErrorBody>(&text).map_or(text, |b| b.error);
            return Err(BridgeCallError::Refused {
                status: status.as_u16(),
                message,
            });
        }
        let body: OutcomeBody =
            serde_json::from_str(&text).map_err(|e| BridgeCallError::BadResponse(e.to_string()))?;
        RunOutcome::try_from(body).map_err(BridgeCallError::BadResponse)
    }

    /// Has the bridge run execution `execution_id` of `tenant_id` from
    /// where it stands (as [`Runner::run`](outbox_workflow_runner::Runner::run)).
    ///
    /// # Errors
    ///
    /// [`BridgeCallError`].
    pub async fn run(
        &self,
        tenant_id: &str,
        execution_id: Uuid,
    ) -> Result<RunOutcome, BridgeCallError> {
        let request = RunRequest {
            tenant_id: tenant_id.to_owned(),
            execution_id,
        };
        self.outcome(RUN_PATH, &request).await
    }

    /// Has the bridge continue the waiting execution (as
    /// [`Runner::resume`](outbox_workflow_runner::Runner::resume)).
    ///
    /// # Errors
    ///
    /// [`BridgeCallError`].
    pub async fn resume(
        &self,
        tenant_id: &str,
        execution_id: Uuid,
        waiting_block: &str,
        kind: ContinueKind,
        input: &Value,
    ) -> Result<RunOutcome, BridgeCallError> {
        let request = ContinueRequest {
            tenant_id: tenant_id.to_owned(),
            execution_id,
            waiting_block: waiting_block.to_owned(),
            kind,
            input: input.clone(),
        };
        self.outcome(CONTINUE_PATH, &request).await
    }
}
