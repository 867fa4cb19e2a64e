//! The workflow pages over plain HTTP: a saved workflow, its versions and
//! a run moved to `waiting` in its `waitForInput` block; who may answer or
//! cancel it (401, 403 for a reader or without the session's CSRF token),
//! what an answer and a cancel write, and that no page shows a secret of
//! the definition, the input or the outputs. Real Postgres, a real server
//! on 127.0.0.1; no worker runs the workflow (the browser test in
//! outbox-worker does).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use diesel_async::SimpleAsyncConnection;
use outbox_store::EventKey;
use outbox_workflow_store::admin::{self, AnsweredRun};
use outbox_workflow_store::{self as store, ExecutionStatus, WorkflowRef, WorkflowStatus};
use reqwest::StatusCode;
use reqwest::header::LOCATION;
use serde_json::json;
use uuid::Uuid;

mod support;

use support::*;

/// manualTrigger → waitForInput (`ask`) → httpRequest whose URL and
/// header hold secrets.
const DEFINITION: &str = r#"{
  "blocks": [
    { "id": "start", "type": "manualTrigger" },
    { "id": "ask", "type": "waitForInput", "params": { "prompt": "Approve the refund?" } },
    { "id": "notify", "type": "httpRequest", "params": {
        "method": "POST", "url": "https://hooks.example.test/t/private-path?sig=def-sig-value",
        "headers": { "Authorization": "Bearer header-secret-value" } } }
  ],
  "edges": [
    { "from": "start", "to": "ask" },
    { "from": "ask", "to": "notify", "label": "input" }
  ]
}"#;

/// Secrets the definition, the input, the variables and the outputs hold.
const SECRETS: [&str; 6] = [
    "private-path",
    "def-sig-value",
    "header-secret-value",
    "input-token-value",
    "vars-password-value",
    "output-secret-value",
];

/// A saved live workflow and one run of it, `waiting` in `ask` after its
/// trigger block: (workflow id, execution id).
async fn waiting_run(console: &Served) -> (Uuid, Uuid) {
    let mut conn = console.db.conn().await;
    let saved = admin::save_document(
        &mut conn,
        "acme",
        "refund-approval",
        Some(WorkflowStatus::Live),
        DEFINITION,
    )
    .await
    .unwrap();
    let workflow = saved.workflow.id;
    let run = admin::start_run(
        &mut conn,
        "acme",
        &WorkflowRef::Id(workflow),
        &json!({ "refund": 12, "apiToken": "input-token-value" }),
    )
    .await
    .unwrap();
    let id = run.execution_id;
    // What the runner would have written up to the wait.
    conn.batch_execute(&format!(
        r#"UPDATE workflow_execution
             SET status = 'waiting', waiting_block = 'ask', started_at = now(),
                 vars = '{{"password": "vars-password-value"}}'
           WHERE id = '{id}';
           INSERT INTO workflow_block_execution
             (execution_id, block_id, sequence, status, output, started_at, finished_at)
           VALUES
             ('{id}', 'start', 1, 'success',
              '{{"refund": 12, "secret": "output-secret-value"}}', now(), now()),
             ('{id}', 'ask', 1, 'waiting', NULL, now() + interval '1 ms', NULL);"#
    ))
    .await
    .unwrap();
    (workflow, id)
}

async fn execution(console: &Served, id: Uuid) -> store::WorkflowExecution {
    let mut conn = console.db.conn().await;
    store::get_execution(&mut conn, id).await.unwrap().unwrap()
}

/// Whether the answer to `id`'s wait in `ask` was published.
async fn answer_published(console: &Served, id: Uuid) -> bool {
    let mut conn = console.db.conn().await;
    let key = format!("wf-continue:{id}:ask:input");
    outbox_store::summary(&mut conn, EventKey::DispatchKey(&key))
        .await
        .unwrap()
        .is_some()
}

#[tokio::test]
async fn the_workflow_pages_show_the_workflow_its_versions_and_a_waiting_runs_timeline_and_answer_form()
 {
    let console = served().await;
    let (workflow, id) = waiting_run(&console).await;

    let (status, list) = console.get_as(READER, "/workflows").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        list.contains("refund-approval") && list.contains("live"),
        "{list}"
    );

    let (status, one) = console
        .get_as(READER, &format!("/workflows/{workflow}"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(one.contains(r#"id="versions""#), "{one}");
    assert!(one.contains("current: new runs start on it"));
    assert!(one.contains("waitForInput") && one.contains(&id.to_string()));
    let (status, _) = console
        .get_as(READER, &format!("/workflows/{workflow}?version=9"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, waiting) = console.get_as(READER, "/executions?status=waiting").await;
    assert_eq!(status, StatusCode::OK);
    assert!(waiting.contains(&id.to_string()), "{waiting}");
    let (_, finished) = console.get_as(READER, "/executions?status=success").await;
    assert!(!finished.contains(&id.to_string()));
    let (status, wrong) = console.get_as(READER, "/executions?status=sleeping").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(wrong.contains("unknown execution status"), "{wrong}");

    let (status, page) = console.get_as(READER, &format!("/executions/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("Approve the refund?"), "{page}");
    assert!(page.contains(r#"id="answer-form""#) && page.contains(r#"id="cancel-form""#));
    assert!(page.contains(r#"data-block="start" data-status="success""#));
    assert!(page.contains(r#"data-block="ask" data-status="waiting""#));
    assert!(page.contains("manualTrigger") && page.contains("refund-approval"));
    assert!(
        page.contains("(workflow.execution.requested, PENDING)"),
        "the run's request, as outbox workflow show names it"
    );
    assert!(
        page.contains("data-live-url"),
        "an unfinished run is followed live"
    );

    let (status, _) = console
        .get_as(READER, &format!("/executions/{}", Uuid::now_v7()))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn no_workflow_page_shows_a_secret_of_the_definition_the_input_the_variables_or_the_outputs()
{
    let console = served().await;
    let (workflow, id) = waiting_run(&console).await;
    for path in [
        "/workflows".to_owned(),
        format!("/workflows/{workflow}"),
        "/executions".to_owned(),
        format!("/executions/{id}"),
    ] {
        let (status, page) = console.get_as(OPERATOR, &path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        for secret in SECRETS {
            assert!(!page.contains(secret), "{path} shows {secret}");
        }
    }
    let (_, page) = console.get_as(OPERATOR, &format!("/executions/{id}")).await;
    assert!(
        page.contains("&quot;apiToken&quot;: &quot;***&quot;"),
        "{page}"
    );
    assert!(page.contains("&quot;refund&quot;: 12"));
}

#[tokio::test]
async fn without_a_token_the_workflow_pages_and_actions_get_401() {
    let console = served().await;
    let (workflow, id) = waiting_run(&console).await;
    for path in [
        "/workflows".to_owned(),
        format!("/workflows/{workflow}"),
        "/executions".to_owned(),
        format!("/executions/{id}"),
        format!("/executions/{id}/live"),
    ] {
        let response = console.get_anonymous(&path).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    for action in ["answer", "cancel"] {
        let response = console
            .post(&format!("/executions/{id}/{action}"), &[], "answer={}")
            .await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{action}");
    }
    assert_eq!(
        execution(&console, id).await.status,
        ExecutionStatus::Waiting
    );
}

#[tokio::test]
async fn a_readers_answer_or_cancel_is_refused_with_403_and_changes_nothing() {
    let console = served().await;
    let (_, id) = waiting_run(&console).await;
    let answer = console
        .post_as(READER, &format!("/executions/{id}/answer"), "answer=%7B%7D")
        .await;
    assert_eq!(answer.status(), StatusCode::FORBIDDEN);
    let cancel = console
        .post_as(READER, &format!("/executions/{id}/cancel"), "")
        .await;
    assert_eq!(cancel.status(), StatusCode::FORBIDDEN);
    assert!(!answer_published(&console, id).await);
    let run = execution(&console, id).await;
    assert_eq!(run.status, ExecutionStatus::Waiting);
    assert_eq!(run.error, None);
}

#[tokio::test]
async fn an_answer_or_cancel_without_the_sessions_csrf_token_is_refused_with_403() {
    let console = served().await;
    let (_, id) = waiting_run(&console).await;
    let cookie = console.sign_in(OPERATOR).await;
    let page = console
        .get_with_cookie(&cookie, &format!("/executions/{id}"))
        .await;
    let csrf = csrf_of(&page);
    for (action, form) in [
        ("answer", "answer=%7B%7D".to_owned()),
        ("cancel", String::new()),
        ("answer", format!("answer=%7B%7D&csrf={}", "0".repeat(64))),
    ] {
        let refused = console
            .post(
                &format!("/executions/{id}/{action}"),
                &[("cookie", cookie.clone())],
                &form,
            )
            .await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{action} {form}");
    }
    assert!(!answer_published(&console, id).await);
    let answered = console
        .post(
            &format!("/executions/{id}/answer"),
            &[("cookie", cookie.clone())],
            &format!("answer=%7B%22approved%22%3Atrue%7D&csrf={csrf}"),
        )
        .await;
    assert_eq!(answered.status(), StatusCode::SEE_OTHER);
    assert!(answer_published(&console, id).await);
}

#[tokio::test]
async fn an_operators_answer_publishes_the_continuation_once_and_an_answer_that_is_not_json_is_refused()
 {
    let console = served().await;
    let (_, id) = waiting_run(&console).await;
    let path = format!("/executions/{id}/answer");

    let not_json = console.post_as(OPERATOR, &path, "answer=%7Bapproved").await;
    assert_eq!(not_json.status(), StatusCode::BAD_REQUEST);
    assert!(not_json.text().await.unwrap().contains("not JSON"));
    assert!(!answer_published(&console, id).await);

    let first = console
        .post_as(OPERATOR, &path, "answer=%7B%22approved%22%3Atrue%7D")
        .await;
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    assert!(
        first.headers()[LOCATION]
            .to_str()
            .unwrap()
            .ends_with("?done=answered")
    );
    assert!(answer_published(&console, id).await);
    let second = console
        .post_as(OPERATOR, &path, "answer=%7B%22approved%22%3Afalse%7D")
        .await;
    assert!(
        second.headers()[LOCATION]
            .to_str()
            .unwrap()
            .ends_with("?done=duplicate")
    );

    // The first answer stands: the store refuses nothing, writes nothing.
    let mut conn = console.db.conn().await;
    let again: AnsweredRun = admin::answer_run(&mut conn, "acme", id, &json!({}), "test")
        .await
        .unwrap();
    assert!(again.event.is_duplicate());
}

#[tokio::test]
async fn an_operators_cancel_ends_the_run_naming_the_operator_and_a_second_is_refused_with_409() {
    let console = served().await;
    let (_, id) = waiting_run(&console).await;
    let path = format!("/executions/{id}/cancel");

    let cancelled = console.post_as(OPERATOR, &path, "").await;
    assert_eq!(cancelled.status(), StatusCode::SEE_OTHER);
    let run = execution(&console, id).await;
    assert_eq!(run.status, ExecutionStatus::Cancelled);
    assert_eq!(
        run.error.as_deref(),
        Some("cancelled by console:ana (operator)")
    );

    let again = console.post_as(OPERATOR, &path, "").await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
    assert!(again.text().await.unwrap().contains("already finished"));
    let answer = console
        .post_as(
            OPERATOR,
            &format!("/executions/{id}/answer"),
            "answer=%7B%7D",
        )
        .await;
    assert_eq!(answer.status(), StatusCode::CONFLICT);

    let (_, page) = console.get_as(READER, &format!("/executions/{id}")).await;
    assert!(page.contains("cancelled by console:ana (operator)"));
    assert!(!page.contains("answer-form") && !page.contains("data-live-url"));
}

#[tokio::test]
async fn following_a_run_sends_its_page_part_then_the_change_once_it_ends_and_the_stream_ends() {
    let console = served().await;
    let (_, id) = waiting_run(&console).await;
    let mut live = console
        .http
        .get(format!("{}/executions/{id}/live", console.url))
        .header("authorization", format!("Bearer {READER}"))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), StatusCode::OK);
    let first = live.chunk().await.unwrap().expect("the first fragment");
    let first = String::from_utf8_lossy(&first).into_owned();
    assert!(first.contains("event: fragments"), "{first}");
    assert!(first.contains("Approve the refund?"));

    let cancelled = console
        .post_as(OPERATOR, &format!("/executions/{id}/cancel"), "")
        .await;
    assert_eq!(cancelled.status(), StatusCode::SEE_OTHER);
    // The next read shows the run cancelled, then the stream says done and ends.
    let rest = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        let mut rest = Vec::new();
        while let Some(chunk) = live.chunk().await.unwrap() {
            rest.extend_from_slice(&chunk);
        }
        String::from_utf8_lossy(&rest).into_owned()
    })
    .await
    .expect("the stream ended once the run had ended");
    assert!(
        rest.contains("cancelled by console:ana (operator)"),
        "{rest}"
    );
    assert!(!rest.contains("answer-form"));
    assert!(
        rest.trim_end().ends_with("event: done\ndata: ended"),
        "{rest}"
    );
}

#[tokio::test]
async fn under_a_mount_prefix_the_workflow_pages_links_forms_and_live_url_follow_it() {
    let console = served_under("/ops/outbox").await;
    let (workflow, id) = waiting_run(&console).await;
    let (_, list) = console.get_as(READER, "/executions").await;
    assert!(
        list.contains(&format!(r#"href="/ops/outbox/executions/{id}""#)),
        "{list}"
    );
    assert!(list.contains(&format!(r#"href="/ops/outbox/workflows/{workflow}""#)));
    let (_, page) = console.get_as(OPERATOR, &format!("/executions/{id}")).await;
    for target in [
        format!(r#"action="/ops/outbox/executions/{id}/answer""#),
        format!(r#"action="/ops/outbox/executions/{id}/cancel""#),
        format!(r#"data-live-url="/ops/outbox/executions/{id}/live""#),
    ] {
        assert!(page.contains(&target), "{target} in {page}");
    }
}

#[tokio::test]
async fn the_executions_page_pages_newest_first_and_the_next_page_starts_after_the_last_run() {
    let console = served().await;
    let (workflow, _) = waiting_run(&console).await;
    // 59 more runs, one a second into the past; 60 in all.
    console
        .db
        .conn()
        .await
        .batch_execute(&format!(
            "INSERT INTO workflow_execution (tenant_id, workflow_id, workflow_version,
                                             trigger_kind, input, created_at)
             SELECT 'acme', '{workflow}', 1, 'manual', '{{}}', now() - make_interval(secs => n)
             FROM generate_series(1, 59) AS n"
        ))
        .await
        .unwrap();
    let ids = |page: &str| -> Vec<String> {
        page.match_indices(r#"class="execution-link" href="/executions/"#)
            .map(|(i, m)| page[i + m.len()..i + m.len() + 36].to_owned())
            .collect()
    };

    let (_, first) = console.get_as(READER, "/executions?tenant=acme").await;
    assert!(
        first.contains("60 matching execution(s), newest first"),
        "{first}"
    );
    assert_eq!(ids(&first).len(), 50);
    let start = first.find(r#"id="next-page" href=""#).expect("a next page") + 21;
    let next = &first[start..start + first[start..].find('"').unwrap()];
    assert!(next.contains("tenant=acme&amp;after="), "{next}");
    let (status, second) = console.get_as(READER, &next.replace("&amp;", "&")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ids(&second).len(), 10);
    assert!(!second.contains("next-page"));

    let mut conn = console.db.conn().await;
    let all = store::list_executions(&mut conn, &store::ExecutionFilter::default())
        .await
        .unwrap();
    let newest_first: Vec<String> = all.iter().map(|e| e.id.to_string()).collect();
    assert_eq!([ids(&first), ids(&second)].concat(), newest_first);
    let (status, _) = console.get_as(READER, "/executions?after=yesterday").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn who_answered_a_wait_is_kept_on_the_waiting_block_run_and_shown_on_the_run_page() {
    let console = served().await;
    let (_, id) = waiting_run(&console).await;
    let path = format!("/executions/{id}/answer");

    let first = console
        .post_as(OPERATOR, &path, "answer=%7B%22approved%22%3Atrue%7D")
        .await;
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    // A second answer (here from the CLI's operation) is a duplicate and
    // leaves the first answerer in place.
    let mut conn = console.db.conn().await;
    let again = admin::answer_run(&mut conn, "acme", id, &json!({}), "alice")
        .await
        .unwrap();
    assert!(again.event.is_duplicate());

    let blocks = store::block_executions(&mut conn, id).await.unwrap();
    let ask = blocks.iter().find(|b| b.block_id == "ask").unwrap();
    let (by, at) = ask.answered_by().expect("who answered");
    assert_eq!(by, "console:ana (operator)");
    assert!(at.is_some());
    let (_, page) = console.get_as(READER, &format!("/executions/{id}")).await;
    assert!(
        page.contains(r#"answered by <span class="who">console:ana (operator)</span>"#),
        "{page}"
    );
    assert!(!page.contains("alice"));
}
