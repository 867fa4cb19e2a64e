//! The shop as its users see it, through real Postgres and Redis: an order
//! posted over HTTP is confirmed by the service's own handler, run by the
//! worker inside the service; the endpoint's transaction publishes exactly
//! the order's event, and nothing for a refused order; the handler's effect
//! happens once per order however often the event is delivered; and the
//! service creates the outbox's core tables only.
//!
//! Each test has a database and a Redis key prefix of its own, from
//! outbox-testkit, removed when the test ends. Postgres:
//! `OUTBOX_TEST_DATABASE_URL` (else `DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/postgres`); Redis:
//! `OUTBOX_TEST_REDIS_URL` (else `REDIS_URL`, else `redis://127.0.0.1:6379`).
//! `cargo xtask test` sets both.

use std::collections::HashMap;
use std::time::Duration;

use axum_diesel_example::orders::{self, NewOrder, Order, OrderError};
use axum_diesel_example::{OrderPlaced, confirmations, migrate, pool, serve};
use diesel::dsl::count_star;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_testkit::{
    HandlerOutcome, TestDatabase, TestRedis, database_server_url, eventually, published,
    published_events, require_not_published, require_published, run_handler, with_database,
};
use outbox_worker::{Group, WorkerConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long the test waits for an effect before failing.
const WAIT: Duration = Duration::from_secs(60);

/// Ada's order of 42.00, in tenant `acme`.
fn adas_order() -> NewOrder {
    NewOrder {
        tenant_id: "acme".into(),
        customer: "ada@example.com".into(),
        total_cents: 4200,
    }
}

/// An order the table refuses (a negative total).
fn refused_order() -> NewOrder {
    NewOrder {
        tenant_id: "acme".into(),
        customer: "bob@example.com".into(),
        total_cents: -1,
    }
}

/// A test database with the service's migrations applied, as at start.
async fn shop_database() -> TestDatabase {
    let db = TestDatabase::new().await;
    migrate(db.url()).await.unwrap();
    db
}

/// The running service: its address, its stop, its task.
struct Shop {
    addr: String,
    stop: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
    http: reqwest::Client,
}

impl Shop {
    /// Serves the shop on `db` (migrated) and a free port with the worker
    /// inside it (dispatcher on, queue keys under `redis`'s prefix), and
    /// waits until the worker's `/readyz` answers 200 on the shop's port.
    async fn start(db: &TestDatabase, redis: &TestRedis) -> Self {
        let env: HashMap<&str, String> = [
            ("DATABASE_URL", db.url().to_owned()),
            ("REDIS_URL", redis.url().to_owned()),
            ("OUTBOX_QUEUE_PREFIX", redis.prefix().to_owned()),
            ("OUTBOX_DISPATCHER_ENABLED", "true".to_owned()),
        ]
        .into_iter()
        .collect();
        let config =
            WorkerConfig::from_lookup(Group::General, &|name| env.get(name).cloned()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(
            listener,
            pool(db.url()).await.unwrap(),
            config,
            stop.clone(),
        ));
        let shop = Self {
            addr,
            stop,
            task,
            http: reqwest::Client::new(),
        };
        eventually(
            "the worker's /readyz on the shop's port",
            WAIT,
            async || shop.get_status("/readyz").await == 200,
        )
        .await;
        shop
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn get_status(&self, path: &str) -> u16 {
        match self.http.get(self.url(path)).send().await {
            Ok(response) => response.status().as_u16(),
            Err(_) => 0,
        }
    }

    async fn post_order(&self, order: &NewOrder) -> reqwest::Response {
        self.http
            .post(self.url("/orders"))
            .json(order)
            .send()
            .await
            .unwrap()
    }

    async fn order(&self, id: i64) -> Order {
        let response = self
            .http
            .get(self.url(&format!("/orders/{id}")))
            .send()
            .await;
        response.unwrap().json().await.unwrap()
    }

    /// Stops the shop as its shutdown would; returns what `serve` returned.
    async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.task.await.unwrap()
    }
}

/// The `OrderPlaced` that placing `order` as order `order_id` publishes.
fn placed(order_id: i64, order: &NewOrder) -> OrderPlaced {
    OrderPlaced {
        order_id,
        customer: order.customer.clone(),
        total_cents: order.total_cents,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_posted_order_is_confirmed_by_the_services_own_handler_and_a_refused_one_publishes_nothing()
 {
    let db = shop_database().await;
    let redis = TestRedis::new().await;
    let shop = Shop::start(&db, &redis).await;

    let response = shop.post_order(&adas_order()).await;
    assert_eq!(response.status().as_u16(), 201);
    let order: Order = response.json().await.unwrap();
    assert!(!order.confirmed);
    eventually("the order's confirmation", WAIT, async || {
        shop.order(order.id).await.confirmed
    })
    .await;

    // The table refuses a negative total: the transaction rolls back
    // before anything is published.
    let refused = shop.post_order(&refused_order()).await;
    assert_eq!(refused.status().as_u16(), 422);
    let mut conn = db.conn().await;
    let events = published::<OrderPlaced>(&mut conn).await;
    assert_eq!(
        events.iter().map(|e| &e.event).collect::<Vec<_>>(),
        [&placed(order.id, &adas_order())],
        "one event, for the one order committed"
    );

    shop.stop().await.unwrap();
}

#[tokio::test]
async fn placing_an_order_publishes_exactly_its_order_placed_in_its_tenant() {
    let db = shop_database().await;
    let mut conn = db.conn().await;

    let order = orders::place(&mut conn, adas_order()).await.unwrap();

    let event = require_published(&mut conn, &placed(order.id, &adas_order())).await;
    assert_eq!(event.tenant_id, "acme");
    assert_eq!(published_events(&mut conn).await.len(), 1, "nothing else");
}

#[tokio::test]
async fn a_refused_order_publishes_nothing() {
    let db = shop_database().await;
    let mut conn = db.conn().await;

    let refused = orders::place(&mut conn, refused_order()).await;

    assert!(
        matches!(refused, Err(OrderError::Refused(_))),
        "{refused:?}"
    );
    require_not_published::<OrderPlaced>(&mut conn).await;
    assert!(published_events(&mut conn).await.is_empty());
}

#[tokio::test]
async fn the_order_placed_rolls_back_with_the_transaction_it_was_published_in() {
    let db = shop_database().await;
    let mut conn = db.conn().await;

    // The caller's transaction (`place` nests in it): the event is visible
    // inside it, then rolled back with the order.
    let rolled_back = conn
        .transaction::<(), OrderError, _>(async |conn| {
            let order = orders::place(conn, adas_order()).await?;
            require_published(conn, &placed(order.id, &adas_order())).await;
            Err(OrderError::NotFound(order.id))
        })
        .await;

    assert!(matches!(rolled_back, Err(OrderError::NotFound(_))));
    require_not_published::<OrderPlaced>(&mut conn).await;
}

#[tokio::test]
async fn the_handler_confirms_an_order_once_when_its_event_is_delivered_twice() {
    use axum_diesel_example::schema::order_confirmations;

    let db = shop_database().await;
    let mut conn = db.conn().await;
    let order = orders::place(&mut conn, adas_order()).await.unwrap();
    let event = require_published(&mut conn, &placed(order.id, &adas_order())).await;
    let handler = confirmations(pool(db.url()).await.unwrap()).unwrap();

    // The job the dispatcher makes of the event, delivered twice: the
    // confirmation is keyed on the order, so the second run writes nothing.
    let job = event.dispatched();
    assert_eq!(run_handler(&handler, &job).await, HandlerOutcome::Done);
    assert_eq!(run_handler(&handler, &job).await, HandlerOutcome::Done);

    assert!(orders::find(&mut conn, order.id).await.unwrap().confirmed);
    let confirmations: i64 = order_confirmations::table
        .select(count_star())
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(confirmations, 1);
}

#[tokio::test]
async fn the_service_creates_the_outbox_core_tables_and_its_own_only() {
    // The kit's databases hold every migration set, so this test migrates
    // a fresh database of its own, as the service does at start.
    let server = database_server_url();
    let name = format!("shop_bare_{}", uuid::Uuid::new_v4().simple());
    let mut admin = AsyncPgConnection::establish(&server).await.unwrap();
    diesel::sql_query(format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let url = with_database(&server, &name);

    let tables = async {
        migrate(&url).await?;
        let mut conn = AsyncPgConnection::establish(&url).await?;
        #[derive(QueryableByName)]
        struct Table {
            #[diesel(sql_type = diesel::sql_types::Text)]
            name: String,
        }
        let tables: Vec<Table> = diesel::sql_query(
            "SELECT tablename::text AS name FROM pg_tables \
             WHERE schemaname = 'public' ORDER BY tablename",
        )
        .load(&mut conn)
        .await?;
        anyhow::Ok(tables.into_iter().map(|t| t.name).collect::<Vec<_>>())
    }
    .await;
    diesel::sql_query(format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .unwrap();

    assert_eq!(
        tables.unwrap(),
        [
            "__diesel_schema_migrations",
            "order_confirmations",
            "orders",
            "outbox_dispatch_key",
            "outbox_event",
            "outbox_event_requeue",
            "outbox_ordering_key",
            "outbox_partitioning",
            "outbox_redis_epoch",
            "outbox_redis_safe_point",
            "outbox_schedule",
            "outbox_worker_registration",
        ],
        "no built-in subscriber's table (audit_log, notification, ...)"
    );
}
