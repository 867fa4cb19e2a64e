//! Trace export over OTLP, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
//!
//! With the variable set, every `tracing` span of the process (the
//! dispatcher's hand-offs, each job, each HTTP request and SMTP send, and
//! in `workflow-bridge` each bridge request) also becomes an OpenTelemetry
//! span, exported in batches over OTLP/HTTP (protobuf) to
//! `<endpoint>/v1/traces`, and jobs continue the trace their event was
//! published in (see `outbox_trace`), as do the bridge's requests the trace
//! of the job that sent them. Without it no layer is installed, nothing is
//! exported, and trace contexts received are passed on unchanged.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::ConfigError;

/// The variable that turns trace export on: the OTLP/HTTP base URL of a
/// collector (spans go to `<it>/v1/traces`).
pub const OTLP_ENDPOINT_VARIABLE: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The variable that names the service in exported spans (default: the
/// binary's name).
pub const SERVICE_NAME_VARIABLE: &str = "OTEL_SERVICE_NAME";

/// `OTEL_EXPORTER_OTLP_ENDPOINT` ([`OTLP_ENDPOINT_VARIABLE`]), read by
/// [`TraceExportConfig::from_lookup`].
pub const OTEL_EXPORTER_OTLP_ENDPOINT: outbox_env::Text = outbox_env::Text {
    name: OTLP_ENDPOINT_VARIABLE,
    default: "unset (no trace export)",
    form: "an http:// or https:// base URL of an OTLP/HTTP collector",
    meaning: "export spans (protobuf, to <URL>/v1/traces) that continue each event's trace from its publisher to its side effects",
};

/// `OTEL_SERVICE_NAME` ([`SERVICE_NAME_VARIABLE`]), read by
/// [`TraceExportConfig::from_lookup`].
pub const OTEL_SERVICE_NAME: outbox_env::Text = outbox_env::Text {
    name: SERVICE_NAME_VARIABLE,
    default: "the binary's name",
    form: "a name",
    meaning: "the service name of exported spans",
};

/// The instrumentation scope of the spans the workers and the bridge export.
const SCOPE: &str = "outbox";

/// Where spans go and under which service name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceExportConfig {
    /// The full traces URL: `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`.
    pub traces_url: String,
    /// `OTEL_SERVICE_NAME`, or the binary's name.
    pub service_name: String,
}

impl TraceExportConfig {
    /// Reads `OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_SERVICE_NAME` through
    /// `get`: `None` when the endpoint is unset or empty (no export).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the endpoint variable when it is not an
    /// `http` or `https` URL.
    pub fn from_lookup(
        get: &dyn Fn(&str) -> Option<String>,
        binary: &str,
    ) -> Result<Option<Self>, ConfigError> {
        let Some(endpoint) = OTEL_EXPORTER_OTLP_ENDPOINT
            .read(get)
            .map(|v| v.trim().to_owned())
        else {
            return Ok(None);
        };
        let refuse = |problem: String| {
            OTEL_EXPORTER_OTLP_ENDPOINT.refuse(outbox_queue::redact_url(&endpoint), problem)
        };
        let parsed = url::Url::parse(&endpoint).map_err(|e| refuse(format!("not a URL ({e})")))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(refuse("must be an http:// or https:// URL".into()));
        }
        let service_name = OTEL_SERVICE_NAME
            .read(get)
            .map_or_else(|| binary.to_owned(), |v| v.trim().to_owned());
        Ok(Some(Self {
            // The base URL of every signal, as OpenTelemetry defines the
            // variable: traces go to its `/v1/traces`.
            traces_url: format!("{}/v1/traces", endpoint.trim_end_matches('/')),
            service_name,
        }))
    }
}

/// Keeps trace export on while it lives; dropping it sends the spans still
/// pending. Drop it outside the async runtime (the exporter's HTTP client
/// blocks).
#[must_use = "trace export stops when the guard is dropped"]
#[derive(Debug, Default)]
pub struct TraceExport {
    provider: Option<SdkTracerProvider>,
}

impl TraceExport {
    /// Whether spans are exported.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.provider.is_some()
    }

    /// The tracer provider, when spans are exported.
    #[must_use]
    pub fn provider(&self) -> Option<&SdkTracerProvider> {
        self.provider.as_ref()
    }
}

impl Drop for TraceExport {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("cannot send the last spans: {e}");
        }
    }
}

/// Starts the OTLP exporter `config` describes (a batch processor on a
/// thread of its own; call it before the async runtime starts).
///
/// # Errors
///
/// A [`ConfigError`] naming `OTEL_EXPORTER_OTLP_ENDPOINT` when the exporter
/// cannot be built.
pub fn start_trace_export(config: &TraceExportConfig) -> Result<TraceExport, ConfigError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(config.traces_url.clone())
        .build()
        .map_err(|e| ConfigError {
            variable: OTLP_ENDPOINT_VARIABLE,
            value: outbox_queue::redact_url(&config.traces_url),
            problem: format!("cannot start the exporter ({e})"),
        })?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    Ok(TraceExport {
        provider: Some(provider),
    })
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of
/// `provider` (what the workers install with an exporter; tests install it
/// with an in-memory one). Spans carry their `tracing` fields as attributes;
/// `otel.kind` and `otel.status_code` fields set the span kind and status.
pub fn trace_layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + use<S>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(SCOPE))
        .with_tracked_inactivity(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(
        endpoint: Option<&str>,
        service: Option<&str>,
    ) -> Result<Option<TraceExportConfig>, ConfigError> {
        let get = |name: &str| match name {
            OTLP_ENDPOINT_VARIABLE => endpoint.map(str::to_owned),
            SERVICE_NAME_VARIABLE => service.map(str::to_owned),
            _ => None,
        };
        TraceExportConfig::from_lookup(&get, "worker-general")
    }

    #[test]
    fn the_endpoint_is_a_base_url_and_unset_means_no_export() {
        assert_eq!(read(None, None).unwrap(), None);
        assert_eq!(read(Some(" "), None).unwrap(), None);
        let config = read(Some("http://collector:4318/"), None).unwrap().unwrap();
        assert_eq!(config.traces_url, "http://collector:4318/v1/traces");
        assert_eq!(config.service_name, "worker-general");
        let config = read(Some("https://otel.example/base"), Some("billing-worker"))
            .unwrap()
            .unwrap();
        assert_eq!(config.traces_url, "https://otel.example/base/v1/traces");
        assert_eq!(config.service_name, "billing-worker");
        for bad in ["collector:4318", "grpc://collector:4317", "not a url"] {
            let e = read(Some(bad), None).unwrap_err();
            assert_eq!(e.variable, OTLP_ENDPOINT_VARIABLE, "{bad}");
        }
    }
}
