//! The shop end to end, as its users see it: an order posted over HTTP is
//! confirmed by the service's own handler, run by the worker inside the
//! service, through real Postgres and Redis (a database and a key prefix
//! of the test's own, removed afterwards).
//!
//! Postgres: `OUTBOX_TEST_DATABASE_URL` (else `DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/postgres`); Redis:
//! `OUTBOX_TEST_REDIS_URL` (else `REDIS_URL`, else `redis://127.0.0.1:6379`).
//! `cargo xtask test` sets both.

// TODO(testkit): the database, the key prefix and the waits below come
// from outbox-testkit once it exists.

use std::collections::HashMap;
use std::time::Duration;

use axum_diesel_example::orders::{NewOrder, Order};
use axum_diesel_example::{OrderPlaced, migrate, pool, serve};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_publish::TypedEvent;
use outbox_worker::{Group, WorkerConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long the test waits for an effect before failing.
const WAIT: Duration = Duration::from_secs(60);

/// The first of `names` that is set, else `default`.
fn setting(names: &[&str], default: &str) -> String {
    names
        .iter()
        .find_map(|name| std::env::var(name).ok())
        .unwrap_or_else(|| default.to_owned())
}

/// A database of the test's own on the test server, dropped by `drop_it`.
struct Database {
    admin_url: String,
    name: String,
    url: String,
}

impl Database {
    async fn create() -> Self {
        let admin_url = setting(
            &["OUTBOX_TEST_DATABASE_URL", "DATABASE_URL"],
            "postgres://postgres@127.0.0.1:5432/postgres",
        );
        let name = format!("shop_test_{}", uuid::Uuid::new_v4().simple());
        let (base, query) = admin_url
            .split_once('?')
            .map_or((admin_url.as_str(), None), |(base, query)| {
                (base, Some(query))
            });
        let (server, _) = base.rsplit_once('/').expect("a database URL with a path");
        let url = match query {
            Some(query) => format!("{server}/{name}?{query}"),
            None => format!("{server}/{name}"),
        };
        let mut admin = AsyncPgConnection::establish(&admin_url).await.unwrap();
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .unwrap();
        Self {
            admin_url,
            name,
            url,
        }
    }

    async fn drop_it(self) {
        let mut admin = AsyncPgConnection::establish(&self.admin_url).await.unwrap();
        diesel::sql_query(format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

/// The running service: its address, its stop, its task.
struct Shop {
    addr: String,
    stop: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
    http: reqwest::Client,
}

impl Shop {
    /// Migrates `db`, serves the shop on a free port with the worker
    /// inside it (dispatcher on, queue keys under `prefix`), and waits
    /// until the worker's `/readyz` answers 200 on the shop's port.
    async fn start(db: &Database, redis_url: &str, prefix: &str) -> Self {
        migrate(&db.url).await.unwrap();
        let env: HashMap<&str, String> = [
            ("DATABASE_URL", db.url.clone()),
            ("REDIS_URL", redis_url.to_owned()),
            ("OUTBOX_QUEUE_PREFIX", prefix.to_owned()),
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
            pool(&db.url).await.unwrap(),
            config,
            stop.clone(),
        ));
        let shop = Self {
            addr,
            stop,
            task,
            http: reqwest::Client::new(),
        };
        eventually("the worker's /readyz on the shop's port", async || {
            shop.get_status("/readyz").await == 200
        })
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

/// Polls `check` until it holds; fails the test after [`WAIT`].
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still waiting after {WAIT:?} for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Removes every key under `prefix`.
async fn remove_keys(redis_url: &str, prefix: &str) {
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("UNLINK")
            .arg(keys)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// The outbox rows of `event_type`, by status.
async fn events_by_status(db: &Database, event_type: &str) -> Vec<(String, i64)> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        status: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT status, count(*) AS n FROM outbox_event WHERE event_type = $1 GROUP BY status ORDER BY status",
    )
    .bind::<diesel::sql_types::Text, _>(event_type)
    .load(&mut conn)
    .await
    .unwrap();
    rows.into_iter().map(|r| (r.status, r.n)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_posted_order_is_confirmed_by_the_services_own_handler_and_a_refused_one_publishes_nothing()
 {
    let db = Database::create().await;
    let redis_url = setting(
        &["OUTBOX_TEST_REDIS_URL", "REDIS_URL"],
        "redis://127.0.0.1:6379",
    );
    let prefix = format!("shop-test:{}:", uuid::Uuid::new_v4().simple());
    let shop = Shop::start(&db, &redis_url, &prefix).await;

    let response = shop
        .post_order(&NewOrder {
            tenant_id: "acme".into(),
            customer: "ada@example.com".into(),
            total_cents: 4200,
        })
        .await;
    assert_eq!(response.status().as_u16(), 201);
    let placed: Order = response.json().await.unwrap();
    assert!(!placed.confirmed);
    eventually("the order's confirmation", async || {
        shop.order(placed.id).await.confirmed
    })
    .await;

    // The table refuses a negative total: the transaction rolls back
    // before anything is published.
    let refused = shop
        .post_order(&NewOrder {
            tenant_id: "acme".into(),
            customer: "bob@example.com".into(),
            total_cents: -1,
        })
        .await;
    assert_eq!(refused.status().as_u16(), 422);
    assert_eq!(
        events_by_status(&db, OrderPlaced::EVENT_TYPE).await,
        vec![("DONE".to_owned(), 1)],
        "one event, for the one order committed, handed off"
    );

    shop.stop().await.unwrap();
    remove_keys(&redis_url, &prefix).await;
    db.drop_it().await;
}
