//! The console over plain HTTP, without a browser: who gets in (401
//! without a token), who may act (403 for a reader), the CSRF check on
//! every action, links under a mount prefix, and that no page shows a
//! secret. Real Postgres, a real server on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use diesel_async::SimpleAsyncConnection;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, COOKIE, LOCATION, SET_COOKIE};
use uuid::Uuid;

mod support;

use support::*;

#[tokio::test]
async fn pages_assets_and_the_login_form_forbid_caching_framing_and_sniffing() {
    let console = served().await;
    for (token, path) in [
        (None, "/"),
        (Some(READER), "/"),
        (Some(READER), "/events"),
        (Some(READER), "/assets/console.js"),
    ] {
        let mut request = console.http.get(format!("{}{path}", console.url));
        if let Some(token) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = request.send().await.unwrap();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(
            header("cache-control").as_deref(),
            Some("no-store"),
            "{path}"
        );
        assert_eq!(header("x-frame-options").as_deref(), Some("DENY"), "{path}");
        assert_eq!(
            header("content-security-policy").as_deref(),
            Some("frame-ancestors 'none'"),
            "{path}"
        );
        assert_eq!(
            header("x-content-type-options").as_deref(),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(
            header("referrer-policy").as_deref(),
            Some("same-origin"),
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_request_without_a_valid_token_gets_401_and_the_login_form() {
    let console = served().await;

    for path in ["/", "/events", "/live"] {
        let response = console.get_anonymous(path).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
        assert!(response.text().await.unwrap().contains("Sign in"));
    }
    let (status, _) = console.get_as("not-a-token-of-this-console", "/").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let wrong = console
        .post("/login", &[], "token=not-a-token-of-this-console")
        .await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong.headers().get(SET_COOKIE).is_none());
}

#[tokio::test]
async fn a_reader_sees_every_page_but_its_requeue_is_refused_with_403() {
    let console = served().await;
    let id = console.failed_event().await;

    for path in [
        "/".to_owned(),
        "/events?status=FAILED".to_owned(),
        format!("/events/{id}"),
        format!("/events/{id}/requeue"),
    ] {
        let (status, _) = console.get_as(READER, &path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    let (_, event) = console.get_as(READER, &format!("/events/{id}")).await;
    assert!(
        event.contains("Not shown: the console was not given the Redis queues."),
        "a console without Redis shows the event without its job: {event}"
    );
    let refused = console
        .post_as(
            READER,
            &format!("/events/{id}/requeue"),
            "replay=false&reason=try",
        )
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("Readers may look but not act")
    );
    assert_eq!(console.status(id).await, "FAILED");
    assert!(console.history(id).await.is_empty());

    // A reader signed in through the form is refused the same way.
    let cookie = console.sign_in(READER).await;
    let page = console
        .get_with_cookie(&cookie, &format!("/events/{id}/requeue"))
        .await;
    let refused = console
        .post(
            &format!("/events/{id}/requeue"),
            &[("cookie", cookie)],
            &format!("csrf={}&replay=false", csrf_of(&page)),
        )
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(console.status(id).await, "FAILED");
}

/// The embedding application's hook (`Console::with_authorizer`) names
/// who asks: that identity is let in without a token and shown, with no
/// "Sign out" (the application signs its users out), its actions need the
/// CSRF token of its own forms and are recorded under its name, and a
/// request the hook does not name falls back to the tokens.
// Break checked: with the hook not asked (its identity ignored) the first
// page answers 401; with "Sign out" shown whenever a form token exists
// (the header before) the page's assertion fails.
#[tokio::test]
async fn an_identity_the_applications_hook_names_is_let_in_and_its_actions_need_its_forms_csrf_token()
 {
    let console = served_with("", |console| {
        console.with_authorizer(|parts: &axum::http::request::Parts| {
            let user = parts.headers.get("x-user")?.to_str().ok()?;
            Some(outbox_console::Identity::new(
                user,
                outbox_console::Role::Operator,
            ))
        })
    })
    .await;
    let id = console.failed_event().await;
    let alice = || [("x-user", "alice".to_owned())];
    let page = console
        .http
        .get(format!("{}/events/{id}/requeue", console.url))
        .header("x-user", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let page = page.text().await.unwrap();
    assert!(page.contains("alice (operator)"), "{page}");
    assert!(!page.contains("Sign out"), "{page}");
    let csrf = csrf_of(&page);

    let path = format!("/events/{id}/requeue");
    let refused = console.post(&path, &alice(), "replay=false").await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    // Bob's forms carry another token.
    let refused = console
        .post(
            &path,
            &[("x-user", "bob".to_owned())],
            &format!("csrf={csrf}&replay=false"),
        )
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(console.status(id).await, "FAILED");

    let done = console
        .post(
            &path,
            &alice(),
            &format!("csrf={csrf}&replay=false&reason=queue+is+back"),
        )
        .await;
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert_eq!(console.status(id).await, "PENDING");
    assert_eq!(
        console.history(id).await[0].requested_by.as_deref(),
        Some("console:alice (operator)")
    );

    // Not named by the hook: the tokens decide.
    assert_eq!(
        console.get_anonymous("/").await.status(),
        StatusCode::UNAUTHORIZED
    );
    let (status, page) = console.get_as(READER, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("(reader)"), "{page}");
}

#[tokio::test]
async fn an_action_without_the_sessions_csrf_token_is_refused_and_with_it_is_recorded_with_its_actor()
 {
    let console = served().await;
    let id = console.failed_event().await;
    let cookie = console.sign_in(OPERATOR).await;
    let dry_run = console
        .get_with_cookie(&cookie, &format!("/events/{id}/requeue"))
        .await;
    assert!(
        dry_run.contains(r#"<span id="dry-run-count">1</span>"#),
        "{dry_run}"
    );
    let csrf = csrf_of(&dry_run);

    for form in [
        "replay=false".to_owned(),
        "csrf=&replay=false".to_owned(),
        format!("csrf={}&replay=false", "0".repeat(64)),
    ] {
        let refused = requeue(&console, &cookie, id, &form).await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{form}");
        assert!(refused.text().await.unwrap().contains("CSRF"));
    }
    assert_eq!(console.status(id).await, "FAILED");

    // Another session's token is no better than none.
    let other = console.sign_in(OPERATOR).await;
    let other_csrf = csrf_of(&console.get_with_cookie(&other, "/").await);
    assert_ne!(other_csrf, csrf);
    let refused = requeue(
        &console,
        &cookie,
        id,
        &format!("csrf={other_csrf}&replay=false"),
    )
    .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);

    let done = requeue(
        &console,
        &cookie,
        id,
        &format!("csrf={csrf}&replay=false&reason=queue+is+back"),
    )
    .await;
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert!(
        done.headers()[LOCATION]
            .to_str()
            .unwrap()
            .ends_with("?done=requeued")
    );
    assert_eq!(console.status(id).await, "PENDING");
    let history = console.history(id).await;
    assert_eq!(history.len(), 1);
    assert_eq!(
        history[0].requested_by.as_deref(),
        Some("console:ana (operator)")
    );
    assert_eq!(history[0].reason, "queue is back");
    assert_eq!(history[0].previous_status, "FAILED");
    let page = console
        .get_with_cookie(&cookie, &format!("/events/{id}"))
        .await;
    assert!(page.contains("console:ana (operator)") && page.contains("requeued from FAILED"));
}

#[tokio::test]
async fn the_requeue_policy_is_the_clis_a_pending_event_is_refused_and_a_done_one_needs_replay() {
    let console = served().await;
    let pending = console.event(r#"{"a": 1}"#, "", "").await;
    let done = console
        .event(r#"{"a": 2}"#, ", status, processed_at", ", 'DONE', now()")
        .await;

    let (_, page) = console
        .get_as(OPERATOR, &format!("/events/{pending}/requeue"))
        .await;
    assert!(page.contains(r#"<span id="dry-run-count">0</span>"#));
    assert!(page.contains("already PENDING"));
    let refused = console
        .post_as(
            OPERATOR,
            &format!("/events/{pending}/requeue"),
            "replay=false",
        )
        .await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);

    let replayed = console
        .post_as(OPERATOR, &format!("/events/{done}/requeue"), "replay=true")
        .await;
    assert_eq!(replayed.status(), StatusCode::SEE_OTHER);
    let history = console.history(done).await;
    assert!(history[0].replay && history[0].generation == Some(1));
}

#[tokio::test]
async fn no_page_shows_a_secret_of_a_payload_an_error_or_the_tokens() {
    let console = served().await;
    let id = console
        .event(
            r#"{"user": "ana", "webhook": {"signingSecret": "whsec_c2VjcmV0LXZhbHVl", "url": "https://hooks.example.com/t/private-path?sig=abc"}, "password": "hunter2-hunter2"}"#,
            ", status, retries, failed_at, last_error",
            ", 'FAILED', 1, now(), 'error sending request for url (https://hooks.example.com/t/private-path?sig=abc): timed out'",
        )
        .await;
    let cookie = console.sign_in(OPERATOR).await;
    let mut pages = Vec::new();
    for path in [
        "/".to_owned(),
        "/events".to_owned(),
        format!("/events/{id}"),
        format!("/events/{id}/requeue"),
    ] {
        pages.push((path.clone(), console.get_with_cookie(&cookie, &path).await));
    }
    for (path, page) in &pages {
        for secret in [
            "whsec_c2VjcmV0LXZhbHVl",
            "private-path",
            "hunter2-hunter2",
            OPERATOR,
            READER,
            cookie.trim_start_matches("outbox_console="),
        ] {
            assert!(!page.contains(secret), "{path} shows {secret}");
        }
    }
    // The payload is shown, HTML-escaped, with its secrets masked.
    let event_page = &pages[2].1;
    assert!(
        event_page.contains("&quot;signingSecret&quot;: &quot;***&quot;"),
        "{event_page}"
    );
    assert!(event_page.contains("https://hooks.example.com/…"));
    assert!(event_page.contains("&quot;user&quot;: &quot;ana&quot;"));
}

#[tokio::test]
async fn links_and_the_session_cookie_follow_the_mount_prefix() {
    let console = served_under("/ops/outbox").await;
    let id = console.failed_event().await;
    let login = console.http.get(&console.url).send().await.unwrap();
    assert_eq!(login.status(), StatusCode::UNAUTHORIZED);
    assert!(
        login
            .text()
            .await
            .unwrap()
            .contains(r#"action="/ops/outbox/login""#)
    );

    let response = console
        .post("/login", &[], &format!("token={OPERATOR}"))
        .await;
    assert_eq!(response.headers()[LOCATION], "/ops/outbox");
    assert!(
        response.headers()[SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Path=/ops/outbox;")
    );

    let (status, overview) = console.get_as(OPERATOR, "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(overview.contains(r#"href="/ops/outbox/events""#));
    assert!(overview.contains(r#"src="/ops/outbox/assets/console.js""#));
    assert!(overview.contains(r#"data-live-url="/ops/outbox/live""#));
    let (_, events) = console.get_as(OPERATOR, "/events?status=failed").await;
    assert!(
        events.contains(&format!(r#"href="/ops/outbox/events/{id}""#)),
        "{events}"
    );
    let (status, _) = console.get_as(OPERATOR, "/assets/console.js").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_cancel_shows_its_dry_run_then_cancels_with_its_actor_and_refuses_a_done_event() {
    let console = served().await;
    let failed = console.failed_event().await;
    let done = console
        .event(r#"{"a": 2}"#, ", status, processed_at", ", 'DONE', now()")
        .await;

    let (_, dry_run) = console
        .get_as(OPERATOR, &format!("/events/{failed}/cancel"))
        .await;
    assert!(dry_run.contains(r#"<span id="dry-run-count">1</span>"#));
    assert!(dry_run.contains("FAILED → CANCELLED"));
    let reader = console
        .post_as(READER, &format!("/events/{failed}/cancel"), "reason=x")
        .await;
    assert_eq!(reader.status(), StatusCode::FORBIDDEN);
    assert_eq!(console.status(failed).await, "FAILED");

    let cancelled = console
        .post_as(
            OPERATOR,
            &format!("/events/{failed}/cancel"),
            "reason=duplicate",
        )
        .await;
    assert_eq!(cancelled.status(), StatusCode::SEE_OTHER);
    assert_eq!(console.status(failed).await, "CANCELLED");
    let history = console.history(failed).await;
    assert_eq!(history[0].action, "cancel");
    assert_eq!(
        history[0].requested_by.as_deref(),
        Some("console:ana (operator)")
    );
    assert_eq!(history[0].reason, "duplicate");

    let (_, refused_page) = console
        .get_as(OPERATOR, &format!("/events/{done}/cancel"))
        .await;
    assert!(refused_page.contains(r#"<span id="dry-run-count">0</span>"#));
    assert!(refused_page.contains("DONE: it was handed off already"));
    let refused = console
        .post_as(OPERATOR, &format!("/events/{done}/cancel"), "")
        .await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert_eq!(console.status(done).await, "DONE");
}

/// A handler that refuses every job for good: its jobs die at once.
struct Doomed;

impl outbox_subscriber::JobHandler for Doomed {
    type Job = serde_json::Value;

    fn queue(&self) -> &str {
        outbox_queue::queues::WEBHOOK
    }

    async fn handle(
        &self,
        _job: serde_json::Value,
        _meta: &outbox_subscriber::JobMeta,
    ) -> Result<(), outbox_subscriber::JobError> {
        Err(outbox_subscriber::JobError::permanent(
            "the receiver refuses this body",
        ))
    }
}

/// Pushes the jobs (task id, body) on the webhook queue and runs a
/// handler that refuses each until all of them are dead.
async fn dead_webhook_jobs(
    conn: &outbox_queue::RedisConnection,
    namespace: &outbox_queue::QueueNamespace,
    jobs: &[(&str, &str)],
) {
    use outbox_queue::queues::WEBHOOK;
    let jobs: Vec<(String, Vec<u8>)> = jobs
        .iter()
        .map(|(id, body)| ((*id).to_owned(), body.as_bytes().to_vec()))
        .collect();
    outbox_queue::push_raw(&mut conn.clone(), namespace, WEBHOOK, &jobs)
        .await
        .unwrap();
    let group = outbox_subscriber::HandlerGroup::new().with(Doomed).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let (worker_conn, worker_ns, worker_stop) = (conn.clone(), namespace.clone(), stop.clone());
    let worker = tokio::spawn(async move {
        group
            .run(
                worker_conn,
                &worker_ns,
                &outbox_subscriber::WorkerSettings::default(),
                worker_stop,
            )
            .await
    });
    outbox_test_support::eventually(
        "every job dead",
        std::time::Duration::from_secs(30),
        async || {
            outbox_queue::dead_task_ids(&mut conn.clone(), namespace, WEBHOOK)
                .await
                .unwrap()
                .len()
                == jobs.len()
        },
    )
    .await;
    stop.cancel();
    worker.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_jobs_are_listed_and_put_back_no_more_than_shown_recorded_in_the_history_and_the_event_page_shows_the_jobs_state()
 {
    use outbox_queue::{QueueNamespace, RedisSettings, queues::WEBHOOK};
    let redis = outbox_test_support::TestRedis::new().await;
    let namespace = QueueNamespace::prefixed(redis.prefix());
    let conn = outbox_queue::connect(&RedisSettings::new(redis.url())).unwrap();
    let console = served_with("", |console| {
        console.with_queues(conn.clone(), namespace.clone(), vec![WEBHOOK.to_owned()])
    })
    .await;
    // job-2 is an event's own job: its history records the put-back, and
    // the event's page shows its state.
    let event = console
        .event(
            r#"{"a": 1}"#,
            ", status, processed_at, target_queue",
            &format!(", 'DONE', now(), '{WEBHOOK}'"),
        )
        .await;
    let job_2 = outbox_queue::task_id(event);
    let job_state = async || {
        let (status, page) = console.get_as(READER, &format!("/events/{event}")).await;
        assert_eq!(status, StatusCode::OK);
        page
    };
    assert!(
        job_state()
            .await
            .contains(r#"<td id="job-state"><strong>not in Redis</strong>"#),
        "before the push"
    );
    dead_webhook_jobs(
        &conn,
        &namespace,
        &[("job-1", "{}"), (&job_2, "{}"), ("job-3", "{}")],
    )
    .await;
    let dead = async || {
        outbox_queue::dead_task_ids(&mut conn.clone(), &namespace, WEBHOOK)
            .await
            .unwrap()
            .len()
    };
    let dead_page = job_state().await;
    assert!(
        dead_page.contains(r#"<td id="job-state"><strong>dead</strong>"#),
        "{dead_page}"
    );
    assert!(
        dead_page.contains(r#"<td id="job-reason">{&quot;Err&quot;:&quot;AbortError: the receiver refuses this body&quot;}</td>"#),
        "{dead_page}"
    );
    assert!(dead_page.contains(&format!(r#"<td id="job-task">{job_2}</td>"#)));

    let (status, overview) = console.get_as(OPERATOR, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        overview.contains(&format!(r#"href="/queues/{WEBHOOK}/dead""#)),
        "{overview}"
    );
    let (status, page) = console
        .get_as(READER, &format!("/queues/{WEBHOOK}/dead"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains(r#"<span id="dry-run-count">3</span>"#),
        "{page}"
    );
    assert!(page.contains("the receiver refuses this body"));

    let refused = console
        .post_as(READER, &format!("/queues/{WEBHOOK}/dead"), "")
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(dead().await, 3);

    assert!(page.contains(r#"<input type="hidden" name="expected" value="3">"#));
    // A confirmation for fewer jobs than the queue now holds puts none back.
    let stale = console
        .post_as(OPERATOR, &format!("/queues/{WEBHOOK}/dead"), "expected=2")
        .await;
    assert_eq!(stale.status(), StatusCode::CONFLICT);
    assert_eq!(dead().await, 3);

    assert!(console.history(event).await.is_empty());

    let put_back = console
        .post_as(
            OPERATOR,
            &format!("/queues/{WEBHOOK}/dead"),
            "expected=3&reason=receiver+back",
        )
        .await;
    assert_eq!(put_back.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        put_back.headers()[LOCATION],
        format!("/queues/{WEBHOOK}/dead?put_back=3&recorded=1")
    );
    assert_eq!(dead().await, 0);
    let history = console.history(event).await;
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(
        (
            history[0].action.as_str(),
            history[0].requested_by.as_deref(),
            history[0].reason.as_str(),
            history[0].queue.as_deref(),
            history[0].task_id.as_deref(),
        ),
        (
            "retry_dead",
            Some("console:ana (operator)"),
            "receiver back",
            Some(WEBHOOK),
            Some(job_2.as_str()),
        ),
        "the event's history says who put its dead job back, why, and where"
    );
    let (_, page) = console
        .get_as(
            OPERATOR,
            &format!("/queues/{WEBHOOK}/dead?put_back=3&recorded=1"),
        )
        .await;
    assert!(page.contains("Put 3 dead job(s) back"));
    assert!(page.contains("1 recorded in their events' history"));
    let event_page = job_state().await;
    assert!(
        event_page.contains(&format!("dead job {job_2} put back on {WEBHOOK}")),
        "{event_page}"
    );
    assert!(
        event_page.contains(r#"<td id="job-state"><strong>waiting</strong>"#),
        "put back, the job waits on its queue again: {event_page}"
    );

    let (status, _) = console
        .get_as(OPERATOR, "/queues/outbox.nowhere/dead")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

// Break checked: with `past_their_keys` answering no job, the page counts
// both jobs as going back and the POST puts the ordered one back too; with
// the event page's `key_past` answering false, it offers the put-back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_ordered_job_whose_key_moved_past_it_stays_dead_and_the_page_says_to_replay_it() {
    use outbox_queue::{QueueNamespace, RedisSettings, queues::WEBHOOK};
    let redis = outbox_test_support::TestRedis::new().await;
    let namespace = QueueNamespace::prefixed(redis.prefix());
    let conn = outbox_queue::connect(&RedisSettings::new(redis.url())).unwrap();
    let console = served_with("", |console| {
        console.with_queues(conn.clone(), namespace.clone(), vec![WEBHOOK.to_owned()])
    })
    .await;
    let ordered = console
        .event(
            "{}",
            ", status, processed_at, target_queue, ordering_key",
            &format!(", 'DONE', now(), '{WEBHOOK}', 'acct-7'"),
        )
        .await;
    let plain = console
        .event(
            "{}",
            ", status, processed_at, target_queue",
            &format!(", 'DONE', now(), '{WEBHOOK}'"),
        )
        .await;
    let (ordered_job, plain_job) = (outbox_queue::task_id(ordered), outbox_queue::task_id(plain));
    let first_body = format!(
        r#"{{"outbox_event_id":"{ordered}","ordering_key":"acct-7","ordering_position":1}}"#
    );
    let plain_body = format!(r#"{{"outbox_event_id":"{plain}"}}"#);
    dead_webhook_jobs(
        &conn,
        &namespace,
        &[(&ordered_job, &first_body), (&plain_job, &plain_body)],
    )
    .await;
    // A worker whose ordering policy skips dead events moved the key on.
    let mut db = console.db.conn().await;
    db.batch_execute("SELECT outbox_ordering_advance('acct-7', 1)")
        .await
        .unwrap();
    let (_, event_page) = console.get_as(READER, &format!("/events/{ordered}")).await;
    assert!(
        event_page.contains("its ordering key has moved past it since")
            && !event_page.contains("job-dead-jobs"),
        "the event's page says replay, not put back: {event_page}"
    );
    // Retention deleted the row since: the job's body still decides.
    db.batch_execute(&format!("DELETE FROM outbox_event WHERE id = '{ordered}'"))
        .await
        .unwrap();
    let dead = async || {
        outbox_queue::dead_task_ids(&mut conn.clone(), &namespace, WEBHOOK)
            .await
            .unwrap()
    };

    let (status, page) = console
        .get_as(READER, &format!("/queues/{WEBHOOK}/dead"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains(r#"<span id="dry-run-count">1</span>"#)
            && page.contains("1 would stay dead")
            && page.contains("replay the event from its page")
            && page.contains(r#"name="expected" value="1""#)
            && page.contains(&format!(
                r#"{ordered_job}: key acct-7, position 1, event <a href="/events/{ordered}">"#
            )),
        "{page}"
    );
    let put_back = console
        .post_as(OPERATOR, &format!("/queues/{WEBHOOK}/dead"), "expected=1")
        .await;
    assert_eq!(put_back.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        put_back.headers()[LOCATION],
        format!("/queues/{WEBHOOK}/dead?put_back=1&recorded=1&left=1")
    );
    assert_eq!(dead().await, [ordered_job], "the ordered job stays dead");
    assert!(console.history(ordered).await.is_empty());
    let (_, page) = console
        .get_as(
            OPERATOR,
            &format!("/queues/{WEBHOOK}/dead?put_back=1&recorded=1&left=1"),
        )
        .await;
    assert!(
        page.contains("1 left dead: their ordering key has moved past their event."),
        "{page}"
    );
}

#[tokio::test]
async fn the_events_page_pages_by_keyset_and_the_next_page_starts_after_the_last_row() {
    let console = served().await;
    console
        .db
        .conn()
        .await
        .batch_execute(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, created_at)
             SELECT 'acme', 'audit.user.login', jsonb_build_object('n', n),
                    now() - make_interval(secs => 100 - n)
             FROM generate_series(1, 60) AS n",
        )
        .await
        .unwrap();

    let (_, first) = console.get_as(OPERATOR, "/events?tenant=acme").await;
    assert!(first.contains("60 matching event(s)"));
    assert_eq!(first.matches(r#"class="event-link""#).count(), 50);
    let start = first.find(r#"id="next-page" href=""#).expect("a next page") + 21;
    let next = &first[start..start + first[start..].find('"').unwrap()];
    assert!(next.contains("tenant=acme&amp;after="), "{next}");
    let (_, second) = console.get_as(OPERATOR, &next.replace("&amp;", "&")).await;
    assert_eq!(second.matches(r#"class="event-link""#).count(), 10);
    assert!(!second.contains("next-page"));
    let ids = |page: &str| -> Vec<String> {
        page.match_indices(r#"class="event-link" href="/events/"#)
            .map(|(i, m)| page[i + m.len()..i + m.len() + 36].to_owned())
            .collect()
    };
    let (first_ids, second_ids) = (ids(&first), ids(&second));
    assert!(second_ids.iter().all(|id| !first_ids.contains(id)));
}

#[tokio::test]
async fn a_filter_no_index_serves_searches_ten_thousand_events_a_page_then_offers_to_search_further()
 {
    let console = served().await;
    // 10,050 events of acme, and one of initech with the smallest id: the
    // last in the listing's order (newest first by id).
    let initech = "00000000-0000-7000-8000-000000000001";
    console
        .db
        .conn()
        .await
        .batch_execute(&format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload)
             SELECT 'acme', 'audit.user.login', '{{}}' FROM generate_series(1, 10050);
             INSERT INTO outbox_event (id, tenant_id, event_type, payload)
             VALUES ('{initech}', 'initech', 'audit.user.login', '{{}}');"
        ))
        .await
        .unwrap();

    let (status, first) = console.get_as(READER, "/events?tenant=initech").await;
    assert_eq!(status, StatusCode::OK);
    assert!(first.contains("Newest first by id"), "{first}");
    assert!(
        first.contains("0 matching event(s) among the newest 10,000"),
        "{first}"
    );
    assert!(!first.contains(initech));
    assert!(first.contains("No more matching events among the 10,000 searched"));
    let start = first
        .find(r#"id="search-further" href=""#)
        .expect("search further")
        + 26;
    let further = &first[start..start + first[start..].find('"').unwrap()];
    assert!(further.contains("tenant=initech&amp;after="), "{further}");
    let (status, second) = console.get_as(READER, &further.replace("&amp;", "&")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        second.contains(&format!(r#"href="/events/{initech}""#)),
        "{second}"
    );
    assert!(!second.contains("search-further") && !second.contains("next-page"));
}

#[tokio::test]
async fn the_events_a_filter_selects_are_requeued_after_a_dry_run_only_those_and_never_more_than_it_counted()
 {
    let console = served().await;
    let mut acme = Vec::new();
    for _ in 0..3 {
        acme.push(console.failed_event().await);
    }
    let other = console.failed_event().await;
    console
        .db
        .conn()
        .await
        .batch_execute(&format!(
            "UPDATE outbox_event SET tenant_id = 'globex' WHERE id = '{other}'"
        ))
        .await
        .unwrap();

    let (status, dry_run) = console.get_as(READER, "/events/requeue?tenant=acme").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        dry_run.contains(r#"<span id="dry-run-count">3</span>"#),
        "{dry_run}"
    );
    assert!(dry_run.contains(r#"<input type="hidden" name="tenant" value="acme">"#));
    let refused = console
        .post_as(READER, "/events/requeue", "tenant=acme")
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);

    assert!(dry_run.contains(r#"<input type="hidden" name="expected" value="3">"#));
    // A confirmation for fewer events than now match requeues none.
    let stale = console
        .post_as(OPERATOR, "/events/requeue", "tenant=acme&expected=2")
        .await;
    assert_eq!(stale.status(), StatusCode::CONFLICT);
    for id in &acme {
        assert_eq!(console.status(*id).await, "FAILED");
    }

    let done = console
        .post_as(
            OPERATOR,
            "/events/requeue",
            "tenant=acme&reason=broker+back&expected=3",
        )
        .await;
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert_eq!(done.headers()[LOCATION], "/events?tenant=acme&requeued=3");
    for id in &acme {
        assert_eq!(console.status(*id).await, "PENDING");
        let history = console.history(*id).await;
        assert_eq!(
            history[0].requested_by.as_deref(),
            Some("console:ana (operator)")
        );
        assert_eq!(history[0].reason, "broker back");
    }
    assert_eq!(console.status(other).await, "FAILED");
    let again = console
        .post_as(OPERATOR, "/events/requeue", "tenant=acme&expected=3")
        .await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
}

#[tokio::test]
async fn done_events_a_filter_selects_are_replayed_only_with_replay_after_a_dry_run_that_counts_them()
 {
    let console = served().await;
    let failed = console.failed_event().await;
    let done: Vec<Uuid> = {
        let mut done = Vec::new();
        for n in 0..2 {
            done.push(
                console
                    .event(
                        &format!(r#"{{"n": {n}}}"#),
                        ", status, processed_at",
                        ", 'DONE', now()",
                    )
                    .await,
            );
        }
        done
    };
    let pending = console.event(r#"{"p": 1}"#, "", "").await;

    // Without replay, DONE events are refused, as `outbox requeue` without
    // --replay refuses them.
    let (_, plain) = console.get_as(READER, "/events/requeue?status=DONE").await;
    assert!(
        plain.contains(r#"<span id="dry-run-count">0</span>"#),
        "{plain}"
    );
    assert!(plain.contains(r#"id="with-replay""#), "{plain}");
    let (_, failed_only) = console.get_as(READER, "/events/requeue").await;
    assert!(
        !failed_only.contains("with-replay"),
        "a selection of FAILED events offers no replay: {failed_only}"
    );

    let (status, dry_run) = console
        .get_as(READER, "/events/requeue?status=DONE&replay=true")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        dry_run.contains(r#"<span id="dry-run-count">2</span>"#),
        "{dry_run}"
    );
    assert!(
        dry_run.contains(r#"<span id="replay-count">2</span>"#),
        "{dry_run}"
    );
    assert!(dry_run.contains(r#"<input type="hidden" name="replay" value="true">"#));
    assert!(dry_run.contains(r#"<input type="hidden" name="expected" value="2">"#));
    let refused = console
        .post_as(
            READER,
            "/events/requeue",
            "status=DONE&replay=true&expected=2",
        )
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);

    // Without replay=true the confirmation replays nothing.
    let without = console
        .post_as(OPERATOR, "/events/requeue", "status=DONE&expected=2")
        .await;
    assert_eq!(without.status(), StatusCode::CONFLICT);
    let replayed = console
        .post_as(
            OPERATOR,
            "/events/requeue",
            "status=DONE&replay=true&expected=2",
        )
        .await;
    assert_eq!(replayed.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        replayed.headers()[LOCATION],
        "/events?status=DONE&requeued=2&replayed=2"
    );
    for id in &done {
        assert_eq!(console.status(*id).await, "PENDING");
        let history = console.history(*id).await;
        assert_eq!(history.len(), 1);
        assert!(history[0].replay, "{history:?}");
        assert_eq!(history[0].generation, Some(1));
        assert_eq!(history[0].reason, "replayed from the console (by filter)");
        assert_eq!(
            history[0].requested_by.as_deref(),
            Some("console:ana (operator)")
        );
    }
    assert_eq!(console.status(failed).await, "FAILED", "outside the filter");
    assert!(
        console.history(pending).await.is_empty(),
        "outside the filter"
    );
}

#[tokio::test]
async fn the_events_a_filter_selects_are_cancelled_after_a_dry_run_only_pending_and_failed_ones_refused_when_more_match_than_counted()
 {
    let console = served().await;
    let failed = console.failed_event().await;
    let pending = console.event(r#"{"p": 1}"#, "", "").await;
    let done = console
        .event(r#"{"d": 1}"#, ", status, processed_at", ", 'DONE', now()")
        .await;
    let other = console.event(r#"{"o": 1}"#, "", "").await;
    console
        .db
        .conn()
        .await
        .batch_execute(&format!(
            "UPDATE outbox_event SET tenant_id = 'globex' WHERE id = '{other}'"
        ))
        .await
        .unwrap();
    let tenant = "acme";

    let (status, _) = console.get_as(READER, "/events/cancel").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no filter, no cancel");

    let (status, dry_run) = console
        .get_as(READER, &format!("/events/cancel?tenant={tenant}"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        dry_run.contains(r#"<span id="dry-run-count">2</span>"#),
        "{dry_run}"
    );
    assert!(
        dry_run.contains("DONE: it was handed off already"),
        "{dry_run}"
    );
    assert!(dry_run.contains(r#"<input type="hidden" name="expected" value="2">"#));
    let form = format!("tenant={tenant}&reason=order+withdrawn&expected=2");
    let refused = console.post_as(READER, "/events/cancel", &form).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let stale = console
        .post_as(
            OPERATOR,
            "/events/cancel",
            &format!("tenant={tenant}&expected=1"),
        )
        .await;
    assert_eq!(stale.status(), StatusCode::CONFLICT);
    assert_eq!(console.status(pending).await, "PENDING");

    let cancelled = console.post_as(OPERATOR, "/events/cancel", &form).await;
    assert_eq!(cancelled.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        cancelled.headers()[LOCATION],
        format!("/events?tenant={tenant}&cancelled=2")
    );
    for id in [failed, pending] {
        assert_eq!(console.status(id).await, "CANCELLED");
        let history = console.history(id).await;
        assert_eq!(
            (
                history[0].action.as_str(),
                history[0].reason.as_str(),
                history[0].requested_by.as_deref()
            ),
            ("cancel", "order withdrawn", Some("console:ana (operator)"))
        );
    }
    assert_eq!(console.status(done).await, "DONE");
    assert_eq!(console.status(other).await, "PENDING", "outside the filter");
    let (_, events) = console
        .get_as(OPERATOR, &format!("/events?tenant={tenant}&cancelled=2"))
        .await;
    assert!(events.contains("Cancelled 2 event(s)."), "{events}");
}

/// Sign-out is an action like the others: a POST without the session's
/// CSRF token (a form on another site) is refused with 403 and the
/// session goes on; with the token, the session ends.
// Break checked: the sign-out without its CSRF check ends the session at
// the first refused form (403 expected, 303 seen).
#[tokio::test]
async fn a_sign_out_without_the_sessions_csrf_token_is_refused_and_the_session_goes_on() {
    let console = served().await;
    let cookie = console.sign_in(OPERATOR).await;
    let csrf = csrf_of(&console.get_with_cookie(&cookie, "/").await);
    let logout = async |form: &str| {
        console
            .post("/logout", &[("cookie", cookie.clone())], form)
            .await
            .status()
    };
    for form in [
        String::new(),
        "csrf=".to_owned(),
        format!("csrf={}", "0".repeat(64)),
    ] {
        assert_eq!(logout(&form).await, StatusCode::FORBIDDEN, "{form:?}");
    }
    // Still signed in: the page answers with the same session's form.
    assert_eq!(csrf_of(&console.get_with_cookie(&cookie, "/").await), csrf);

    assert_eq!(logout(&format!("csrf={csrf}")).await, StatusCode::SEE_OTHER);
    let after = console
        .http
        .get(format!("{}/", console.url))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_live_overview_of_a_session_ends_when_it_signs_out() {
    let console = served().await;
    let cookie = console.sign_in(OPERATOR).await;
    let csrf = csrf_of(&console.get_with_cookie(&cookie, "/").await);
    let mut live = console
        .http
        .get(format!("{}/live", console.url))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), StatusCode::OK);
    let first = live.chunk().await.unwrap().expect("the first figures");
    assert!(String::from_utf8_lossy(&first).contains("event: figures"));

    let out = console
        .post(
            "/logout",
            &[("cookie", cookie.clone())],
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    // The stream sends nothing more and ends at its next tick.
    let rest = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        let mut rest = Vec::new();
        while let Some(chunk) = live.chunk().await.unwrap() {
            rest.extend_from_slice(&chunk);
        }
        rest
    })
    .await
    .expect("the stream ended after the sign-out");
    assert!(
        !String::from_utf8_lossy(&rest).contains("event: figures"),
        "{}",
        String::from_utf8_lossy(&rest)
    );
}

#[tokio::test]
async fn the_overview_counts_done_events_until_the_table_is_analyzed_then_says_about_its_estimate()
{
    let console = served().await;
    for _ in 0..2 {
        console
            .event(
                r#"{"a": 1}"#,
                ", status, processed_at, target_queue",
                ", 'DONE', now(), 'outbox.audit'",
            )
            .await;
    }
    console.failed_event().await;
    let (_, page) = console.get_as(READER, "/").await;
    assert!(
        page.contains(r#"id="done-count" data-live="total:DONE">2<"#),
        "{page}"
    );
    assert!(!page.contains(r#"id="estimated""#));

    console
        .db
        .conn()
        .await
        .batch_execute("ANALYZE outbox_event")
        .await
        .unwrap();
    let (_, page) = console.get_as(READER, "/").await;
    assert!(
        page.contains(r#"id="done-count" data-live="total:DONE">about 2<"#),
        "{page}"
    );
    assert!(page.contains(r#"id="estimated""#));
    assert!(page.contains(r#"data-live="total:FAILED">1<"#));
}
