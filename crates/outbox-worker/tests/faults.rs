//! The fault suite, against the real binaries.
//!
//! While a plain-SQL producer and a Rust producer write every routed kind of
//! event (plus an unroutable one, payloads `serde_json` cannot hold, and
//! repeated dispatch keys), `worker-general` and `worker-mail` are killed
//! with SIGKILL at seeded moments and restarted, their Redis (a private
//! `redis-server` with an append-only file fsync'd on every write) is
//! restarted, and every Postgres connection to the database is broken. Once
//! production has stopped and everything has settled, the test checks what a
//! user sees:
//!
//! - every routable row is DONE; the unroutable one is FAILED with a reason
//!   naming the missing rule; awkward payloads reach `audit_log` as the exact
//!   text of the row;
//! - one job per event: each DONE row's task id `outbox:<id>` is in its
//!   target queue and no other `outbox:*` job exists (retry copies
//!   `~retry<n>` aside), and one downstream job per mail and per plugin call;
//! - `audit_log` and `notification` rows exactly once per event;
//! - every mail, webhook and plugin call arrived at least once, and
//!   duplicates stay inside the at-least-once window of docs/reliability.md:
//!   at most (kills of the sending worker + Redis restarts) × its concurrency.
//!
//! The figures (events, faults, duplicates, wall time) are printed on stderr
//! as lines starting with `faults:`; `cargo nextest run -p outbox-worker
//! --test faults --no-capture` shows them. `FAULTS_SEED=<n>` runs another
//! schedule; the seed in use is printed first.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Display;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{GENERAL, MAIL, Stack, Worker};
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_publish::{
    NewOutboxEvent, OutboxTx, PublishError, PublishOutcome, publish_outbox_event,
};
use outbox_queue::RedisConnection;
use outbox_queue::{QueueNamespace, RedisSettings, apalis_config, queues};
use outbox_test_support::{RedisProcess, eventually};
use serde_json::json;

/// Rounds each producer writes (21 events a round from SQL, 7 from Rust).
const ROUNDS: usize = 70;
/// No fault before this round, so that work is in flight at the first one.
const FIRST_FAULT_ROUND: usize = 4;
/// No fault in the last rounds: the last faults still find events flowing.
const QUIET_TAIL: usize = 6;
/// How many rounds a producer may run ahead of a fault that is still being
/// applied (a worker being restarted): events keep flowing during the fault.
const LAG: usize = 3;
/// Pause between a producer's rounds, so that production overlaps the faults.
const PACE: Duration = Duration::from_millis(100);
/// kill -9 of each worker binary.
const KILLS_EACH: usize = 3;
/// `WORKER_CONCURRENCY` of both binaries: jobs per queue in parallel, hence
/// at most this many deliveries of one queue caught between effect and
/// record by one kill.
const CONCURRENCY: usize = 4;
/// The schedule run unless `FAULTS_SEED` says otherwise.
const DEFAULT_SEED: u64 = 20_261_130;
/// Deadline of one step while producing (a round, a fault, a reconnection).
const STEP: Duration = Duration::from_secs(120);
/// Deadline for everything to settle once production has stopped: covers the
/// dispatcher's first hand-off backoff (1 min) after the Redis restart and a
/// receiver's first retry round (30 s).
const SETTLE: Duration = Duration::from_secs(180);
/// How long the settled state must hold before it is taken as final.
const QUIET: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(60);

const TENANT: &str = "acme";
/// The domain of `MAIL_FROM` in the stack's environment.
const MAIL_DOMAIN: &str = "example.test";
const HOOK_PATH: &str = "/hook";
const PLUGIN_PATH: &str = "/plugin";
const UNROUTABLE: &str = "legacy.report.generated";
const POISON_TYPE: &str = "audit.record.imported";

/// The SQL producer writes these, `n` of each kind, every round.
const SQL_KINDS: [(&str, usize); 7] = [
    ("audit.user.login", 6),
    ("notification.user.mentioned", 3),
    ("billing.invoice.paid", 3),
    ("webhook.order.created", 3),
    ("mail.user.notice", 3),
    ("plugin.hook.workflow.executed", 2),
    ("marketing.lead.created", 1),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    KillGeneral,
    KillMail,
    RestartRedis,
    BreakPostgres,
}

impl Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::KillGeneral => "kill -9 worker-general",
            Self::KillMail => "kill -9 worker-mail",
            Self::RestartRedis => "restart Redis",
            Self::BreakPostgres => "break every Postgres connection",
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Planned {
    /// Applied once the SQL producer has completed this many rounds...
    round: usize,
    /// ...and this much later.
    delay: Duration,
    fault: Fault,
}

/// SplitMix64: a small, seedable generator, so a schedule is reproducible.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The faults in random order at distinct random rounds, each with a random
/// delay of up to half a second after its round.
fn plan(seed: u64) -> Vec<Planned> {
    let mut rng = SplitMix(seed);
    let mut faults = Vec::new();
    faults.extend([Fault::KillGeneral; KILLS_EACH]);
    faults.extend([Fault::KillMail; KILLS_EACH]);
    faults.extend([Fault::RestartRedis, Fault::BreakPostgres]);
    for i in (1..faults.len()).rev() {
        faults.swap(i, rng.below(i + 1));
    }
    let mut rounds = BTreeSet::new();
    while rounds.len() < faults.len() {
        rounds.insert(FIRST_FAULT_ROUND + rng.below(ROUNDS - FIRST_FAULT_ROUND - QUIET_TAIL));
    }
    rounds
        .into_iter()
        .zip(faults)
        .map(|(round, fault)| Planned {
            round,
            delay: Duration::from_millis(rng.below(500) as u64),
            fault,
        })
        .collect()
}

/// Reads a counter. (`RunQueryDsl::load`, implemented for every type,
/// shadows `AtomicUsize::load` on a field.)
fn get(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}

/// Where production and the fault script are.
#[derive(Default)]
struct Progress {
    sql_rounds: AtomicUsize,
    faults_applied: AtomicUsize,
    reconnects: AtomicUsize,
}

/// What happened while producing, for the report.
#[derive(Default)]
struct Journal {
    /// (seconds since start, what).
    faults: Vec<(f64, String)>,
    terminated_backends: i64,
    refused_by_constraint: usize,
    reported_by_publisher: usize,
}

/// A directory of its own for the private Redis' append-only file, removed
/// at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!(
            "outbox-faults-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A new connection, retried until Postgres takes it.
async fn connect(url: &str) -> AsyncPgConnection {
    let deadline = Instant::now() + STEP;
    loop {
        match outbox_pg::establish(url).await {
            Ok(conn) => return conn,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "Postgres took no connection within {STEP:?}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Runs `op` until it succeeds, on a new connection after each failure (the
/// connection may have been terminated under it). An attempt whose commit
/// was lost with its connection may have committed: `op` must accept that
/// (the checks count what is in the table, not what producers believe).
async fn retrying<T, E: Display>(
    what: &str,
    url: &str,
    conn: &mut AsyncPgConnection,
    progress: &Progress,
    mut op: impl AsyncFnMut(&mut AsyncPgConnection) -> Result<T, E>,
) -> T {
    let deadline = Instant::now() + STEP;
    loop {
        match op(conn).await {
            Ok(value) => return value,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "{what}: still failing after {STEP:?}: {e}"
                );
                eprintln!("faults: {what} failed ({e}); reconnecting and trying again");
                progress.reconnects.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                *conn = connect(url).await;
            }
        }
    }
}

/// Waits until every fault planned `LAG` or more rounds before `round` has
/// been applied.
async fn wait_for_faults(producer: &str, round: usize, plan: &[Planned], progress: &Progress) {
    let due = plan.iter().filter(|p| p.round + LAG <= round).count();
    if get(&progress.faults_applied) >= due {
        return;
    }
    eventually(
        &format!("{producer}: the {due} fault(s) planned before round {round} to be applied"),
        STEP,
        async || get(&progress.faults_applied) >= due,
    )
    .await;
}

fn is_dispatch_key_violation(e: &DieselError) -> bool {
    matches!(
        e,
        DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, info)
            if info.constraint_name() == Some("outbox_event_dispatch_key_key")
    )
}

/// One round of the SQL producer: `INSERT … SELECT` over `generate_series`.
fn sql_round(round: usize) -> String {
    let kinds = SQL_KINDS
        .iter()
        .map(|(kind, n)| format!("('{kind}', {n})"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         SELECT '{TENANT}', k.event_type,
                CASE
                  WHEN k.event_type LIKE 'mail.%' THEN jsonb_build_object(
                    'to', 'sql-{round}-' || g || '@example.com',
                    'subject', 'Round {round}', 'text', 'Hello from SQL')
                  WHEN k.event_type LIKE 'marketing.%' THEN jsonb_build_object(
                    'name', 'Lead {round}-' || g, 'email', 'lead-{round}-' || g || '@example.com',
                    'company', 'Initech', 'message', 'Call me')
                  ELSE jsonb_build_object('actor', 'sql', 'round', {round}, 'n', g)
                END
         FROM (VALUES {kinds}) AS k(event_type, n)
         CROSS JOIN LATERAL generate_series(1, k.n) AS g"
    )
}

/// Payloads `serde_json::Value` cannot hold or would change, written by SQL.
fn poison_payloads() -> [String; 3] {
    [
        r#"{"actor": "cy", "huge": 1e400}"#.to_owned(),
        r#"{"actor": "ada", "id": 123456789012345678901234567, "amount": 0.1000000000000000055511151231257827}"#
            .to_owned(),
        format!(
            r#"{{"actor": "bob", "deep": {}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        ),
    ]
}

async fn insert_sql_event(
    conn: &mut AsyncPgConnection,
    event_type: &str,
    payload: &str,
    dispatch_key: Option<&str>,
) -> Result<usize, DieselError> {
    diesel::sql_query(
        "INSERT INTO outbox_event (tenant_id, event_type, payload, dispatch_key)
         VALUES ($1, $2, $3::jsonb, $4)",
    )
    .bind::<Text, _>(TENANT)
    .bind::<Text, _>(event_type)
    .bind::<Text, _>(payload)
    .bind::<Nullable<Text>, _>(dispatch_key)
    .execute(conn)
    .await
}

/// The plain-SQL producer.
async fn sql_producer(url: &str, plan: &[Planned], progress: &Progress, journal: &mut Journal) {
    let mut conn = connect(url).await;
    for round in 0..ROUNDS {
        wait_for_faults("the SQL producer", round, plan, progress).await;
        let statement = sql_round(round);
        retrying(
            &format!("SQL round {round}"),
            url,
            &mut conn,
            progress,
            async |conn| conn.batch_execute(&statement).await,
        )
        .await;
        if round == ROUNDS / 3 {
            for payload in poison_payloads() {
                retrying("a poison row", url, &mut conn, progress, async |conn| {
                    insert_sql_event(conn, POISON_TYPE, &payload, None).await
                })
                .await;
            }
            retrying(
                "the unroutable row",
                url,
                &mut conn,
                progress,
                async |conn| insert_sql_event(conn, UNROUTABLE, r#"{"report": "q3"}"#, None).await,
            )
            .await;
        }
        if round % 20 == 12 {
            // A repeated dispatch key: the second insert is refused by the
            // unique constraint.
            let key = format!("sql-key-{round}");
            let payload = json!({ "actor": "sql", "key": key }).to_string();
            retrying("a keyed insert", url, &mut conn, progress, async |conn| {
                match insert_sql_event(conn, "audit.key.checked", &payload, Some(&key)).await {
                    // An earlier attempt committed before its connection died.
                    Err(e) if is_dispatch_key_violation(&e) => Ok(0),
                    other => other,
                }
            })
            .await;
            let refused = retrying("the repeated key", url, &mut conn, progress, async |conn| {
                match insert_sql_event(conn, "audit.key.checked", &payload, Some(&key)).await {
                    Ok(_) => Ok(None),
                    Err(e) if is_dispatch_key_violation(&e) => Ok(Some(e.to_string())),
                    Err(e) => Err(e),
                }
            })
            .await;
            let refused = refused
                .unwrap_or_else(|| panic!("a second row with dispatch key {key:?} was accepted"));
            eprintln!("faults: the second insert with dispatch key {key:?} was refused: {refused}");
            journal.refused_by_constraint += 1;
        }
        progress.sql_rounds.store(round + 1, Ordering::SeqCst);
        tokio::time::sleep(PACE).await;
    }
}

/// One round of the Rust producer: one transaction, several events.
fn rust_events(round: usize) -> Vec<NewOutboxEvent> {
    let event = |kind: &str, payload| NewOutboxEvent::new(TENANT, kind, payload);
    vec![
        event(
            "mail.user.welcome",
            json!({ "to": format!("rust-{round}@example.com"), "template": "welcome", "vars": { "name": format!("User {round}") } }),
        ),
        event("webhook.invoice.paid", json!({ "invoice": round })),
        event(
            "audit.user.logout",
            json!({ "actor": "rust", "round": round }),
        ),
        event(
            "notification.user.invited",
            json!({ "title": format!("Invitation {round}"), "userId": format!("u{round}") }),
        ),
        event(
            "billing.subscription.updated",
            json!({ "userId": format!("u{round}"), "plan": "pro" }),
        ),
        event(
            "plugin.hook.workflow.executed",
            json!({ "workflowId": format!("w{round}") }),
        ),
        event(
            "marketing.lead.created",
            json!({ "name": format!("Rust lead {round}"), "email": format!("rust-lead-{round}@example.com"), "company": "Initech", "message": "Call me" }),
        ),
    ]
}

async fn publish_all(
    conn: &mut AsyncPgConnection,
    events: Vec<NewOutboxEvent>,
) -> Result<Vec<PublishOutcome>, PublishError> {
    conn.transaction::<_, PublishError, _>(async |conn| {
        let tx = OutboxTx::new(conn)?;
        let mut outcomes = Vec::new();
        for event in events {
            outcomes.push(publish_outbox_event(&tx, event).await?);
        }
        Ok(outcomes)
    })
    .await
}

/// The Rust producer, publishing through `outbox-publish`.
async fn rust_producer(url: &str, plan: &[Planned], progress: &Progress, journal: &mut Journal) {
    let mut conn = connect(url).await;
    for round in 0..ROUNDS {
        wait_for_faults("the Rust producer", round, plan, progress).await;
        retrying(
            &format!("Rust round {round}"),
            url,
            &mut conn,
            progress,
            async |conn| publish_all(conn, rust_events(round)).await,
        )
        .await;
        if round % 20 == 10 {
            // A repeated dispatch key: the publisher reports the duplicate
            // and writes nothing.
            let key = format!("rust-key-{round}");
            let keyed = || {
                vec![
                    NewOutboxEvent::new(TENANT, "webhook.key.checked", json!({ "key": key }))
                        .dispatch_key(key.clone()),
                ]
            };
            let first = retrying("a keyed publish", url, &mut conn, progress, async |conn| {
                publish_all(conn, keyed()).await
            })
            .await;
            let second = retrying("the repeated key", url, &mut conn, progress, async |conn| {
                publish_all(conn, keyed()).await
            })
            .await;
            assert!(
                second[0].is_duplicate() && second[0].id() == first[0].id(),
                "the publisher did not report dispatch key {key:?} as a duplicate of {:?}: {:?}",
                first[0],
                second[0]
            );
            journal.reported_by_publisher += 1;
        }
        tokio::time::sleep(PACE).await;
    }
}

/// Kills `worker` with SIGKILL, checks it died of it (it was still running),
/// and starts a new one; the dead one is kept in `retired` for its output.
async fn kill_and_restart(
    stack: &Stack,
    worker: &mut Worker,
    retired: &mut Vec<Worker>,
    binary: &str,
    env: &[(&str, &str)],
) {
    worker.signal("KILL");
    let status = worker.wait_exit(WAIT).await;
    assert_eq!(
        status.signal(),
        Some(9),
        "{binary} was expected to die of SIGKILL: {status}"
    );
    retired.push(std::mem::replace(worker, stack.start(binary, env).await));
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn count(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

/// Terminates every other backend connected to `database`; returns how many.
async fn break_postgres(url: &str, database: &str) -> i64 {
    let mut conn = connect(url).await;
    count(
        &mut conn,
        &format!(
            "SELECT count(*) FILTER (WHERE t.terminated) AS n FROM (
               SELECT pg_terminate_backend(pid) AS terminated FROM pg_stat_activity
               WHERE datname = '{database}' AND pid <> pg_backend_pid()) AS t"
        ),
    )
    .await
}

struct Workers {
    general: Worker,
    mail: Worker,
    /// The killed ones.
    retired: Vec<Worker>,
}

impl Workers {
    /// How many log lines of every worker, killed or running, contain all
    /// of `texts` (field names are wrapped in colour codes, values not).
    fn lines_with(&self, texts: &[&str]) -> usize {
        self.retired
            .iter()
            .chain([&self.general, &self.mail])
            .map(|w| {
                w.output()
                    .lines()
                    .filter(|l| texts.iter().all(|t| l.contains(t)))
                    .count()
            })
            .sum()
    }
}

/// Applies the plan in order as production reaches each fault's round.
#[allow(clippy::too_many_arguments)]
async fn run_faults(
    stack: &Stack,
    env: &[(&str, &str)],
    workers: &mut Workers,
    redis: &mut RedisProcess,
    plan: &[Planned],
    progress: &Progress,
    journal: &mut Journal,
    started: Instant,
) {
    for (i, planned) in plan.iter().enumerate() {
        eventually(
            &format!(
                "the SQL producer to reach round {} for fault {} ({})",
                planned.round, i, planned.fault
            ),
            STEP,
            async || get(&progress.sql_rounds) >= planned.round,
        )
        .await;
        tokio::time::sleep(planned.delay).await;
        let at = started.elapsed().as_secs_f64();
        eprintln!(
            "faults: {at:.1}s: {} (round {})",
            planned.fault, planned.round
        );
        let mut what = planned.fault.to_string();
        match planned.fault {
            Fault::KillGeneral => {
                let worker = &mut workers.general;
                kill_and_restart(stack, worker, &mut workers.retired, GENERAL, env).await;
            }
            Fault::KillMail => {
                let worker = &mut workers.mail;
                kill_and_restart(stack, worker, &mut workers.retired, MAIL, env).await;
            }
            Fault::RestartRedis => redis.restart().await,
            Fault::BreakPostgres => {
                let terminated = break_postgres(stack.db.url(), stack.db.name()).await;
                assert!(
                    terminated > 0,
                    "no connection to {} was terminated: the workers hold none?",
                    stack.db.name()
                );
                journal.terminated_backends = terminated;
                what = format!("{what} ({terminated} terminated)");
            }
        }
        journal
            .faults
            .push((at, format!("round {}: {what}", planned.round)));
        progress.faults_applied.fetch_add(1, Ordering::SeqCst);
    }
}

/// An event as written, read back once production has stopped.
#[derive(diesel::QueryableByName)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: uuid::Uuid,
    #[diesel(sql_type = Text)]
    event_type: String,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Nullable<Text>)]
    target_queue: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = BigInt)]
    retries: i64,
}

async fn rows(conn: &mut AsyncPgConnection) -> Vec<Row> {
    diesel::sql_query(
        "SELECT id, event_type, status, target_queue, last_error, retries::bigint AS retries
         FROM outbox_event ORDER BY created_at",
    )
    .load(conn)
    .await
    .unwrap()
}

/// What the receivers must get, derived from the rows.
struct Expected {
    audit: i64,
    notification: i64,
    /// Message-IDs of mails (`mail.*` and `marketing.lead.*` events).
    mails: HashSet<String>,
    /// `webhook-id`s of webhook deliveries (one endpoint).
    webhooks: HashSet<String>,
    /// `webhook-id`s of plugin invocations (one subscription).
    plugins: HashSet<String>,
}

impl Expected {
    fn from_rows(rows: &[Row]) -> Self {
        let ids = |pred: &dyn Fn(&str) -> bool| -> Vec<uuid::Uuid> {
            rows.iter()
                .filter(|r| pred(&r.event_type))
                .map(|r| r.id)
                .collect()
        };
        let n = |pred: &dyn Fn(&str) -> bool| ids(pred).len() as i64;
        Self {
            audit: n(&|t| t.starts_with("audit.")),
            notification: n(&|t| t.starts_with("notification.") || t.starts_with("billing.")),
            mails: ids(&|t| is_mail(t))
                .into_iter()
                .map(|id| format!("<{id}.0@{MAIL_DOMAIN}>"))
                .collect(),
            webhooks: ids(&|t| t.starts_with("webhook."))
                .into_iter()
                .map(|id| id.to_string())
                .collect(),
            plugins: ids(&|t| t.starts_with("plugin.hook."))
                .into_iter()
                .map(|id| id.to_string())
                .collect(),
        }
    }
}

fn all_queues() -> Vec<&'static str> {
    outbox_catalog::Catalog::built_in().queues()
}

/// Message-IDs of the mails received, with how often each came.
fn mails_received(stack: &Stack) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for mail in stack.smtp.messages() {
        *seen
            .entry(mail.header("message-id").unwrap_or_default())
            .or_insert(0) += 1;
    }
    seen
}

/// `webhook-id`s of the requests to `path`, with how often each came.
fn requests_received(stack: &Stack, path: &str) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for request in stack.http.requests_to(path) {
        *seen
            .entry(request.header("webhook-id").unwrap_or_default().to_owned())
            .or_insert(0) += 1;
    }
    seen
}

fn missing(expected: &HashSet<String>, seen: &HashMap<String, usize>) -> usize {
    expected.iter().filter(|id| !seen.contains_key(*id)).count()
}

/// What is still outstanding: rows not final, jobs waiting or running,
/// effects not arrived. Empty when everything has settled.
async fn outstanding(
    stack: &Stack,
    conn: &mut AsyncPgConnection,
    redis: &mut RedisConnection,
    expected: &Expected,
) -> Vec<String> {
    let mut out = Vec::new();
    let open = count(
        conn,
        "SELECT count(*) AS n FROM outbox_event WHERE status IN ('PENDING', 'PROCESSING')",
    )
    .await;
    if open > 0 {
        out.push(format!("{open} row(s) PENDING or PROCESSING"));
    }
    for queue in all_queues() {
        let stats = match outbox_queue::queue_stats(redis, &stack.namespace, queue, WAIT).await {
            Ok(stats) => stats,
            Err(e) => {
                // The test's own connection may still be reconnecting.
                out.push(format!("{queue}: Redis error {e}"));
                continue;
            }
        };
        if stats.backlog > 0 || stats.running > 0 {
            out.push(format!(
                "{queue}: {} waiting ({} due), {} running",
                stats.backlog, stats.due, stats.running
            ));
        }
    }
    let audit = count(conn, "SELECT count(*) AS n FROM audit_log").await;
    if audit < expected.audit {
        out.push(format!("audit_log: {audit} of {} rows", expected.audit));
    }
    let notification = count(conn, "SELECT count(*) AS n FROM notification").await;
    if notification < expected.notification {
        out.push(format!(
            "notification: {notification} of {} rows",
            expected.notification
        ));
    }
    for (what, ids, seen) in [
        ("mails", &expected.mails, mails_received(stack)),
        (
            "webhooks",
            &expected.webhooks,
            requests_received(stack, HOOK_PATH),
        ),
        (
            "plugin calls",
            &expected.plugins,
            requests_received(stack, PLUGIN_PATH),
        ),
    ] {
        let missing = missing(ids, &seen);
        if missing > 0 {
            out.push(format!("{missing} of {} {what} not arrived", ids.len()));
        }
    }
    out
}

/// The task ids in `queue`'s body hash, grouped by base id (retry copies
/// `<id>~retry<n>` folded into `<id>`), with the number of retry copies.
async fn task_ids(
    redis: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
) -> (BTreeSet<String>, usize) {
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(apalis_config(namespace, queue).job_data_hash())
        .query_async(redis)
        .await
        .unwrap();
    let mut bases = BTreeSet::new();
    let mut retries = 0;
    for field in fields {
        match field.split_once("~retry") {
            Some((base, _)) => {
                retries += 1;
                bases.insert(base.to_owned());
            }
            None => {
                bases.insert(field);
            }
        }
    }
    (bases, retries)
}

/// Duplicates among `seen` (deliveries beyond the first of each id).
fn duplicates(seen: &HashMap<String, usize>) -> usize {
    seen.values().map(|n| n.saturating_sub(1)).sum()
}

#[derive(diesel::QueryableByName)]
struct Pair {
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Text)]
    source: String,
    #[diesel(sql_type = Nullable<Text>)]
    copy: Option<String>,
}

#[derive(diesel::QueryableByName)]
struct TextId {
    #[diesel(sql_type = Text)]
    id: String,
}

/// What the Redis guard logs when it finds Redis restarted with
/// `appendfsync always`.
const SAFE_RESTART: &str =
    "Redis restarted; its persistence (appendfsync always) keeps every write";

/// A private Redis that keeps what it acknowledged across a restart: an
/// append-only file fsync'd on every write, in `dir`.
async fn persistent_redis(dir: &TempDir) -> RedisProcess {
    let redis = RedisProcess::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dir",
        dir.path(),
    ])
    .await;
    let mut conn = outbox_queue::connect(&RedisSettings::new(redis.url().as_str())).unwrap();
    let config: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("append*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        config.windows(2).any(|w| w == ["appendonly", "yes"])
            && config.windows(2).any(|w| w == ["appendfsync", "always"]),
        "the private Redis runs without its append-only file: {config:?}"
    );
    redis
}

/// Waits until every row is final, every queue drained and idle, and every
/// effect arrived, and that has held for [`QUIET`]; says what is missing
/// every 10 s meanwhile.
async fn settle(
    stack: &Stack,
    conn: &mut AsyncPgConnection,
    redis: &mut RedisConnection,
    expected: &Expected,
) {
    let mut stable_since: Option<Instant> = None;
    let mut last_report = Instant::now();
    eventually(
        "every row final, every queue drained and idle, every effect arrived (held for 2 s)",
        SETTLE,
        async || {
            let pending = outstanding(stack, conn, redis, expected).await;
            if last_report.elapsed() > Duration::from_secs(10) {
                eprintln!("faults: still waiting for {pending:?}");
                last_report = Instant::now();
            }
            if pending.is_empty() {
                stable_since.get_or_insert_with(Instant::now).elapsed() >= QUIET
            } else {
                stable_since = None;
                false
            }
        },
    )
    .await;
}

/// Routable rows DONE; the unroutable FAILED naming the missing rule; the
/// poison rows DONE with their exact text in `audit_log`; one row per
/// dispatch key.
async fn assert_rows(conn: &mut AsyncPgConnection, rows: &[Row], dispatch_keys: usize) {
    let not_done: Vec<String> = rows
        .iter()
        .filter(|r| r.event_type != UNROUTABLE && r.status != "DONE")
        .map(|r| format!("{} {} {} {:?}", r.id, r.event_type, r.status, r.last_error))
        .collect();
    assert!(not_done.is_empty(), "routable rows not DONE: {not_done:#?}");

    let unroutable: Vec<&Row> = rows.iter().filter(|r| r.event_type == UNROUTABLE).collect();
    assert!(!unroutable.is_empty(), "the unroutable row was not written");
    let reason = format!("no routing rule matches event type \"{UNROUTABLE}\"");
    for row in &unroutable {
        let error = row.last_error.as_deref().unwrap_or_default();
        assert!(
            row.status == "FAILED" && error.contains(&reason),
            "the unroutable row is {} with {error:?}, expected FAILED with {reason:?}",
            row.status
        );
    }

    let pairs: Vec<Pair> = diesel::sql_query(
        "SELECT e.status, e.payload::text AS source, a.payload::text AS copy
         FROM outbox_event e LEFT JOIN audit_log a ON a.outbox_event_id = e.id
         WHERE e.event_type = $1",
    )
    .bind::<Text, _>(POISON_TYPE)
    .load(conn)
    .await
    .unwrap();
    assert!(pairs.len() >= 3, "the poison rows: {}", pairs.len());
    for pair in &pairs {
        assert_eq!(pair.status, "DONE", "{}", pair.source);
        assert_eq!(
            pair.copy.as_deref(),
            Some(pair.source.as_str()),
            "audit_log keeps the payload text exactly"
        );
    }

    let keyed = count(
        conn,
        "SELECT count(*) AS n FROM (SELECT dispatch_key FROM outbox_event
         WHERE dispatch_key IS NOT NULL GROUP BY dispatch_key HAVING count(*) = 1) AS k",
    )
    .await;
    assert_eq!(keyed, dispatch_keys as i64, "one row per dispatch key");
}

/// One job per event: the outbox queues hold exactly the DONE rows' task
/// ids, each in its target queue only; the downstream queues one send job
/// per mail and one invocation job per plugin call. No job is dead.
/// Returns the number of retry copies.
async fn assert_one_job_per_event(
    conn: &mut AsyncPgConnection,
    redis: &mut RedisConnection,
    namespace: &QueueNamespace,
    rows: &[Row],
) -> usize {
    let mut jobs: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut downstream: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut retry_copies = 0;
    for queue in all_queues() {
        let (bases, retries) = task_ids(redis, namespace, queue).await;
        retry_copies += retries;
        for base in bases {
            if base.starts_with("outbox:") {
                jobs.entry(base).or_default().push(queue);
            } else {
                downstream.entry(queue).or_default().insert(base);
            }
        }
    }
    let mut wrong = Vec::new();
    for row in rows.iter().filter(|r| r.status == "DONE") {
        let task = outbox_queue::task_id(row.id);
        let target = row.target_queue.as_deref().unwrap_or("<none>");
        match jobs.remove(&task) {
            Some(found) if found == [target] => {}
            found => wrong.push(format!(
                "{task} ({}): in {found:?}, target {target}",
                row.event_type
            )),
        }
    }
    assert!(
        wrong.is_empty(),
        "jobs not one per DONE row in its queue: {wrong:#?}"
    );
    assert!(jobs.is_empty(), "jobs of no DONE row: {jobs:#?}");

    let subscription = diesel::sql_query("SELECT id::text AS id FROM plugin_hook_subscription")
        .get_result::<TextId>(conn)
        .await
        .unwrap()
        .id;
    let mail_tasks: BTreeSet<String> = rows
        .iter()
        .filter(|r| is_mail(&r.event_type))
        .map(|r| outbox_subscriber_mail::email_task_id(&r.id.to_string()))
        .collect();
    let plugin_tasks: BTreeSet<String> = rows
        .iter()
        .filter(|r| r.event_type.starts_with("plugin.hook."))
        .map(|r| format!("plugin-invoke:{}:{subscription}", r.id))
        .collect();
    assert_eq!(
        downstream
            .remove(queues::TOOLCTRL_EMAIL)
            .unwrap_or_default(),
        mail_tasks,
        "one send job per mail"
    );
    assert_eq!(
        downstream
            .remove(queues::TOOLCTRL_PLUGIN_INVOKE)
            .unwrap_or_default(),
        plugin_tasks,
        "one invocation job per plugin call"
    );
    assert!(downstream.is_empty(), "unexpected jobs: {downstream:#?}");

    let mut dead = Vec::new();
    for queue in all_queues() {
        dead.extend(
            outbox_queue::dead_jobs(redis, namespace, queue, 20)
                .await
                .unwrap()
                .into_iter()
                .map(|d| format!("{queue}: {} {:?}", d.task_id, d.reason)),
        );
    }
    assert!(dead.is_empty(), "dead jobs: {dead:#?}");
    retry_copies
}

/// `audit_log` and `notification`: exactly one row per event of their kinds.
async fn assert_owned_rows_once(conn: &mut AsyncPgConnection, expected: &Expected) {
    let audit = count(
        conn,
        "SELECT count(*) AS n FROM audit_log a JOIN outbox_event e ON e.id = a.outbox_event_id
         WHERE e.event_type LIKE 'audit.%'",
    )
    .await;
    let audit_all = count(conn, "SELECT count(*) AS n FROM audit_log").await;
    assert_eq!(
        (audit, audit_all),
        (expected.audit, expected.audit),
        "audit_log rows (of audit events, in all) against audit events"
    );
    let notification = count(
        conn,
        "SELECT count(*) AS n FROM notification x JOIN outbox_event e ON e.id = x.outbox_event_id
         WHERE e.event_type LIKE 'notification.%' OR e.event_type LIKE 'billing.%'",
    )
    .await;
    let notification_all = count(conn, "SELECT count(*) AS n FROM notification").await;
    assert_eq!(
        (notification, notification_all),
        (expected.notification, expected.notification),
        "notification rows (of notification and billing events, in all) against those events"
    );
}

/// Every expected delivery arrived, and nothing else did.
fn assert_delivered(what: &str, expected: &HashSet<String>, seen: &HashMap<String, usize>) {
    let missing: Vec<&String> = expected
        .iter()
        .filter(|id| !seen.contains_key(*id))
        .collect();
    assert!(missing.is_empty(), "{what}s never arrived: {missing:?}");
    let strangers: Vec<&String> = seen.keys().filter(|id| !expected.contains(*id)).collect();
    assert!(strangers.is_empty(), "{what}s of no event: {strangers:?}");
}

fn is_mail(event_type: &str) -> bool {
    event_type.starts_with("mail.") || event_type.starts_with("marketing.lead.")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_restarts_and_broken_connections_lose_nothing_and_repeat_only_inside_the_window() {
    let started = Instant::now();
    let seed = std::env::var("FAULTS_SEED")
        .ok()
        .map(|s| {
            s.parse::<u64>()
                .expect("FAULTS_SEED must be a whole number")
        })
        .unwrap_or(DEFAULT_SEED);
    let plan = plan(seed);
    eprintln!("faults: seed {seed} (FAULTS_SEED={seed} replays this schedule)");
    for planned in &plan {
        eprintln!(
            "faults: planned: after round {} + {} ms: {}",
            planned.round,
            planned.delay.as_millis(),
            planned.fault
        );
    }

    let stack = Stack::new().await;
    let aof_dir = TempDir::new();
    let mut redis = persistent_redis(&aof_dir).await;
    let redis_url = redis.url();
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret) VALUES ('{TENANT}', '{}', 'whsec-faults');
             INSERT INTO plugin_hook_subscription (tenant_id, plugin, hook, endpoint, secret)
               VALUES ('{TENANT}', 'jira', 'workflow.executed', '{}', 'k-faults');
             INSERT INTO tenant_mail_settings (tenant_id, sales_inbox) VALUES ('{TENANT}', 'sales@acme.test')",
            stack.http.url_for(HOOK_PATH),
            stack.http.url_for(PLUGIN_PATH),
        ))
        .await;
    let concurrency = CONCURRENCY.to_string();
    let env: [(&str, &str); 7] = [
        ("REDIS_URL", redis_url.as_str()),
        ("WORKER_CONCURRENCY", concurrency.as_str()),
        // Orphaned jobs come back 4 heartbeats after a kill.
        ("WORKER_HEARTBEAT_MS", "1000"),
        // Rows a killed dispatcher had claimed come back after this.
        ("OUTBOX_LOCK_TIMEOUT_MS", "10000"),
        // A receiver slower than this is retried (a duplicate no fault
        // caused): generous for a loaded machine, and below the lease.
        ("WEBHOOK_TIMEOUT_MS", "3000"),
        // A killed delivery's key is free again about when its job comes back.
        ("DELIVERY_LEASE_MS", "3500"),
        // The unroutable row is dead-lettered at once, not after waiting
        // for a route.
        ("OUTBOX_UNROUTED_GRACE_SECONDS", "0"),
    ];
    let mut workers = Workers {
        general: stack.start(GENERAL, &env).await,
        mail: stack.start(MAIL, &env).await,
        retired: Vec::new(),
    };

    // Production and faults, together.
    let progress = Progress::default();
    let mut sql_journal = Journal::default();
    let mut rust_journal = Journal::default();
    let mut fault_journal = Journal::default();
    tokio::join!(
        sql_producer(stack.db.url(), &plan, &progress, &mut sql_journal),
        rust_producer(stack.db.url(), &plan, &progress, &mut rust_journal),
        run_faults(
            &stack,
            &env,
            &mut workers,
            &mut redis,
            &plan,
            &progress,
            &mut fault_journal,
            started,
        ),
    );
    let produced_at = started.elapsed();
    eprintln!(
        "faults: production stopped after {:.1}s",
        produced_at.as_secs_f64()
    );

    let mut conn = connect(stack.db.url()).await;
    let mut redis_conn = outbox_queue::connect(&RedisSettings::new(redis_url.as_str())).unwrap();
    let rows = rows(&mut conn).await;
    let expected = Expected::from_rows(&rows);
    settle(&stack, &mut conn, &mut redis_conn, &expected).await;
    let settled_at = started.elapsed();
    if plan.iter().any(|p| p.fault == Fault::RestartRedis) {
        // The guard's verdict on the restarted Redis, from its next check
        // (at most one check interval, 10 s, after it came back).
        eventually(
            "the Redis guard to give its verdict on the restarted Redis",
            Duration::from_secs(30),
            async || {
                workers.lines_with(&[SAFE_RESTART]) + workers.lines_with(&["Redis lost data"]) > 0
            },
        )
        .await;
    }

    // The figures, first, so that a failing run shows them too.
    let final_rows = self::rows(&mut conn).await;
    let mails = mails_received(&stack);
    let webhooks = requests_received(&stack, HOOK_PATH);
    let plugins = requests_received(&stack, PLUGIN_PATH);
    let count_of = |fault: Fault| plan.iter().filter(|p| p.fault == fault).count();
    let general_kills = count_of(Fault::KillGeneral);
    let mail_kills = count_of(Fault::KillMail);
    let redis_restarts = count_of(Fault::RestartRedis);
    let (mail_dups, webhook_dups, plugin_dups) = (
        duplicates(&mails),
        duplicates(&webhooks),
        duplicates(&plugins),
    );
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for row in &final_rows {
        *kinds
            .entry(row.event_type.split('.').next().unwrap_or_default())
            .or_default() += 1;
    }
    eprintln!("faults: ---- figures (seed {seed}) ----");
    eprintln!("faults: events: {} {kinds:?}", final_rows.len());
    eprintln!(
        "faults: faults: kill -9 worker-general {general_kills}, kill -9 worker-mail {mail_kills}, Redis restarts {redis_restarts}, Postgres connections broken once ({} terminated)",
        fault_journal.terminated_backends
    );
    for (at, what) in &fault_journal.faults {
        eprintln!("faults:   at {at:.1}s {what}");
    }
    eprintln!(
        "faults: producer reconnects: {}; repeated dispatch keys refused by the constraint: {}, reported as duplicates by the publisher: {}",
        get(&progress.reconnects),
        sql_journal.refused_by_constraint,
        rust_journal.reported_by_publisher
    );
    eprintln!(
        "faults: rows whose hand-off was retried: {}",
        final_rows.iter().filter(|r| r.retries > 0).count()
    );
    eprintln!(
        "faults: deliveries made but not recorded because Redis was away (worker logs): mails {}, webhooks {}, plugin calls {}",
        workers.lines_with(&["mail sent but not recorded"]),
        workers.lines_with(&["delivered but could not record it", "\"webhook:"]),
        workers.lines_with(&["delivered but could not record it", "\"plugin-invoke:"]),
    );
    eprintln!(
        "faults: duplicates: mails {mail_dups} of {}, webhooks {webhook_dups} of {} (worker-mail: {mail_kills} kills + {redis_restarts} Redis restart(s)), plugin calls {plugin_dups} of {} (worker-general: {general_kills} kills + {redis_restarts} Redis restart(s))",
        expected.mails.len(),
        expected.webhooks.len(),
        expected.plugins.len(),
    );
    let losses_reported = workers.lines_with(&["Redis lost data"]);
    eprintln!(
        "faults: the Redis guard's verdicts after {redis_restarts} restart(s) of a Redis with appendfsync always: {} safe, {losses_reported} loss(es)",
        workers.lines_with(&[SAFE_RESTART])
    );
    eprintln!(
        "faults: wall time: production {:.1}s, settled {:.1}s later, total {:.1}s",
        produced_at.as_secs_f64(),
        (settled_at - produced_at).as_secs_f64(),
        started.elapsed().as_secs_f64()
    );

    // No worker died on its own.
    for (name, worker) in [
        ("worker-general", &mut workers.general),
        ("worker-mail", &mut workers.mail),
    ] {
        assert!(
            worker.child.try_wait().unwrap().is_none(),
            "{name} exited on its own"
        );
    }
    assert_eq!(
        final_rows.len(),
        rows.len(),
        "rows appeared after production stopped"
    );
    let dispatch_keys = sql_journal.refused_by_constraint + rust_journal.reported_by_publisher;
    assert_rows(&mut conn, &final_rows, dispatch_keys).await;
    let retry_copies =
        assert_one_job_per_event(&mut conn, &mut redis_conn, &stack.namespace, &final_rows).await;
    eprintln!("faults: receiver retry copies (~retry<n>): {retry_copies}");
    assert_owned_rows_once(&mut conn, &expected).await;
    // A SIGKILL of a Redis that syncs every write loses nothing, and the
    // guard says so: no reconciliation, no "Redis lost data".
    // Break checked: with the verdict `RestartedSafely` never given
    // (`assess`), the guard reports a loss and this fails.
    assert_eq!(
        losses_reported, 0,
        "the guard took a restart of a Redis with appendfsync always for a loss"
    );
    assert_delivered("mail", &expected.mails, &mails);
    assert_delivered("webhook", &expected.webhooks, &webhooks);
    assert_delivered("plugin call", &expected.plugins, &plugins);

    // Duplicates only inside the window: a delivery caught between its
    // effect and its record, by a kill of the worker that makes it or by
    // Redis going away under the record. Each such fault catches at most
    // CONCURRENCY deliveries of a queue (one endpoint, one subscription).
    for (what, dups, worker, kills) in [
        ("mails", mail_dups, "worker-mail", mail_kills),
        ("webhooks", webhook_dups, "worker-mail", mail_kills),
        ("plugin calls", plugin_dups, "worker-general", general_kills),
    ] {
        let bound = (kills + redis_restarts) * CONCURRENCY;
        assert!(
            dups <= bound,
            "{dups} duplicate {what}: more than ({kills} kills of {worker} + {redis_restarts} Redis restart(s)) × concurrency {CONCURRENCY} = {bound}"
        );
    }
}
