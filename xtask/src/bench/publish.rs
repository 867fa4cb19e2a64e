//! `cargo xtask bench --only publish_overhead`: what publishing one event
//! costs a business transaction.
//!
//! Eight clients (one connection each) run one-row business transactions
//! (`BEGIN; INSERT INTO bench_order …; COMMIT`) for a fixed time, then the
//! same with one event published in each transaction
//! (`publish_outbox_event`), first with no dispatcher waiting (the insert
//! trigger then sends no `NOTIFY`: what publishing costs while the
//! dispatchers are busy or none runs), then with a connection holding the
//! wake gate as a waiting dispatcher does, so that every commit notifies
//! (`NOTIFY` makes each commit take a database-wide lock on the
//! notification queue). A fourth arm inserts the same event row with one
//! plain prepared statement instead of the publisher (no validation, no
//! span, no trace context): the SQL's own cost, so that the publisher's
//! share shows. A fifth writes the same row into a copy of the table
//! without its `CHECK` constraints (those of the table and those of the
//! column types) and without its triggers (`bench_event_copy`, same
//! columns, defaults and indexes): what the checks cost the transaction.
//!
//! With `--publish-arms all` more arms follow, each writing the row into a
//! copy of the table made again for it: the copy with everything
//! (`sql_only_copy`, against which the others compare), the copy with the
//! column types' rules as table checks instead
//! (`sql_only_copy_rules_as_table_checks`: the table before migration
//! `2026-12-05-170002`), and one copy per
//! piece without that piece alone (`sql_only_copy_without_<piece>`): each
//! `CHECK` constraint of the table, each column type's rule (the column
//! then has the type's base type), each insert trigger, each index but the
//! primary key. A last arm writes the publisher's row through
//! `outbox_store::insert_event` without the publisher (`with_event_store`:
//! the publisher's statement without its validation, span and trace
//! context).
//!
//! Each round's line also gives the CPU time a transaction took in the
//! clients' own server backends (`server_us`) and in the bench process
//! (`client_us`); the summary line `publish_overhead_arms` (with either arm set)
//! gives per arm the ratio of the rates, `cpu_ratio` (the bare
//! transaction's CPU time over the arm's) and `server_us`. Before the rates,
//! `all` measures the server's CPU time per event row of every plain-SQL
//! arm in loops of one-row transactions inside the server (no clients, no
//! network, no WAL flush waited for: `publish_overhead_server_us`, the bare
//! transaction's time subtracted): on a shared machine the one figure of
//! the stage that the load of the other tenants hardly moves.
//!
//! The arms alternate over the rounds so that the load of a shared machine
//! falls on all alike; each round's line gives the machine's CPU shares
//! (`cpu_share`: the bench's clients and the server split the cores), the
//! summary the medians and their ratios to the bare transaction. No
//! dispatcher runs.

use std::time::{Duration, Instant};

use anyhow::Result;
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Jsonb, Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_model::NewOutboxEventRow;
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_event};
use serde_json::json;

use crate::bench::handoff::{median, ratio};
use crate::bench::kit::{Run, Scratch, line, stage};
use crate::bench::process::Cpu;

/// Concurrent clients.
const CLIENTS: usize = 8;

/// Which arms run.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Arms {
    /// The six arms of every run.
    Default,
    /// Those, then one copy of the table per piece without it, and the
    /// store's insert without the publisher.
    All,
}

/// What to measure.
pub struct Plan {
    /// Rounds (each runs every arm).
    pub rounds: usize,
    /// How long each arm runs per round.
    pub duration: Duration,
    /// Which arms.
    pub arms: Arms,
    /// Transactions of each server loop (`Arms::All`).
    pub loop_rows: usize,
    /// Rounds of the server loops.
    pub loop_rounds: usize,
}

/// Makes `bench_event_copy` again: `outbox_event`'s columns, defaults,
/// `CHECK` constraints, indexes and triggers, without what `kind` and
/// `piece` name: `none` (a full copy), `unchecked` (no checks of the table
/// or of the column types, no triggers), `table_checks` (the column
/// types' rules as table checks instead), `check` (the table's constraint
/// `piece`), `type` (column `piece` gets its type's base type), `trigger`
/// or `index` (the one named `piece`).
const COPY_FUNCTION: &str = r#"
CREATE FUNCTION bench_event_copy_without(kind text, piece text) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    DROP TABLE IF EXISTS bench_event_copy;
    CREATE TABLE bench_event_copy (LIKE outbox_event INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
    FOR r IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'bench_event_copy'::regclass AND contype = 'c' LOOP
        IF kind = 'unchecked' OR (kind = 'check' AND r.conname = piece) THEN
            EXECUTE format('ALTER TABLE bench_event_copy DROP CONSTRAINT %I', r.conname);
        END IF;
    END LOOP;
    FOR r IN SELECT a.attname, format_type(t.typbasetype, t.typtypmod) AS base
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
             WHERE a.attrelid = 'bench_event_copy'::regclass AND t.typtype = 'd' LOOP
        IF kind IN ('unchecked', 'table_checks') OR (kind = 'type' AND r.attname = piece) THEN
            EXECUTE format('ALTER TABLE bench_event_copy ALTER COLUMN %I TYPE %s',
                           r.attname, r.base);
        END IF;
    END LOOP;
    -- The column types' rules as table checks, the shape of the table
    -- before its rules moved into domains.
    FOR r IN SELECT a.attname, d.conname, pg_get_constraintdef(d.oid) AS def
             FROM pg_attribute a JOIN pg_constraint d ON d.contypid = a.atttypid
             WHERE a.attrelid = 'outbox_event'::regclass AND kind = 'table_checks' LOOP
        EXECUTE format('ALTER TABLE bench_event_copy ADD CONSTRAINT %I %s', r.conname,
                       regexp_replace(r.def, '\mVALUE\M', quote_ident(r.attname), 'g'));
    END LOOP;
    FOR r IN SELECT c.relname, pg_get_indexdef(i.indexrelid) AS def FROM pg_index i
             JOIN pg_class c ON c.oid = i.indexrelid
             WHERE i.indrelid = 'outbox_event'::regclass LOOP
        IF NOT (kind = 'index' AND r.relname = piece) THEN
            EXECUTE replace(
                replace(r.def, ' ON public.outbox_event ', ' ON public.bench_event_copy '),
                'INDEX ' || r.relname || ' ', 'INDEX bench_copy_' || r.relname || ' ');
        END IF;
    END LOOP;
    FOR r IN SELECT tgname, pg_get_triggerdef(oid) AS def FROM pg_trigger
             WHERE tgrelid = 'outbox_event'::regclass AND NOT tgisinternal LOOP
        IF NOT (kind = 'unchecked' OR (kind = 'trigger' AND r.tgname = piece)) THEN
            EXECUTE replace(r.def, ' ON public.outbox_event ', ' ON public.bench_event_copy ');
        END IF;
    END LOOP;
END;
$$;
"#;

/// Loops of one-row transactions inside the server, for the server's CPU
/// time per event row without the clients, the network and the load of the
/// machine in the figure: `n` transactions of one `bench_order` row
/// (`bench_loop_bare`), with one event row in `outbox_event`
/// (`bench_loop_event`) or in `bench_event_copy` (`bench_loop_copy`), each
/// committed (without waiting for the WAL flush: the flush is not CPU).
fn loop_procedures() -> String {
    [
        ("bench_loop_bare", ""),
        ("bench_loop_event", "outbox_event"),
        ("bench_loop_copy", "bench_event_copy"),
    ]
    .iter()
    .map(|(name, table)| {
        let event = if table.is_empty() {
            String::new()
        } else {
            format!(
                "INSERT INTO {table} (id, tenant_id, event_type, payload)
                 VALUES (gen_random_uuid(), 'tenant-1', 'billing.invoice.paid',
                         jsonb_build_object('order', i, 'amount', i));"
            )
        };
        format!(
            "CREATE PROCEDURE {name}(n int) LANGUAGE plpgsql AS $$
             BEGIN
                 SET synchronous_commit = off;
                 FOR i IN 1..n LOOP
                     INSERT INTO bench_order (tenant_id, amount) VALUES ('tenant-1', i);
                     {event}
                     COMMIT;
                 END LOOP;
             END;
             $$;"
        )
    })
    .collect()
}

/// The pieces of `outbox_event` an arm can leave out of a copy: kind
/// (as `bench_event_copy_without` takes it) and name. The checks of the
/// table, the columns whose type is a domain with a rule, the triggers that
/// fire on insert, the indexes but the primary key.
const PIECES_SQL: &str = "
SELECT 'check' AS kind, conname::text AS name FROM pg_constraint
WHERE conrelid = 'outbox_event'::regclass AND contype = 'c'
UNION ALL
SELECT 'type', a.attname::text FROM pg_attribute a
WHERE a.attrelid = 'outbox_event'::regclass AND a.attnum > 0 AND NOT a.attisdropped
  AND EXISTS (SELECT 1 FROM pg_constraint d WHERE d.contypid = a.atttypid)
UNION ALL
SELECT 'trigger', tgname::text FROM pg_trigger
WHERE tgrelid = 'outbox_event'::regclass AND NOT tgisinternal AND tgtype & 4 <> 0
UNION ALL
SELECT 'index', c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = 'outbox_event'::regclass AND NOT i.indisprimary
ORDER BY 1, 2";

/// A piece of the table (see [`PIECES_SQL`]).
#[derive(QueryableByName)]
struct Piece {
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Text)]
    name: String,
}

/// One arm: its name, how its transactions write their event, whether a
/// dispatcher waits (so that commits notify).
struct Arm {
    name: String,
    event: Event,
    waiting: bool,
}

impl Arm {
    fn new(name: impl Into<String>, event: Event) -> Self {
        Self {
            name: name.into(),
            event,
            waiting: false,
        }
    }
}

/// Measures every arm of `plan.arms`, `plan.rounds` times.
pub async fn run(run: &Run, plan: &Plan) -> Result<()> {
    let scratch = Scratch::create(
        &run.found.database_url,
        run.database("outbox_bench_publish"),
    )
    .await?;
    let mut conn = outbox_pg::establish(&scratch.url).await?;
    conn.batch_execute(
        "CREATE TABLE bench_order (
             id bigserial PRIMARY KEY,
             tenant_id text NOT NULL,
             amount bigint NOT NULL,
             created_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    conn.batch_execute(COPY_FUNCTION).await?;
    let arms = arms(&mut conn, plan.arms).await?;
    if plan.arms == Arms::All {
        conn.batch_execute(&loop_procedures()).await?;
        server_loops(&mut conn, &scratch.url, &arms, plan).await?;
        // The loops' rows out of the way of the rates.
        conn.batch_execute("TRUNCATE bench_order; TRUNCATE outbox_event")
            .await?;
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    // CPU per transaction (server and client), and the server's alone.
    let mut costs: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    let mut servers: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    for round in 1..=plan.rounds {
        for (((arm, rates), costs), server) in arms
            .iter()
            .zip(rates.iter_mut())
            .zip(costs.iter_mut())
            .zip(servers.iter_mut())
        {
            stage(&format!(
                "publish_overhead {}, round {round}/{}, {CLIENTS} clients",
                arm.name, plan.rounds
            ));
            if let Event::Copy(kind, piece) = &arm.event {
                diesel::sql_query("SELECT bench_event_copy_without($1, $2)")
                    .bind::<Text, _>(kind)
                    .bind::<Text, _>(piece)
                    .execute(&mut conn)
                    .await?;
            }
            // The wake gate as a waiting dispatcher holds it, on this
            // connection, for this arm only.
            let (key1, key2) = outbox_model::WAKE_GATE_LOCK;
            conn.batch_execute(&if arm.waiting {
                format!("SELECT pg_advisory_lock({key1}, {key2})")
            } else {
                "SELECT pg_advisory_unlock_all()".to_owned()
            })
            .await?;
            let m = measure(&scratch.url, &arm.event, plan.duration).await?;
            line(json!({
                "bench": "publish_overhead_round", "arm": arm.name, "round": round,
                "clients": CLIENTS, "per_second": m.rate.round(), "cpu_share": m.cpu,
                "server_us": round1(m.server_us), "client_us": round1(m.client_us),
            }));
            rates.push(m.rate);
            costs.push(m.server_us + m.client_us);
            server.push(m.server_us);
        }
    }
    let medians: Vec<f64> = rates.into_iter().map(median).collect();
    let (bare, with_event, waiting, sql_only, unchecked, pipelined) = (
        medians[0], medians[1], medians[2], medians[3], medians[4], medians[5],
    );
    line(json!({
        "bench": "publish_overhead", "clients": CLIENTS, "rounds": plan.rounds,
        "bare_per_second": bare.round(), "with_event_per_second": with_event.round(),
        "ratio": ratio(with_event, bare),
        "with_event_dispatcher_waiting_per_second": waiting.round(),
        "ratio_dispatcher_waiting": ratio(waiting, bare),
        "with_event_sql_only_per_second": sql_only.round(),
        "ratio_sql_only": ratio(sql_only, bare),
        "with_event_sql_only_unchecked_per_second": unchecked.round(),
        "ratio_sql_only_unchecked": ratio(unchecked, bare),
        "with_event_pipelined_per_second": pipelined.round(),
        "ratio_pipelined": ratio(pipelined, bare),
    }));
    // Per arm: the ratio of the rates, the ratio of the CPU a transaction
    // takes (the bare one's over the arm's: what the rate ratio would be
    // with the cores to the bench alone), and the server's CPU per
    // transaction.
    let costs: Vec<f64> = costs.into_iter().map(median).collect();
    let servers: Vec<f64> = servers.into_iter().map(median).collect();
    let mut figures = serde_json::Map::new();
    for (((arm, rate), cost), server) in arms.iter().zip(&medians).zip(&costs).zip(&servers) {
        figures.insert(
            arm.name.clone(),
            json!({
                "ratio": ratio(*rate, bare),
                "cpu_ratio": ratio(costs[0], *cost),
                "server_us": round1(*server),
            }),
        );
    }
    line(json!({
        "bench": "publish_overhead_arms", "clients": CLIENTS, "rounds": plan.rounds,
        "arms": figures,
    }));
    drop(conn);
    scratch.remove().await
}

/// The server's CPU time per event row of every arm that writes its row
/// with plain SQL (the rest of the transaction's subtracted), from loops
/// inside the server ([`loop_procedures`]) of `plan.loop_rows`
/// transactions, in `plan.loop_rounds` alternating rounds; the median of
/// each in a line `publish_overhead_server_us`.
async fn server_loops(
    conn: &mut AsyncPgConnection,
    url: &str,
    arms: &[Arm],
    plan: &Plan,
) -> Result<()> {
    let looped: Vec<&Arm> = arms
        .iter()
        .filter(|arm| matches!(arm.event, Event::None | Event::SqlOnly | Event::Copy(..)))
        .collect();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); looped.len()];
    for round in 1..=plan.loop_rounds {
        for (arm, times) in looped.iter().zip(times.iter_mut()) {
            stage(&format!(
                "publish_overhead server loop {}, round {round}/{}",
                arm.name, plan.loop_rounds
            ));
            let procedure = match &arm.event {
                Event::Copy(kind, piece) => {
                    diesel::sql_query("SELECT bench_event_copy_without($1, $2)")
                        .bind::<Text, _>(kind)
                        .bind::<Text, _>(piece)
                        .execute(conn)
                        .await?;
                    "bench_loop_copy"
                }
                Event::SqlOnly => "bench_loop_event",
                _ => "bench_loop_bare",
            };
            // A new connection: nothing planned or cached from another arm.
            let mut looping = outbox_pg::establish(url).await?;
            let pid: BackendPid = diesel::sql_query("SELECT pg_backend_pid() AS pid")
                .get_result(&mut looping)
                .await?;
            let before = on_cpu_ns(&[pid.pid]);
            looping
                .batch_execute(&format!("CALL {procedure}({})", plan.loop_rows))
                .await?;
            let us =
                on_cpu_ns(&[pid.pid]).saturating_sub(before) as f64 / 1e3 / plan.loop_rows as f64;
            line(json!({
                "bench": "publish_overhead_server_round", "arm": arm.name, "round": round,
                "transactions": plan.loop_rows, "server_us_per_transaction": round1(us),
            }));
            times.push(us);
        }
    }
    let medians: Vec<f64> = times.into_iter().map(median).collect();
    // `<[_]>::first`: diesel's `RunQueryDsl::first` would be taken otherwise.
    let bare = <[f64]>::first(&medians).copied().unwrap_or(f64::NAN);
    let mut figures = serde_json::Map::new();
    for (arm, median) in looped.iter().zip(&medians).skip(1) {
        figures.insert(arm.name.clone(), json!(round1(median - bare)));
    }
    line(json!({
        "bench": "publish_overhead_server_us", "rounds": plan.loop_rounds,
        "transactions": plan.loop_rows, "bare_transaction_us": round1(bare),
        "event_row_us": figures,
    }));
    Ok(())
}

/// The arms of `which`, the six of every run first (the summary reads
/// them by position).
async fn arms(conn: &mut AsyncPgConnection, which: Arms) -> Result<Vec<Arm>> {
    let mut arms = vec![
        Arm::new("bare", Event::None),
        Arm::new("with_event", Event::Publisher),
        Arm {
            waiting: true,
            ..Arm::new("with_event_dispatcher_waiting", Event::Publisher)
        },
        Arm::new("with_event_sql_only", Event::SqlOnly),
        Arm::new(
            "with_event_sql_only_unchecked",
            Event::Copy("unchecked".to_owned(), String::new()),
        ),
        Arm::new("with_event_pipelined", Event::Pipelined),
    ];
    if which == Arms::All {
        arms.push(Arm::new("with_event_store", Event::Store));
        arms.push(Arm::new(
            "sql_only_copy",
            Event::Copy("none".to_owned(), String::new()),
        ));
        arms.push(Arm::new(
            "sql_only_copy_rules_as_table_checks",
            Event::Copy("table_checks".to_owned(), String::new()),
        ));
        let pieces: Vec<Piece> = diesel::sql_query(PIECES_SQL).load(conn).await?;
        for piece in pieces {
            let name = match piece.kind.as_str() {
                "type" => format!("sql_only_copy_without_rule_of_{}", piece.name),
                _ => format!("sql_only_copy_without_{}", piece.name),
            };
            arms.push(Arm::new(name, Event::Copy(piece.kind, piece.name)));
        }
    }
    Ok(arms)
}

/// How an arm's transactions write their event.
#[derive(Clone, PartialEq, Eq)]
enum Event {
    /// No event: the bare business transaction.
    None,
    /// `publish_outbox_event`.
    Publisher,
    /// `publish_outbox_event` and the business insert sent together
    /// (joined futures on the shared connection: one round trip for both).
    Pipelined,
    /// The publisher's row through `outbox_store::insert_event`, without
    /// the publisher's validation, span and trace context.
    Store,
    /// Four columns in one prepared `INSERT`, nothing else.
    SqlOnly,
    /// The same `INSERT` into `bench_event_copy`, made by
    /// `bench_event_copy_without(kind, piece)` before the arm.
    Copy(String, String),
}

/// What one arm measured in one round.
struct Measured {
    /// Transactions a second of all clients.
    rate: f64,
    /// The machine's CPU shares meanwhile.
    cpu: serde_json::Value,
    /// CPU time of the clients' own server backends per transaction, µs.
    server_us: f64,
    /// CPU time of the bench process per transaction, µs.
    client_us: f64,
}

/// Transactions per second of `CLIENTS` clients for `duration`, the
/// machine's CPU shares meanwhile (sampled while the clients' connections
/// are open: a backend's time counts for the server only until it exits),
/// and the CPU time each transaction took in the clients' backends and in
/// this process: unlike the rate, those hardly depend on what else the
/// machine runs.
async fn measure(url: &str, event: &Event, duration: Duration) -> Result<Measured> {
    let mut conns = Vec::with_capacity(CLIENTS);
    let mut backends = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let mut conn = outbox_pg::establish(url).await?;
        let pid: BackendPid = diesel::sql_query("SELECT pg_backend_pid() AS pid")
            .get_result(&mut conn)
            .await?;
        backends.push(pid.pid);
        conns.push(conn);
    }
    let server_before = on_cpu_ns(&backends);
    let client_before = own_cpu_ns();
    let before = Cpu::sample(&[]);
    let started = Instant::now();
    let deadline = started + duration;
    let clients = conns
        .into_iter()
        .enumerate()
        .map(|(client, mut conn)| async move {
            let mut done = 0usize;
            while Instant::now() < deadline {
                conn.transaction::<_, PublishError, _>(async |conn| {
                    // Kept prepared, as a business insert written with
                    // diesel's query builder would be.
                    let order = || {
                        outbox_model::prepared(
                            "INSERT INTO bench_order (tenant_id, amount) VALUES ($1, $2)",
                        )
                        .bind::<Text, _>(format!("tenant-{client}"))
                        .bind::<BigInt, _>(done as i64)
                    };
                    if *event == Event::Pipelined {
                        let tx = OutboxTx::new(conn)?;
                        let published = publish_outbox_event(
                            &tx,
                            NewOutboxEvent::new(
                                format!("tenant-{client}"),
                                "billing.invoice.paid",
                                json!({ "order": done, "amount": done }),
                            ),
                        );
                        let ordered = order().execute(&mut &*tx);
                        futures::try_join!(published, async {
                            ordered.await.map_err(PublishError::from)
                        })?;
                        return Ok(());
                    }
                    order().execute(conn).await?;
                    match event {
                        Event::None | Event::Pipelined => {}
                        Event::SqlOnly | Event::Copy(..) => {
                            outbox_model::prepared(if *event == Event::SqlOnly {
                                "INSERT INTO outbox_event (id, tenant_id, event_type, payload)
                                 VALUES ($1, $2, $3, $4)"
                            } else {
                                "INSERT INTO bench_event_copy (id, tenant_id, event_type, payload)
                                 VALUES ($1, $2, $3, $4)"
                            })
                            .bind::<SqlUuid, _>(uuid::Uuid::now_v7())
                            .bind::<Text, _>(format!("tenant-{client}"))
                            .bind::<Text, _>("billing.invoice.paid")
                            .bind::<Jsonb, _>(json!({ "order": done, "amount": done }))
                            .execute(conn)
                            .await?;
                        }
                        Event::Store => {
                            outbox_store::insert_event(conn, &store_row(client, done)).await?;
                        }
                        Event::Publisher => {
                            let tx = OutboxTx::new(conn)?;
                            publish_outbox_event(
                                &tx,
                                NewOutboxEvent::new(
                                    format!("tenant-{client}"),
                                    "billing.invoice.paid",
                                    json!({ "order": done, "amount": done }),
                                ),
                            )
                            .await?;
                        }
                    }
                    Ok(())
                })
                .await?;
                done += 1;
            }
            Ok::<_, anyhow::Error>((done, conn))
        });
    let finished = futures::future::try_join_all(clients).await?;
    let transactions = finished.iter().map(|(done, _)| done).sum::<usize>() as f64;
    let rate = transactions / started.elapsed().as_secs_f64();
    let cpu = before.shares(&Cpu::sample(&[]));
    let server_ns = on_cpu_ns(&backends).saturating_sub(server_before);
    let client_ns = own_cpu_ns().saturating_sub(client_before);
    drop(finished);
    Ok(Measured {
        rate,
        cpu,
        server_us: server_ns as f64 / 1e3 / transactions,
        client_us: client_ns as f64 / 1e3 / transactions,
    })
}

/// A backend's process id.
#[derive(QueryableByName)]
struct BackendPid {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pid: i32,
}

/// Nanoseconds the processes `pids` (the server's backends, on this
/// machine) have run on a CPU (`/proc/<pid>/schedstat`); 0 for one that
/// cannot be read.
fn on_cpu_ns(pids: &[i32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Nanoseconds this process (every thread) has run on a CPU: user plus
/// system time of `/proc/self/stat`, in clock ticks of 10 ms.
fn own_cpu_ns() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // The fields after the command name (which may hold spaces), from the
    // third on: utime and stime are the 14th and 15th.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<u64>().ok())
        .sum();
    ticks * 10_000_000
}

/// The row the publisher writes for client `client`'s `done`-th event,
/// made without it.
fn store_row(client: usize, done: usize) -> NewOutboxEventRow {
    NewOutboxEventRow {
        id: uuid::Uuid::now_v7(),
        tenant_id: format!("tenant-{client}"),
        event_type: "billing.invoice.paid".to_owned(),
        payload: json!({ "order": done, "amount": done }),
        dispatch_key: None,
        scheduled_at: None,
        traceparent: None,
        tracestate: None,
        dedupe_for: None,
        dedupe_while_pending: false,
        replace_pending: false,
        priority: outbox_model::Priority::NORMAL,
        ordering_key: None,
    }
}

/// `value` to one decimal.
fn round1(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}
