//! The drivers the suite runs against: one transaction of steps (publish
//! calls and business writes), committed or rolled back, through the
//! diesel publisher (`OutboxTx`) or the sqlx one (`sqlx::Transaction`).

use chrono::{DateTime, Utc};
use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, TransactionManager};
use outbox_publish::{
    ChangeError, EventRef, EventRoutes, NewOutboxEvent, OutboxEvent, PublishError, PublishOutcome,
};
use outbox_test_support::TestDatabase;
use serde::Serialize;
use sqlx::Connection as _;
use uuid::Uuid;

/// The application's own table, written in the same transaction.
pub const BUSINESS_TABLE: &str = "CREATE TABLE subscription (id bigint PRIMARY KEY)";
const BUSINESS_INSERT: &str = "INSERT INTO subscription (id) VALUES ($1)";

/// A typed event.
#[derive(Debug, Clone, Serialize, OutboxEvent)]
#[outbox(event_type = "orders.order.created")]
pub struct OrderCreated {
    pub order_id: u64,
    #[serde(rename = "totalCents")]
    pub total_cents: i64,
    pub note: Option<String>,
}

/// A typed event that serializes as a map with non-string keys, which
/// JSON cannot hold.
#[derive(Debug, Clone, Serialize, OutboxEvent)]
#[outbox(event_type = "orders.order.priced")]
pub struct OrderPriced {
    pub prices: std::collections::BTreeMap<(u32, u32), i64>,
}

/// The typed events a step publishes.
pub enum Typed {
    Created(OrderCreated),
    Priced(OrderPriced),
}

/// The routing table of routed steps: `orders.*` goes to `app.orders`,
/// nothing else has a route.
pub struct Routes;

impl EventRoutes for Routes {
    fn route(&self, event_type: &str) -> Option<&str> {
        event_type.starts_with("orders.").then_some("app.orders")
    }
}

/// One call inside the transaction.
pub enum Step {
    /// `publish_outbox_event`.
    One(NewOutboxEvent),
    /// `publish_outbox_events`.
    Batch(Vec<NewOutboxEvent>),
    /// `publish(tx, tenant, event)`.
    Typed(&'static str, Typed),
    /// `publish_routed_event` with [`Routes`].
    Routed(NewOutboxEvent),
    /// A row of the business table, through the same transaction.
    Business(i64),
}

/// How the transaction ends.
#[derive(Clone, Copy)]
pub enum End {
    Commit,
    Rollback,
}

/// What a step returned: the outcomes of its events (none for a business
/// write), or the error.
pub type StepResult = Result<Vec<PublishOutcome>, PublishError>;

/// One change of an existing event inside the transaction.
pub enum Change {
    /// `cancel(tx, event, reason)`.
    Cancel(EventRef, &'static str),
    /// `reschedule(tx, event, at, reason)`.
    Reschedule(EventRef, DateTime<Utc>, &'static str),
}

/// What a change returned: the event's id, or the error.
pub type ChangeResult = Result<Uuid, ChangeError>;

/// A publisher the suite runs against.
pub trait Driver: Sized {
    /// A connection to `db`.
    async fn connect(db: &TestDatabase) -> Self;

    /// Runs `steps` in one transaction ended by `end`; each step's result.
    async fn transaction(&mut self, steps: Vec<Step>, end: End) -> Vec<StepResult>;

    /// Runs `changes` in one transaction ended by `end`; each one's result.
    async fn changes(&mut self, changes: Vec<Change>, end: End) -> Vec<ChangeResult>;
}

/// Runs each change through the publisher module `$api` on `$tx`.
macro_rules! run_changes {
    ($($api:ident)::+, $tx:ident, $changes:expr) => {{
        use $($api)::+ as api;
        let mut results = Vec::new();
        for change in $changes {
            results.push(match change {
                Change::Cancel(event, reason) => api::cancel(&mut $tx, event, reason).await,
                Change::Reschedule(event, at, reason) => {
                    api::reschedule(&mut $tx, event, at, reason).await
                }
            });
        }
        results
    }};
}

/// Runs each step through the publisher module `$api` (the crate root or
/// its `sqlx` module: the functions have the same names) on `$tx`, writing
/// business rows with `$business`.
macro_rules! run_steps {
    ($($api:ident)::+, $tx:ident, $steps:expr, $business:path) => {{
        use $($api)::+ as api;
        let mut results = Vec::new();
        for step in $steps {
            results.push(match step {
                Step::One(event) => api::publish_outbox_event(&mut $tx, event).await.map(one),
                Step::Batch(events) => api::publish_outbox_events(&mut $tx, events).await,
                Step::Typed(tenant, Typed::Created(event)) => {
                    api::publish(&mut $tx, tenant, &event).await.map(one)
                }
                Step::Typed(tenant, Typed::Priced(event)) => {
                    api::publish(&mut $tx, tenant, &event).await.map(one)
                }
                Step::Routed(event) => {
                    api::publish_routed_event(&mut $tx, &Routes, event).await.map(one)
                }
                Step::Business(id) => $business(&mut $tx, id).await.map(|()| Vec::new()),
            });
        }
        results
    }};
}

fn one(outcome: PublishOutcome) -> Vec<PublishOutcome> {
    vec![outcome]
}

/// The diesel publisher: `OutboxTx` over an `AsyncPgConnection`.
pub struct Diesel(AsyncPgConnection);

type DieselManager = <AsyncPgConnection as AsyncConnection>::TransactionManager;

async fn diesel_business(
    tx: &mut outbox_publish::OutboxTx<'_>,
    id: i64,
) -> Result<(), PublishError> {
    diesel::sql_query(BUSINESS_INSERT)
        .bind::<BigInt, _>(id)
        .execute(tx.conn())
        .await?;
    Ok(())
}

impl Driver for Diesel {
    async fn connect(db: &TestDatabase) -> Self {
        Self(db.conn().await)
    }

    async fn transaction(&mut self, steps: Vec<Step>, end: End) -> Vec<StepResult> {
        let conn = &mut self.0;
        DieselManager::begin_transaction(conn).await.unwrap();
        let mut tx = outbox_publish::OutboxTx::new(conn).unwrap();
        let results = run_steps!(outbox_publish, tx, steps, diesel_business);
        match end {
            End::Commit => DieselManager::commit_transaction(conn).await.unwrap(),
            End::Rollback => DieselManager::rollback_transaction(conn).await.unwrap(),
        }
        results
    }

    async fn changes(&mut self, changes: Vec<Change>, end: End) -> Vec<ChangeResult> {
        let conn = &mut self.0;
        DieselManager::begin_transaction(conn).await.unwrap();
        let mut tx = outbox_publish::OutboxTx::new(conn).unwrap();
        let results = run_changes!(outbox_publish, tx, changes);
        match end {
            End::Commit => DieselManager::commit_transaction(conn).await.unwrap(),
            End::Rollback => DieselManager::rollback_transaction(conn).await.unwrap(),
        }
        results
    }
}

/// The sqlx publisher: `outbox_publish::sqlx` over an `sqlx::Transaction`.
pub struct Sqlx(sqlx::PgConnection);

async fn sqlx_business(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    id: i64,
) -> Result<(), PublishError> {
    sqlx::query(BUSINESS_INSERT)
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

impl Driver for Sqlx {
    async fn connect(db: &TestDatabase) -> Self {
        Self(sqlx::PgConnection::connect(db.url()).await.unwrap())
    }

    async fn transaction(&mut self, steps: Vec<Step>, end: End) -> Vec<StepResult> {
        let mut tx = self.0.begin().await.unwrap();
        let results = run_steps!(outbox_publish::sqlx, tx, steps, sqlx_business);
        match end {
            End::Commit => tx.commit().await.unwrap(),
            End::Rollback => tx.rollback().await.unwrap(),
        }
        results
    }

    async fn changes(&mut self, changes: Vec<Change>, end: End) -> Vec<ChangeResult> {
        let mut tx = self.0.begin().await.unwrap();
        let results = run_changes!(outbox_publish::sqlx, tx, changes);
        match end {
            End::Commit => tx.commit().await.unwrap(),
            End::Rollback => tx.rollback().await.unwrap(),
        }
        results
    }
}
