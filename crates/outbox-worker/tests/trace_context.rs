//! One trace from publish to side effect: with the workers' OpenTelemetry
//! layer over an in-memory exporter, an event published inside a span is
//! claimed and pushed by the dispatcher, handled by the webhook subscriber
//! and delivered to an HTTP sink, and the exported spans form one trace:
//! request → `outbox.publish` → `outbox.dispatch.handoff` → `outbox.job` →
//! `outbox.http.request`, whose context is the `traceparent` the sink got.
//! A row written by plain SQL with a `traceparent` is continued the same
//! way; a row without one starts a new trace at the dispatcher. A mail
//! request's job, the mail job it pushes and the SMTP send are one trace
//! too, and so are a plugin hook's fan-out, the invocation and its request.
//! A workflow run in `http` mode goes to a workflow bridge served in this
//! process: the bridge's request span is a child of the workflow job's
//! span, and the request of the run's `httpRequest` block carries that
//! trace to the sink.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::Stack;
use diesel_async::AsyncConnection;
use opentelemetry::trace::SpanId;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_dispatch::{Dispatcher, DispatcherConfig};
use outbox_idempotency::RedisIdempotencyStore;
use outbox_publish::{NewOutboxEvent, OutboxTx};
use outbox_queue::RedisSettings;
use outbox_subscriber::{HandlerGroup, WorkerSettings};
use outbox_subscriber_mail::{MailRequestHandler, SmtpHandler, SmtpSettings, Templates};
use outbox_subscriber_webhook::{
    Deliverer, DeliverySettings, OnceSettings, PluginHookHandler, PluginInvokeHandler,
    WebhookHandler,
};
use outbox_subscriber_workflow::WorkflowHandler;
use outbox_test_support::{ReceivedRequest, eventually};
use outbox_trace::TraceContext;
use outbox_workflow_bridge::executor::{Executor, ExecutorMode};
use outbox_workflow_bridge::{BridgeClient, BridgeSecret, BridgeState};
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_runner::{AddressPolicy, Runner};
use outbox_workflow_store::producers::{self, EventContext, ProducerError};
use outbox_workflow_store::{self as store, WorkflowStatus};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

/// The process-wide exporter: the workers' layer over it is installed
/// once, before anything else sets a subscriber. Tests tell their spans
/// apart by trace id.
fn exporter() -> &'static InMemorySpanExporter {
    static INSTALLED: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    let (exporter, _) = INSTALLED.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new(
                "info,apalis=warn,apalis_core=warn,apalis_redis=warn",
            ))
            .with(outbox_worker::trace_layer(&provider))
            .with(tracing_subscriber::fmt::layer().with_test_writer());
        tracing::subscriber::set_global_default(subscriber)
            .expect("no subscriber was installed before");
        (exporter, provider)
    });
    exporter
}

/// The finished spans of trace `trace_id`.
fn spans_of(trace_id: &str) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|span| span.span_context.trace_id().to_string() == trace_id)
        .collect()
}

/// The one span called `name` among `spans`.
fn named<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found: Vec<&SpanData> = spans.iter().filter(|s| s.name == name).collect();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(found.len(), 1, "one {name} span among {names:?}");
    found[0]
}

/// Asserts that `child` is a child of `parent` in the same trace.
fn assert_child(child: &SpanData, parent: &SpanData) {
    assert_eq!(
        child.span_context.trace_id(),
        parent.span_context.trace_id(),
        "{} and {} are in one trace",
        child.name,
        parent.name
    );
    assert_eq!(
        child.parent_span_id,
        parent.span_context.span_id(),
        "{} is a child of {}",
        child.name,
        parent.name
    );
}

/// The path of a webhook event: a dispatcher the test ticks, and the
/// webhook handler consuming its queue in this test's namespace, delivering
/// to the stack's HTTP sink.
struct Pipeline {
    stack: Stack,
    dispatcher: Arc<Dispatcher>,
    shutdown: CancellationToken,
    workers: tokio::task::JoinHandle<()>,
}

/// The handler group of the webhook tests.
fn webhook_group(
    stack: &Stack,
    store: RedisIdempotencyStore<outbox_queue::RedisConnection>,
) -> HandlerGroup {
    let deliverer = Deliverer::new(DeliverySettings {
        address_policy: AddressPolicy::AllowInternal,
        ..DeliverySettings::default()
    })
    .unwrap();
    HandlerGroup::new()
        .with(WebhookHandler::new(
            stack.db.pool().clone(),
            deliverer,
            store,
            OnceSettings::default(),
        ))
        .unwrap()
}

/// The handler group of the mail test: requests become `toolctrl.email`
/// jobs, sent to the stack's SMTP sink.
fn mail_group(
    stack: &Stack,
    store: RedisIdempotencyStore<outbox_queue::RedisConnection>,
) -> HandlerGroup {
    let redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let smtp = SmtpSettings {
        default_from: "outbox@example.test".to_owned(),
        ..SmtpSettings::new(stack.smtp.url())
    };
    HandlerGroup::new()
        .with(MailRequestHandler::new(
            Templates::standard(),
            redis,
            stack.namespace.clone(),
        ))
        .unwrap()
        .with(SmtpHandler::new(smtp, store).unwrap())
        .unwrap()
}

/// The handler group of the plugin test: the fan-out and the invocations,
/// delivering to the stack's sink.
fn plugin_group(
    stack: &Stack,
    store: RedisIdempotencyStore<outbox_queue::RedisConnection>,
) -> HandlerGroup {
    let redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let deliverer = Deliverer::new(DeliverySettings {
        address_policy: AddressPolicy::AllowInternal,
        ..DeliverySettings::default()
    })
    .unwrap();
    HandlerGroup::new()
        .with(PluginHookHandler::new(
            stack.db.pool().clone(),
            redis,
            stack.namespace.clone(),
        ))
        .unwrap()
        .with(PluginInvokeHandler::new(
            stack.db.pool().clone(),
            deliverer,
            store,
            OnceSettings::default(),
        ))
        .unwrap()
}

impl Pipeline {
    async fn start() -> Self {
        Self::start_with(webhook_group).await
    }

    async fn start_with(
        group: impl FnOnce(&Stack, RedisIdempotencyStore<outbox_queue::RedisConnection>) -> HandlerGroup,
    ) -> Self {
        exporter();
        let stack = Stack::new().await;
        stack
            .sql(&format!(
                "INSERT INTO webhook_endpoint (id, tenant_id, url, secret) \
                 VALUES (gen_random_uuid(), 'acme', '{}', 's')",
                stack.http.url_for("/hook")
            ))
            .await;
        let redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
        let dispatcher = Arc::new(
            Dispatcher::new(
                stack.db.pool().clone(),
                stack.db.url(),
                redis.clone(),
                stack.namespace.clone(),
                outbox_catalog::standard_router().unwrap(),
                DispatcherConfig::default(),
            )
            .unwrap(),
        );
        let store = RedisIdempotencyStore::new(redis.clone())
            .with_prefix(outbox_queue::idempotency_prefix(&stack.namespace));
        let group = group(&stack, store);
        let shutdown = CancellationToken::new();
        let settings = WorkerSettings {
            poll_interval: Duration::from_millis(100),
            heartbeat: Duration::from_secs(1),
            ..WorkerSettings::default()
        };
        let (namespace, token) = (stack.namespace.clone(), shutdown.clone());
        let workers = tokio::spawn(async move {
            group
                .run(redis, &namespace, &settings, token)
                .await
                .unwrap();
        });
        Self {
            stack,
            dispatcher,
            shutdown,
            workers,
        }
    }

    /// Dispatches what is pending and waits for `n` deliveries in all.
    async fn deliver(&self, n: usize) -> Vec<ReceivedRequest> {
        let report = self.dispatcher.tick().await.unwrap();
        assert!(report.dispatched > 0, "{report:?}");
        self.stack
            .http
            .wait_for_requests("/hook", n, Duration::from_secs(60))
            .await
    }

    /// Waits until `n` job spans of trace `trace_id` have ended (after
    /// their work) and returns the trace's spans.
    async fn finished_jobs(&self, trace_id: &str, n: usize) -> Vec<SpanData> {
        eventually(
            "the job spans to end",
            Duration::from_secs(30),
            async || {
                spans_of(trace_id)
                    .iter()
                    .filter(|s| s.name == "outbox.job")
                    .count()
                    >= n
            },
        )
        .await;
        spans_of(trace_id)
    }

    /// [`Pipeline::finished_jobs`] of one job.
    async fn finished_trace(&self, trace_id: &str) -> Vec<SpanData> {
        self.finished_jobs(trace_id, 1).await
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.workers.await.unwrap();
    }
}

/// The trace context the sink received with a request.
fn received_context(request: &ReceivedRequest) -> TraceContext {
    let traceparent = request
        .header("traceparent")
        .unwrap_or_else(|| panic!("no traceparent among {:?}", request.headers));
    TraceContext::parse(traceparent, request.header("tracestate")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_published_in_a_span_is_one_trace_down_to_the_webhook_request() {
    let pipeline = Pipeline::start().await;
    let request_span = tracing::info_span!("test.request");
    pipeline
        .stack
        .publish(NewOutboxEvent::new(
            "acme",
            "webhook.order.created",
            json!({ "orderId": 7 }),
        ))
        .instrument(request_span.clone())
        .await;
    let trace_id = TraceContext::of_span(&request_span)
        .expect("the layer gives the test's span a context")
        .trace_id()
        .to_owned();
    drop(request_span);

    let requests = pipeline.deliver(1).await;
    let received = received_context(&requests[0]);
    assert_eq!(
        received.trace_id(),
        trace_id,
        "the webhook continues the trace"
    );

    let spans = pipeline.finished_trace(&trace_id).await;
    let request = named(&spans, "test.request");
    let publish = named(&spans, "outbox.publish");
    let handoff = named(&spans, "outbox.dispatch.handoff");
    let job = named(&spans, "outbox.job");
    let http = named(&spans, "outbox.http.request");
    assert_eq!(request.parent_span_id, SpanId::INVALID);
    assert_child(publish, request);
    assert_child(handoff, publish);
    assert_child(job, handoff);
    assert_child(http, job);
    assert_eq!(
        received.span_context().span_id(),
        http.span_context.span_id(),
        "the receiver's parent is the request span"
    );
    // The hand-off links to the batch's push span (a trace of its own).
    let push_links: Vec<_> = handoff.links.links.iter().collect();
    assert_eq!(push_links.len(), 1, "{push_links:?}");
    assert_ne!(
        push_links[0].span_context.trace_id(),
        handoff.span_context.trace_id()
    );
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_sql_traceparent_is_continued_and_a_row_without_one_starts_a_trace() {
    let pipeline = Pipeline::start().await;
    let producer_trace = "0af7651916cd43dd8448eb211c80319c";
    let producer_span = "b7ad6b7169203331";
    pipeline
        .stack
        .sql(&format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, traceparent, tracestate) \
             VALUES ('acme', 'webhook.order.created', '{{\"n\": 1}}', \
                     '00-{producer_trace}-{producer_span}-01', 'vendor=opaque'); \
             INSERT INTO outbox_event (tenant_id, event_type, payload) \
             VALUES ('acme', 'webhook.order.created', '{{\"n\": 2}}')"
        ))
        .await;

    let requests = pipeline.deliver(2).await;
    let by_n = |n: i64| {
        requests
            .iter()
            .find(|r| r.json()["data"]["n"] == n)
            .unwrap_or_else(|| panic!("no delivery of n = {n}"))
    };

    let continued = received_context(by_n(1));
    assert_eq!(continued.trace_id(), producer_trace);
    assert_eq!(continued.tracestate(), Some("vendor=opaque"));
    let spans = pipeline.finished_trace(producer_trace).await;
    let handoff = named(&spans, "outbox.dispatch.handoff");
    assert_eq!(handoff.parent_span_id.to_string(), producer_span);
    assert!(handoff.parent_span_is_remote);
    assert_child(named(&spans, "outbox.job"), handoff);
    assert_child(
        named(&spans, "outbox.http.request"),
        named(&spans, "outbox.job"),
    );

    let fresh = received_context(by_n(2));
    assert_ne!(fresh.trace_id(), producer_trace);
    let spans = pipeline.finished_trace(fresh.trace_id()).await;
    let handoff = named(&spans, "outbox.dispatch.handoff");
    assert_eq!(handoff.parent_span_id, SpanId::INVALID, "a new root");
    assert_child(named(&spans, "outbox.job"), handoff);
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_request_and_the_mail_job_it_pushes_are_in_the_events_trace() {
    let pipeline = Pipeline::start_with(mail_group).await;
    let request_span = tracing::info_span!("test.request");
    pipeline
        .stack
        .publish(NewOutboxEvent::new(
            "acme",
            "mail.user.welcome",
            json!({ "to": "ada@example.com", "template": "welcome", "vars": { "name": "Ada" } }),
        ))
        .instrument(request_span.clone())
        .await;
    let trace_id = TraceContext::of_span(&request_span)
        .unwrap()
        .trace_id()
        .to_owned();
    drop(request_span);
    let report = pipeline.dispatcher.tick().await.unwrap();
    assert_eq!(report.dispatched, 1, "{report:?}");
    pipeline
        .stack
        .smtp
        .wait_for_messages(1, Duration::from_secs(60))
        .await;

    let spans = pipeline.finished_jobs(&trace_id, 2).await;
    let handoff = named(&spans, "outbox.dispatch.handoff");
    let jobs: Vec<&SpanData> = spans.iter().filter(|s| s.name == "outbox.job").collect();
    let queue_of = |span: &SpanData| {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == "queue")
            .map(|kv| kv.value.to_string())
            .unwrap_or_default()
    };
    let request = jobs
        .iter()
        .find(|s| queue_of(s) == "outbox.mail")
        .expect("the mail request's job");
    let send = jobs
        .iter()
        .find(|s| queue_of(s) == "toolctrl.email")
        .expect("the mail job");
    assert_child(request, handoff);
    assert_child(send, request);
    assert_child(named(&spans, "outbox.smtp.send"), send);
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_invocation_pushed_by_the_fan_out_continues_the_events_trace() {
    let pipeline = Pipeline::start_with(plugin_group).await;
    pipeline
        .stack
        .sql(&format!(
            "INSERT INTO plugin_hook_subscription (tenant_id, plugin, hook, endpoint, secret) \
             VALUES ('acme', 'crm', 'order.created', '{}', 's')",
            pipeline.stack.http.url_for("/plugin")
        ))
        .await;
    let producer_trace = "0af7651916cd43dd8448eb211c80319c";
    pipeline
        .stack
        .sql(&format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, traceparent) \
             VALUES ('acme', 'plugin.hook.order.created', '{{}}', \
                     '00-{producer_trace}-b7ad6b7169203331-01')"
        ))
        .await;
    let report = pipeline.dispatcher.tick().await.unwrap();
    assert_eq!(report.dispatched, 1, "{report:?}");
    let requests = pipeline
        .stack
        .http
        .wait_for_requests("/plugin", 1, Duration::from_secs(60))
        .await;
    assert_eq!(received_context(&requests[0]).trace_id(), producer_trace);

    let spans = pipeline.finished_jobs(producer_trace, 2).await;
    let handoff = named(&spans, "outbox.dispatch.handoff");
    let http = named(&spans, "outbox.http.request");
    let fan_out = spans
        .iter()
        .find(|s| s.name == "outbox.job" && s.parent_span_id == handoff.span_context.span_id())
        .expect("the fan-out's job is the hand-off's child");
    let invoke = spans
        .iter()
        .find(|s| s.name == "outbox.job" && s.parent_span_id == fan_out.span_context.span_id())
        .expect("the invocation's job is the fan-out's child");
    assert_child(http, invoke);
    pipeline.stop().await;
}

/// The secret the in-process bridge and its client share.
const BRIDGE_SECRET: &str = "trace-test-bridge-secret-of-at-least-32-bytes";

/// The handler group of the bridge test: the workflow handler in `http`
/// mode, whose bridge (the router `workflow-bridge` serves, with a runner
/// that may call the stack's sink) runs in this process on its own pool.
fn workflow_group(
    stack: &Stack,
    _store: RedisIdempotencyStore<outbox_queue::RedisConnection>,
) -> HandlerGroup {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let bridge_url = format!("http://{}", listener.local_addr().unwrap());
    let database_url = stack.db.url().to_owned();
    tokio::spawn(async move {
        let pool = outbox_pg::connect_pool(&database_url, 2).await.unwrap();
        let runner = Runner::with_address_policy(AddressPolicy::allow_internal(true))
            .unwrap()
            .with_bridge_blocks(std::sync::Arc::new(outbox_workflow_sandbox::QuickJs));
        let secret = BridgeSecret::new(BRIDGE_SECRET).unwrap();
        let app = outbox_workflow_bridge::router(BridgeState::new(pool, runner, vec![secret]));
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        axum::serve(listener, app).await.unwrap();
    });
    let client = BridgeClient::new(&bridge_url, BridgeSecret::new(BRIDGE_SECRET).unwrap()).unwrap();
    // The worker's own runner never runs: every run goes to the bridge.
    let runner = Runner::with_address_policy(AddressPolicy::allow_internal(true)).unwrap();
    let executor = Executor::new(ExecutorMode::Http, runner, Some(client)).unwrap();
    HandlerGroup::new()
        .with(WorkflowHandler::new(stack.db.pool().clone(), executor))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_run_on_the_bridge_continues_the_jobs_trace_down_to_its_http_block() {
    let pipeline = Pipeline::start_with(workflow_group).await;
    let definition = WorkflowDefinition::from_value(json!({
        "blocks": [
            { "id": "created", "type": "eventTrigger",
              "params": { "entity": "order", "event": "row.created" } },
            { "id": "crm", "type": "httpRequest", "params": {
                "method": "POST", "url": pipeline.stack.http.url_for("/crm"),
                "body": { "var": "input.order" }, "timeoutMs": 5000 } }
        ],
        "edges": [{ "from": "created", "to": "crm" }]
    }))
    .unwrap();
    let mut conn = pipeline.stack.db.conn().await;
    store::save_workflow(&mut conn, "acme", "crm", WorkflowStatus::Live, &definition)
        .await
        .unwrap();
    let request_span = tracing::info_span!("test.request");
    conn.transaction::<_, ProducerError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        let context = EventContext::Request { actor: None };
        producers::create_row(&mut tx, "acme", "order", &json!({ "total": 7 }), &context).await
    })
    .instrument(request_span.clone())
    .await
    .unwrap();
    drop(conn);
    let trace_id = TraceContext::of_span(&request_span)
        .unwrap()
        .trace_id()
        .to_owned();
    drop(request_span);

    let report = pipeline.dispatcher.tick().await.unwrap();
    assert!(report.dispatched > 0, "{report:?}");
    let requests = pipeline
        .stack
        .http
        .wait_for_requests("/crm", 1, Duration::from_secs(60))
        .await;
    let received = received_context(&requests[0]);
    assert_eq!(
        received.trace_id(),
        trace_id,
        "the block's request continues the event's trace"
    );

    eventually(
        "the job's and the bridge's spans to end",
        Duration::from_secs(30),
        async || {
            let spans = spans_of(&trace_id);
            let ended = |name: &str| spans.iter().any(|s| s.name == name);
            ended("outbox.job") && ended("outbox.bridge.request")
        },
    )
    .await;
    let spans = spans_of(&trace_id);
    let handoff = spans
        .iter()
        .find(|s| s.name == "outbox.dispatch.handoff" && attribute(s, "queue") == "outbox.workflow")
        .expect("the workflow event's hand-off");
    let job = named(&spans, "outbox.job");
    let bridge = named(&spans, "outbox.bridge.request");
    let http = named(&spans, "outbox.http.request");
    assert_child(job, handoff);
    assert_child(bridge, job);
    assert!(
        bridge.parent_span_is_remote,
        "the bridge continues a carried context"
    );
    assert_child(http, bridge);
    assert_eq!(
        received.span_context().span_id(),
        http.span_context.span_id(),
        "the sink's parent is the block's request span"
    );
    // The run's terminal hook is published on the bridge, in its span.
    assert!(
        spans.iter().any(|s| s.name == "outbox.publish"
            && s.parent_span_id == bridge.span_context.span_id()
            && attribute(s, "event_type") == "plugin.hook.workflow.executed"),
        "the terminal hook is published in the bridge's span"
    );
    pipeline.stop().await;
}

/// The value of `span`'s attribute `key`, as text ("" without one).
fn attribute(span: &SpanData, key: &str) -> String {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
        .unwrap_or_default()
}
