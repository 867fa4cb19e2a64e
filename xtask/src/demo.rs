//! `cargo xtask demo`: the outbox seen from an application.
//!
//! Creates a fresh `outbox_demo` database, migrates it, runs a few business
//! transactions that publish events (one of which rolls back, one repeats a
//! dispatch key, one uses the batch form, one is plain SQL from "another
//! language"), prints the outbox rows by status, runs the dispatcher until
//! nothing is due, and prints the rows and queue depths again.

use anyhow::Result;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_dispatch::{Dispatcher, DispatcherConfig, Router};
use outbox_model::OutboxEvent;
use outbox_model::schema::outbox_event;
use outbox_publish::{
    NewOutboxEvent, OutboxTx, PublishError, publish_outbox_event, publish_outbox_events,
};
use outbox_queue::{QueueNamespace, RedisSettings};
use outbox_test_support::{HttpSink, SmtpSink};
use serde_json::json;

use crate::services;

const DEMO_DB: &str = "outbox_demo";

/// Runs the demo.
pub async fn run() -> Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,apalis=error,apalis_core=error")
            }),
        )
        .with_target(false)
        .try_init();
    let found = services::ensure().await?;
    // Left in place afterwards, for a look at the rows.
    let scratch = crate::bench::Scratch::create(&found.database_url, DEMO_DB).await?;
    let url = scratch.url.clone();
    println!("database  {url}");
    let applied = &scratch.applied;
    println!(
        "migrated  {} migration(s): {}",
        applied.len(),
        applied.join(", ")
    );

    let mut conn = AsyncPgConnection::establish(&url).await?;
    conn.batch_execute(
        "CREATE TABLE shop_order (
             id bigserial PRIMARY KEY,
             tenant_id text NOT NULL,
             customer_email text NOT NULL,
             total_cents bigint NOT NULL
         )",
    )
    .await?;

    // Real peers for the subscribers: an SMTP server and an HTTP server.
    let smtp = SmtpSink::start().await;
    let http = HttpSink::start().await;
    conn.batch_execute(&format!(
        "INSERT INTO webhook_endpoint (tenant_id, url, secret, event_types)
             VALUES ('acme', '{}', 'whsec_ZGVtby1zZWNyZXQ=', '{{webhook.order.*}}');
         INSERT INTO plugin_hook_subscription (tenant_id, plugin, hook, endpoint, secret)
             VALUES ('acme', 'slack', 'workflow.executed', '{}', 'plugin-secret');
         INSERT INTO tenant_mail_settings (tenant_id, sales_inbox) VALUES ('acme', 'sales@acme.test')",
        http.url_for("/acme/webhooks"),
        http.url_for("/plugins/slack"),
    ))
    .await?;
    println!(
        "tenant acme: a webhook endpoint, a Slack plugin on workflow.executed, sales inbox sales@acme.test"
    );

    println!("\n-- business transactions --");
    place_order(&mut conn, "acme", "ada@example.com", 4_200).await?;
    place_order(&mut conn, "globex", "grace@example.com", 1_999).await?;
    stripe_webhook(&mut conn, "evt_1001").await?;
    stripe_webhook(&mut conn, "evt_1001").await?; // Stripe redelivers
    rolled_back_order(&mut conn).await?;
    reindex_catalog(&mut conn).await?;
    plain_sql_producer(&mut conn).await?;
    lead_and_hook(&mut conn).await?;

    print_rows(&mut conn, "after publishing").await?;
    dispatch(&url, &found.redis_url).await?;
    print_rows(&mut conn, "after dispatching").await?;
    println!(
        "\nDONE means handed to the queue. The review reminders stay PENDING until tomorrow; \
         legacy.report.generated has no route and is FAILED for an operator to look at."
    );
    crate::demo_subscribers::run(&url, &found.redis_url, DEMO_NAMESPACE, &smtp, &http).await?;
    print_effects(&mut conn).await
}

/// A marketing lead and a plugin hook, both for acme.
async fn lead_and_hook(conn: &mut AsyncPgConnection) -> Result<()> {
    conn.transaction::<_, PublishError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        publish_outbox_events(
            &mut tx,
            vec![
                NewOutboxEvent::new(
                    "acme",
                    "marketing.lead.created",
                    json!({ "name": "Linus", "email": "linus@example.com", "company": "Initech", "message": "Call me" }),
                ),
                NewOutboxEvent::new(
                    "acme",
                    "plugin.hook.workflow.executed",
                    json!({ "workflowId": "wf-7", "status": "success" }),
                ),
            ],
        )
        .await
    })
    .await?;
    println!("published a marketing lead and a plugin hook for acme");
    Ok(())
}

/// What the subscribers did, as rows in the database.
async fn print_effects(conn: &mut AsyncPgConnection) -> Result<()> {
    let audit: i64 = diesel::dsl::sql::<BigInt>("SELECT count(*) FROM audit_log")
        .get_result(conn)
        .await?;
    let notifications: Vec<String> =
        diesel::dsl::sql::<Text>("SELECT title FROM notification ORDER BY created_at")
            .load(conn)
            .await?;
    println!("audit_log: {audit} row(s); notifications: {notifications:?}");
    println!(
        "\nThat is the whole path: business transaction → outbox row → dispatcher → Redis queue → \
         subscriber → SMTP / HTTP / rows, each at most once."
    );
    Ok(())
}

/// The Redis key prefix of the demo's queues, so it never touches real ones.
const DEMO_NAMESPACE: &str = "outbox-demo:";

/// Runs a dispatcher until nothing is due, then shows the queues' depths.
async fn dispatch(url: &str, redis_url: &str) -> Result<()> {
    let redis = outbox_queue::connect(&RedisSettings::new(redis_url))?;
    let mut cleaner = redis.clone();
    let stale: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{DEMO_NAMESPACE}*"))
        .query_async(&mut cleaner)
        .await?;
    if !stale.is_empty() {
        redis::cmd("DEL")
            .arg(&stale)
            .query_async::<()>(&mut cleaner)
            .await?;
    }
    let pool = outbox_model::connect_pool(url, 2).await?;
    let namespace = QueueNamespace::prefixed(DEMO_NAMESPACE);
    let dispatcher = Dispatcher::new(
        pool,
        url,
        redis,
        namespace.clone(),
        Router::standard(),
        DispatcherConfig::default(),
    )?;
    println!("\n-- dispatching (Redis {redis_url}, queues prefixed {DEMO_NAMESPACE:?}) --");
    loop {
        let report = dispatcher.tick().await?;
        if report.claimed == 0 {
            break;
        }
        println!(
            "tick: claimed {}, dispatched {}, unrouted {}, retried {}, failed {}",
            report.claimed, report.dispatched, report.unrouted, report.retried, report.failed
        );
    }
    for queue in dispatcher.router().queues() {
        let depth: i64 = redis::cmd("ZCARD")
            .arg(format!("{}:scheduled", namespace.queue(queue)))
            .query_async(&mut cleaner)
            .await?;
        if depth > 0 {
            println!("queue {queue:<22} {depth} job(s) waiting for a subscriber");
        }
    }
    Ok(())
}

#[derive(QueryableByName)]
struct OrderId {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// An order and its three side effects, all or nothing.
async fn place_order(
    conn: &mut AsyncPgConnection,
    tenant: &str,
    email: &str,
    total_cents: i64,
) -> Result<()> {
    let order = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let order: OrderId = diesel::sql_query(
                "INSERT INTO shop_order (tenant_id, customer_email, total_cents)
                 VALUES ($1, $2, $3) RETURNING id",
            )
            .bind::<Text, _>(tenant)
            .bind::<Text, _>(email)
            .bind::<BigInt, _>(total_cents)
            .get_result(conn)
            .await?;
            let mut tx = OutboxTx::new(conn)?;
            let body = json!({ "orderId": order.id, "totalCents": total_cents });
            publish_outbox_event(
                &mut tx,
                NewOutboxEvent::new(
                    tenant,
                    "mail.order.confirmation",
                    json!({ "to": email, "template": "order-confirmation", "vars": body }),
                ),
            )
            .await?;
            publish_outbox_event(
                &mut tx,
                NewOutboxEvent::new(tenant, "audit.order.created", body.clone()),
            )
            .await?;
            publish_outbox_event(
                &mut tx,
                NewOutboxEvent::new(tenant, "webhook.order.created", body),
            )
            .await?;
            // A reminder mail, not dispatched before tomorrow.
            publish_outbox_event(
                &mut tx,
                NewOutboxEvent::new(tenant, "mail.order.review-reminder", json!({ "to": email }))
                    .scheduled_at(Utc::now() + chrono::Duration::days(1)),
            )
            .await?;
            Ok(order.id)
        })
        .await?;
    println!("committed order #{order} of {tenant} with 4 events (one scheduled for tomorrow)");
    Ok(())
}

/// A provider webhook with its event id as dispatch key: redelivery is a no-op.
async fn stripe_webhook(conn: &mut AsyncPgConnection, stripe_event: &str) -> Result<()> {
    let outcome = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            publish_outbox_event(
                &mut tx,
                NewOutboxEvent::new(
                    "acme",
                    "billing.subscription.updated",
                    json!({ "subscriptionId": "sub_42", "status": "active" }),
                )
                .dispatch_key(format!("stripe:{stripe_event}")),
            )
            .await
        })
        .await?;
    if outcome.is_duplicate() {
        println!(
            "stripe {stripe_event} again: duplicate of event {}, nothing written",
            outcome.id()
        );
    } else {
        println!("stripe {stripe_event}: published event {}", outcome.id());
    }
    Ok(())
}

/// A transaction that fails after the business write: neither the order nor
/// its event survive.
async fn rolled_back_order(conn: &mut AsyncPgConnection) -> Result<()> {
    let result = conn
        .transaction::<(), PublishError, _>(async |conn| {
            diesel::sql_query(
                "INSERT INTO shop_order (tenant_id, customer_email, total_cents)
                 VALUES ('acme', 'mallory@example.com', 100)",
            )
            .execute(conn)
            .await?;
            let mut tx = OutboxTx::new(conn)?;
            publish_outbox_event(
                &mut tx,
                NewOutboxEvent::new(
                    "acme",
                    "mail.order.confirmation",
                    json!({ "to": "mallory@example.com" }),
                ),
            )
            .await?;
            // The application then rejects its own event type: the whole
            // transaction rolls back, the event above with it.
            publish_outbox_event(
                &mut tx,
                NewOutboxEvent::new("acme", "Order.Created", json!({})),
            )
            .await?;
            Ok(())
        })
        .await;
    match result {
        Err(e) => println!("rolled back: {e} (no order row, no event)"),
        Ok(()) => println!("unexpected: the invalid event was accepted"),
    }
    Ok(())
}

/// The batch form: one INSERT for many events.
async fn reindex_catalog(conn: &mut AsyncPgConnection) -> Result<()> {
    let outcomes = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            let events = (1..=3).map(|sku| {
                NewOutboxEvent::new(
                    "acme",
                    "search.index.product.updated",
                    json!({ "sku": sku }),
                )
            });
            publish_outbox_events(&mut tx, events).await
        })
        .await?;
    println!(
        "batch: published {} search.index events in one statement",
        outcomes.len()
    );
    Ok(())
}

/// Another language's producer writes plain SQL with only the required columns.
async fn plain_sql_producer(conn: &mut AsyncPgConnection) -> Result<()> {
    conn.batch_execute(
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         VALUES ('globex', 'notification.user.mentioned', '{\"userId\": 7}')",
    )
    .await?;
    println!("plain SQL: inserted a notification event with the table's defaults");
    // An unroutable type is a valid event; the dispatcher will dead-letter it.
    conn.batch_execute(
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         VALUES ('globex', 'legacy.report.generated', '{}')",
    )
    .await?;
    println!("plain SQL: inserted legacy.report.generated (no route: the dispatcher will fail it)");
    Ok(())
}

async fn print_rows(conn: &mut AsyncPgConnection, when: &str) -> Result<()> {
    let rows: Vec<OutboxEvent> = outbox_event::table
        .order((outbox_event::status, outbox_event::created_at))
        .select(OutboxEvent::as_select())
        .load(conn)
        .await?;
    let orders: i64 = diesel::dsl::sql::<BigInt>("SELECT count(*) FROM shop_order")
        .get_result(conn)
        .await?;
    println!(
        "\n-- outbox_event {when} ({} rows; {orders} orders) --",
        rows.len()
    );
    let mut current = None;
    for row in &rows {
        if current != Some(row.status) {
            current = Some(row.status);
            let count = rows.iter().filter(|r| r.status == row.status).count();
            println!("\n{} ({count})", row.status);
            println!(
                "  {:<36}  {:<7}  {:<30}  {:<20}  {:<16}  queue / last error",
                "id", "tenant", "event_type", "scheduled_at", "dispatch_key"
            );
        }
        println!(
            "  {:<36}  {:<7}  {:<30}  {:<20}  {:<16}  {}",
            row.id,
            row.tenant_id,
            row.event_type,
            short_time(row.scheduled_at),
            row.dispatch_key.as_deref().unwrap_or("-"),
            row.last_error
                .as_deref()
                .or(row.target_queue.as_deref())
                .unwrap_or("-"),
        );
    }
    Ok(())
}

fn short_time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S").to_string()
}
