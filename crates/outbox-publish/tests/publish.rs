//! The publisher against a real Postgres: what an application sees.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly by design

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use diesel_async::{
    AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection, TransactionManager,
};
use outbox_model::schema::outbox_event;
use outbox_model::{EventTypeError, NewOutboxEventRow, OutboxEvent, OutboxStatus};
use outbox_publish::{
    NewOutboxEvent, NotInTransaction, OutboxTx, PublishError, PublishOutcome, publish_outbox_event,
    publish_outbox_events,
};
use outbox_test_support::TestDatabase;
use serde_json::{Value, json};
use uuid::Uuid;

async fn with_business_table(db: &TestDatabase) -> AsyncPgConnection {
    let mut conn = db.conn().await;
    conn.batch_execute(
        "CREATE TABLE subscription (id bigint PRIMARY KEY, tenant_id text NOT NULL, status text NOT NULL)",
    )
    .await
    .unwrap();
    conn
}

async fn all_events(conn: &mut AsyncPgConnection) -> Vec<OutboxEvent> {
    outbox_event::table
        .order(outbox_event::id)
        .select(OutboxEvent::as_select())
        .load(conn)
        .await
        .unwrap()
}

async fn count(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    diesel::dsl::sql::<BigInt>(sql)
        .get_result(conn)
        .await
        .unwrap()
}

fn activated(id: i64) -> NewOutboxEvent {
    NewOutboxEvent::new(
        "tenant-1",
        "billing.subscription.updated",
        json!({ "subscriptionId": id, "status": "active" }),
    )
}

async fn insert_subscription(conn: &mut AsyncPgConnection, id: i64) -> QueryResult<usize> {
    diesel::sql_query(
        "INSERT INTO subscription (id, tenant_id, status) VALUES ($1, 'tenant-1', 'active')",
    )
    .bind::<BigInt, _>(id)
    .execute(conn)
    .await
}

#[tokio::test]
async fn publish_commits_with_the_business_row() {
    let db = TestDatabase::new().await;
    let mut conn = with_business_table(&db).await;

    let outcome = conn
        .transaction::<_, PublishError, _>(async |conn| {
            insert_subscription(conn, 42).await?;
            let tx = OutboxTx::new(conn)?;
            publish_outbox_event(&tx, activated(42).dispatch_key("stripe:evt_1")).await
        })
        .await
        .unwrap();

    let PublishOutcome::Published(id) = outcome else {
        panic!("expected a new event, got {outcome:?}");
    };
    assert_eq!(id.get_version_num(), 7, "publisher ids are UUIDv7");
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM subscription").await,
        1
    );
    let events = all_events(&mut conn).await;
    assert_eq!(events.len(), 1);
    let event = &events[0];
    assert_eq!(event.id, id);
    assert_eq!(event.tenant_id, "tenant-1");
    assert_eq!(event.event_type, "billing.subscription.updated");
    assert_eq!(
        event.payload.value().unwrap(),
        json!({ "subscriptionId": 42, "status": "active" })
    );
    assert_eq!(event.dispatch_key.as_deref(), Some("stripe:evt_1"));
    assert_eq!(event.status, OutboxStatus::Pending);
    assert_eq!(event.retries, 0);
    assert!(event.scheduled_at <= chrono::Utc::now());
    assert_eq!((event.locked_until, event.processed_at), (None, None));
    assert_eq!((&event.last_error, &event.target_queue), (&None, &None));
}

#[tokio::test]
async fn rollback_leaves_neither_row_nor_event() {
    let db = TestDatabase::new().await;
    let mut conn = with_business_table(&db).await;

    let result = conn
        .transaction::<(), PublishError, _>(async |conn| {
            insert_subscription(conn, 7).await?;
            let mut tx = OutboxTx::new(conn)?;
            publish_outbox_event(&tx, activated(7)).await?;
            // The business logic fails after publishing: everything goes.
            insert_subscription(tx.conn(), 7).await?; // duplicate primary key
            Ok(())
        })
        .await;

    assert!(
        matches!(result, Err(PublishError::Database(_))),
        "{result:?}"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM subscription").await,
        0
    );
    assert!(all_events(&mut conn).await.is_empty());
}

#[tokio::test]
async fn concurrent_transactions_with_one_dispatch_key_write_one_event() {
    let db = TestDatabase::new().await;
    let mut a = db.conn().await;
    let mut b = db.conn().await;
    // Both transactions are open before either publishes.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let run = async |conn: &mut AsyncPgConnection,
                     barrier: std::sync::Arc<tokio::sync::Barrier>| {
        conn.transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            barrier.wait().await;
            publish_outbox_event(&tx, activated(1).dispatch_key("race")).await
        })
        .await
        .unwrap()
    };
    let (x, y) = tokio::join!(run(&mut a, barrier.clone()), run(&mut b, barrier));
    assert_eq!(x.id(), y.id());
    assert_eq!(
        [x, y].iter().filter(|o| o.is_duplicate()).count(),
        1,
        "{x:?} {y:?}"
    );
    assert_eq!(all_events(&mut a).await.len(), 1);
}

#[tokio::test]
async fn invalid_event_types_are_rejected_with_their_reason() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let too_long = format!("audit.user.{}", "x".repeat(250));
    let cases: Vec<(&str, EventTypeError)> = vec![
        (
            "Billing.subscription.updated",
            EventTypeError::Uppercase {
                ch: 'B',
                position: 0,
            },
        ),
        (
            "billing.subscription.Updated",
            EventTypeError::Uppercase {
                ch: 'U',
                position: 21,
            },
        ),
        (
            "billing.updated",
            EventTypeError::TooFewSegments { found: 2 },
        ),
        (
            "billing..updated",
            EventTypeError::EmptySegment { segment: 1 },
        ),
        (
            "billing.subscription.",
            EventTypeError::EmptySegment { segment: 2 },
        ),
        ("", EventTypeError::Empty),
        (
            "billing.sub_scription.updated",
            EventTypeError::InvalidCharacter {
                ch: '_',
                position: 11,
            },
        ),
        (
            "billing.subscription.up dated",
            EventTypeError::InvalidCharacter {
                ch: ' ',
                position: 23,
            },
        ),
        (
            "billing.subscription.updated;",
            EventTypeError::InvalidCharacter {
                ch: ';',
                position: 28,
            },
        ),
        (
            "billing.2subscription.updated",
            EventTypeError::SegmentStartsWithNonLetter {
                segment: 1,
                text: "2subscription".into(),
            },
        ),
        (
            too_long.as_str(),
            EventTypeError::TooLong {
                len: too_long.len(),
            },
        ),
    ];

    conn.transaction::<_, PublishError, _>(async |conn| {
        let tx = OutboxTx::new(conn)?;
        for (raw, expected) in cases {
            let event = NewOutboxEvent::new("tenant-1", raw, json!({}));
            match publish_outbox_event(&tx, event).await {
                Err(PublishError::InvalidEventType(got)) => {
                    assert_eq!(got, expected, "for {raw:?}")
                }
                other => panic!("{raw:?}: expected InvalidEventType({expected:?}), got {other:?}"),
            }
        }
        // Validation ran no SQL, so the transaction is still good.
        publish_outbox_event(&tx, activated(1)).await?;
        Ok(())
    })
    .await
    .unwrap();

    let events = all_events(&mut conn).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event_type, "billing.subscription.updated");
}

#[tokio::test]
async fn a_refused_event_leaves_the_callers_transaction_usable() {
    let db = TestDatabase::new().await;
    let mut conn = with_business_table(&db).await;

    let good = conn
        .transaction::<_, PublishError, _>(async |conn| {
            insert_subscription(conn, 5).await?;
            let mut tx = OutboxTx::new(conn)?;
            let pasted = NewOutboxEvent::new(
                "tenant-1",
                "billing.subscription.updated",
                json!({ "subscriptionId": 5, "note": "pasted\0text" }),
            );
            let err = publish_outbox_event(&tx, pasted).await.unwrap_err();
            assert!(
                matches!(&err, PublishError::PayloadStringContainsNul { path } if path == "/note"),
                "{err:?}"
            );
            assert!(err.to_string().contains("\"/note\""), "{err}");
            // The caller handles the refusal and goes on in the same transaction.
            insert_subscription(tx.conn(), 6).await?;
            publish_outbox_event(&tx, activated(5)).await
        })
        .await
        .unwrap();

    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM subscription").await,
        2
    );
    let events = all_events(&mut conn).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].id, good.id());
    assert_eq!(
        events[0].payload.value().unwrap(),
        json!({ "subscriptionId": 5, "status": "active" })
    );
}

/// Why the NUL refusals exist: the same rows written past the publisher make
/// Postgres fail the statement, which aborts the caller's transaction.
#[tokio::test]
async fn postgres_aborts_the_transaction_on_what_the_publisher_refuses() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let row = |tenant_id: &str, payload: Value, dispatch_key: Option<&str>| NewOutboxEventRow {
        id: Uuid::now_v7(),
        tenant_id: tenant_id.to_owned(),
        event_type: "audit.file.uploaded".to_owned(),
        payload,
        dispatch_key: dispatch_key.map(str::to_owned),
        scheduled_at: None,
        traceparent: None,
        tracestate: None,
        dedupe_for: None,
        dedupe_while_pending: false,
        replace_pending: false,
        priority: outbox_model::Priority::NORMAL,
        ordering_key: None,
    };
    let unicode = "unsupported Unicode escape sequence";
    let utf8 = "invalid byte sequence";
    let cases = [
        (
            "NUL in a string",
            row("acme", json!({ "a": "\0" }), None),
            unicode,
        ),
        (
            "NUL in a key",
            row("acme", json!({ "a\0": 1 }), None),
            unicode,
        ),
        ("NUL in the tenant", row("ac\0me", json!({}), None), utf8),
        (
            "NUL in the dispatch key",
            row("acme", json!({}), Some("k\0")),
            utf8,
        ),
    ];
    for (case, row, refusal) in cases {
        let result = conn
            .transaction::<(), diesel::result::Error, _>(async |conn| {
                let insert = diesel::insert_into(outbox_event::table)
                    .values(&row)
                    .execute(conn)
                    .await;
                let message = insert.unwrap_err().to_string();
                assert!(message.contains(refusal), "{case}: {message}");
                // The transaction is aborted: the next statement fails too.
                diesel::sql_query("SELECT 1").execute(conn).await.map(drop)
            })
            .await;
        let message = result.unwrap_err().to_string();
        assert!(
            message.contains("current transaction is aborted"),
            "{case}: {message}"
        );
    }
    assert!(all_events(&mut conn).await.is_empty());
}

#[tokio::test]
async fn publishing_outside_a_transaction_is_refused() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    assert_eq!(OutboxTx::new(&mut conn).err(), Some(NotInTransaction));
    let err: PublishError = NotInTransaction.into();
    assert!(err.to_string().contains("inside a transaction"), "{err}");
}

#[tokio::test]
async fn two_hundred_concurrent_publishers_all_land() {
    let db = TestDatabase::with_pool_size(10).await;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let pool = db.pool().clone();
            tokio::spawn(async move {
                let mut conn = pool.get().await.unwrap();
                conn.transaction::<_, PublishError, _>(async |conn| {
                    let tx = OutboxTx::new(conn)?;
                    let event = NewOutboxEvent::new(
                        format!("tenant-{}", i % 7),
                        "notification.user.mentioned",
                        json!({ "n": i }),
                    )
                    .dispatch_key(format!("mention-{i}"));
                    publish_outbox_event(&tx, event).await
                })
                .await
                .unwrap()
            })
        })
        .collect();
    let mut ids = Vec::new();
    for task in tasks {
        let outcome = task.await.unwrap();
        assert!(!outcome.is_duplicate());
        ids.push(outcome.id());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 200);

    let mut conn = db.conn().await;
    let mut stored: Vec<Uuid> = outbox_event::table
        .select(outbox_event::id)
        .load(&mut conn)
        .await
        .unwrap();
    stored.sort();
    assert_eq!(stored, ids);
    let distinct_n = count(
        &mut conn,
        "SELECT count(DISTINCT payload->>'n') FROM outbox_event",
    )
    .await;
    assert_eq!(distinct_n, 200);
}

/// Takes the wake gate's lock on `conn` as a waiting dispatcher does;
/// whether it was free.
async fn take_wake_gate(conn: &mut AsyncPgConnection) -> bool {
    #[derive(diesel::QueryableByName)]
    struct Taken {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        taken: bool,
    }
    let (key1, key2) = outbox_model::WAKE_GATE_LOCK;
    diesel::sql_query("SELECT pg_try_advisory_lock($1, $2) AS taken")
        .bind::<diesel::sql_types::Integer, _>(key1)
        .bind::<diesel::sql_types::Integer, _>(key2)
        .get_result::<Taken>(conn)
        .await
        .unwrap()
        .taken
}

/// While a dispatcher waits (holds the wake gate), a publish notifies it,
/// once per statement and only on commit.
#[tokio::test]
async fn published_event_notifies_a_waiting_dispatcher_only_on_commit() {
    use futures::StreamExt;
    let db = TestDatabase::new().await;
    let mut listener = db.conn().await;
    listener.batch_execute("LISTEN outbox_event").await.unwrap();
    assert!(take_wake_gate(&mut listener).await);
    let mut notifications = Box::pin(listener.notifications_stream());

    let mut conn = db.conn().await;
    let _ = conn
        .transaction::<(), PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_event(&tx, activated(1)).await?;
            Err(PublishError::Database(
                diesel::result::Error::RollbackTransaction,
            ))
        })
        .await;
    conn.transaction::<_, PublishError, _>(async |conn| {
        let tx = OutboxTx::new(conn)?;
        publish_outbox_events(&tx, vec![activated(2), activated(3)]).await
    })
    .await
    .unwrap();

    let first = tokio::time::timeout(std::time::Duration::from_secs(10), notifications.next())
        .await
        .expect("a notification within 10 s")
        .expect("stream open")
        .unwrap();
    assert_eq!(first.channel, outbox_model::NOTIFY_CHANNEL);
    // One statement, one notification; the rolled-back transaction sent none.
    let more =
        tokio::time::timeout(std::time::Duration::from_millis(300), notifications.next()).await;
    assert!(more.is_err(), "unexpected second notification: {more:?}");
}

/// While no dispatcher waits, a publishing transaction sends no `NOTIFY`
/// (which would make its commit wait on a database-wide lock); instead it
/// holds the wake gate shared until it ends, so that a dispatcher can
/// start waiting only after the event is committed (and claims it first).
// Break checked: the trigger notifying unconditionally again (no lock)
// fails the "took the gate while uncommitted" assertion; taking the lock
// shared for the session instead of the transaction fails "stays taken".
#[tokio::test]
async fn without_a_waiting_dispatcher_a_publish_sends_no_notification_and_holds_the_gate_until_commit()
 {
    use futures::StreamExt;
    let db = TestDatabase::new().await;
    let mut listener = db.conn().await;
    listener.batch_execute("LISTEN outbox_event").await.unwrap();
    let mut dispatcher = db.conn().await;
    let mut publisher = db.conn().await;

    type Manager = <AsyncPgConnection as AsyncConnection>::TransactionManager;
    Manager::begin_transaction(&mut publisher).await.unwrap();
    let tx = OutboxTx::new(&mut publisher).unwrap();
    publish_outbox_event(&tx, activated(1)).await.unwrap();
    assert!(
        !take_wake_gate(&mut dispatcher).await,
        "a dispatcher took the gate while an event it cannot see yet was uncommitted"
    );
    Manager::commit_transaction(&mut publisher).await.unwrap();
    assert!(
        take_wake_gate(&mut dispatcher).await,
        "the gate stays taken after the publishing transaction ended"
    );

    let mut notifications = Box::pin(listener.notifications_stream());
    let sent =
        tokio::time::timeout(std::time::Duration::from_millis(300), notifications.next()).await;
    assert!(sent.is_err(), "a notification nobody waited for: {sent:?}");
}

/// The calls of the trigger's function in `conn`'s open transaction.
async fn notify_calls_in_transaction(conn: &mut AsyncPgConnection) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct Calls {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        calls: i64,
    }
    diesel::sql_query(
        "SELECT coalesce(pg_stat_get_xact_function_calls('outbox_event_notify'::regproc), 0)
             AS calls",
    )
    .get_result::<Calls>(conn)
    .await
    .unwrap()
    .calls
}

/// The wake gate is tried in the trigger's `WHEN` condition: while no
/// dispatcher waits, a publishing statement calls no PL/pgSQL function at
/// all; while one waits, the function runs once per statement (and sends
/// the `NOTIFY`).
// Break checked: the test back in the function's body (the trigger of
// 2026-12-04-000000 with no WHEN) fails "no function call".
#[tokio::test]
async fn the_trigger_calls_its_function_only_while_a_dispatcher_waits() {
    let db = TestDatabase::new().await;
    let mut dispatcher = db.conn().await;
    let mut publisher = db.conn().await;
    type Manager = <AsyncPgConnection as AsyncConnection>::TransactionManager;

    for waiting in [false, true] {
        if waiting {
            assert!(take_wake_gate(&mut dispatcher).await);
        }
        Manager::begin_transaction(&mut publisher).await.unwrap();
        // Superuser only; counts this transaction's calls of PL/pgSQL
        // functions.
        publisher
            .batch_execute("SET LOCAL track_functions = 'pl'")
            .await
            .unwrap();
        let tx = OutboxTx::new(&mut publisher).unwrap();
        publish_outbox_event(&tx, activated(1)).await.unwrap();
        publish_outbox_events(&tx, vec![activated(2), activated(3)])
            .await
            .unwrap();
        let calls = notify_calls_in_transaction(&mut publisher).await;
        Manager::commit_transaction(&mut publisher).await.unwrap();
        if waiting {
            assert_eq!(
                calls, 2,
                "one function call per statement while a dispatcher waits"
            );
        } else {
            assert_eq!(calls, 0, "no function call while no dispatcher waits");
        }
    }
}

#[derive(diesel::QueryableByName)]
struct PreparedStatement {
    #[diesel(sql_type = diesel::sql_types::Text)]
    statement: String,
}

/// Publishing one event is one round trip: the connection keeps each form
/// of the insert (with and without a dispatch key) prepared, whatever the
/// optional values, instead of preparing it afresh on every call. An
/// absent schedule still takes the database's `now()` (the transaction's
/// time, as `created_at`), a given one is kept.
// Break checked: inserting through the row type's own `Insertable` again
// (which writes `DEFAULT` for absent values) leaves no insert prepared.
#[tokio::test]
async fn each_form_of_the_insert_stays_prepared_on_the_connection() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let later = chrono::DateTime::parse_from_rfc3339("2031-05-06T07:08:09.123456Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    for i in 0..4_i64 {
        conn.transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_event(&tx, activated(i)).await?;
            publish_outbox_event(&tx, activated(i).scheduled_at(later)).await?;
            publish_outbox_event(&tx, activated(i).dispatch_key(format!("key-{i}"))).await?;
            publish_outbox_event(&tx, activated(i).dispatch_key("key-0")).await
        })
        .await
        .unwrap();
    }

    let kept: Vec<PreparedStatement> =
        diesel::sql_query("SELECT statement FROM pg_prepared_statements")
            .load(&mut conn)
            .await
            .unwrap();
    let inserts: Vec<&str> = kept
        .iter()
        .map(|p| p.statement.as_str())
        .filter(|sql| sql.starts_with("INSERT INTO \"outbox_event\""))
        .collect();
    assert_eq!(
        inserts.len(),
        2,
        "one prepared insert with and one without ON CONFLICT: {inserts:?}"
    );
    assert_eq!(
        inserts
            .iter()
            .filter(|sql| sql.contains("ON CONFLICT"))
            .count(),
        1,
        "{inserts:?}"
    );

    let events = all_events(&mut conn).await;
    assert_eq!(
        events.len(),
        4 * 3,
        "3 new events per transaction, one duplicate"
    );
    let scheduled: Vec<_> = events.iter().filter(|e| e.scheduled_at == later).collect();
    assert_eq!(scheduled.len(), 4, "the given schedule is kept");
    assert!(
        events
            .iter()
            .filter(|e| e.scheduled_at != later)
            .all(|e| e.scheduled_at == e.created_at),
        "an absent schedule is the transaction's now()"
    );
}

#[tokio::test]
async fn a_transaction_handle_debug_prints_its_name_and_nothing_of_the_connection() {
    let db = TestDatabase::new().await;
    let mut conn = with_business_table(&db).await;
    let printed = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            Ok(format!("{tx:?}"))
        })
        .await
        .unwrap();
    assert_eq!(printed, "OutboxTx { .. }");
}

/// The business insert of [`insert_subscription`] on the shared connection,
/// as a future that does not hold the connection, and kept prepared (as a
/// statement of diesel's query builder is): joined with a publish, it is
/// sent without waiting for the event's answer.
fn subscription_joined<'a>(
    tx: &'a OutboxTx<'_>,
    id: i64,
) -> impl std::future::Future<Output = Result<usize, PublishError>> + 'a {
    let sent = outbox_model::prepared(
        "INSERT INTO subscription (id, tenant_id, status) VALUES ($1, 'tenant-1', 'active')",
    )
    .bind::<BigInt, _>(id)
    .execute(&mut &**tx);
    async { sent.await.map_err(PublishError::from) }
}

#[tokio::test]
async fn an_event_joined_with_the_business_insert_commits_with_it() {
    let db = TestDatabase::new().await;
    let mut conn = with_business_table(&db).await;

    let (outcome, inserted) = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            futures::try_join!(
                publish_outbox_event(&tx, activated(7).dispatch_key("sub-7")),
                subscription_joined(&tx, 7),
            )
        })
        .await
        .unwrap();

    assert_eq!(inserted, 1);
    let events = all_events(&mut conn).await;
    assert_eq!(events.len(), 1);
    assert_eq!(PublishOutcome::Published(events[0].id), outcome);
    assert_eq!(events[0].dispatch_key.as_deref(), Some("sub-7"));
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM subscription WHERE id = 7").await,
        1
    );
}

#[tokio::test]
async fn a_business_insert_failing_beside_the_event_rolls_the_event_back() {
    let db = TestDatabase::new().await;
    let mut conn = with_business_table(&db).await;
    insert_subscription(&mut conn, 7).await.unwrap();

    let result = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            // Subscription 7 exists: the business insert fails.
            futures::try_join!(
                publish_outbox_event(&tx, activated(7)),
                subscription_joined(&tx, 7),
            )
        })
        .await;

    let Err(PublishError::Database(error)) = result else {
        panic!("expected the duplicate subscription's error, got {result:?}");
    };
    assert!(error.to_string().contains("subscription_pkey"), "{error}");
    assert!(all_events(&mut conn).await.is_empty());
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM subscription").await,
        1
    );
}

#[tokio::test]
async fn a_refused_event_joined_first_sends_no_business_insert_and_the_transaction_goes_on() {
    let db = TestDatabase::new().await;
    let mut conn = with_business_table(&db).await;

    conn.transaction::<_, PublishError, _>(async |conn| {
        let tx = OutboxTx::new(conn)?;
        // Prepared on the connection now: from here on its first poll sends
        // the insert itself, not a request to prepare it.
        subscription_joined(&tx, 1).await?;
        let refused = futures::try_join!(
            publish_outbox_event(
                &tx,
                NewOutboxEvent::new("", "billing.subscription.updated", json!({}))
            ),
            subscription_joined(&tx, 7),
        );
        assert!(
            matches!(refused, Err(PublishError::EmptyTenantId)),
            "{refused:?}"
        );
        // The transaction is usable: the same pair again, with a valid event.
        futures::try_join!(
            publish_outbox_event(&tx, activated(8)),
            subscription_joined(&tx, 8),
        )?;
        Ok(())
    })
    .await
    .unwrap();

    assert_eq!(all_events(&mut conn).await.len(), 1);
    let ids: Vec<i64> = diesel::dsl::sql::<BigInt>("SELECT id FROM subscription ORDER BY id")
        .load(&mut conn)
        .await
        .unwrap();
    assert_eq!(ids, vec![1, 8], "subscription 7's insert was never sent");
}
