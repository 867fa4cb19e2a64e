//! TLS to Postgres and Redis, against real servers: a private Postgres that
//! accepts TLS only (certificate signed by a CA made for the test), a
//! private Postgres without TLS, and a private `redis-server` that speaks
//! TLS only, when this machine's build can.
//!
//! The dispatcher hands an event off over `sslmode=verify-full` (its pool
//! and its LISTEN connection, both seen encrypted in `pg_stat_ssl`); the
//! other modes do what the operations guide says; a queue works over
//! `rediss://`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use diesel::OptionalExtension;
use diesel::sql_types::{Bool, Integer, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_dispatch::{Dispatcher, DispatcherConfig, LISTENER_APPLICATION_NAME};
use outbox_model::OutboxStatus;
use outbox_pg::SslMode;
use outbox_queue::{QueueNamespace, RedisSettings};
use outbox_test_support::{
    PostgresProcess, RedisProcess, TestDatabase, TestPki, TestRedis, eventually,
};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(20);

#[derive(diesel::QueryableByName)]
struct Ssl {
    #[diesel(sql_type = Bool)]
    ssl: bool,
}

/// Whether this connection's own backend is encrypted.
async fn own_ssl(conn: &mut AsyncPgConnection) -> bool {
    diesel::sql_query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .get_result::<Ssl>(conn)
        .await
        .unwrap()
        .ssl
}

/// The URL of `server` with `query` appended.
fn with_query(server: &str, query: &str) -> String {
    format!("{server}?{query}")
}

#[tokio::test]
async fn the_dispatcher_hands_off_over_verify_full_on_its_pool_and_its_listener() {
    outbox_test_support::init_tracing();
    let pg = PostgresProcess::start_tls();
    let server = with_query(
        &pg.server_url(),
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            pg.pki().ca_file.display()
        ),
    );
    // The template, the migrations and the test database all go over TLS.
    let db = TestDatabase::on_server(&server, 2).await;
    assert!(db.url().contains("sslmode=verify-full"), "{}", db.url());
    let redis = TestRedis::new().await;
    let namespace = QueueNamespace::prefixed(redis.prefix());

    let dispatcher = Arc::new(
        Dispatcher::new(
            db.pool().clone(),
            db.url(),
            outbox_queue::connect(&RedisSettings::new(redis.url())).unwrap(),
            namespace.clone(),
            outbox_catalog::standard_router().unwrap(),
            DispatcherConfig {
                // Far longer than the deadlines below: only a notification
                // through the TLS listener can wake it in time.
                interval: Duration::from_secs(60),
                listen: true,
                ..DispatcherConfig::default()
            },
        )
        .unwrap(),
    );
    let shutdown = CancellationToken::new();
    let handle = Arc::clone(&dispatcher).spawn(shutdown.clone());

    let mut conn = db.conn().await;
    // The value seen when the listener first shows is the one asserted: a
    // second read could miss a backend that `pg_stat_activity` showed a
    // moment before (CI once read `None` right after `Some`).
    let mut listener = None;
    eventually("the listener to connect", DEADLINE, async || {
        listener = listener_ssl(&mut conn).await;
        listener.is_some()
    })
    .await;
    assert_eq!(
        listener,
        Some(true),
        "the LISTEN connection is not encrypted"
    );
    {
        let mut pooled = db.pool().get().await.unwrap();
        assert!(
            own_ssl(&mut pooled).await,
            "a pooled connection is not encrypted"
        );
    }

    conn.batch_execute(
        "INSERT INTO outbox_event (tenant_id, event_type, payload) \
         VALUES ('acme', 'audit.user.login', '{\"over\": \"tls\"}')",
    )
    .await
    .unwrap();
    let id: uuid::Uuid = {
        #[derive(diesel::QueryableByName)]
        struct Id {
            #[diesel(sql_type = diesel::sql_types::Uuid)]
            id: uuid::Uuid,
        }
        diesel::sql_query("SELECT id FROM outbox_event")
            .get_result::<Id>(&mut conn)
            .await
            .unwrap()
            .id
    };
    eventually("the event to be handed off", DEADLINE, async || {
        status(&mut conn, id).await == OutboxStatus::Done.as_str()
    })
    .await;
    let mut redis_conn = redis.conn().await;
    let body: Option<String> = redis::cmd("HGET")
        .arg(format!("{}:data", namespace.queue("outbox.audit")))
        .arg(format!("outbox:{id}"))
        .query_async(&mut redis_conn)
        .await
        .unwrap();
    let body: serde_json::Value =
        serde_json::from_str(&body.unwrap_or_else(|| panic!("no job on outbox.audit for {id}")))
            .unwrap();
    assert_eq!(body["payload"]["over"], "tls", "{body}");

    shutdown.cancel();
    handle.await.unwrap().unwrap();
    drop(conn);
    drop(db);
}

/// Whether the dispatcher's LISTEN backend is encrypted; `None` while it
/// has not connected.
async fn listener_ssl(conn: &mut AsyncPgConnection) -> Option<bool> {
    diesel::sql_query(
        "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.datname = current_database() AND a.application_name = $1 \
           AND a.query ILIKE '%LISTEN%'",
    )
    .bind::<Text, _>(LISTENER_APPLICATION_NAME)
    .get_result::<Ssl>(conn)
    .await
    .optional()
    .expect("reading pg_stat_ssl")
    .map(|row| row.ssl)
}

async fn status(conn: &mut AsyncPgConnection, id: uuid::Uuid) -> String {
    #[derive(diesel::QueryableByName)]
    struct Status {
        #[diesel(sql_type = Text)]
        status: String,
    }
    diesel::sql_query("SELECT status FROM outbox_event WHERE id = $1")
        .bind::<diesel::sql_types::Uuid, _>(id)
        .get_result::<Status>(conn)
        .await
        .unwrap()
        .status
}

#[tokio::test]
async fn each_sslmode_does_what_it_says_against_a_tls_only_server() {
    let pg = PostgresProcess::start_tls();
    let server = pg.server_url();
    let ca = pg.pki().ca_file.display().to_string();
    let wrong_ca = pg.pki().other_ca_file.display().to_string();

    // require: encrypted, whoever signed the certificate.
    let mut conn = outbox_pg::establish(&with_query(&server, "sslmode=require"))
        .await
        .unwrap();
    assert!(own_ssl(&mut conn).await);
    // No sslmode is prefer: TLS when the server offers it.
    let mut conn = outbox_pg::establish(&server).await.unwrap();
    assert!(own_ssl(&mut conn).await);
    // verify-ca and verify-full with the right root.
    for mode in ["verify-ca", "verify-full"] {
        let mut conn = outbox_pg::establish(&with_query(
            &server,
            &format!("sslmode={mode}&sslrootcert={ca}"),
        ))
        .await
        .unwrap_or_else(|e| panic!("{mode}: {e}"));
        assert!(own_ssl(&mut conn).await, "{mode}");
    }
    // verify-ca checks the chain only: 127.0.0.2 is not in the certificate,
    // which verify-full refuses.
    let unnamed = server.replace("127.0.0.1", "127.0.0.2");
    let mut conn = outbox_pg::establish(&with_query(
        &unnamed,
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ))
    .await
    .unwrap();
    assert!(own_ssl(&mut conn).await);
    let err = outbox_pg::establish(&with_query(
        &unnamed,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await
    .err()
    .expect("verify-full accepted a certificate that does not name the host");
    eprintln!("verify-full against an address the certificate does not name: {err}");
    assert!(err.to_string().contains("not valid for name"), "{err}");
    // The certificate names localhost too.
    let by_name = server.replace("127.0.0.1", "localhost");
    outbox_pg::establish(&with_query(
        &by_name,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await
    .unwrap();

    // verify-full with a root that did not sign the certificate.
    let err = outbox_pg::establish(&with_query(
        &server,
        &format!("sslmode=verify-full&sslrootcert={wrong_ca}"),
    ))
    .await
    .err()
    .expect("a certificate from another CA was accepted");
    let message = err.to_string();
    eprintln!("verify-full with another CA: {message}");
    assert!(
        message.contains("TLS")
            && message.contains("certificate")
            && message.contains("sslmode=verify-full"),
        "unclear error: {message}"
    );
    // A root file given to require is checked too (libpq's rule).
    let err = outbox_pg::establish(&with_query(
        &server,
        &format!("sslmode=require&sslrootcert={wrong_ca}"),
    ))
    .await
    .err()
    .expect("require with a root file did not check the chain");
    assert!(err.to_string().contains("certificate"), "{err}");

    // disable: the server's pg_hba.conf rejects unencrypted connections.
    let err = outbox_pg::establish(&with_query(&server, "sslmode=disable"))
        .await
        .err()
        .expect("a plain connection was accepted by a hostssl-only server");
    eprintln!("disable against a hostssl-only server: {err}");
    assert!(err.to_string().contains("no encryption"), "{err}");

    // The pool refuses an unknown mode before connecting, naming it.
    let err = outbox_pg::connect_pool(&with_query(&server, "sslmode=verify-everything"), 1)
        .await
        .expect_err("an unknown sslmode was accepted");
    assert!(
        err.to_string()
            .contains("unknown sslmode `verify-everything`"),
        "{err}"
    );
}

#[tokio::test]
async fn prefer_falls_back_to_plain_text_and_require_refuses_a_plain_server() {
    // The shared local server may have TLS on (Debian's default): a
    // private one with ssl=off is the server that refuses TLS.
    let pg = PostgresProcess::start_plain();
    let server = pg.server_url();
    let options = outbox_pg::PgConnectOptions::from_url(&server).unwrap();
    assert_eq!(options.ssl_mode(), SslMode::Prefer);
    let mut conn = options.connect().await.unwrap();
    assert!(!own_ssl(&mut conn).await);
    let mut conn = outbox_pg::establish(&with_query(&server, "sslmode=prefer"))
        .await
        .unwrap();
    assert!(!own_ssl(&mut conn).await);
    let err = outbox_pg::establish(&with_query(&server, "sslmode=require"))
        .await
        .err()
        .expect("require connected to a server without TLS");
    eprintln!("require against a server without TLS: {err}");
    assert!(err.to_string().contains("sslmode=require"), "{err}");
}

#[tokio::test]
async fn a_queue_works_over_rediss() {
    let dir = std::env::temp_dir().join(format!(
        "outbox-redis-tls-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let pki = TestPki::create(&dir);
    let server = match RedisProcess::start_tls(&pki).await {
        Ok(server) => server,
        Err(reason) if reason.to_lowercase().contains("tls") => {
            eprintln!("SKIPPED: this redis-server cannot serve TLS:\n{reason}");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        Err(reason) => panic!("{reason}"),
    };
    assert!(server.url().starts_with("rediss://"));

    // The dispatcher pushes through apalis-redis over TLS.
    let db = TestDatabase::new().await;
    let namespace = QueueNamespace::prefixed(format!("tls{}:", uuid::Uuid::new_v4().simple()));
    let settings = RedisSettings {
        ca_cert: Some(pki.ca_file.clone()),
        ..RedisSettings::new(server.url())
    };
    let dispatcher = Dispatcher::new(
        db.pool().clone(),
        db.url(),
        outbox_queue::connect(&settings).unwrap(),
        namespace.clone(),
        outbox_catalog::standard_router().unwrap(),
        DispatcherConfig {
            interval: Duration::from_millis(100),
            listen: false,
            ..DispatcherConfig::default()
        },
    )
    .unwrap();
    let mut conn = db.conn().await;
    conn.batch_execute(
        "INSERT INTO outbox_event (tenant_id, event_type, payload) \
         VALUES ('acme', 'audit.user.login', '{}')",
    )
    .await
    .unwrap();
    eventually(
        "the event to be handed off over rediss://",
        DEADLINE,
        async || dispatcher.tick().await.is_ok() && pending(&mut conn).await == 0,
    )
    .await;
    // And read back over the same kind of connection.
    let mut redis_conn = outbox_queue::connect(&settings).unwrap();
    let jobs: i64 = redis::cmd("HLEN")
        .arg(format!("{}:data", namespace.queue("outbox.audit")))
        .query_async(&mut redis_conn)
        .await
        .unwrap();
    assert_eq!(jobs, 1);

    // A CA that did not sign the server's certificate is refused.
    let wrong = RedisSettings {
        ca_cert: Some(pki.other_ca_file.clone()),
        ..RedisSettings::new(server.url())
    };
    let mut wrong_conn = outbox_queue::connect(&wrong).unwrap();
    let err = redis::cmd("PING")
        .query_async::<String>(&mut wrong_conn)
        .await
        .expect_err("a server certificate from another CA was accepted");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

async fn pending(conn: &mut AsyncPgConnection) -> i32 {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = Integer)]
        n: i32,
    }
    diesel::sql_query("SELECT count(*)::int AS n FROM outbox_event WHERE status <> 'DONE'")
        .get_result::<Count>(conn)
        .await
        .unwrap()
        .n
}
