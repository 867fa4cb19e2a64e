//! Reading a carried trace context without ever failing the body around it.

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};

use crate::TraceContext;

/// What a job body may hold where a trace context goes.
#[derive(Deserialize)]
#[serde(untagged)]
enum Carried {
    Context {
        traceparent: String,
        #[serde(default)]
        tracestate: Option<String>,
    },
    Other(IgnoredAny),
}

/// Reads an optional trace context (`{"traceparent": …, "tracestate": …}`)
/// for `#[serde(default, deserialize_with = "outbox_trace::deserialize_lenient")]`:
/// `null`, a value of another shape or an invalid context read as `None`,
/// never as an error. Tracing must not make a job undecodable.
///
/// ```
/// #[derive(serde::Deserialize)]
/// struct Job {
///     #[serde(default, deserialize_with = "outbox_trace::deserialize_lenient")]
///     trace_context: Option<outbox_trace::TraceContext>,
/// }
///
/// let job: Job = serde_json::from_str(r#"{"trace_context": {"traceparent": "garbage"}}"#).unwrap();
/// assert!(job.trace_context.is_none());
/// let job: Job = serde_json::from_str(r#"{"trace_context": 7}"#).unwrap();
/// assert!(job.trace_context.is_none());
/// ```
///
/// # Errors
///
/// Only those of the deserializer itself (malformed input).
pub fn deserialize_lenient<'de, D>(deserializer: D) -> Result<Option<TraceContext>, D::Error>
where
    D: Deserializer<'de>,
{
    Ok(match Carried::deserialize(deserializer)? {
        Carried::Context {
            traceparent,
            tracestate,
        } => TraceContext::parse(&traceparent, tracestate.as_deref()),
        Carried::Other(IgnoredAny) => None,
    })
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use crate::TraceContext;

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(default, deserialize_with = "crate::deserialize_lenient")]
        trace_context: Option<TraceContext>,
    }

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn what_is_not_a_valid_context_reads_as_none() {
        for text in [
            "{}",
            r#"{"trace_context": null}"#,
            r#"{"trace_context": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#,
            r#"{"trace_context": []}"#,
            r#"{"trace_context": {"traceparent": 1}}"#,
            r#"{"trace_context": {"traceparent": "00-zz"}}"#,
            r#"{"trace_context": {"tracestate": "a=1"}}"#,
        ] {
            let body: Body = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(body.trace_context, None, "{text}");
        }
    }

    #[test]
    fn a_context_survives_the_round_trip() {
        let cx = TraceContext::parse(PARENT, Some("a=1")).unwrap();
        let text = serde_json::json!({ "trace_context": cx }).to_string();
        assert_eq!(
            text,
            format!(r#"{{"trace_context":{{"traceparent":"{PARENT}","tracestate":"a=1"}}}}"#)
        );
        let body: Body = serde_json::from_str(&text).unwrap();
        assert_eq!(body.trace_context, Some(cx));
        // A bad tracestate of another type costs the context (the shape is wrong).
        let body: Body = serde_json::from_str(&format!(
            r#"{{"trace_context": {{"traceparent": "{PARENT}", "tracestate": 5}}}}"#
        ))
        .unwrap();
        assert_eq!(body.trace_context, None);
    }
}
