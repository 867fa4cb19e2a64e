//! The cases every driver runs: what an application sees in the table
//! after publishing through it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_model::schema::outbox_event;
use outbox_model::{MAX_PAYLOAD_BYTES, OutboxEvent as EventRow, OutboxStatus};
use outbox_publish::{MAX_PAYLOAD_DEPTH, NewOutboxEvent, Priority, PublishError, PublishOutcome};
use outbox_test_support::TestDatabase;
use outbox_trace::TraceContext;
use serde_json::json;

use crate::driver::{BUSINESS_TABLE, Driver, End, OrderCreated, OrderPriced, Step, Typed};
use crate::refusals::{Refusal, nested, refusals};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A database with the business table, and a connection of `D` to it.
pub async fn setup<D: Driver>() -> (TestDatabase, D) {
    let db = TestDatabase::new().await;
    db.conn().await.batch_execute(BUSINESS_TABLE).await.unwrap();
    let driver = D::connect(&db).await;
    (db, driver)
}

/// The events as a reader sees them, oldest first.
pub async fn events(db: &TestDatabase) -> Vec<EventRow> {
    outbox_event::table
        .order(outbox_event::id)
        .select(EventRow::as_select())
        .load(&mut db.conn().await)
        .await
        .unwrap()
}

async fn business_rows(db: &TestDatabase) -> i64 {
    let mut conn: AsyncPgConnection = db.conn().await;
    diesel::dsl::sql::<diesel::sql_types::BigInt>("SELECT count(*) FROM subscription")
        .get_result(&mut conn)
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

fn order(note: Option<&str>) -> OrderCreated {
    OrderCreated {
        order_id: 7,
        total_cents: 1999,
        note: note.map(str::to_owned),
    }
}

/// The single outcome of a step that published one event.
pub fn single(result: &Result<Vec<PublishOutcome>, PublishError>) -> PublishOutcome {
    match result {
        Ok(outcomes) if outcomes.len() == 1 => outcomes[0],
        other => panic!("expected one outcome, got {other:?}"),
    }
}

/// Each column the publisher sets holds what was published: the id it
/// returned (a UUIDv7), tenant, type, payload, dispatch key, schedule (the
/// transaction's `now()` when absent), the trace context of the span it
/// was published in (NULL outside one), and the defaults of a new event.
// Break checked: the sqlx insert writing NULL for `traceparent` fails this
// case for sqlx only (and the store's both-drivers test).
pub async fn published_rows_hold_every_column_given<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let later = DateTime::parse_from_rfc3339("2031-05-06T07:08:09.123456Z")
        .unwrap()
        .with_timezone(&Utc);
    let parent = TraceContext::parse(PARENT, Some("vendor=x")).unwrap();
    let full = NewOutboxEvent::new(
        "tenant-9",
        "audit.file.uploaded",
        json!({ "n": 1.5, "s": "é😀", "a": [null, true, {}] }),
    )
    .dispatch_key("upload-1")
    .scheduled_at(later);
    let traced = outbox_trace::within(
        driver.transaction(vec![Step::One(full), Step::One(activated(1))], End::Commit),
        Some(&parent),
    )
    .await;
    let untraced = driver
        .transaction(vec![Step::One(activated(2))], End::Commit)
        .await;

    let rows = events(&db).await;
    assert_eq!(rows.len(), 3);
    let ids =
        [single(&traced[0]), single(&traced[1]), single(&untraced[0])].map(
            |outcome| match outcome {
                PublishOutcome::Published(id) => id,
                other => panic!("expected a new event, got {other:?}"),
            },
        );
    assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), ids);
    assert!(ids.iter().all(|id| id.get_version_num() == 7), "UUIDv7 ids");

    let full = &rows[0];
    assert_eq!(full.tenant_id, "tenant-9");
    assert_eq!(full.event_type, "audit.file.uploaded");
    assert_eq!(
        full.payload.value().unwrap(),
        json!({ "n": 1.5, "s": "é😀", "a": [null, true, {}] })
    );
    assert_eq!(full.dispatch_key.as_deref(), Some("upload-1"));
    assert_eq!(full.scheduled_at, later);
    assert_eq!(full.traceparent.as_deref(), Some(PARENT));
    assert_eq!(full.tracestate.as_deref(), Some("vendor=x"));

    let minimal = &rows[1];
    assert_eq!(minimal.dispatch_key, None);
    assert_eq!(
        minimal.scheduled_at, minimal.created_at,
        "an absent schedule is the transaction's now()"
    );
    assert_eq!(minimal.traceparent.as_deref(), Some(PARENT));
    assert_eq!(
        (&rows[2].traceparent, &rows[2].tracestate),
        (&None, &None),
        "no trace context outside a traced span"
    );
    for row in &rows {
        assert_eq!(
            (row.status, row.retries, row.generation),
            (OutboxStatus::Pending, 0, 0)
        );
        assert_eq!(
            (row.locked_until, row.processed_at, row.failed_at),
            (None, None, None)
        );
        assert_eq!((&row.last_error, &row.target_queue), (&None, &None));
    }
}

/// A dispatch key already held, earlier in the same transaction or by a
/// committed event, gives `Duplicate` with the holder's id and writes
/// nothing; the transaction stays usable (a business write after it
/// commits).
pub async fn a_repeated_dispatch_key_is_a_duplicate_and_writes_one_row<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let first = driver
        .transaction(
            vec![
                Step::One(activated(1).dispatch_key("stripe:evt_1")),
                Step::One(activated(2).dispatch_key("stripe:evt_1")),
                Step::Business(1),
            ],
            End::Commit,
        )
        .await;
    let later = driver
        .transaction(
            vec![
                Step::One(activated(3).dispatch_key("stripe:evt_1")),
                Step::Business(2),
            ],
            End::Commit,
        )
        .await;

    let holder = single(&first[0]);
    assert!(!holder.is_duplicate());
    assert_eq!(single(&first[1]), PublishOutcome::Duplicate(holder.id()));
    assert_eq!(single(&later[0]), PublishOutcome::Duplicate(holder.id()));
    assert_eq!(
        business_rows(&db).await,
        2,
        "both business writes committed"
    );
    let rows = events(&db).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].payload.value().unwrap()["subscriptionId"],
        1,
        "the first event wins"
    );
}

/// Every refusal, alone and inside a batch, is the same typed error,
/// raised before any SQL: nothing is written, and the transaction goes on
/// to publish the events exactly at the limits.
pub async fn every_refusal_is_typed_and_writes_nothing_alone_or_in_a_batch<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let at_limit = json!({ "blob": "x".repeat(MAX_PAYLOAD_BYTES - 11) });
    assert_eq!(
        serde_json::to_vec(&at_limit).unwrap().len(),
        MAX_PAYLOAD_BYTES
    );
    let mut steps = Vec::new();
    let mut expected = Vec::new();
    for Refusal {
        rule,
        event,
        expected: is,
    } in refusals()
    {
        steps.push(Step::One(event));
        expected.push((rule, is, false));
    }
    for Refusal {
        rule,
        event,
        expected: is,
    } in refusals()
    {
        steps.push(Step::Batch(vec![activated(1), event, activated(3)]));
        expected.push((rule, is, true));
    }
    let limit_event = |payload| NewOutboxEvent::new("tenant-1", "audit.file.uploaded", payload);
    steps.push(Step::One(limit_event(at_limit)));
    steps.push(Step::One(limit_event(nested(MAX_PAYLOAD_DEPTH))));

    let mut results = driver.transaction(steps, End::Commit).await.into_iter();
    for (rule, is, in_batch) in expected {
        match (results.next().unwrap(), in_batch) {
            (Err(e), false) if is(&e) => assert!(e.is_invalid_event(), "{rule}: {e}"),
            (Err(PublishError::InvalidBatchItem { index: 1, source }), true) if is(&source) => {}
            (other, _) => panic!("{rule} (in a batch: {in_batch}): got {other:?}"),
        }
    }
    assert!(
        results.all(|result| result.is_ok()),
        "the events at the limits"
    );

    // Read back (and so parsed by serde_json, as the dispatcher does).
    let rows = events(&db).await;
    assert_eq!(rows.len(), 2, "only the two events at the limits");
    assert_eq!(
        rows[0].payload.value().unwrap()["blob"]
            .as_str()
            .map(str::len),
        Some(MAX_PAYLOAD_BYTES - 11)
    );
    assert_eq!(rows[1].payload.value().unwrap(), nested(MAX_PAYLOAD_DEPTH));
}

/// A rolled-back transaction takes its events (one by one and batched)
/// with its business row.
pub async fn a_rolled_back_transaction_leaves_neither_business_row_nor_event<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let results = driver
        .transaction(
            vec![
                Step::Business(7),
                Step::One(activated(7).dispatch_key("k-7")),
                Step::Batch(vec![activated(8), activated(9)]),
                Step::Typed("tenant-1", Typed::Created(order(None))),
            ],
            End::Rollback,
        )
        .await;

    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(business_rows(&db).await, 0);
    assert!(events(&db).await.is_empty());
    // The dispatch key is free again.
    let again = driver
        .transaction(
            vec![Step::One(activated(7).dispatch_key("k-7"))],
            End::Commit,
        )
        .await;
    assert!(!single(&again[0]).is_duplicate());
}

/// A batch writes its events in one call with one outcome each, in order;
/// a key already held, or repeated within the batch, is a duplicate of
/// the row that holds it.
pub async fn a_batch_writes_in_order_and_reports_duplicates<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let existing = driver
        .transaction(
            vec![Step::One(activated(0).dispatch_key("seen-before"))],
            End::Commit,
        )
        .await;
    let existing = single(&existing[0]).id();
    let mut batch: Vec<NewOutboxEvent> = (1..=250)
        .map(|i| {
            NewOutboxEvent::new(
                "tenant-2",
                "search.index.product.updated",
                json!({ "sku": i }),
            )
        })
        .collect();
    batch.push(activated(1).dispatch_key("seen-before"));
    batch.push(activated(2).dispatch_key("fresh"));
    batch.push(activated(3).dispatch_key("fresh"));
    let mut results = driver
        .transaction(vec![Step::Batch(batch)], End::Commit)
        .await;
    let outcomes = results.remove(0).unwrap();

    assert_eq!(outcomes.len(), 253);
    assert!(outcomes[..250].iter().all(|o| !o.is_duplicate()));
    assert_eq!(outcomes[250], PublishOutcome::Duplicate(existing));
    assert!(!outcomes[251].is_duplicate());
    assert_eq!(outcomes[252], PublishOutcome::Duplicate(outcomes[251].id()));
    let rows = events(&db).await;
    assert_eq!(rows.len(), 1 + 250 + 1);
    for (i, outcome) in outcomes[..250].iter().enumerate() {
        let row = rows.iter().find(|e| e.id == outcome.id()).unwrap();
        assert_eq!(row.payload.value().unwrap()["sku"], i + 1);
    }
}

/// Events with an ordering key are numbered within their key in the order
/// written, one call or a batch, across transactions; only the head of
/// each key is claimable, and an unordered event carries no position.
pub async fn ordered_events_are_numbered_within_their_key_in_written_order<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let first = driver
        .transaction(
            vec![
                Step::One(activated(1).ordering_key("sub-1")),
                Step::One(activated(2)),
            ],
            End::Commit,
        )
        .await;
    let batch: Vec<NewOutboxEvent> = (3..=6)
        .map(|i| activated(i).ordering_key(if i % 2 == 0 { "sub-2" } else { "sub-1" }))
        .collect();
    let second = driver
        .transaction(vec![Step::Batch(batch)], End::Commit)
        .await;
    let rows = events(&db).await;
    let row = |id| rows.iter().find(|e| e.id == id).unwrap();
    let ordered = |id| {
        let row = row(id);
        (
            row.ordering_key.clone(),
            row.ordering_position,
            row.ordering_blocked,
        )
    };
    assert_eq!(
        ordered(single(&first[0]).id()),
        (Some("sub-1".into()), Some(1), false)
    );
    assert_eq!(ordered(single(&first[1]).id()), (None, None, false));
    let outcomes = second[0].as_ref().unwrap();
    let placed: Vec<_> = outcomes.iter().map(|o| ordered(o.id())).collect();
    assert_eq!(
        placed,
        [
            (Some("sub-1".into()), Some(2), true),
            (Some("sub-2".into()), Some(1), false),
            (Some("sub-1".into()), Some(3), true),
            (Some("sub-2".into()), Some(2), true),
        ]
    );
}

/// A derived event is written with its declared type and its serialized
/// payload; what it gets wrong is refused by name before any SQL.
pub async fn a_typed_event_is_written_with_its_declared_type_and_refused_by_name<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let unserializable = OrderPriced {
        prices: BTreeMap::from([((1, 2), 300)]),
    };
    let keyed = || {
        NewOutboxEvent::from_typed("tenant-1", &order(None))
            .unwrap()
            .dispatch_key("order-7-created")
    };
    let results = driver
        .transaction(
            vec![
                Step::Typed("tenant-1", Typed::Priced(unserializable)),
                Step::Typed("", Typed::Created(order(None))),
                Step::Typed("tenant-1", Typed::Created(order(Some("a\0b")))),
                Step::Typed("tenant-1", Typed::Created(order(Some("gift")))),
                Step::One(keyed()),
                Step::One(keyed()),
            ],
            End::Commit,
        )
        .await;

    match &results[0] {
        Err(e @ PublishError::PayloadNotSerializable { event_type, .. }) => {
            assert_eq!(*event_type, "orders.order.priced");
            assert_eq!(
                e.to_string(),
                "the payload of a \"orders.order.priced\" event does not serialize into JSON: key must be a string"
            );
        }
        other => panic!("expected PayloadNotSerializable, got {other:?}"),
    }
    assert!(
        matches!(results[1], Err(PublishError::EmptyTenantId)),
        "{:?}",
        results[1]
    );
    assert!(
        matches!(&results[2], Err(PublishError::PayloadStringContainsNul { path }) if path == "/note"),
        "{:?}",
        results[2]
    );
    let typed = single(&results[3]);
    let keyed = single(&results[4]);
    assert_eq!(single(&results[5]), PublishOutcome::Duplicate(keyed.id()));

    let rows = events(&db).await;
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].id, typed.id());
    assert_eq!(rows[0].tenant_id, "tenant-1");
    assert_eq!(rows[0].event_type, "orders.order.created");
    assert_eq!(
        rows[0].payload.value().unwrap(),
        json!({ "order_id": 7, "totalCents": 1999, "note": "gift" })
    );
    assert_eq!(rows[0].dispatch_key, None);
    assert_eq!(rows[1].dispatch_key.as_deref(), Some("order-7-created"));
}

/// The routed publish refuses an event type no rule matches, before any
/// SQL (the transaction goes on), and writes a routed one.
pub async fn a_routed_publish_refuses_an_unrouted_type_before_any_sql<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let results = driver
        .transaction(
            vec![
                Step::Routed(activated(1)),
                Step::Routed(NewOutboxEvent::new(
                    "tenant-1",
                    "orders.order.shipped",
                    json!({}),
                )),
                Step::Business(1),
            ],
            End::Commit,
        )
        .await;

    match &results[0] {
        Err(e @ PublishError::Unrouted { event_type }) => {
            assert_eq!(event_type, "billing.subscription.updated");
            assert!(e.is_invalid_event());
        }
        other => panic!("expected Unrouted, got {other:?}"),
    }
    let routed = single(&results[1]);
    assert_eq!(business_rows(&db).await, 1);
    let rows = events(&db).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].id, rows[0].event_type.as_str()),
        (routed.id(), "orders.order.shipped")
    );
}

/// The priority given is stored, one by one and in a batch, and an event
/// without one is normal. A level from outside that is out of range is a
/// typed error naming the range, before any event exists to publish: the
/// transaction writes only the events given a valid level.
pub async fn a_priority_is_stored_as_given_and_an_out_of_range_one_is_refused_by_type<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let refused = Priority::try_from(3_i16).map_err(PublishError::from);
    match &refused {
        Err(e @ PublishError::PriorityOutOfRange(out)) => {
            assert_eq!(out.value, 3);
            assert!(e.is_invalid_event());
            assert_eq!(
                e.to_string(),
                "priority 3 is out of range: a priority is from -2 (lowest) to 2 (highest)"
            );
        }
        other => panic!("expected PriorityOutOfRange, got {other:?}"),
    }
    let results = driver
        .transaction(
            vec![
                Step::One(activated(1).priority(Priority::HIGHEST)),
                Step::One(activated(2)),
                Step::Batch(vec![
                    activated(3).priority(Priority::LOWEST),
                    activated(4).priority(Priority::try_from(-1_i16).unwrap()),
                    activated(5),
                ]),
            ],
            End::Commit,
        )
        .await;

    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let stored: Vec<(serde_json::Value, Priority)> = events(&db)
        .await
        .into_iter()
        .map(|row| {
            (
                row.payload.value().unwrap()["subscriptionId"].clone(),
                row.priority,
            )
        })
        .collect();
    assert_eq!(
        stored,
        vec![
            (json!(1), Priority::HIGHEST),
            (json!(2), Priority::NORMAL),
            (json!(3), Priority::LOWEST),
            (json!(4), Priority::LOW),
            (json!(5), Priority::NORMAL),
        ]
    );
}
