//! The one migrations tree of the workspace, embedded at compile time.

use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

/// Every migration under `migrations/` at the workspace root (reached
/// through the crate's `migrations` link, so that the packaged crate
/// carries them).
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// A fingerprint of the migrations tree (paths and contents), computed at
/// build time. Two builds with the same fingerprint create the same schema;
/// test harnesses name their template databases after it.
pub const MIGRATIONS_FINGERPRINT: &str = env!("OUTBOX_MIGRATIONS_FINGERPRINT");

/// [`MIGRATIONS_FINGERPRINT`] followed by a hash of the names of the
/// migrations actually embedded in this build. The build-time fingerprint
/// alone can be fresh while the embedded list is stale (the compiler does
/// not always see a migration directory added or renamed); naming templates
/// after both keeps a stale build from claiming a new schema's name.
#[must_use]
pub fn schema_fingerprint() -> String {
    use diesel::migration::MigrationSource;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let names = MigrationSource::<diesel::pg::Pg>::migrations(&MIGRATIONS)
        .map(|all| all.iter().map(|m| m.name().to_string()).collect::<Vec<_>>())
        .unwrap_or_default();
    for byte in names.iter().flat_map(|n| n.bytes().chain([0])) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{MIGRATIONS_FINGERPRINT}_{:08x}", hash >> 32)
}

/// Why migrations did not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrationError {
    /// A migration failed; the database is left at the last one that succeeded.
    #[error("migration failed: {0}")]
    Migration(String),
    /// Reading which migrations the database has failed.
    #[error("cannot read the applied migrations: {0}")]
    Query(#[from] diesel::result::Error),
    /// The blocking migration task panicked or was cancelled.
    #[error("migration task did not finish: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Applies every pending migration on `conn` and returns the versions it
/// applied (empty when the schema was current).
///
/// Takes a connection rather than a URL: this crate opens none. The
/// outbox's processes open it with `outbox_postgres::establish` (the URL's
/// `sslmode` and `sslrootcert`); an application may pass one of its own.
/// The connection is used up: diesel's synchronous migration harness runs
/// on it on tokio's blocking pool, so this works on any tokio runtime
/// (current-thread included). Each migration runs in its own transaction;
/// diesel takes care that two processes migrating at once do not both
/// apply the same version.
///
/// # Errors
///
/// [`MigrationError::Migration`] when a migration fails,
/// [`MigrationError::Task`] when the blocking task does not finish.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel_async::{AsyncConnection, AsyncPgConnection};
///
/// let conn = AsyncPgConnection::establish("postgres://postgres@127.0.0.1/app").await?;
/// let applied = outbox_model::run_migrations(conn).await?;
/// println!("applied {} migration(s)", applied.len());
/// # Ok(()) }
/// ```
pub async fn run_migrations(conn: AsyncPgConnection) -> Result<Vec<String>, MigrationError> {
    tokio::task::spawn_blocking(move || {
        let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::from(conn);
        let applied = conn
            .run_pending_migrations(MIGRATIONS)
            .map_err(|e| MigrationError::Migration(e.to_string()))?;
        Ok(applied.iter().map(ToString::to_string).collect())
    })
    .await?
}

/// One embedded migration and whether the database has it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MigrationState {
    /// The migration's directory name (`2026-11-29-000001_create_outbox_event`).
    pub name: String,
    /// Its version as diesel records it (`20261129000001`).
    pub version: String,
    /// Whether `__diesel_schema_migrations` lists it.
    pub applied: bool,
}

#[derive(diesel::QueryableByName)]
struct Present {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    present: bool,
}

#[derive(diesel::QueryableByName)]
struct Version {
    #[diesel(sql_type = diesel::sql_types::Text)]
    version: String,
}

/// Every embedded migration, oldest first, with whether the database of
/// `conn` has it applied. Read-only: unlike diesel's own harness it
/// does not create `__diesel_schema_migrations` when it is missing (then
/// every migration is pending). Versions of other migrations in that table
/// (an application's own) are ignored.
///
/// # Errors
///
/// [`MigrationError::Query`] when reading the table fails,
/// [`MigrationError::Migration`] when the embedded list cannot be read.
pub async fn migration_status(
    conn: &mut AsyncPgConnection,
) -> Result<Vec<MigrationState>, MigrationError> {
    use diesel::migration::MigrationSource;
    use diesel_async::RunQueryDsl;

    let present: Present = diesel::sql_query(
        "SELECT to_regclass('__diesel_schema_migrations') IS NOT NULL AS present",
    )
    .get_result(conn)
    .await?;
    let applied: Vec<String> = if present.present {
        diesel::sql_query("SELECT version FROM __diesel_schema_migrations")
            .load::<Version>(conn)
            .await?
            .into_iter()
            .map(|v| v.version)
            .collect()
    } else {
        Vec::new()
    };
    let embedded = MigrationSource::<diesel::pg::Pg>::migrations(&MIGRATIONS)
        .map_err(|e| MigrationError::Migration(e.to_string()))?;
    let mut states: Vec<MigrationState> = embedded
        .iter()
        .map(|m| {
            let version = m.name().version().to_string();
            MigrationState {
                name: m.name().to_string(),
                applied: applied.contains(&version),
                version,
            }
        })
        .collect();
    states.sort_by(|a, b| a.version.cmp(&b.version));
    Ok(states)
}
