//! The console's pages of events (`list_events_newest`): newest first
//! along the index of each status, every matching row once across pages,
//! and a bounded search for filters no index serves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::cmp::Reverse;

use common::database;
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use outbox_model::{OutboxEvent, OutboxStatus};
use outbox_store::{
    EventFilter, PageNext, PageOrder, PagePosition, Tally, count_events_newest, list_events,
    list_events_newest,
};
use uuid::Uuid;

/// 48 rows with random ids (so that id order is not creation order),
/// created in threes at the same instant and handed off in fours at the
/// same instant: FAILED, CANCELLED, DONE and PENDING in turn, four of
/// tenant `acme` then four of `globex`.
async fn rows(conn: &mut AsyncPgConnection) -> Vec<OutboxEvent> {
    conn.batch_execute(
        "INSERT INTO outbox_event (tenant_id, event_type, payload, created_at, status,
                                   processed_at, target_queue)
         SELECT CASE WHEN n % 8 < 4 THEN 'acme' ELSE 'globex' END,
                'audit.user.login', '{}',
                timestamptz '2026-12-01 10:00:00+00' + (n / 3) * interval '1 second',
                (ARRAY['FAILED', 'CANCELLED', 'DONE', 'PENDING'])[1 + n % 4],
                CASE WHEN n % 4 = 2
                     THEN timestamptz '2026-12-01 11:00:00+00' + (n / 16) * interval '1 second' END,
                CASE WHEN n % 4 = 2 THEN 'outbox.audit' END
         FROM generate_series(0, 47) AS n",
    )
    .await
    .unwrap();
    list_events(conn, &EventFilter::default(), 1_000)
        .await
        .unwrap()
}

/// Every page of `filter` in turn: the ids in the order shown, and
/// whether a page ended by offering to search further.
async fn page_through(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    limit: i64,
    budget: i64,
) -> (Vec<Uuid>, bool) {
    let (mut ids, mut searched_further, mut after) = (Vec::new(), false, None);
    for _ in 0..1_000 {
        let page = list_events_newest(conn, filter, after, limit, budget)
            .await
            .unwrap();
        assert!(i64::try_from(page.rows.len()).unwrap() <= limit);
        ids.extend(page.rows.iter().map(|e| e.id));
        match page.next {
            Some(next) => {
                searched_further |= matches!(next, PageNext::SearchFurther(_));
                // The position survives the query string it travels in.
                let text = next.position().to_string();
                assert_eq!(text.parse::<PagePosition>().unwrap(), next.position());
                after = Some(text.parse().unwrap());
            }
            None => return (ids, searched_further),
        }
    }
    panic!("the pages never ended");
}

/// The ids of the rows `keep` selects, in `order`.
fn expected(
    all: &[OutboxEvent],
    order: PageOrder,
    keep: impl Fn(&OutboxEvent) -> bool,
) -> Vec<Uuid> {
    let mut rows: Vec<&OutboxEvent> = all.iter().filter(|e| keep(e)).collect();
    match order {
        PageOrder::Id => rows.sort_by_key(|e| Reverse(e.id)),
        PageOrder::Processed => rows.sort_by_key(|e| Reverse((e.processed_at, e.id))),
        PageOrder::Created => rows.sort_by_key(|e| Reverse((e.created_at, e.id))),
    }
    rows.iter().map(|e| e.id).collect()
}

/// Which rows a case expects.
type Keep = Box<dyn Fn(&OutboxEvent) -> bool>;

fn filter(statuses: &[OutboxStatus], tenant: Option<&str>) -> EventFilter {
    EventFilter {
        statuses: statuses.to_vec(),
        tenant: tenant.map(str::to_owned),
        ..EventFilter::default()
    }
}

#[test]
fn each_status_filter_walks_the_index_that_holds_its_rows() {
    use OutboxStatus::{Cancelled, Done, Failed, Pending, Processing};
    let order = |statuses: &[OutboxStatus]| PageOrder::of(&filter(statuses, None));
    assert_eq!(order(&[]), PageOrder::Id);
    assert_eq!(order(&[Done]), PageOrder::Processed);
    assert_eq!(order(&[Failed]), PageOrder::Created);
    assert_eq!(order(&[Failed, Cancelled]), PageOrder::Created);
    assert_eq!(order(&[Pending]), PageOrder::Id);
    assert_eq!(order(&[Pending, Processing]), PageOrder::Id);
    assert_eq!(order(&[Done, Failed]), PageOrder::Id);
}

#[tokio::test]
async fn pages_show_every_matching_row_once_newest_first_in_each_order() {
    let (_db, mut conn) = database().await;
    let all = rows(&mut conn).await;
    let acme = |e: &OutboxEvent| e.tenant_id == "acme";
    let is = |status: OutboxStatus| move |e: &OutboxEvent| e.status == status;
    use OutboxStatus::{Cancelled, Done, Failed, Pending};

    let cases: Vec<(EventFilter, PageOrder, Keep)> = vec![
        (filter(&[], None), PageOrder::Id, Box::new(|_| true)),
        (filter(&[], Some("acme")), PageOrder::Id, Box::new(acme)),
        (
            filter(&[Pending], None),
            PageOrder::Id,
            Box::new(is(Pending)),
        ),
        (
            filter(&[Done], None),
            PageOrder::Processed,
            Box::new(is(Done)),
        ),
        (
            filter(&[Done], Some("acme")),
            PageOrder::Processed,
            Box::new(move |e| is(Done)(e) && acme(e)),
        ),
        (
            filter(&[Failed, Cancelled], None),
            PageOrder::Created,
            Box::new(|e| matches!(e.status, Failed | Cancelled)),
        ),
        (
            filter(&[Failed], None),
            PageOrder::Created,
            Box::new(is(Failed)),
        ),
    ];
    for (filter, order, keep) in cases {
        let want = expected(&all, order, keep);
        assert!(!want.is_empty(), "{filter:?}");
        for (limit, budget) in [(5, 4), (2, 7), (50, 1_000)] {
            let (paged, _) = page_through(&mut conn, &filter, limit, budget).await;
            assert_eq!(paged, want, "{filter:?}, {limit} a page, budget {budget}");
        }
    }
}

#[tokio::test]
async fn a_filter_no_index_serves_stops_after_its_budget_and_offers_to_search_further() {
    let (_db, mut conn) = database().await;
    let all = rows(&mut conn).await;
    // Only the oldest row (by id) is of tenant `initech`.
    let oldest = all.iter().map(|e| e.id).min().unwrap();
    conn.batch_execute(&format!(
        "UPDATE outbox_event SET tenant_id = 'initech' WHERE id = '{oldest}'"
    ))
    .await
    .unwrap();
    let rare = filter(&[], Some("initech"));

    let first = list_events_newest(&mut conn, &rare, None, 50, 10)
        .await
        .unwrap();
    assert!(first.rows.is_empty());
    let Some(PageNext::SearchFurther(reached)) = first.next else {
        panic!("expected to search further, got {:?}", first.next);
    };
    assert_eq!(
        all.iter().filter(|e| e.id >= reached.id).count(),
        10,
        "the page searched its budget of rows"
    );
    let (found, searched_further) = page_through(&mut conn, &rare, 50, 10).await;
    assert_eq!(found, [oldest]);
    assert!(searched_further);
    // Without a budget's end in sight, the page ends the listing.
    let (found, searched_further) = page_through(&mut conn, &rare, 50, 1_000).await;
    assert_eq!((found, searched_further), (vec![oldest], false));
}

#[tokio::test]
async fn a_count_is_exact_along_an_index_and_among_the_newest_rows_otherwise() {
    let (_db, mut conn) = database().await;
    rows(&mut conn).await;
    let count = async |conn: &mut AsyncPgConnection, filter: &EventFilter, cap| {
        count_events_newest(conn, filter, cap).await.unwrap()
    };
    use OutboxStatus::{Cancelled, Done, Failed};

    assert_eq!(
        count(&mut conn, &filter(&[], None), 100).await,
        Tally::Exact(48)
    );
    assert_eq!(
        count(&mut conn, &filter(&[], None), 10).await,
        Tally::MoreThan(10)
    );
    assert_eq!(
        count(&mut conn, &filter(&[Failed, Cancelled], None), 100).await,
        Tally::Exact(24)
    );
    assert_eq!(
        count(&mut conn, &filter(&[Done], Some("acme")), 100).await,
        Tally::Exact(6)
    );
    // Of the 12 DONE rows, the newest 8 by hand-off time: two instants of
    // four rows, two of them acme's each (the DONE rows alternate).
    assert_eq!(
        count(&mut conn, &filter(&[Done], Some("acme")), 8).await,
        Tally::Among {
            matching: 4,
            searched: 8
        }
    );
    assert_eq!(
        count(&mut conn, &filter(&[Failed], None), 100).await,
        Tally::Exact(12)
    );
}
