//! Where the test servers are: the environment variables the kit reads.

/// The Postgres server tests use: `OUTBOX_TEST_DATABASE_URL`, else
/// `DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/postgres`.
/// Only the server part matters; each test gets its own database.
#[must_use]
pub fn database_server_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// The Redis server tests use: `OUTBOX_TEST_REDIS_URL`, else `REDIS_URL`,
/// else `redis://127.0.0.1:6379`.
#[must_use]
pub fn redis_server_url() -> String {
    std::env::var("OUTBOX_TEST_REDIS_URL")
        .or_else(|_| std::env::var("REDIS_URL"))
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// `url` with its database name replaced by `database`, query kept.
///
/// ```
/// use outbox_testkit::with_database;
/// assert_eq!(
///     with_database("postgres://u@h:5432/app?sslmode=disable", "other"),
///     "postgres://u@h:5432/other?sslmode=disable"
/// );
/// assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
/// ```
#[must_use]
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let server = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}
