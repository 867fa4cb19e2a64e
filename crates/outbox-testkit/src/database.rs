//! [`TestDatabase`]: one Postgres database per test, cloned from a template.

use diesel::sql_types::{BigInt, Bool, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_pg::PgPool;

use crate::url::{database_server_url, with_database};

/// Advisory lock key serializing template creation across test processes.
const TEMPLATE_LOCK_KEY: i64 = 0x6f75_7462_6f78; // "outbox"

/// The prefix of every test database's name; the rest is the second it
/// was created at (Unix time) and a random id.
const TEST_DATABASE_PREFIX: &str = "outbox_test_";

/// The prefix of the template databases; the rest is the migrations'
/// fingerprint.
const TEMPLATE_PREFIX: &str = "outbox_tpl_";

/// The template of the migrations this code was built with.
fn current_template() -> String {
    format!("{TEMPLATE_PREFIX}{}", outbox_model::schema_fingerprint())
}

/// With this variable set to `1`, every test database has a partitioned
/// `outbox_event` (`outbox partition convert`, one partition a day): the
/// same tests then prove that each operation works on both forms of the
/// table. `cargo xtask test` runs the store's, the publisher's and the
/// dispatcher's tests a second time so.
const PARTITIONED_VAR: &str = "OUTBOX_TEST_PARTITIONED";

/// The suffix of the templates whose `outbox_event` is partitioned.
const PARTITIONED_SUFFIX: &str = "_partitioned";

/// Whether this process' test databases have a partitioned `outbox_event`.
fn partitioned_run() -> bool {
    std::env::var(PARTITIONED_VAR).is_ok_and(|v| v == "1")
}

/// The template this process clones: [`current_template`], partitioned
/// when [`PARTITIONED_VAR`] says so.
fn run_template() -> String {
    if partitioned_run() {
        format!("{}{PARTITIONED_SUFFIX}", current_template())
    } else {
        current_template()
    }
}

/// The name of a new test database created at `unix_seconds`.
fn test_database_name(unix_seconds: u64) -> String {
    format!(
        "{TEST_DATABASE_PREFIX}{unix_seconds}_{}",
        uuid::Uuid::new_v4().simple()
    )
}

/// When the test database `name` was created (Unix seconds); `None` for a
/// name of another shape.
fn created_at(name: &str) -> Option<u64> {
    let rest = name.strip_prefix(TEST_DATABASE_PREFIX)?;
    let (seconds, id) = rest.split_once('_')?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| seconds.parse().ok())
        .flatten()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh, migrated database for one test, dropped with the value.
///
/// Creating one clones a template database (`outbox_tpl_<fingerprint>`) that
/// holds the migrated schema (every migration set, whatever the features;
/// with `OUTBOX_TEST_PARTITIONED=1`, `outbox_tpl_<fingerprint>_partitioned`,
/// whose `outbox_event` is partitioned by day);
/// the template is built once per migrations fingerprint, by whichever test
/// process gets there first, under an advisory lock. Cloning costs milliseconds; no test runs migrations.
/// The pool is small (4 by default) so that a parallel suite stays well
/// within the server's default of 100 connections.
pub struct TestDatabase {
    name: String,
    url: String,
    admin_url: String,
    pool: PgPool,
}

#[derive(diesel::QueryableByName)]
struct Exists {
    #[diesel(sql_type = Bool)]
    exists: bool,
}

impl TestDatabase {
    /// A new database with a pool of 4 connections.
    ///
    /// # Panics
    ///
    /// When the Postgres server cannot be reached or the template cannot be
    /// built: a test cannot go on without its database.
    pub async fn new() -> Self {
        Self::with_pool_size(4).await
    }

    /// A new database with a pool of `pool_size` connections.
    ///
    /// # Panics
    ///
    /// As [`TestDatabase::new`].
    pub async fn with_pool_size(pool_size: u32) -> Self {
        Self::on_server(&database_server_url(), pool_size).await
    }

    /// A new database with a pool of `pool_size` connections on the
    /// Postgres server of `server` (only its server part matters), for
    /// suites that take their server from their own variable.
    ///
    /// # Panics
    ///
    /// As [`TestDatabase::new`].
    pub async fn on_server(server: &str, pool_size: u32) -> Self {
        let server = server.to_owned();
        let admin_url = with_database(&server, "postgres");
        let name = test_database_name(unix_now());
        let mut admin = connect(&admin_url).await;
        let create = async |admin: &mut AsyncPgConnection| {
            let template = ensure_template(&admin_url).await;
            admin
                .batch_execute(&format!(
                    "CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""
                ))
                .await
        };
        // A sweep from a suite of other migrations on the same server may
        // drop the template between its check and the clone: build it again
        // and clone once more.
        if let Err(first) = create(&mut admin).await {
            create(&mut admin).await.unwrap_or_else(|e| {
                panic!("cannot create test database {name}: {e} (first attempt: {first})")
            });
        }
        let url = with_database(&server, &name);
        let pool = outbox_pg::connect_pool(&url, pool_size)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to test database {name}: {e}"));
        Self {
            name,
            url,
            admin_url,
            pool,
        }
    }

    /// The database's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL of this database (for binaries under test).
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The shared pool.
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A dedicated connection outside the pool.
    ///
    /// # Panics
    ///
    /// When the connection fails.
    pub async fn conn(&self) -> AsyncPgConnection {
        connect(&self.url).await
    }

    /// Whether a session of this database is waiting on a lock right now
    /// with a statement matching `query_like` (an SQL `LIKE` pattern), such
    /// as the writer a test holds back with a lock of its own.
    ///
    /// # Panics
    ///
    /// When `pg_stat_activity` cannot be read.
    pub async fn waits_on_a_lock(&self, query_like: &str) -> bool {
        #[derive(diesel::QueryableByName)]
        struct Waiting {
            #[diesel(sql_type = Bool)]
            waiting: bool,
        }
        let mut conn = self.conn().await;
        diesel::sql_query(
            "SELECT count(*) > 0 AS waiting FROM pg_stat_activity
             WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE $2",
        )
        .bind::<Text, _>(&self.name)
        .bind::<Text, _>(query_like)
        .get_result::<Waiting>(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("cannot read pg_stat_activity: {e}"))
        .waiting
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop runs inside the test's runtime, where blocking on a future is
        // not allowed; a short-lived thread with its own runtime does it.
        let dropper = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(mut admin) = outbox_pg::establish(&admin_url).await {
                    let _ = admin
                        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                        .await;
                }
            });
        });
        let _ = dropper.join();
    }
}

impl std::fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDatabase")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[derive(diesel::QueryableByName)]
struct Idle {
    #[diesel(sql_type = Text)]
    datname: String,
}

/// Drops the test databases on the Postgres server of `server` (only its
/// server part matters) that a killed test left behind: those created more
/// than `older_than` ago that no session is connected to. A test that is
/// killed (a timeout, an interrupted mutation run) never runs its
/// [`TestDatabase`]'s drop; `cargo xtask test` and `cargo xtask mutants`
/// call this before they start. Also drops the template databases of other
/// migrations than this code's (each change of the migrations builds a new
/// one) that no session is connected to; a suite of those migrations still
/// running builds its template again when it next needs it. Returns the
/// names dropped.
///
/// # Errors
///
/// When the server cannot be reached or a database cannot be dropped.
pub async fn sweep_abandoned_databases(
    server: &str,
    older_than: std::time::Duration,
) -> Result<Vec<String>, String> {
    let admin_url = with_database(server, "postgres");
    let mut admin = outbox_pg::establish(&admin_url)
        .await
        .map_err(|e| format!("cannot connect to {admin_url}: {e}"))?;
    let idle = idle_databases(&mut admin, TEST_DATABASE_PREFIX).await?;
    let cutoff = unix_now().saturating_sub(older_than.as_secs());
    let mut dropped = Vec::new();
    for Idle { datname } in idle {
        if created_at(&datname).is_none_or(|created| created > cutoff) {
            continue;
        }
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{datname}\" WITH (FORCE)"
            ))
            .await
            .map_err(|e| format!("cannot drop {datname}: {e}"))?;
        dropped.push(datname);
    }
    let templates = idle_databases(&mut admin, TEMPLATE_PREFIX).await?;
    let current = current_template();
    for Idle { datname } in templates {
        if !stale_template(&datname, &current) {
            continue;
        }
        // Postgres refuses to drop a database marked as a template.
        let dropping = admin
            .batch_execute(&format!("ALTER DATABASE \"{datname}\" IS_TEMPLATE false"))
            .await;
        match dropping {
            Ok(()) => {
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{datname}\""))
                    .await
                    .map_err(|e| format!("cannot drop {datname}: {e}"))?;
                dropped.push(datname);
            }
            // Dropped meanwhile by a sweep running at the same time.
            Err(_) if !database_exists(&mut admin, &datname).await => {}
            Err(e) => return Err(format!("cannot drop {datname}: {e}")),
        }
    }
    Ok(dropped)
}

/// The databases whose name starts with `prefix` that no session is
/// connected to.
async fn idle_databases(admin: &mut AsyncPgConnection, prefix: &str) -> Result<Vec<Idle>, String> {
    diesel::sql_query(
        "SELECT d.datname::text AS datname FROM pg_database d \
         WHERE starts_with(d.datname, $1) \
           AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datid = d.oid)",
    )
    .bind::<Text, _>(prefix)
    .load(admin)
    .await
    .map_err(|e| format!("cannot list the databases named {prefix}*: {e}"))
}

/// Whether the template database `name` belongs to other migrations than
/// those of `current` (the template of this code, and the one being built
/// for it, are kept).
fn stale_template(name: &str, current: &str) -> bool {
    let name = name.strip_suffix("_building").unwrap_or(name);
    let name = name.strip_suffix(PARTITIONED_SUFFIX).unwrap_or(name);
    name.starts_with(TEMPLATE_PREFIX) && name != current
}

async fn connect(url: &str) -> AsyncPgConnection {
    outbox_pg::establish(url).await.unwrap_or_else(|e| {
        panic!(
            "cannot connect to Postgres at {url}: {e}\n\
             hint: set OUTBOX_TEST_DATABASE_URL to a server whose role may create databases \
             (in the outbox workspace, `cargo xtask services` starts one and prints its URL)"
        )
    })
}

/// Makes sure the template for the current migrations exists; returns its name.
async fn ensure_template(admin_url: &str) -> String {
    let template = run_template();
    let mut admin = connect(admin_url).await;
    if database_exists(&mut admin, &template).await {
        return template;
    }
    diesel::sql_query("SELECT pg_advisory_lock($1)")
        .bind::<BigInt, _>(TEMPLATE_LOCK_KEY)
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("cannot take the template lock: {e}"));
    if !database_exists(&mut admin, &template).await {
        build_template(&mut admin, admin_url, &template).await;
    }
    // The session ends with the connection, which releases the lock too.
    let _ = diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<BigInt, _>(TEMPLATE_LOCK_KEY)
        .execute(&mut admin)
        .await;
    template
}

async fn build_template(admin: &mut AsyncPgConnection, admin_url: &str, template: &str) {
    let building = format!("{template}_building");
    let run = async {
        // CREATE/DROP DATABASE cannot share a (multi-statement) transaction.
        for sql in [
            format!("DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)"),
            format!("CREATE DATABASE \"{building}\""),
        ] {
            admin.batch_execute(&sql).await.map_err(|e| e.to_string())?;
        }
        let conn = outbox_pg::establish(&with_database(admin_url, &building))
            .await
            .map_err(|e| e.to_string())?;
        // Every set, whatever the build's features: a test of any crate
        // finds every table.
        outbox_model::run_migration_sets(conn, &outbox_model::MigrationSet::ALL)
            .await
            .map_err(|e| e.to_string())?;
        if template.ends_with(PARTITIONED_SUFFIX) {
            let mut conn = outbox_pg::establish(&with_database(admin_url, &building))
                .await
                .map_err(|e| e.to_string())?;
            outbox_store::convert_to_partitioned(&mut conn, outbox_store::PartitionUnit::Day, 3)
                .await
                .map_err(|e| e.to_string())?;
        }
        // Renamed only once complete, so a template that exists is whole.
        admin
            .batch_execute(&format!(
                "ALTER DATABASE \"{building}\" RENAME TO \"{template}\"; \
                 ALTER DATABASE \"{template}\" IS_TEMPLATE true"
            ))
            .await
            .map_err(|e| e.to_string())
    };
    if let Err(e) = run.await {
        panic!("cannot build the test template database {template}: {e}");
    }
}

async fn database_exists(admin: &mut AsyncPgConnection, name: &str) -> bool {
    diesel::sql_query("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AS exists")
        .bind::<Text, _>(name)
        .get_result::<Exists>(admin)
        .await
        .unwrap_or_else(|e| panic!("cannot list databases: {e}"))
        .exists
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_database_name_carries_its_creation_time() {
        let name = test_database_name(1_764_500_000);
        assert!(name.len() <= 63, "{name} is longer than Postgres allows");
        assert_eq!(created_at(&name), Some(1_764_500_000));
    }

    #[test]
    fn only_templates_of_other_migrations_are_stale() {
        let current = "outbox_tpl_aaaa";
        for (name, stale) in [
            ("outbox_tpl_aaaa", false),
            ("outbox_tpl_aaaa_building", false),
            ("outbox_tpl_bbbb", true),
            ("outbox_tpl_bbbb_building", true),
            (
                "outbox_test_1764500000_0f3c9a2b5d6e4f708192a3b4c5d6e7f8",
                false,
            ),
            ("orders", false),
        ] {
            assert_eq!(stale_template(name, current), stale, "{name}");
        }
    }

    #[test]
    fn names_of_another_shape_have_no_creation_time() {
        for name in [
            "outbox_test_0f3c9a2b5d6e4f708192a3b4c5d6e7f8",
            "outbox_tpl_1234",
            "outbox_test_12_short",
            "outbox_test_x_0f3c9a2b5d6e4f708192a3b4c5d6e7f8",
            "orders",
        ] {
            assert_eq!(created_at(name), None, "{name}");
        }
    }
}
