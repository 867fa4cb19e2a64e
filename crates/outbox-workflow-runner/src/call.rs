//! The HTTP call of an `httpRequest` block, made after the block is
//! claimed and before its transaction.

use std::time::Duration;

use outbox_http_guard::GuardError;
use outbox_workflow_model::HttpRequestParams;
use outbox_workflow_store::WorkflowExecution;
use serde_json::{Map, Value, json};
use tracing::Instrument;

use crate::{HttpRequestError, Runner};

/// The header every `httpRequest` call carries, unless the block sets it:
/// the same value on every attempt of one block of one execution, so a
/// receiver can tell a repeat (a holder died after its call went out) from
/// a new request.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// The [`IDEMPOTENCY_KEY_HEADER`] value of block `block_id` of execution
/// `execution_id`.
///
/// ```
/// let execution = uuid::Uuid::nil();
/// assert_eq!(
///     outbox_workflow_runner::idempotency_key(execution, "notify"),
///     "wf:00000000-0000-0000-0000-000000000000:notify"
/// );
/// ```
#[must_use]
pub fn idempotency_key(execution_id: uuid::Uuid, block_id: &str) -> String {
    format!("wf:{execution_id}:{block_id}")
}

impl Runner {
    /// The HTTP call of an `httpRequest` block: its output
    /// `{status, headers, body}`, or why it failed. A run that may not call
    /// out fails before anything is rendered or sent.
    ///
    /// The call runs in an `outbox.http.request` span (a child of the
    /// current span: a worker's `outbox.job`, or the bridge's
    /// `outbox.bridge.request`) and carries the W3C `traceparent` (and
    /// `tracestate`) of that span, or of the context passed on when the
    /// process has no OpenTelemetry layer, unless the block sets those
    /// headers itself.
    pub(super) async fn call(
        &self,
        execution: &WorkflowExecution,
        block_id: &str,
        params: &HttpRequestParams,
        ctx: &Value,
    ) -> Result<Value, HttpRequestError> {
        let span = tracing::info_span!(
            "outbox.http.request",
            otel.kind = "client",
            block_id,
            http.request.method = tracing::field::Empty,
            server.origin = tracing::field::Empty,
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let result = self
            .send(execution, block_id, params, ctx)
            .instrument(span.clone())
            .await;
        // A call without an answer, or answered with a 4xx or 5xx.
        let failed = match &result {
            Ok(output) => output["status"].as_u64().is_none_or(|status| status >= 400),
            Err(_) => true,
        };
        if failed {
            span.record("otel.status_code", "ERROR");
        }
        result
    }

    /// [`Runner::call`] inside its span.
    async fn send(
        &self,
        execution: &WorkflowExecution,
        block_id: &str,
        params: &HttpRequestParams,
        ctx: &Value,
    ) -> Result<Value, HttpRequestError> {
        if !execution.allow_external_callouts {
            return Err(HttpRequestError::CalloutsDisabled);
        }
        let url = params.url.render(ctx);
        let parsed =
            url::Url::parse(&url).map_err(|source| HttpRequestError::InvalidUrl { url, source })?;
        let method = serde_json::to_value(params.method)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| HttpRequestError::InvalidMethod { method })?;
        let span = tracing::Span::current();
        span.record("http.request.method", method.as_str());
        // Scheme, host and port only: a URL's path and query may hold secrets.
        span.record("server.origin", parsed.origin().ascii_serialization());
        let mut request = self
            .http
            .request(method, parsed)?
            .timeout(Duration::from_millis(params.timeout_ms()));
        let sets = |name: &str| {
            params
                .headers
                .keys()
                .any(|set| set.eq_ignore_ascii_case(name))
        };
        // The run's trace goes on to the peer, unless the block sets these
        // headers itself.
        if let Some(trace) = outbox_trace::TraceContext::current() {
            for (name, value) in trace.headers() {
                if !sets(name) {
                    request = request.header(name, value);
                }
            }
        }
        if !sets(IDEMPOTENCY_KEY_HEADER) {
            request = request.header(
                IDEMPOTENCY_KEY_HEADER,
                idempotency_key(execution.id, block_id),
            );
        }
        for (name, value) in &params.headers {
            request = request.header(name, value.render(ctx));
        }
        if let Some(body) = &params.body {
            request = request.json(body.resolve(ctx));
        }
        let response = request
            .send()
            .await
            .map_err(|e| match GuardError::find(&e) {
                Some(refused) => HttpRequestError::Refused(refused.clone()),
                None => HttpRequestError::Request(e),
            })?;
        let status = response.status().as_u16();
        tracing::Span::current().record("http.response.status_code", status);
        let headers: Map<String, Value> = response
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.to_string(), Value::String(v.to_str().ok()?.to_owned()))))
            .collect();
        let text = answer_text(response).await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(json!({ "status": status, "headers": headers, "body": body }))
    }
}

/// The body of `response` as text (UTF-8, invalid sequences replaced),
/// read up to [`MAX_ANSWER_BYTES`]: a longer one is refused as soon as its
/// length or what arrived says so, before it fills the worker's memory or
/// a `jsonb` value Postgres refuses (which would have the call made again
/// up to the claim limit).
async fn answer_text(mut response: reqwest::Response) -> Result<String, HttpRequestError> {
    let too_large = HttpRequestError::AnswerTooLarge {
        limit: MAX_ANSWER_BYTES,
    };
    if response
        .content_length()
        .is_some_and(|length| length > MAX_ANSWER_BYTES as u64)
    {
        return Err(too_large);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(HttpRequestError::Body)? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(too_large);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(match String::from_utf8(body) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// The longest answer body an `httpRequest` block records, in bytes
/// (10 MiB): a longer answer fails the block
/// ([`HttpRequestError::AnswerTooLarge`]).
///
/// ```
/// assert_eq!(outbox_workflow_runner::MAX_ANSWER_BYTES, 10 * 1024 * 1024);
/// ```
pub const MAX_ANSWER_BYTES: usize = 10 * 1024 * 1024;

/// Replaces each NUL character of `text` with U+FFFD: Postgres' `text`
/// refuses it.
pub(super) fn storable_text(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}

/// Replaces each NUL character of `value`'s strings and keys with U+FFFD:
/// Postgres' `jsonb` refuses `\u0000`, and an answer that cannot be
/// recorded would have its call made again.
pub(super) fn storable(value: &mut Value) {
    const NUL: char = '\0';
    match value {
        Value::String(text) if text.contains(NUL) => *text = text.replace(NUL, "\u{FFFD}"),
        Value::Array(items) => items.iter_mut().for_each(storable),
        Value::Object(map) if map.keys().any(|k| k.contains(NUL)) => {
            let entries = std::mem::take(map);
            for (key, mut item) in entries {
                storable(&mut item);
                map.insert(key.replace(NUL, "\u{FFFD}"), item);
            }
        }
        Value::Object(map) => map.values_mut().for_each(storable),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::storable;

    #[test]
    fn nul_characters_become_replacement_characters_in_strings_and_keys() {
        let mut value: serde_json::Value =
            serde_json::from_str(r#"{"a\u0000b": ["x\u0000", {"k": "\u0000"}], "n": 1}"#).unwrap();
        storable(&mut value);
        assert_eq!(
            value,
            json!({ "a\u{FFFD}b": ["x\u{FFFD}", { "k": "\u{FFFD}" }], "n": 1 })
        );
    }
}
