//! The workspace's migrations, embedded at compile time, in sets: the core
//! (what publishing and dispatching need) and one per built-in subscriber
//! ([`MigrationSet`]). Each set is a directory of `migrations/` at the
//! workspace root (reached through the crate's `migrations` link, so that
//! the packaged crate carries them).

use diesel::migration::{Migration, MigrationSource};
use diesel::pg::Pg;
use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

const CORE: EmbeddedMigrations = embed_migrations!("migrations/core");
const AUDIT: EmbeddedMigrations = embed_migrations!("migrations/audit");
const NOTIFICATION: EmbeddedMigrations = embed_migrations!("migrations/notification");
const WEBHOOK: EmbeddedMigrations = embed_migrations!("migrations/webhook");
const PLUGIN: EmbeddedMigrations = embed_migrations!("migrations/plugin");
const MAIL: EmbeddedMigrations = embed_migrations!("migrations/mail");
const WORKFLOW: EmbeddedMigrations = embed_migrations!("migrations/workflow");

/// One set of migrations: the core, which every outbox needs, or the
/// tables of one built-in subscriber. Every set is embedded in every
/// build; the crate's features (one per subscriber set, all on by
/// default) decide which sets [`run_migrations`] and [`migration_status`]
/// work on ([`MigrationSet::built`]). Sets other than the core only add
/// tables of their own, so any choice of them applies after the core.
///
/// ```
/// use outbox_model::MigrationSet;
///
/// let set: MigrationSet = "audit".parse()?;
/// assert_eq!(set, MigrationSet::Audit);
/// assert_eq!(set.feature(), Some("audit"));
/// assert_eq!(MigrationSet::built()[0], MigrationSet::Core);
/// # Ok::<(), outbox_model::UnknownMigrationSet>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum MigrationSet {
    /// `outbox_event`, `outbox_event_requeue`, `outbox_redis_epoch`,
    /// `outbox_redis_safe_point`, `outbox_worker_registration`,
    /// `outbox_ordering_key`, `outbox_schedule`, `outbox_partitioning`,
    /// `outbox_dispatch_key`: publishing, dispatching, requeue history, the
    /// Redis guard, worker registration, per-key ordering, periodic events
    /// and a partitioned `outbox_event`. Always built.
    Core,
    /// `audit_log` (feature `audit`).
    Audit,
    /// `notification` (feature `notification`).
    Notification,
    /// `webhook_endpoint` (feature `webhook`).
    Webhook,
    /// `plugin_hook_subscription` (feature `plugin`).
    Plugin,
    /// `tenant_mail_settings` (feature `mail`).
    Mail,
    /// `workflow`, `workflow_version`, `workflow_execution`,
    /// `workflow_block_execution`, `entity_row`, `application_event`,
    /// `workflow_bridge_request` (feature `workflow`).
    Workflow,
}

/// A name that is not a [`MigrationSet`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown migration set {0:?}: expected core, audit, notification, webhook, plugin, mail or workflow"
)]
pub struct UnknownMigrationSet(pub String);

impl MigrationSet {
    /// Every set, the core first.
    pub const ALL: [Self; 7] = [
        Self::Core,
        Self::Audit,
        Self::Notification,
        Self::Webhook,
        Self::Plugin,
        Self::Mail,
        Self::Workflow,
    ];

    /// The set's name (`core`, `audit`, ...), as `outbox migrate --set`
    /// takes it and its output shows it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Core => "core",
            Self::Audit => "audit",
            Self::Notification => "notification",
            Self::Webhook => "webhook",
            Self::Plugin => "plugin",
            Self::Mail => "mail",
            Self::Workflow => "workflow",
        }
    }

    /// The crate feature that builds the set; `None` for the core.
    #[must_use]
    pub const fn feature(self) -> Option<&'static str> {
        match self {
            Self::Core => None,
            other => Some(other.name()),
        }
    }

    /// Whether this build has the set: the core always, another set when
    /// its feature is on.
    #[must_use]
    pub const fn is_built(self) -> bool {
        match self {
            Self::Core => true,
            Self::Audit => cfg!(feature = "audit"),
            Self::Notification => cfg!(feature = "notification"),
            Self::Webhook => cfg!(feature = "webhook"),
            Self::Plugin => cfg!(feature = "plugin"),
            Self::Mail => cfg!(feature = "mail"),
            Self::Workflow => cfg!(feature = "workflow"),
        }
    }

    /// The sets this build has ([`MigrationSet::is_built`]), the core first.
    #[must_use]
    pub fn built() -> Vec<Self> {
        Self::ALL.into_iter().filter(|set| set.is_built()).collect()
    }

    /// The set's embedded migrations, for a diesel harness of your own.
    #[must_use]
    pub const fn migrations(self) -> EmbeddedMigrations {
        match self {
            Self::Core => CORE,
            Self::Audit => AUDIT,
            Self::Notification => NOTIFICATION,
            Self::Webhook => WEBHOOK,
            Self::Plugin => PLUGIN,
            Self::Mail => MAIL,
            Self::Workflow => WORKFLOW,
        }
    }
}

impl std::fmt::Display for MigrationSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for MigrationSet {
    type Err = UnknownMigrationSet;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|set| set.name() == name)
            .ok_or_else(|| UnknownMigrationSet(name.to_owned()))
    }
}

/// The migrations of several sets as one diesel source: diesel applies
/// the pending ones in version order, whatever their set, and ignores
/// versions the database has from elsewhere (another set, an
/// application's own migrations).
struct Sets(Vec<MigrationSet>);

impl MigrationSource<Pg> for Sets {
    fn migrations(&self) -> diesel::migration::Result<Vec<Box<dyn Migration<Pg>>>> {
        let mut all = Vec::new();
        for set in &self.0 {
            all.extend(MigrationSource::<Pg>::migrations(&set.migrations())?);
        }
        Ok(all)
    }
}

impl Sets {
    fn new(sets: &[MigrationSet]) -> Self {
        let mut sets = sets.to_vec();
        sets.sort_unstable();
        sets.dedup();
        Self(sets)
    }
}

/// A fingerprint of the migrations tree (paths and contents of every set),
/// computed at build time. Two builds with the same fingerprint create the
/// same schema; test harnesses name their template databases after it.
pub const MIGRATIONS_FINGERPRINT: &str = env!("OUTBOX_MIGRATIONS_FINGERPRINT");

/// [`MIGRATIONS_FINGERPRINT`] followed by a hash of the names of the
/// migrations of every set actually embedded in this build (whatever its
/// features). The build-time fingerprint alone can be fresh while the
/// embedded list is stale (the compiler does not always see a migration
/// directory added or renamed); naming templates after both keeps a stale
/// build from claiming a new schema's name.
#[must_use]
pub fn schema_fingerprint() -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let names = MigrationSource::<Pg>::migrations(&Sets::new(&MigrationSet::ALL))
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

/// Applies every pending migration of the sets this build has
/// ([`MigrationSet::built`]: the core, and with the default features every
/// subscriber's set) on `conn` and returns the versions it applied (empty
/// when the schema was current). [`run_migration_sets`] chooses the sets.
///
/// Takes a connection rather than a URL: this crate opens none. The
/// outbox's processes open it with `outbox_pg::establish` (the URL's
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
    run_migration_sets(conn, &MigrationSet::built()).await
}

/// [`run_migrations`] for the migrations of `sets` only, whatever the
/// build's features: pending ones are applied in version order, versions
/// of other sets that the database has are left alone. Include
/// [`MigrationSet::Core`]: the other sets assume it.
///
/// # Errors
///
/// As [`run_migrations`].
///
/// # Example
///
/// A bare application (no built-in subscriber) needs the core only:
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel_async::{AsyncConnection, AsyncPgConnection};
/// use outbox_model::MigrationSet;
///
/// let conn = AsyncPgConnection::establish("postgres://postgres@127.0.0.1/app").await?;
/// outbox_model::run_migration_sets(conn, &[MigrationSet::Core]).await?;
/// # Ok(()) }
/// ```
pub async fn run_migration_sets(
    conn: AsyncPgConnection,
    sets: &[MigrationSet],
) -> Result<Vec<String>, MigrationError> {
    let source = Sets::new(sets);
    tokio::task::spawn_blocking(move || {
        let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::from(conn);
        let applied = conn
            .run_pending_migrations(source)
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
    /// The set it belongs to.
    pub set: MigrationSet,
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

/// Every embedded migration of the sets this build has
/// ([`MigrationSet::built`]), oldest first, with whether the database of
/// `conn` has it applied. Read-only: unlike diesel's own harness it
/// does not create `__diesel_schema_migrations` when it is missing (then
/// every migration is pending). Versions of other migrations in that table
/// (an application's own, a set this build leaves out) are ignored.
///
/// # Errors
///
/// [`MigrationError::Query`] when reading the table fails,
/// [`MigrationError::Migration`] when the embedded list cannot be read.
pub async fn migration_status(
    conn: &mut AsyncPgConnection,
) -> Result<Vec<MigrationState>, MigrationError> {
    migration_set_status(conn, &MigrationSet::built()).await
}

/// [`migration_status`] for the migrations of `sets` only.
///
/// # Errors
///
/// As [`migration_status`].
pub async fn migration_set_status(
    conn: &mut AsyncPgConnection,
    sets: &[MigrationSet],
) -> Result<Vec<MigrationState>, MigrationError> {
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
    let mut states = Vec::new();
    for set in Sets::new(sets).0 {
        let embedded = MigrationSource::<Pg>::migrations(&set.migrations())
            .map_err(|e| MigrationError::Migration(e.to_string()))?;
        states.extend(embedded.iter().map(|m| {
            let version = m.name().version().to_string();
            MigrationState {
                name: m.name().to_string(),
                applied: applied.contains(&version),
                version,
                set,
            }
        }));
    }
    states.sort_by(|a, b| a.version.cmp(&b.version));
    Ok(states)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No version is in two sets (diesel would take one for the other),
    /// and the core holds the first migration, which creates `outbox_event`.
    #[test]
    fn each_version_belongs_to_one_set_and_the_core_starts() {
        let mut versions: Vec<(String, MigrationSet)> = Vec::new();
        for set in MigrationSet::ALL {
            let embedded = MigrationSource::<Pg>::migrations(&set.migrations()).unwrap_or_default();
            assert!(!embedded.is_empty(), "{set} has no migration");
            versions.extend(
                embedded
                    .iter()
                    .map(|m| (m.name().version().to_string(), set)),
            );
        }
        versions.sort();
        assert_eq!(
            versions[0],
            ("20261129000001".to_owned(), MigrationSet::Core)
        );
        for pair in versions.windows(2) {
            assert_ne!(pair[0].0, pair[1].0, "{:?} and {:?}", pair[0], pair[1]);
        }
    }

    #[test]
    fn set_names_parse_back_and_unknown_ones_are_named() {
        for set in MigrationSet::ALL {
            assert_eq!(set.name().parse::<MigrationSet>(), Ok(set));
            assert_eq!(set.to_string(), set.name());
        }
        let err = "billing".parse::<MigrationSet>().unwrap_err();
        assert!(err.to_string().contains("\"billing\""), "{err}");
    }
}
