//! `workflow-bridge` and the executors with the real binaries: a
//! `worker-general` in `hybrid` mode hands a workflow with a `code` block to
//! the bridge, whose mail goes out through worker-mail; bad settings stop
//! both with exit code 2; the bridge stops cleanly on SIGTERM; with an OTLP
//! endpoint the bridge exports its request spans in the caller's trace.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{BRIDGE, BRIDGE_SECRET, GENERAL, MAIL, Stack};
use diesel_async::AsyncConnection;
use outbox_publish::OutboxTx;
use outbox_trace::TraceContext;
use outbox_workflow_bridge::{BridgeCallError, BridgeClient, BridgeSecret};
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_store::producers::{self, EventContext, ProducerError};
use outbox_workflow_store::{self as store, WorkflowStatus};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

async fn save(stack: &Stack, name: &str, definition: Value) {
    let definition = WorkflowDefinition::from_value(definition).unwrap();
    let mut conn = stack.db.conn().await;
    store::save_workflow(&mut conn, "acme", name, WorkflowStatus::Live, &definition)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hybrid_worker_hands_a_code_workflow_to_the_bridge_and_runs_the_rest_natively() {
    let stack = Stack::new().await;
    // Needs the bridge: a code block.
    save(
        &stack,
        "discounts",
        json!({
            "blocks": [
                { "id": "created", "type": "eventTrigger",
                  "params": { "entity": "order", "event": "row.created" } },
                { "id": "js", "type": "code", "params": { "language": "javascript",
                  "source": "return { discount: input.order.total > 100 ? 10 : 0 };" } },
                { "id": "mail", "type": "email", "params": {
                    "to": ["{{ input.order.email }}"],
                    "subject": "Your discount: {{ blocks.js.output.discount }}%",
                    "text": "Thanks." } }
            ],
            "edges": [{ "from": "created", "to": "js" }, { "from": "js", "to": "mail" }]
        }),
    )
    .await;
    // Runs natively.
    save(
        &stack,
        "receipts",
        json!({
            "blocks": [
                { "id": "created", "type": "eventTrigger",
                  "params": { "entity": "order", "event": "row.created" } },
                { "id": "mail", "type": "email", "params": {
                    "to": ["{{ input.order.email }}"], "subject": "Receipt", "text": "Paid." } }
            ],
            "edges": [{ "from": "created", "to": "mail" }]
        }),
    )
    .await;
    let bridge = stack
        .start(BRIDGE, &[("WORKFLOW_BRIDGE_SECRET", BRIDGE_SECRET)])
        .await;
    let bridge_url = format!("http://{}", bridge.addr);
    let _general = stack
        .start(
            GENERAL,
            &[
                ("WORKFLOW_EXECUTOR", "hybrid"),
                ("WORKFLOW_BRIDGE_URL", &bridge_url),
                ("WORKFLOW_BRIDGE_SECRET", BRIDGE_SECRET),
            ],
        )
        .await;
    let _mail = stack.start(MAIL, &[]).await;

    let mut conn = stack.db.conn().await;
    conn.transaction::<_, ProducerError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        let data = json!({ "total": 250, "email": "ada@example.com" });
        let context = EventContext::Request { actor: None };
        producers::create_row(&mut tx, "acme", "order", &data, &context).await
    })
    .await
    .unwrap();

    let mails = stack.smtp.wait_for_messages(2, WAIT).await;
    let mut subjects: Vec<String> = mails.iter().map(|m| m.header("subject").unwrap()).collect();
    subjects.sort();
    assert_eq!(subjects, ["Receipt", "Your discount: 10%"]);
    stack
        .wait_count(
            "SELECT count(*) FROM workflow_execution WHERE status = 'success'",
            2,
        )
        .await;
    // The bridge ran exactly the run that needed it.
    let discounts: String = {
        use diesel_async::RunQueryDsl;
        diesel::sql_query(
            "SELECT e.id::text AS id FROM workflow_execution e JOIN workflow w ON w.id = e.workflow_id
             WHERE w.name = 'discounts'",
        )
        .get_result::<IdRow>(&mut conn)
        .await
        .unwrap()
        .id
    };
    let log = bridge.wait_output("bridge advanced the execution").await;
    assert!(log.contains(&discounts), "{log}");
    assert_eq!(
        log.matches("bridge advanced the execution").count(),
        1,
        "{log}"
    );
    let metrics = stack
        .wait_metric(&bridge, "workflow_bridge_requests_total")
        .await;
    assert!(metrics.contains("endpoint=\"run\""), "{metrics}");
}

#[derive(diesel::QueryableByName)]
struct IdRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    id: String,
}

#[tokio::test]
async fn bad_executor_or_bridge_settings_stop_start_up_with_exit_code_2() {
    let stack = Stack::new().await;
    // (binary, extra variables, the variable the message must name)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 4] = [
        (BRIDGE, &[], "WORKFLOW_BRIDGE_SECRET"),
        (
            BRIDGE,
            &[("WORKFLOW_BRIDGE_SECRET", "short")],
            "WORKFLOW_BRIDGE_SECRET",
        ),
        (
            GENERAL,
            &[("WORKFLOW_EXECUTOR", "http")],
            "WORKFLOW_BRIDGE_URL",
        ),
        (
            GENERAL,
            &[("WORKFLOW_EXECUTOR", "remote")],
            "WORKFLOW_EXECUTOR",
        ),
    ];
    for (binary, extra, variable) in cases {
        let output = Command::new(binary)
            .envs(stack.env())
            .envs(extra.iter().copied())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{binary} {extra:?}: {stderr}"
        );
        assert!(stderr.contains(variable), "{binary} {extra:?}: {stderr}");
        assert!(
            !stderr.contains("short\""),
            "a secret is never echoed: {stderr}"
        );
    }
}

#[tokio::test]
async fn the_bridge_answers_health_checks_and_stops_cleanly_on_sigterm() {
    let stack = Stack::new().await;
    let mut bridge = stack
        .start(BRIDGE, &[("WORKFLOW_BRIDGE_SECRET", BRIDGE_SECRET)])
        .await;
    let health = reqwest::get(format!("http://{}/healthz", bridge.addr))
        .await
        .unwrap();
    assert!(health.status().is_success());
    // An unsigned request is refused.
    let refused = reqwest::Client::new()
        .post(format!("http://{}/v1/executions/run", bridge.addr))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 401);
    bridge.signal("TERM");
    let status = bridge.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "{status}");
    assert!(bridge.output().contains("bridge stopped cleanly"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_otlp_endpoint_the_bridge_exports_its_request_spans_in_the_callers_trace() {
    let stack = Stack::new().await;
    let collector = stack.http.url_for("/collector");
    let bridge = stack
        .start(
            BRIDGE,
            &[
                ("WORKFLOW_BRIDGE_SECRET", BRIDGE_SECRET),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.as_str()),
                // The SDK's batch delay (5 s by default), for a quicker test.
                ("OTEL_BSP_SCHEDULE_DELAY", "200"),
            ],
        )
        .await;
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let caller = TraceContext::parse(&format!("00-{trace_id}-b7ad6b7169203331-01"), None).unwrap();
    let client = BridgeClient::new(
        &format!("http://{}", bridge.addr),
        BridgeSecret::new(BRIDGE_SECRET).unwrap(),
    )
    .unwrap();
    // This process has no OpenTelemetry layer: the client sends the
    // context it runs in. The execution does not exist: a 404, in a span.
    let refused = outbox_trace::within(client.run("acme", uuid::Uuid::new_v4()), Some(&caller))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, BridgeCallError::Refused { status: 404, .. }),
        "{refused:?}"
    );
    let exported = stack
        .exported_spans_of(
            trace_id,
            "the bridge's span of the caller's trace at the collector",
        )
        .await;
    let body = &exported[0].body;
    let contains = |text: &str| body.windows(text.len()).any(|w| w == text.as_bytes());
    assert!(
        contains("outbox.bridge.request"),
        "the bridge's request span"
    );
    assert!(contains("workflow-bridge"), "the default service name");
}
