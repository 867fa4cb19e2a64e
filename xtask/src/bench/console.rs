//! `cargo xtask bench --only console`: how long each page of the operator
//! console takes with a large table (1,000,000 events by default,
//! `--console-rows`): the console served in this process on a loopback
//! port, each page asked `--console-requests` times (after one unmeasured
//! request) over a plain HTTP/1.1 connection, timed from the request to
//! the answer's last byte (the live overview: to its first figures, each
//! request after the shared read of the figures has expired, two seconds
//! or ten times the last read, so that it reads them afresh).
//!
//! The table holds a mix like a service's after some days: most events
//! DONE, one in a hundred FAILED, one in a hundred PENDING, over 17
//! tenants and three event types, created over the last day. The workflow
//! pages read 200,000 runs by default (`--console-runs`) of 17 workflows,
//! one per tenant: 90 % succeeded, 5 % failed, 3 % waiting, 2 % running,
//! created over the last day.
//!
//! Lines: `console_page_ms` per page (median, min and max), then
//! `console_pages` with every page's median.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use diesel_async::SimpleAsyncConnection;
use outbox_console::{Console, Tokens};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::bench::handoff::median;
use crate::bench::kit::{Run, Scratch, line, stage};
use crate::bench::open_loop::round2;

/// What the stage runs.
pub struct Plan {
    /// Events in the table.
    pub rows: usize,
    /// Measured requests per page.
    pub requests: usize,
    /// Workflow runs in the tables.
    pub runs: usize,
}

/// The runs of one workflow: `{runs}` of them, a status mix (90 %
/// success, 5 % error, 3 % waiting, 2 % running), created over the last
/// day.
const RUNS_SQL: &str = "
INSERT INTO workflow_execution (tenant_id, workflow_id, workflow_version, trigger_kind, status,
                                input, waiting_block, error, created_at, updated_at,
                                started_at, finished_at)
SELECT '{tenant}', '{workflow}', {version}, 'manual',
       CASE WHEN g % 100 < 90 THEN 'success' WHEN g % 100 < 95 THEN 'error'
            WHEN g % 100 < 98 THEN 'waiting' ELSE 'running' END,
       jsonb_build_object('n', g),
       CASE WHEN g % 100 BETWEEN 95 AND 97 THEN 'note' END,
       CASE WHEN g % 100 BETWEEN 90 AND 94 THEN 'benchmark failure' END,
       ts, ts, ts, CASE WHEN g % 100 < 95 THEN ts + interval '40 ms' END
FROM (SELECT g, now() - interval '1 day' + g * (interval '1 day' / {runs}) AS ts
      FROM generate_series(1, {runs}) AS g) AS s";

/// Saves one live manual workflow per tenant (17) and fills each with
/// its share of `runs`; returns one workflow's id and one of its runs.
async fn fill_runs(
    conn: &mut diesel_async::AsyncPgConnection,
    runs: usize,
) -> Result<(uuid::Uuid, uuid::Uuid)> {
    use diesel_async::RunQueryDsl;
    let definition = outbox_workflow_model::WorkflowDefinition::from_value(json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "note", "type": "log", "params": { "message": "benchmark" } }
        ],
        "edges": [{ "from": "start", "to": "note" }]
    }))?;
    let mut first = None;
    for n in 0..17 {
        let tenant = format!("tenant-{n}");
        let saved = outbox_workflow_store::save_workflow(
            conn,
            &tenant,
            "benchmark",
            outbox_workflow_store::WorkflowStatus::Live,
            &definition,
        )
        .await?;
        let sql = RUNS_SQL
            .replace("{tenant}", &tenant)
            .replace("{workflow}", &saved.workflow.id.to_string())
            .replace("{version}", &saved.version.to_string())
            .replace("{runs}", &(runs / 17).max(1).to_string());
        diesel::sql_query(sql)
            .execute(conn)
            .await
            .context("filling the workflow runs")?;
        first.get_or_insert(saved.workflow.id);
    }
    let workflow = first.context("no workflow saved")?;
    let filter = outbox_workflow_store::ExecutionFilter {
        workflow_id: Some(workflow),
        limit: Some(1),
        ..Default::default()
    };
    let runs = outbox_workflow_store::list_executions(conn, &filter).await?;
    let run = runs
        .into_iter()
        .next()
        .map(|run| run.id)
        .context("a workflow run")?;
    Ok((workflow, run))
}

/// The reader's token the stage signs in with.
const TOKEN: &str = "bench-reader-0123456789";

/// Fills the table: time-ordered ids like the publisher's, a status mix
/// (98 % DONE, 1 % FAILED, 1 % PENDING), then `VACUUM ANALYZE`.
const FILL_SQL: &str = "
INSERT INTO outbox_event (id, tenant_id, event_type, payload, created_at, scheduled_at,
                          status, processed_at, target_queue, failed_at, last_error, retries)
SELECT (lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7'
        || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
       'tenant-' || (g % 17),
       (ARRAY['audit.user.login', 'mail.user.welcome', 'webhook.order.created'])[1 + g % 3],
       jsonb_build_object('n', g, 'note', 'benchmark', 'apiToken', 'not-shown'),
       ts, ts,
       CASE WHEN g % 100 = 0 THEN 'FAILED' WHEN g % 100 = 1 THEN 'PENDING' ELSE 'DONE' END,
       CASE WHEN g % 100 > 1 THEN ts + interval '3 ms' END,
       CASE WHEN g % 100 <> 1 THEN 'outbox.' || split_part((ARRAY['audit.user.login', 'mail.user.welcome', 'webhook.order.created'])[1 + g % 3], '.', 1) END,
       CASE WHEN g % 100 = 0 THEN ts + interval '1 s' END,
       CASE WHEN g % 100 = 0 THEN 'hand-off to the queue failed: connection refused' END,
       CASE WHEN g % 100 = 0 THEN 5 ELSE 0 END
FROM (SELECT g, now() - interval '1 day' + g * (interval '1 day' / {rows}) AS ts,
             md5(g::text) AS h
      FROM generate_series(1, {rows}) AS g) AS s";

/// Runs the stage.
pub async fn run(run: &Run, plan: &Plan) -> Result<()> {
    stage(&format!(
        "console: each page with {} events and {} workflow runs in the tables",
        plan.rows, plan.runs
    ));
    let scratch = Scratch::create(&run.found.database_url, run.database("bench_console")).await?;
    let mut conn = outbox_pg::establish(&scratch.url).await?;
    conn.batch_execute(&FILL_SQL.replace("{rows}", &plan.rows.to_string()))
        .await
        .context("filling the table")?;
    let (workflow, workflow_run) = fill_runs(&mut conn, plan.runs).await?;
    conn.batch_execute("VACUUM ANALYZE outbox_event").await?;
    conn.batch_execute("VACUUM ANALYZE workflow_execution")
        .await?;
    let failed = outbox_store::EventFilter {
        statuses: vec![outbox_model::OutboxStatus::Failed],
        ..outbox_store::EventFilter::default()
    };
    let failed = outbox_store::list_events(&mut conn, &failed, 1)
        .await?
        .first()
        .map(|event| event.id.to_string())
        .context("a FAILED event")?;
    drop(conn);

    let pool = outbox_pg::connect_pool(&scratch.url, 4).await?;
    let console = Console::new(pool).with_tokens(Tokens::parse(&format!("bench=reader:{TOKEN}"))?);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = tokio_util::sync::CancellationToken::new();
    let server = {
        let app = console.with_shutdown(stop.clone()).router();
        let stop = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        })
    };

    let pages: Vec<(&str, String)> = vec![
        ("overview", "/".to_owned()),
        ("live", "/live".to_owned()),
        ("events", "/events".to_owned()),
        ("events_failed", "/events?status=FAILED".to_owned()),
        ("events_done", "/events?status=DONE".to_owned()),
        ("events_pending", "/events?status=PENDING".to_owned()),
        ("events_tenant", "/events?tenant=tenant-3".to_owned()),
        ("events_type", "/events?type_prefix=mail.".to_owned()),
        ("event", format!("/events/{failed}")),
        (
            "requeue_dry_run",
            "/events/requeue?status=FAILED".to_owned(),
        ),
        ("workflows", "/workflows".to_owned()),
        ("workflow", format!("/workflows/{workflow}")),
        ("executions", "/executions".to_owned()),
        ("executions_error", "/executions?status=error".to_owned()),
        (
            "executions_tenant",
            "/executions?tenant=tenant-3".to_owned(),
        ),
        (
            "executions_workflow",
            format!("/executions?workflow={workflow}"),
        ),
        ("execution", format!("/executions/{workflow_run}")),
    ];
    let result = async {
        let mut medians = serde_json::Map::new();
        for (page, path) in &pages {
            let live = *page == "live";
            let warm = ask(addr, path, live).await?;
            let mut times = Vec::with_capacity(plan.requests);
            let mut last = warm;
            for _ in 0..plan.requests {
                if live {
                    // Past the shared read's lifetime (two seconds, or ten
                    // times the last read), so that each request reads the
                    // figures afresh.
                    let last_read = Duration::from_secs_f64(last / 1000.0);
                    let shared = outbox_console::LIVE_EVERY.max(last_read.saturating_mul(10));
                    tokio::time::sleep(shared + Duration::from_millis(100)).await;
                }
                last = ask(addr, path, live).await?;
                times.push(last);
            }
            let p50 = round2(median(times.clone()));
            let min = times.iter().copied().fold(f64::INFINITY, f64::min);
            let max = times.iter().copied().fold(0.0, f64::max);
            line(json!({
                "bench": "console_page_ms", "page": page, "path": path, "rows": plan.rows, "runs": plan.runs,
                "requests": plan.requests, "p50": p50, "min": round2(min), "max": round2(max),
            }));
            medians.insert((*page).to_owned(), Value::from(p50));
        }
        line(json!({ "bench": "console_pages", "rows": plan.rows, "runs": plan.runs, "p50_ms": medians }));
        Ok::<_, anyhow::Error>(())
    }
    .await;
    stop.cancel();
    let _ = server.await;
    scratch.remove().await?;
    result
}

/// One request for `path`; the milliseconds to the answer's end, or for
/// the live overview (`live`) to its first figures.
async fn ask(addr: std::net::SocketAddr, path: &str, live: bool) -> Result<f64> {
    let mut stream = TcpStream::connect(addr).await?;
    let started = Instant::now();
    stream
        .write_all(
            format!(
                "GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 16 * 1024];
    let read = async {
        loop {
            let n = stream.read(&mut buffer).await?;
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buffer[..n]);
            if live && contains(&answer, b"event: figures") {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(300), read)
        .await
        .with_context(|| format!("{path}: no answer within 5 minutes"))??;
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    if !answer.starts_with(b"HTTP/1.1 200") {
        let head = String::from_utf8_lossy(&answer[..answer.len().min(200)]).into_owned();
        bail!("{path} answered {head:?}");
    }
    if live && !contains(&answer, b"event: figures") {
        bail!("{path} ended without figures");
    }
    Ok(elapsed)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
