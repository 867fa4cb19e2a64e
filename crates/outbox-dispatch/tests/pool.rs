//! The connection pool every process uses (`outbox_pg::connect_pool`):
//! a checkout sends no statement, and a connection the server ended is
//! not handed out again. Every dispatcher tick and every handler's
//! statement starts with a checkout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use diesel::QueryableByName;
use diesel::sql_types::{Bool, Integer, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_test_support::TestDatabase;

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

async fn backend_pid(conn: &mut AsyncPgConnection) -> i32 {
    diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result::<Pid>(conn)
        .await
        .unwrap()
        .pid
}

#[derive(QueryableByName)]
struct Query {
    #[diesel(sql_type = Text)]
    query: String,
}

/// The last statement the server saw from backend `pid`.
async fn last_statement(admin: &mut AsyncPgConnection, pid: i32) -> String {
    diesel::sql_query("SELECT query FROM pg_stat_activity WHERE pid = $1")
        .bind::<Integer, _>(pid)
        .get_result::<Query>(admin)
        .await
        .unwrap()
        .query
}

#[tokio::test]
async fn taking_a_connection_from_the_pool_sends_no_statement() {
    let db = TestDatabase::with_pool_size(1).await;
    let mut admin = db.conn().await;
    let pid = {
        let mut conn = db.pool().get().await.unwrap();
        let pid = backend_pid(&mut conn).await;
        diesel::sql_query("SELECT 'the last statement before the checkouts'")
            .execute(&mut *conn)
            .await
            .unwrap();
        pid
    };
    for _ in 0..3 {
        let conn = db.pool().get().await.unwrap();
        drop(conn);
    }
    // The pool of one handed out the same connection each time, and the
    // server saw nothing from it since (a ping would show as `SELECT $1`).
    assert_eq!(
        last_statement(&mut admin, pid).await,
        "SELECT 'the last statement before the checkouts'"
    );
    let mut conn = db.pool().get().await.unwrap();
    assert_eq!(backend_pid(&mut conn).await, pid);
}

#[derive(QueryableByName)]
struct Ended {
    #[diesel(sql_type = Bool)]
    ended: bool,
}

// Multi-threaded, so that the idle connection's own task reads the end of
// its stream on another thread while this one waits on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_server_ended_while_idle_is_replaced_at_checkout() {
    let db = TestDatabase::with_pool_size(1).await;
    let mut admin = db.conn().await;
    let pid = backend_pid(&mut db.pool().get().await.unwrap()).await;
    // With a timeout, the call returns once the backend process has exited
    // (its socket closed), not when it was only signalled.
    let ended: Ended = diesel::sql_query("SELECT pg_terminate_backend($1, 10000) AS ended")
        .bind::<Integer, _>(pid)
        .get_result(&mut admin)
        .await
        .unwrap();
    assert!(ended.ended, "backend {pid} did not end");

    // The first statement on the next checkout works, on a new backend: the
    // dead connection was refused without a round trip to find out.
    let mut conn = db.pool().get().await.unwrap();
    let new_pid = backend_pid(&mut conn).await;
    assert_ne!(new_pid, pid);
}
