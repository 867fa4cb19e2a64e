//! The operator console in a real browser (headless Chromium driven over
//! WebDriver), served by `worker-general` with its dispatcher and queue
//! workers: sign in, the live overview, the events filtered to a FAILED
//! one, its page, its requeue (the dry run's count, then the confirmation)
//! until the worker has handed it off again (DONE, its job done in Redis), and a reader's requeue
//! refused; and a workflow run waiting for input, answered in its page's
//! form, followed until it has ended with every block in its timeline.
//! Each page saves a screenshot (`CONSOLE_SCREENSHOTS_DIR=docs/console`
//! refreshes the pictures of docs/console.md; by default they go under
//! `target/`).
//!
//! Needs `chromium` and `chromedriver` (Debian: `apt-get install chromium
//! chromium-driver`; `cargo xtask test` installs them as root). Without
//! them the test fails and says what to install: CI can install them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{GENERAL, Stack, Worker, free_addr};
use fantoccini::{Client, ClientBuilder, Locator};
use outbox_test_support::eventually;
use outbox_workflow_store::admin::{self, StartedRun};
use outbox_workflow_store::{self as store, ExecutionStatus, WorkflowRef, WorkflowStatus};
use serde_json::json;
use uuid::Uuid;

const OPERATOR: &str = "browser-operator-token-0123";
const READER: &str = "browser-reader-token-0123";
const WAIT: Duration = Duration::from_secs(30);

/// A program by its Debian path or on PATH, or the test fails saying what
/// to install.
fn program(name: &str, debian: &str) -> PathBuf {
    if Path::new(debian).exists() {
        return PathBuf::from(debian);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.exists())
    });
    found.unwrap_or_else(|| {
        panic!(
            "the console's browser test needs {name} ({debian}), which is not installed: \
             `apt-get install chromium chromium-driver` on Debian/Ubuntu \
             (`cargo xtask test` does it when it runs as root)"
        )
    })
}

/// ChromeDriver on a free port, stopped on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_driver() -> Driver {
    let chromedriver = program("chromedriver", "/usr/bin/chromedriver");
    let addr = free_addr();
    let port = addr.rsplit(':').next().unwrap().to_owned();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver {
        child,
        url: format!("http://{addr}"),
    };
    eventually("chromedriver answers", WAIT, async || {
        tokio::net::TcpStream::connect(&addr).await.is_ok()
    })
    .await;
    driver
}

async fn browser(driver: &Driver) -> Client {
    let chromium = program("chromium", "/usr/bin/chromium");
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,900"]
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a headless Chromium session")
}

/// Saves what the browser shows as `<page>.png` in `CONSOLE_SCREENSHOTS_DIR`
/// (relative to the workspace root; `docs/console` refreshes the docs'
/// pictures), else in the test's scratch directory under `target/`, so that
/// a test run leaves the checkout as it was.
async fn screenshot(client: &Client, page: &str) {
    let png = client.screenshot().await.unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = match std::env::var_os("CONSOLE_SCREENSHOTS_DIR") {
        Some(dir) => root.join(dir),
        None => Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots"),
    };
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{page}.png")), png).unwrap();
}

async fn text_of(client: &Client, css: &str) -> String {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
        .text()
        .await
        .unwrap()
}

async fn click(client: &Client, element: Locator<'_>) {
    client.find(element).await.unwrap().click().await.unwrap();
}

/// The text of `css`, or `None` while the page has none (mid-navigation).
async fn maybe_text(client: &Client, css: &str) -> Option<String> {
    client.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

/// Waits until `css` holds `text` (a click's navigation may still be on its way).
async fn wait_for(client: &Client, css: &str, text: &str) {
    eventually(&format!("{css} holding {text:?}"), WAIT, async || {
        maybe_text(client, css)
            .await
            .is_some_and(|t| t.contains(text))
    })
    .await;
}

async fn sign_in(client: &Client, console: &str, token: &str) {
    client.goto(console).await.unwrap();
    let form = client.form(Locator::Css("form")).await.unwrap();
    form.set_by_name("token", token).await.unwrap();
    form.submit().await.unwrap();
    eventually("the overview after signing in", WAIT, async || {
        client.find(Locator::Id("who")).await.is_ok()
    })
    .await;
}

/// `worker-general` with its console on a free address (the operator
/// `ana` and a reader); the console's URL.
async fn serve_console(stack: &Stack) -> (Worker, String) {
    let console_addr = free_addr();
    let tokens = format!("ana=operator:{OPERATOR},reader:{READER}");
    let worker = stack
        .start(
            GENERAL,
            &[
                ("OUTBOX_CONSOLE_TOKENS", &tokens),
                ("OUTBOX_CONSOLE_ADDR", &console_addr),
            ],
        )
        .await;
    (worker, format!("http://{console_addr}"))
}

async fn failed_event(stack: &Stack) -> Uuid {
    let id = Uuid::now_v7();
    stack
        .sql(&format!(
            "INSERT INTO outbox_event (id, tenant_id, event_type, payload, status, retries, failed_at, last_error)
             VALUES ('{id}', 'acme', 'audit.user.login', '{{\"userId\": \"u1\", \"apiToken\": \"tok_live_secret\"}}',
                     'FAILED', 5, now(), 'Redis refused the hand-off')"
        ))
        .await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_requeues_a_failed_event_in_the_browser_and_sees_it_done_and_a_reader_is_refused()
 {
    let driver = start_driver().await;
    let stack = Stack::new().await;
    let failed = failed_event(&stack).await;
    let (_worker, console) = serve_console(&stack).await;
    let client = browser(&driver).await;

    // Sign in.
    client.goto(&console).await.unwrap();
    assert!(text_of(&client, "main").await.contains("Token"));
    screenshot(&client, "login").await;
    sign_in(&client, &console, OPERATOR).await;
    assert_eq!(text_of(&client, "#who").await, "ana (operator)");

    // The overview: the FAILED event is counted, and the numbers update live.
    assert_eq!(text_of(&client, "[data-live='total:FAILED']").await, "1");
    wait_for(&client, "[data-live-stamp]", "updated").await;
    screenshot(&client, "overview").await;

    // The events, filtered to FAILED.
    client.goto(&format!("{console}/events")).await.unwrap();
    let filters = client.form(Locator::Id("filters")).await.unwrap();
    filters.set_by_name("status", "FAILED").await.unwrap();
    filters.submit().await.unwrap();
    wait_for(&client, "#matching", "1 matching").await;
    screenshot(&client, "events").await;

    // Its page: the payload's secret is masked.
    click(&client, Locator::Css("a.event-link")).await;
    wait_for(&client, "#field-status", "FAILED").await;
    let payload = text_of(&client, "#payload").await;
    assert!(payload.contains("\"apiToken\": \"***\"") && !payload.contains("tok_live_secret"));
    screenshot(&client, "event").await;

    // Requeue: the dry run's count first, then the confirmation.
    click(&client, Locator::Id("requeue")).await;
    wait_for(&client, "#dry-run-count", "1").await;
    screenshot(&client, "requeue").await;
    click(&client, Locator::Id("confirm")).await;
    wait_for(&client, "#done", "Requeued").await;

    // The dispatcher hands it off again: DONE, with the operator in its history.
    let event_page = format!("{console}/events/{failed}");
    eventually("the requeued event DONE", WAIT, async || {
        client.goto(&event_page).await.unwrap();
        maybe_text(&client, "#field-status").await.as_deref() == Some("DONE")
    })
    .await;
    assert!(
        text_of(&client, "#history")
            .await
            .contains("console:ana (operator)")
    );
    // Its job in Redis: the audit worker finished it.
    eventually("the event's job done in Redis", WAIT, async || {
        client.goto(&event_page).await.unwrap();
        maybe_text(&client, "#job-state")
            .await
            .is_some_and(|state| state.starts_with("done"))
    })
    .await;
    screenshot(&client, "event-done").await;

    // The actions by filter and a queue's dead jobs: their dry runs.
    failed_event(&stack).await;
    client
        .goto(&format!("{console}/events/requeue?status=FAILED"))
        .await
        .unwrap();
    wait_for(&client, "#dry-run-count", "1").await;
    screenshot(&client, "requeue-by-filter").await;
    client
        .goto(&format!("{console}/events/cancel?status=FAILED"))
        .await
        .unwrap();
    wait_for(&client, "#dry-run-count", "1").await;
    screenshot(&client, "cancel-by-filter").await;
    // A job whose body the audit worker cannot read dies at once.
    let mut redis =
        outbox_queue::connect(&outbox_queue::RedisSettings::new(stack.redis.url())).unwrap();
    let unreadable = format!("outbox:{}", Uuid::now_v7());
    outbox_queue::push_raw(
        &mut redis,
        &stack.namespace,
        "outbox.audit",
        &[(unreadable, b"not an audit job".to_vec())],
    )
    .await
    .unwrap();
    let dead_page = format!("{console}/queues/outbox.audit/dead");
    eventually("a dead job of outbox.audit", WAIT, async || {
        client.goto(&dead_page).await.unwrap();
        maybe_text(&client, "#dry-run-count").await.as_deref() == Some("1")
    })
    .await;
    screenshot(&client, "dead-jobs").await;

    // A reader sees the dry run but the confirmation is refused (403).
    let other = failed_event(&stack).await;
    click(&client, Locator::Css("header form button")).await;
    sign_in(&client, &console, READER).await;
    client
        .goto(&format!("{console}/events/{other}/requeue"))
        .await
        .unwrap();
    assert_eq!(text_of(&client, "#dry-run-count").await, "1");
    click(&client, Locator::Id("confirm")).await;
    wait_for(&client, "#refusal", "Readers may look but not act").await;
    screenshot(&client, "refused").await;
    client
        .goto(&format!("{console}/events/{other}"))
        .await
        .unwrap();
    assert_eq!(text_of(&client, "#field-status").await, "FAILED");

    client.close().await.unwrap();
}

/// manualTrigger → waitForInput (`ask`, no timeout) → log of the answer.
const APPROVAL: &str = r#"{
  "blocks": [
    { "id": "start", "type": "manualTrigger" },
    { "id": "ask", "type": "waitForInput", "params": { "prompt": "Approve the refund of 12 EUR?" } },
    { "id": "note", "type": "log", "params": { "message": "approved: {{ blocks.ask.output.answer.approved }}" } }
  ],
  "edges": [
    { "from": "start", "to": "ask" },
    { "from": "ask", "to": "note", "label": "input" }
  ]
}"#;

/// Saves the live workflow `refund-approval` and starts a run of it.
async fn approval_run(stack: &Stack) -> StartedRun {
    let mut conn = stack.db.conn().await;
    let saved = admin::save_document(
        &mut conn,
        "acme",
        "refund-approval",
        Some(WorkflowStatus::Live),
        APPROVAL,
    )
    .await
    .unwrap();
    admin::start_run(
        &mut conn,
        "acme",
        &WorkflowRef::Id(saved.workflow.id),
        &json!({ "refund": 12, "apiToken": "tok_live_secret" }),
    )
    .await
    .unwrap()
}

async fn execution_status(stack: &Stack, id: Uuid) -> ExecutionStatus {
    let mut conn = stack.db.conn().await;
    store::get_execution(&mut conn, id)
        .await
        .unwrap()
        .unwrap()
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_answers_a_waiting_workflow_in_the_browser_and_sees_its_timeline_finish() {
    let driver = start_driver().await;
    let stack = Stack::new().await;
    let (_worker, console) = serve_console(&stack).await;
    let run = approval_run(&stack).await;
    let id = run.execution_id;
    eventually("the run waiting for input", WAIT, async || {
        execution_status(&stack, id).await == ExecutionStatus::Waiting
    })
    .await;
    let client = browser(&driver).await;
    sign_in(&client, &console, OPERATOR).await;

    // The workflows, and the workflow with its versions and definition.
    client.goto(&format!("{console}/workflows")).await.unwrap();
    wait_for(&client, "#workflows", "refund-approval").await;
    screenshot(&client, "workflows").await;
    click(&client, Locator::Css("a.workflow-link")).await;
    wait_for(&client, "#versions", "current").await;
    assert!(
        text_of(&client, "#definition")
            .await
            .contains("waitForInput")
    );
    screenshot(&client, "workflow").await;

    // The executions waiting for input: the run.
    client
        .goto(&format!("{console}/executions?status=waiting"))
        .await
        .unwrap();
    wait_for(&client, "#matching", "1 matching").await;
    screenshot(&client, "executions").await;

    // Its page: the prompt, the timeline so far, the input with its secret masked.
    click(&client, Locator::Css("a.execution-link")).await;
    wait_for(&client, "#field-status", "waiting").await;
    assert_eq!(
        text_of(&client, "#prompt").await,
        "Approve the refund of 12 EUR?"
    );
    let input = text_of(&client, "#input").await;
    assert!(input.contains("\"apiToken\": \"***\"") && !input.contains("tok_live_secret"));
    wait_for(&client, "[data-live-stamp]", "updated").await;
    screenshot(&client, "execution-waiting").await;

    // The answer, typed into the form: the run resumes and the page follows it.
    let answer = client.find(Locator::Id("answer")).await.unwrap();
    answer.clear().await.unwrap();
    answer.send_keys(r#"{"approved": true}"#).await.unwrap();
    click(&client, Locator::Id("send-answer")).await;
    wait_for(&client, "#done", "Answered").await;
    wait_for(&client, "#field-status", "success").await;
    let blocks: Vec<(String, String)> = {
        let mut blocks = Vec::new();
        for row in client
            .find_all(Locator::Css("#timeline tr.block"))
            .await
            .unwrap()
        {
            blocks.push((
                row.attr("data-block").await.unwrap().unwrap(),
                row.attr("data-status").await.unwrap().unwrap(),
            ));
        }
        blocks
    };
    let expected = [
        ("start", "success"),
        ("ask", "waiting"),
        ("ask", "success"),
        ("note", "success"),
    ]
    .map(|(b, s)| (b.to_owned(), s.to_owned()));
    assert_eq!(blocks, expected);
    assert!(
        text_of(&client, "#timeline")
            .await
            .contains("\"approved\": true")
    );
    assert!(client.find(Locator::Id("answer-form")).await.is_err());
    // The picture shows the timeline, below the run's fields.
    client
        .execute(
            "document.getElementById('timeline').scrollIntoView()",
            Vec::new(),
        )
        .await
        .unwrap();
    screenshot(&client, "execution-done").await;
    assert_eq!(execution_status(&stack, id).await, ExecutionStatus::Success);

    client.close().await.unwrap();
}
