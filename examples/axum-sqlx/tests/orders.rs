//! The shop as its users see it, through real Postgres and Redis: an order
//! posted over HTTP is confirmed by the service's own handler, run by the
//! worker inside the service; the endpoint's sqlx transaction publishes
//! exactly the order's event, and nothing for a refused order or a
//! rolled-back transaction; the handler's effect happens once per order
//! however often the event is delivered; and the service creates the
//! outbox's core tables only.
//!
//! Each test has a database and a Redis key prefix of its own, from
//! outbox-testkit (whose `sqlx` feature reads the published events through
//! sqlx connections and transactions), removed when the test ends.
//! Postgres: `OUTBOX_TEST_DATABASE_URL` (else `DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/postgres`); Redis:
//! `OUTBOX_TEST_REDIS_URL` (else `REDIS_URL`, else `redis://127.0.0.1:6379`).
//! `cargo xtask test` sets both.

use std::collections::HashMap;
use std::time::Duration;

use axum_sqlx_example::orders::{self, NewOrder, Order, OrderError};
use axum_sqlx_example::{OrderPlaced, confirmations, migrate, pool, serve};
use outbox_testkit::{
    HandlerOutcome, TestDatabase, TestRedis, database_server_url, eventually, published,
    published_events, require_not_published, require_published, run_handler, with_database,
};
use outbox_worker::{Group, WorkerConfig};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool};
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

/// A test database with the service's migrations applied, as at start,
/// and the service's pool on it.
async fn shop_database() -> (TestDatabase, PgPool) {
    let db = TestDatabase::new().await;
    migrate(db.url()).await.unwrap();
    let pool = pool(db.url()).await.unwrap();
    (db, pool)
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
    async fn start(db: &TestDatabase, pool: PgPool, redis: &TestRedis) -> Self {
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
        let task = tokio::spawn(serve(listener, pool, config, stop.clone()));
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
    let (db, pool) = shop_database().await;
    let redis = TestRedis::new().await;
    let shop = Shop::start(&db, pool.clone(), &redis).await;

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
    let mut conn = pool.acquire().await.unwrap();
    let events = published::<OrderPlaced>(&mut *conn).await;
    assert_eq!(
        events.iter().map(|e| &e.event).collect::<Vec<_>>(),
        [&placed(order.id, &adas_order())],
        "one event, for the one order committed"
    );

    shop.stop().await.unwrap();
}

#[tokio::test]
async fn placing_an_order_publishes_exactly_its_order_placed_in_the_same_transaction() {
    let (_db, pool) = shop_database().await;
    let mut tx = pool.begin().await.unwrap();

    let order = orders::place(&mut tx, adas_order()).await.unwrap();

    // Inside the transaction, before the commit.
    let event = require_published(&mut tx, &placed(order.id, &adas_order())).await;
    assert_eq!(event.tenant_id, "acme");
    assert_eq!(published_events(&mut tx).await.len(), 1, "nothing else");
    tx.commit().await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    require_published(&mut *conn, &placed(order.id, &adas_order())).await;
}

#[tokio::test]
async fn the_order_placed_rolls_back_with_the_transaction_it_was_published_in() {
    let (_db, pool) = shop_database().await;
    let mut tx = pool.begin().await.unwrap();
    let order = orders::place(&mut tx, adas_order()).await.unwrap();
    require_published(&mut tx, &placed(order.id, &adas_order())).await;

    tx.rollback().await.unwrap();

    let mut conn = pool.acquire().await.unwrap();
    require_not_published::<OrderPlaced>(&mut *conn).await;
    assert!(matches!(
        orders::find(&pool, order.id).await,
        Err(OrderError::NotFound(_))
    ));
}

#[tokio::test]
async fn a_refused_order_publishes_nothing() {
    let (_db, pool) = shop_database().await;
    let mut tx = pool.begin().await.unwrap();

    let refused = orders::place(&mut tx, refused_order()).await;

    assert!(
        matches!(refused, Err(OrderError::Refused(_))),
        "{refused:?}"
    );
    drop(tx);
    let mut conn = pool.acquire().await.unwrap();
    require_not_published::<OrderPlaced>(&mut *conn).await;
    assert!(published_events(&mut *conn).await.is_empty());
}

#[tokio::test]
async fn the_handler_confirms_an_order_once_when_its_event_is_delivered_twice() {
    let (_db, pool) = shop_database().await;
    let mut tx = pool.begin().await.unwrap();
    let order = orders::place(&mut tx, adas_order()).await.unwrap();
    tx.commit().await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let event = require_published(&mut *conn, &placed(order.id, &adas_order())).await;
    let handler = confirmations(pool.clone()).unwrap();

    // The job the dispatcher makes of the event, delivered twice: the
    // confirmation is keyed on the order, so the second run writes nothing.
    let job = event.dispatched();
    assert_eq!(run_handler(&handler, &job).await, HandlerOutcome::Done);
    assert_eq!(run_handler(&handler, &job).await, HandlerOutcome::Done);

    assert!(orders::find(&pool, order.id).await.unwrap().confirmed);
    let (confirmations,): (i64,) = sqlx::query_as("SELECT count(*) FROM order_confirmations")
        .fetch_one(&pool)
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
    let mut admin = PgConnection::connect(&server).await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let url = with_database(&server, &name);

    let tables = async {
        migrate(&url).await?;
        let mut conn = PgConnection::connect(&url).await?;
        let tables: Vec<(String,)> = sqlx::query_as(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename",
        )
        .fetch_all(&mut conn)
        .await?;
        conn.close().await?;
        anyhow::Ok(tables.into_iter().map(|(t,)| t).collect::<Vec<_>>())
    }
    .await;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)")))
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
