//! The demo's tenants, workflows and event mix.
//!
//! Tenants `acme`, `globex` and `initech`: webhook endpoints for the first
//! two, plugins subscribed to `order.shipped` and `workflow.executed` for
//! `acme`, sales inboxes for marketing leads; `acme` also has a live
//! event-trigger workflow (a created order mails the customer and calls a
//! CRM) and one that waits for input. The mix: concurrent business
//! transactions in Rust over every route, plain SQL batches from "another
//! language", an unroutable event, repeated dispatch keys, an event
//! scheduled for tomorrow and a rolled-back transaction. Everything
//! committed is written down in a [`Ledger`] for the verdict.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chrono::Utc;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_publish::{
    NewOutboxEvent, OutboxTx, PublishError, PublishOutcome, publish_outbox_event,
    publish_outbox_events,
};
use outbox_test_support::HttpSink;
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_store::producers::{self, EventContext, ProducerError, RunTrigger};
use outbox_workflow_store::{self as store, WorkflowStatus};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::demo::verdict::{APPROVAL_WORKFLOW, CRM_PATH, Ledger, ORDER_WORKFLOW, Setup};

/// The tenants of the mix.
const TENANTS: [&str; 3] = ["acme", "globex", "initech"];

/// The signed endpoints at the HTTP sink: (tenant, kind, path, secret),
/// kind being `webhook` or a plugin hook.
pub const ENDPOINTS: [(&str, &str, &str, &str); 4] = [
    (
        "acme",
        "webhook",
        "/acme/webhooks",
        "whsec_ZGVtby1hY21lLXNlY3JldA==",
    ),
    ("globex", "webhook", "/globex/webhooks", "globex-secret"),
    ("acme", "order.shipped", "/plugins/erp", "erp-secret"),
    (
        "acme",
        "workflow.executed",
        "/plugins/slack",
        "slack-secret",
    ),
];

/// The marker in the payload of the rolled-back transaction's event.
pub const ROLLED_BACK_EMAIL: &str = "rolled-back@example.com";

/// Creates the business table, the tenants' endpoints and the workflows;
/// returns where each effect is expected.
pub async fn setup(conn: &mut AsyncPgConnection, http: &HttpSink, chaos: bool) -> Result<Setup> {
    conn.batch_execute(
        "CREATE TABLE shop_order (
             id bigserial PRIMARY KEY,
             tenant_id text NOT NULL,
             customer_email text NOT NULL,
             total_cents bigint NOT NULL
         );
         INSERT INTO tenant_mail_settings (tenant_id, sales_inbox)
             VALUES ('acme', 'sales@acme.test'), ('globex', 'sales@globex.test')",
    )
    .await?;
    let mut setup = Setup {
        chaos,
        ..Setup::default()
    };
    for (tenant, kind, path, secret) in ENDPOINTS {
        let url = http.url_for(path);
        if kind == "webhook" {
            diesel::sql_query(
                "INSERT INTO webhook_endpoint (tenant_id, url, secret, event_types)
                 VALUES ($1, $2, $3, '{}')",
            )
            .bind::<Text, _>(tenant)
            .bind::<Text, _>(&url)
            .bind::<Text, _>(secret)
            .execute(conn)
            .await?;
            setup
                .webhook_paths
                .entry(tenant.to_owned())
                .or_default()
                .push(path.to_owned());
        } else {
            let plugin = path.trim_start_matches("/plugins/");
            diesel::sql_query(
                "INSERT INTO plugin_hook_subscription (tenant_id, plugin, hook, endpoint, secret)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind::<Text, _>(tenant)
            .bind::<Text, _>(plugin)
            .bind::<Text, _>(kind)
            .bind::<Text, _>(&url)
            .bind::<Text, _>(secret)
            .execute(conn)
            .await?;
            setup
                .plugin_paths
                .entry((tenant.to_owned(), kind.to_owned()))
                .or_default()
                .push(path.to_owned());
        }
    }
    save(
        conn,
        ORDER_WORKFLOW,
        order_workflow(&http.url_for(CRM_PATH)),
    )
    .await?;
    save(conn, APPROVAL_WORKFLOW, approval_workflow()).await?;
    Ok(setup)
}

async fn save(conn: &mut AsyncPgConnection, name: &str, definition: Value) -> Result<Uuid> {
    let definition =
        WorkflowDefinition::from_value(definition).with_context(|| format!("workflow {name:?}"))?;
    Ok(
        store::save_workflow(conn, "acme", name, WorkflowStatus::Live, &definition)
            .await
            .with_context(|| format!("saving workflow {name:?}"))?
            .workflow
            .id,
    )
}

/// eventTrigger(order created) → thank-you mail → POST to the CRM.
fn order_workflow(crm: &str) -> Value {
    json!({
        "blocks": [
            { "id": "created", "type": "eventTrigger",
              "params": { "entity": "order", "event": "row.created" } },
            { "id": "thank", "type": "email", "params": {
                "to": ["{{ input.order.email }}"],
                "subject": "Thank you for order {{ input.order.id }}",
                "text": "We received your order of {{ input.order.total }} EUR." } },
            { "id": "crm", "type": "httpRequest", "params": {
                "method": "POST", "url": crm,
                "body": { "var": "input.order" }, "timeoutMs": 5000 } }
        ],
        "edges": [
            { "from": "created", "to": "thank" },
            { "from": "thank", "to": "crm" }
        ]
    })
}

/// manualTrigger → waitForInput (an hour) → `approved` mail on input,
/// `late` mail on timeout.
fn approval_workflow() -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "ask", "type": "waitForInput",
              "params": { "prompt": "Refund order 42?", "timeoutMs": 3_600_000 } },
            { "id": "approved", "type": "email", "params": {
                "to": ["support@acme.test"],
                "subject": "Refund approved: {{ blocks.ask.output.answer.approved }}",
                "text": "The refund was answered." } },
            { "id": "late", "type": "email", "params": {
                "to": ["support@acme.test"], "subject": "Refund: no answer", "text": "timed out" } }
        ],
        "edges": [
            { "from": "start", "to": "ask" },
            { "from": "ask", "to": "approved", "label": "input" },
            { "from": "ask", "to": "late", "label": "timeout" }
        ]
    })
}

/// The mix's size and where it reports how far it got.
pub struct Mix {
    /// The database.
    pub url: String,
    /// Events to publish (about: transactions are not split).
    pub events: usize,
    /// Events committed so far (for the progress bar).
    pub published: Arc<AtomicUsize>,
}

/// How many concurrent Rust producers run.
const PRODUCERS: usize = 3;
/// The share of the events written by the plain-SQL producer, in percent.
const SQL_PERCENT: usize = 15;
/// Events per plain-SQL statement.
const SQL_BATCH: usize = 25;

impl Mix {
    /// Publishes the whole mix; the ledger of what was committed.
    pub async fn run(&self) -> Result<Ledger> {
        let mut conn = outbox_pg::establish(&self.url).await?;
        let mut ledger = Ledger::default();
        self.specials(&mut conn, &mut ledger).await?;
        let sql_events = self.events * SQL_PERCENT / 100;
        let rust_events = self
            .events
            .saturating_sub(sql_events + ledger.committed.len());
        let next = Arc::new(AtomicUsize::new(0));
        let rust_done = Arc::new(AtomicUsize::new(0));
        let producers = (0..PRODUCERS).map(|_| {
            let (next, done) = (next.clone(), rust_done.clone());
            async move {
                let mut conn = outbox_pg::establish(&self.url).await?;
                let mut ledger = Ledger::default();
                while AtomicUsize::load(&done, Ordering::Relaxed) < rust_events {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let before = ledger.committed.len();
                    transaction(&mut conn, n, &mut ledger).await?;
                    let added = ledger.committed.len() - before;
                    done.fetch_add(added, Ordering::Relaxed);
                    self.published.fetch_add(added, Ordering::Relaxed);
                }
                Ok::<_, anyhow::Error>(ledger)
            }
        });
        let plain = async {
            let mut conn = outbox_pg::establish(&self.url).await?;
            let mut ledger = Ledger::default();
            let mut from = 0;
            while from < sql_events {
                let to = (from + SQL_BATCH).min(sql_events);
                for id in plain_sql_batch(&mut conn, from, to).await? {
                    ledger.committed.insert(id);
                }
                self.published.fetch_add(to - from, Ordering::Relaxed);
                from = to;
            }
            Ok::<_, anyhow::Error>(ledger)
        };
        let (rust, sql) = tokio::try_join!(futures::future::try_join_all(producers), plain)?;
        for part in rust.into_iter().chain([sql]) {
            ledger.committed.extend(part.committed);
            ledger.repeated_keys.extend(part.repeated_keys);
        }
        Ok(ledger)
    }

    /// The unroutable event, the scheduled one, the rolled-back
    /// transaction, the workflow triggers and the run that waits.
    async fn specials(&self, conn: &mut AsyncPgConnection, ledger: &mut Ledger) -> Result<()> {
        let unroutable: IdRow = diesel::sql_query(
            "INSERT INTO outbox_event (tenant_id, event_type, payload)
             VALUES ('globex', 'legacy.report.generated', '{\"report\": \"q3\"}') RETURNING id",
        )
        .get_result(conn)
        .await?;
        ledger.unroutable.push(unroutable.id);
        ledger.committed.insert(unroutable.id);
        let later = publish_one(
            conn,
            NewOutboxEvent::new(
                "acme",
                "mail.order.review-reminder",
                json!({ "to": "ada@example.com", "subject": "How was your order?", "text": "Tell us." }),
            )
            .scheduled_at(Utc::now() + chrono::Duration::days(1)),
        )
        .await?
        .id();
        ledger.scheduled.push(later);
        ledger.committed.insert(later);
        rolled_back(conn).await?;
        for i in 0..(self.events / 200).max(2) {
            let data = json!({ "total": 100 + i, "email": format!("buyer{i}@example.com") });
            let change = conn
                .transaction::<_, ProducerError, _>(async |conn| {
                    let mut tx = OutboxTx::new(conn)?;
                    let context = EventContext::Request {
                        actor: Some("shop".into()),
                    };
                    producers::create_row(&mut tx, "acme", "order", &data, &context).await
                })
                .await?;
            ledger.orders.push(change.row.id);
            if let Some(event) = change.outbox_event {
                ledger.committed.insert(event.id());
            }
        }
        let approval = workflow_id(conn, APPROVAL_WORKFLOW).await?;
        let run = conn
            .transaction::<_, ProducerError, _>(async |conn| {
                let mut tx = OutboxTx::new(conn)?;
                let input = json!({ "order": 42 });
                producers::request_execution(&mut tx, "acme", approval, RunTrigger::Manual, &input)
                    .await
            })
            .await?;
        ledger.approval = Some(run);
        self.published
            .fetch_add(ledger.committed.len(), Ordering::Relaxed);
        Ok(())
    }
}

/// Waits until the run `id` waits for input, then answers it; the
/// continuation's event id.
pub async fn continue_waiting_run(url: &str, id: Uuid) -> Result<Uuid> {
    let mut conn = outbox_pg::establish(url).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        let StatusRow { status } =
            diesel::sql_query("SELECT status FROM workflow_execution WHERE id = $1")
                .bind::<diesel::sql_types::Uuid, _>(id)
                .get_result(&mut conn)
                .await?;
        if status == "waiting" {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the run of {APPROVAL_WORKFLOW:?} did not start waiting within 5 minutes (it is {status})"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let outcome = conn
        .transaction::<_, ProducerError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            producers::request_continuation(&mut tx, "acme", id, &json!({ "approved": true }), None)
                .await
        })
        .await?;
    Ok(outcome.id())
}

async fn workflow_id(conn: &mut AsyncPgConnection, name: &str) -> Result<Uuid> {
    let row: IdRow =
        diesel::sql_query("SELECT id FROM workflow WHERE tenant_id = 'acme' AND name = $1")
            .bind::<Text, _>(name)
            .get_result(conn)
            .await?;
    Ok(row.id)
}

#[derive(diesel::QueryableByName)]
struct IdRow {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: Uuid,
}

#[derive(diesel::QueryableByName)]
struct StatusRow {
    #[diesel(sql_type = Text)]
    status: String,
}

async fn publish_one(
    conn: &mut AsyncPgConnection,
    event: NewOutboxEvent,
) -> Result<PublishOutcome> {
    Ok(conn
        .transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_event(&tx, event).await
        })
        .await?)
}

/// A business transaction that fails after its writes: neither its order
/// nor its event may survive.
async fn rolled_back(conn: &mut AsyncPgConnection) -> Result<()> {
    let result = conn
        .transaction::<(), PublishError, _>(async |conn| {
            diesel::sql_query(
                "INSERT INTO shop_order (tenant_id, customer_email, total_cents)
                 VALUES ('acme', $1, 100)",
            )
            .bind::<Text, _>(ROLLED_BACK_EMAIL)
            .execute(conn)
            .await?;
            let tx = OutboxTx::new(conn)?;
            publish_outbox_event(
                &tx,
                NewOutboxEvent::new(
                    "acme",
                    "mail.order.confirmation",
                    json!({ "to": ROLLED_BACK_EMAIL, "subject": "never sent", "text": "-" }),
                ),
            )
            .await?;
            // The application then refuses its own event type: the whole
            // transaction rolls back, the event above with it.
            publish_outbox_event(&tx, NewOutboxEvent::new("acme", "Order.Created", json!({})))
                .await?;
            Ok(())
        })
        .await;
    if result.is_ok() {
        bail!("the invalid event type was accepted: the rolled-back transaction committed");
    }
    Ok(())
}

#[derive(diesel::QueryableByName)]
struct OrderId {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// The seven kinds of business transaction of the mix, in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An order row and its confirmation mail, audit entry, webhook and index update.
    Order,
    /// A shipped order: a plugin hook and a notification.
    Shipping,
    /// A billing event with a provider's dispatch key, which the provider repeats.
    Billing,
    /// A marketing lead for a sales inbox.
    Lead,
    /// Indexing, AI cost, a plugin's capability use and a form submission.
    Content,
    /// A welcome mail, a login audit and a renewal.
    Signup,
    /// A paid invoice: a webhook and an audit entry.
    Invoice,
}

impl Kind {
    /// The kind of transaction `n`.
    fn of(n: usize) -> Self {
        [
            Self::Order,
            Self::Shipping,
            Self::Billing,
            Self::Lead,
            Self::Content,
            Self::Signup,
            Self::Invoice,
        ][n % 7]
    }
}

/// Business transaction `n` of the mix (see [`Kind`]), written to `ledger`
/// once committed.
async fn transaction(conn: &mut AsyncPgConnection, n: usize, ledger: &mut Ledger) -> Result<()> {
    let tenant = TENANTS[n % TENANTS.len()];
    let email = format!("customer{n}@example.com");
    let kind = Kind::of(n);
    let outcomes = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let order = if kind == Kind::Order {
                let total = 1_000 + (n as i64 % 9_000);
                let order: OrderId = diesel::sql_query(
                    "INSERT INTO shop_order (tenant_id, customer_email, total_cents)
                     VALUES ($1, $2, $3) RETURNING id",
                )
                .bind::<Text, _>(tenant)
                .bind::<Text, _>(&email)
                .bind::<BigInt, _>(total)
                .get_result(conn)
                .await?;
                Some((order.id, total))
            } else {
                None
            };
            let events = mix_events(n, tenant, &email, order);
            let tx = OutboxTx::new(conn)?;
            publish_outbox_events(&tx, events).await
        })
        .await?;
    for outcome in &outcomes {
        ledger.committed.insert(outcome.id());
    }
    if kind == Kind::Billing {
        repeat_dispatch_key(conn, n, tenant, ledger).await?;
    }
    Ok(())
}

/// The events of transaction `n` of the mix for `tenant` and the customer
/// `email`; `order` is the `(id, total in cents)` an [`Kind::Order`]
/// transaction inserted.
fn mix_events(
    n: usize,
    tenant: &str,
    email: &str,
    order: Option<(i64, i64)>,
) -> Vec<NewOutboxEvent> {
    let event = |event_type: &str, payload: Value| NewOutboxEvent::new(tenant, event_type, payload);
    match Kind::of(n) {
        Kind::Order => {
            let (id, total) = order.unwrap_or_default();
            let vars = json!({ "orderId": id, "totalCents": total });
            vec![
                event(
                    "mail.order.confirmation",
                    json!({ "to": email, "template": "order-confirmation", "vars": vars }),
                ),
                event("audit.order.created", vars.clone()),
                event("webhook.order.created", vars),
                event("search.index.product.updated", json!({ "sku": n % 500 })),
            ]
        }
        Kind::Shipping => vec![
            event(
                "plugin.hook.order.shipped",
                json!({ "orderId": n, "carrier": "dhl" }),
            ),
            event(
                "notification.order.shipped",
                json!({ "title": format!("Order {n} shipped"), "userId": "u-1" }),
            ),
        ],
        Kind::Billing => vec![billing_event(n, tenant)],
        Kind::Lead => vec![lead_event(n, email)],
        Kind::Content => vec![
            event("rag.index.doc.updated", json!({ "doc": n })),
            event("ai.cost.tokens.used", json!({ "tokens": n })),
            event("plugin.capability-use.ai.call", json!({ "plugin": "erp" })),
            event(
                "form.submission.received",
                json!({ "form": "contact", "n": n }),
            ),
        ],
        Kind::Signup => vec![
            event(
                "mail.user.welcome",
                json!({ "to": email, "template": "welcome", "vars": { "name": format!("User {n}") } }),
            ),
            event("audit.user.login", json!({ "user": n })),
            event("tenant.subscription.renewed", json!({ "plan": "pro" })),
        ],
        Kind::Invoice => vec![
            event("webhook.invoice.paid", json!({ "invoice": n })),
            event("audit.invoice.paid", json!({ "invoice": n })),
        ],
    }
}

/// The billing event of transaction `n`, keyed as its provider keys it;
/// [`repeat_dispatch_key`] sends it again.
fn billing_event(n: usize, tenant: &str) -> NewOutboxEvent {
    NewOutboxEvent::new(
        tenant,
        "billing.subscription.updated",
        json!({ "subscriptionId": format!("sub_{n}"), "status": "active" }),
    )
    .dispatch_key(format!("stripe:evt_{n}"))
}

/// The marketing lead of transaction `n`: for `acme` or `globex` in turn
/// (the tenants with sales inboxes), whoever the transaction's tenant is.
fn lead_event(n: usize, email: &str) -> NewOutboxEvent {
    let tenant = if n.is_multiple_of(2) {
        "acme"
    } else {
        "globex"
    };
    NewOutboxEvent::new(
        tenant,
        "marketing.lead.created",
        json!({ "name": format!("Lead {n}"), "email": email, "company": "Initech", "message": "Call me" }),
    )
}

/// The provider delivers transaction `n`'s event again: the key makes it
/// a no-op, which `ledger` records.
async fn repeat_dispatch_key(
    conn: &mut AsyncPgConnection,
    n: usize,
    tenant: &str,
    ledger: &mut Ledger,
) -> Result<()> {
    let event = billing_event(n, tenant);
    let key = event.dispatch_key.clone().unwrap_or_default();
    let again = publish_one(conn, event).await?;
    if !again.is_duplicate() {
        bail!("a repeated dispatch key {key} was published again");
    }
    ledger.repeated_keys.push(key);
    Ok(())
}

/// Events `from..to` of the plain-SQL producer in one statement, with only
/// the required columns (the table's defaults do the rest).
async fn plain_sql_batch(
    conn: &mut AsyncPgConnection,
    from: usize,
    to: usize,
) -> Result<Vec<Uuid>> {
    let rows: Vec<IdRow> = diesel::sql_query(
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         SELECT (ARRAY['acme', 'globex', 'initech'])[1 + g % 3],
                (ARRAY['notification.report.ready', 'audit.report.exported',
                       'webhook.report.ready', 'search.index.report.updated'])[1 + (g / 3) % 4],
                jsonb_build_object('reportId', g, 'title', 'Report ' || g)
         FROM generate_series($1::bigint, $2::bigint - 1) AS g
         RETURNING id",
    )
    .bind::<BigInt, _>(from as i64)
    .bind::<BigInt, _>(to as i64)
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_names_its_order_and_keys_its_billing_event() {
        let order = mix_events(7, "acme", "c@example.com", Some((42, 1_500)));
        let types: Vec<&str> = order.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(
            types,
            [
                "mail.order.confirmation",
                "audit.order.created",
                "webhook.order.created",
                "search.index.product.updated"
            ]
        );
        assert_eq!(
            order[1].payload,
            json!({ "orderId": 42, "totalCents": 1_500 })
        );
        let billing = mix_events(9, "acme", "c@example.com", None);
        assert_eq!(billing.len(), 1);
        assert_eq!(billing[0].dispatch_key.as_deref(), Some("stripe:evt_9"));
    }

    #[test]
    fn the_seven_kinds_of_transaction_come_in_turn() {
        let kinds: Vec<Kind> = (0..8).map(Kind::of).collect();
        assert_eq!(
            kinds,
            [
                Kind::Order,
                Kind::Shipping,
                Kind::Billing,
                Kind::Lead,
                Kind::Content,
                Kind::Signup,
                Kind::Invoice,
                Kind::Order
            ]
        );
    }

    #[test]
    fn leads_go_to_the_tenants_with_sales_inboxes_in_turn() {
        let tenants: Vec<String> = [3, 10]
            .into_iter()
            .map(|n| {
                mix_events(n, "initech", "c@example.com", None)[0]
                    .tenant_id
                    .clone()
            })
            .collect();
        assert_eq!(tenants, ["globex", "acme"]);
    }
}
