//! What every bench stage shares: the run's sizes and scratch state
//! ([`Run`], [`Scratch`]), the JSON lines it prints ([`line()`], [`rate`],
//! [`printed`]) and its progress on stderr ([`stage`]), preloading a
//! backlog and clearing the stage's Redis keys. The stages
//! (`bench/*.rs`) and the command (`bench/mod.rs`) use it; it uses neither.

use std::time::Duration;

use anyhow::{Context, Result};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use outbox_test_support::with_database;
use serde_json::json;

use crate::services;

/// One bench run: how big, and where its scratch state lives.
pub struct Run {
    /// The services.
    pub found: services::Services,
    /// Tiny sizes, one round: the stages run, the figures mean nothing.
    pub smoke: bool,
    /// Appended to scratch names: empty for a full run, unique to the
    /// process for a smoke run (concurrent `cargo xtask test`s).
    pub tag: String,
}

impl Run {
    /// A run against `found`. Its Postgres URL gets `sslmode=disable`
    /// unless it names an `sslmode` itself: a server with TLS switched on
    /// would otherwise encrypt every connection of the run (a URL without
    /// `sslmode` prefers TLS), and the figures of builds that cannot speak
    /// TLS, or of another server, would not compare.
    pub fn new(mut found: services::Services, smoke: bool) -> Self {
        found.database_url = plain_text_unless_asked(&found.database_url);
        let tag = if smoke {
            format!("_smoke{}", std::process::id())
        } else {
            String::new()
        };
        Self { found, smoke, tag }
    }

    /// The scratch database `base` of this run.
    pub fn database(&self, base: &str) -> String {
        format!("{base}{}", self.tag)
    }

    /// The Redis key prefix of this run.
    pub fn prefix(&self) -> String {
        format!("outbox-bench{}:", self.tag)
    }

    /// The Redis key prefix of one stage of this run: stages clear and use
    /// only their own keys, so that a stage running at the same time in
    /// another bench process (`--only <stage>`) is not disturbed.
    pub fn stage_prefix(&self, stage: &str) -> String {
        format!("{}{stage}:", self.prefix())
    }

    /// `full` in a full run, `smoke` in a smoke run.
    pub fn size<T>(&self, full: T, smoke: T) -> T {
        if self.smoke { smoke } else { full }
    }
}

/// Says on stderr what is being measured now.
pub fn stage(name: &str) {
    eprintln!("bench: {name}");
}

/// Every line printed so far, for the chart.
static PRINTED: std::sync::Mutex<Vec<serde_json::Value>> = std::sync::Mutex::new(Vec::new());

/// Prints one JSON line on stdout (and keeps it for the chart).
pub fn line(value: serde_json::Value) {
    println!("{value}");
    PRINTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(value);
}

/// Prints one throughput line.
pub fn rate(bench: &str, events: usize, elapsed: Duration) {
    let seconds = elapsed.as_secs_f64();
    line(
        json!({ "bench": bench, "events": events, "seconds": (seconds * 1000.0).round() / 1000.0,
                 "per_second": (events as f64 / seconds).round() }),
    );
}

/// A scratch database, created afresh (dropped first if it exists) with the
/// migrations applied.
pub struct Scratch {
    admin: AsyncPgConnection,
    name: String,
    /// Its URL.
    pub url: String,
    /// The migrations applied, in order.
    pub applied: Vec<String>,
}

impl Scratch {
    /// Drops `name` if it exists, creates it and migrates it.
    pub async fn create(database_url: &str, name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let admin_url = with_database(database_url, "postgres");
        let mut admin = outbox_pg::establish(&admin_url)
            .await
            .with_context(|| format!("cannot connect to {admin_url}"))?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await?;
        let url = with_database(database_url, &name);
        let conn = outbox_pg::establish(&url).await?;
        let applied =
            outbox_model::run_migration_sets(conn, &outbox_model::MigrationSet::ALL).await?;
        Ok(Self {
            admin,
            name,
            url,
            applied,
        })
    }

    /// Creates `name` as a copy of this database (`CREATE DATABASE …
    /// TEMPLATE`, dropping an earlier `name` first) and returns its URL;
    /// nothing may be connected to this database meanwhile.
    pub async fn copy(&mut self, name: &str) -> Result<String> {
        self.remove_copy(name).await?;
        self.admin
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {}", self.name))
            .await?;
        Ok(with_database(&self.url, name))
    }

    /// Drops a copy made by [`Scratch::copy`].
    pub async fn remove_copy(&mut self, name: &str) -> Result<()> {
        self.admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await?;
        Ok(())
    }

    /// Drops the database.
    pub async fn remove(mut self) -> Result<()> {
        self.admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await?;
        Ok(())
    }
}

/// Inserts `rows` due `PENDING` rows spread over `event_types`, with
/// time-ordered ids like the publisher's UUIDv7 and a small payload, then
/// `VACUUM ANALYZE`s the table (the statistics a dispatcher starting on this
/// backlog would find: every row `PENDING`).
pub async fn preload_pending(
    conn: &mut AsyncPgConnection,
    rows: usize,
    event_types: &[&str],
) -> Result<()> {
    preload_pending_due_in(conn, rows, event_types, None).await
}

/// As [`preload_pending`], with every row falling due `due_in` from now
/// when given (the rows are due at once otherwise): a backlog that
/// processes already running find, rather than one they start on.
pub async fn preload_pending_due_in(
    conn: &mut AsyncPgConnection,
    rows: usize,
    event_types: &[&str],
    due_in: Option<Duration>,
) -> Result<()> {
    let scheduled = due_in.map_or_else(
        || "ts".to_owned(),
        |due_in| format!("now() + interval '{} milliseconds'", due_in.as_millis()),
    );
    let types = event_types
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(", ");
    conn.batch_execute(&format!(
        "INSERT INTO outbox_event (id, tenant_id, event_type, payload, created_at, scheduled_at)
         SELECT (lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7'
                 || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
                'tenant-' || (g % 17),
                (ARRAY[{types}])[1 + g % {n}],
                jsonb_build_object('n', g, 'note', 'benchmark'), ts, {scheduled}
         FROM (SELECT g, now() - interval '1 hour' + g * interval '1 ms' AS ts,
                      md5(g::text) AS h
               FROM generate_series(1, {rows}) AS g) AS s",
        n = event_types.len()
    ))
    .await?;
    conn.batch_execute("VACUUM ANALYZE outbox_event").await?;
    Ok(())
}

/// Deletes every key under `prefix`, on one server or, for a cluster's
/// URL, on each of its primaries.
pub async fn clear_redis(redis_url: &str, prefix: &str) -> Result<()> {
    match outbox_queue::cluster_nodes(redis_url) {
        None => clear_node(redis_url, prefix, false).await,
        Some(nodes) => {
            for node in nodes {
                clear_node(&node, prefix, true).await?;
            }
            Ok(())
        }
    }
}

/// [`clear_redis`] on one node; a cluster's replica is left alone (its
/// primary's deletions reach it), and a cluster node's keys are deleted one
/// by one (they are in different slots).
async fn clear_node(url: &str, prefix: &str, cluster: bool) -> Result<()> {
    let client = outbox_queue::redis_client(url, None)?;
    // Freeing a queue of 200,000 jobs takes longer than the default
    // response timeout on a busy machine: UNLINK frees in the background,
    // and the timeout is generous.
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(120)));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    if cluster {
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
        let primary = role
            .first()
            .and_then(|role| redis::from_redis_value::<String>(role.clone()).ok())
            .is_some_and(|role| role == "master");
        if !primary {
            return Ok(());
        }
    }
    // SCAN in steps, not KEYS: a run leaves hundreds of thousands of keys
    // (the soak), and one KEYS over them outlasts the client's timeout.
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if cluster && !keys.is_empty() {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("UNLINK").arg(key).ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
        } else if !keys.is_empty() {
            redis::cmd("UNLINK")
                .arg(&keys)
                .query_async::<()>(&mut conn)
                .await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// Every line printed so far, for the chart.
pub fn printed() -> Vec<serde_json::Value> {
    PRINTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// `url` with `sslmode=disable` added when it has no `sslmode`.
pub fn plain_text_unless_asked(url: &str) -> String {
    if url.contains("sslmode=") {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&sslmode=disable")
    } else {
        format!("{url}?sslmode=disable")
    }
}

#[cfg(test)]
mod tests {
    use super::plain_text_unless_asked;

    #[test]
    fn the_bench_talks_plain_text_to_postgres_unless_the_url_says_otherwise() {
        assert_eq!(
            plain_text_unless_asked("postgres://postgres@127.0.0.1:5432/postgres"),
            "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
        );
        assert_eq!(
            plain_text_unless_asked("postgres://h/db?application_name=x"),
            "postgres://h/db?application_name=x&sslmode=disable"
        );
        assert_eq!(
            plain_text_unless_asked("postgres://h/db?sslmode=verify-full"),
            "postgres://h/db?sslmode=verify-full"
        );
    }
}
