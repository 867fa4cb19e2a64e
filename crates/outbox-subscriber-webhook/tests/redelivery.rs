//! The delivery handlers (and the plugin hook fan-out) called directly, on
//! real Postgres, Redis and an HTTP sink, with the same job more than once
//! (a redelivery the queue cannot see, or the next try after a failure):
//! what the receivers get.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use diesel_async::SimpleAsyncConnection;
use outbox_idempotency::{IdempotencyStore, RedisIdempotencyStore};
use outbox_queue::{OutboxJob, QueueNamespace, queues};
use outbox_subscriber::{JobError, JobHandler, JobMeta};
use outbox_subscriber_webhook::{
    AddressPolicy, Deliverer, Delivery, DeliverySettings, Once, OnceSettings, PluginHookHandler,
    PluginInvokeHandler, PluginInvokeJob, WebhookHandler, deliver_once, invoke_task_id,
};
use outbox_test_support::{HttpSink, LogCapture, TestDatabase, TestRedis};
use uuid::Uuid;

/// A database, a Redis namespace for the delivery records and an HTTP sink.
struct Env {
    db: TestDatabase,
    redis: TestRedis,
    sink: HttpSink,
}

impl Env {
    async fn new() -> Self {
        outbox_test_support::init_tracing();
        Self {
            db: TestDatabase::new().await,
            redis: TestRedis::new().await,
            sink: HttpSink::start().await,
        }
    }

    async fn sql(&self, sql: &str) {
        self.db.conn().await.batch_execute(sql).await.unwrap();
    }

    /// The parts both handlers take: a deliverer that may reach the sink on
    /// 127.0.0.1, and the delivery records in this test's namespace.
    async fn parts(
        &self,
    ) -> (
        Deliverer,
        RedisIdempotencyStore<outbox_queue::RedisConnection>,
        OnceSettings,
    ) {
        let deliverer = Deliverer::new(DeliverySettings {
            address_policy: AddressPolicy::AllowInternal,
            ..DeliverySettings::default()
        })
        .unwrap();
        let store =
            RedisIdempotencyStore::new(self.redis.conn().await).with_prefix(self.redis.prefix());
        (deliverer, store, OnceSettings::default())
    }

    async fn webhook_handler(&self) -> WebhookHandler {
        let (deliverer, store, once) = self.parts().await;
        WebhookHandler::new(self.db.pool().clone(), deliverer, store, once)
    }

    async fn plugin_handler(&self) -> PluginInvokeHandler {
        let (deliverer, store, once) = self.parts().await;
        PluginInvokeHandler::new(self.db.pool().clone(), deliverer, store, once)
    }

    /// Registers a webhook endpoint of tenant `acme` on the sink's `path`.
    async fn endpoint(&self, path: &str) -> Uuid {
        let id = Uuid::now_v7();
        self.sql(&format!(
            "INSERT INTO webhook_endpoint (id, tenant_id, url, secret) VALUES ('{id}', 'acme', '{}', 's')",
            self.sink.url_for(path)
        ))
        .await;
        id
    }

    /// Subscribes plugin `slack` of tenant `acme` to hook `workflow.executed`
    /// on the sink's `path`.
    async fn plugin_subscription(&self, path: &str) -> Uuid {
        let id = Uuid::now_v7();
        self.sql(&format!(
            "INSERT INTO plugin_hook_subscription (id, tenant_id, plugin, hook, endpoint, secret)
             VALUES ('{id}', 'acme', 'slack', 'workflow.executed', '{}', 'k1')",
            self.sink.url_for(path)
        ))
        .await;
        id
    }
}

/// The invocation of `subscription` for generation `generation` of event
/// `event_id`.
fn plugin_job(event_id: Uuid, generation: u32, subscription: Uuid) -> PluginInvokeJob {
    serde_json::from_str(&format!(
        r#"{{"outbox_event_id": "{event_id}", "tenant_id": "acme", "generation": {generation},
            "subscription_id": "{subscription}", "plugin": "slack", "hook": "workflow.executed",
            "event_type": "plugin.hook.workflow.executed", "payload": {{"workflowId": "w1"}},
            "created_at": "2026-01-05T10:00:00Z"}}"#
    ))
    .unwrap()
}

fn meta(queue: &str, task_id: &str) -> JobMeta {
    JobMeta {
        queue: queue.to_owned(),
        task_id: task_id.to_owned(),
        attempt: 1,
    }
}

/// The `outbox.webhook` job of a `webhook.order.created` event of `acme`.
fn webhook_job(event_id: Uuid) -> OutboxJob {
    serde_json::from_str(&format!(
        r#"{{"outbox_event_id": "{event_id}", "tenant_id": "acme",
            "event_type": "webhook.order.created", "payload": {{"orderId": 7}},
            "dispatch_key": null, "created_at": "2026-01-05T10:00:00Z"}}"#
    ))
    .unwrap()
}

#[tokio::test]
async fn a_delivered_webhook_is_not_sent_again_when_its_job_comes_back() {
    let env = Env::new().await;
    env.endpoint("/hook").await;
    let handler = env.webhook_handler().await;
    let job = webhook_job(Uuid::now_v7());

    handler
        .handle(job.clone(), &meta(queues::WEBHOOK, &job.task_id()))
        .await
        .unwrap();
    assert_eq!(env.sink.requests_to("/hook").len(), 1);
    // The same envelope under another task id: the queue sees a new job.
    handler
        .handle(job, &meta(queues::WEBHOOK, "redelivery-1"))
        .await
        .unwrap();
    assert_eq!(
        env.sink.requests_to("/hook").len(),
        1,
        "the endpoint got the webhook once"
    );
}

#[tokio::test]
async fn a_retry_after_one_endpoint_failed_sends_only_to_that_endpoint() {
    let env = Env::new().await;
    let fine = env.endpoint("/a").await;
    let failing = env.endpoint("/b").await;
    env.sink.respond("/b", vec![503]);
    let handler = env.webhook_handler().await;
    let job = webhook_job(Uuid::now_v7());
    let meta = meta(queues::WEBHOOK, &job.task_id());

    let first = handler.handle(job.clone(), &meta).await;
    let Err(JobError::Retry(reason)) = &first else {
        panic!("a 503 is retried: {first:?}");
    };
    assert!(
        reason.contains(&failing.to_string()) && reason.contains("503"),
        "{reason}"
    );
    assert!(!reason.contains(&fine.to_string()), "{reason}");
    // The next try (in process or a later round: the same body again).
    handler.handle(job.clone(), &meta).await.unwrap();

    assert_eq!(
        env.sink.requests_to("/a").len(),
        1,
        "the endpoint that answered 200 got the webhook once"
    );
    let retried = env.sink.requests_to("/b");
    assert_eq!(
        retried.len(),
        2,
        "the endpoint that answered 503 got it again"
    );
    let id = job.outbox_event_id.to_string();
    for request in &retried {
        assert_eq!(request.header("webhook-id"), Some(id.as_str()));
    }
}

#[tokio::test]
async fn a_delivered_plugin_invocation_is_not_sent_again_when_its_job_comes_back() {
    let env = Env::new().await;
    let subscription = env.plugin_subscription("/slack").await;
    let handler = env.plugin_handler().await;
    let job = plugin_job(Uuid::now_v7(), 0, subscription);
    let task_id = outbox_subscriber_webhook::invoke_task_id(&job.delivery_id(), subscription);

    handler
        .handle(job.clone(), &meta(queues::TOOLCTRL_PLUGIN_INVOKE, &task_id))
        .await
        .unwrap();
    assert_eq!(env.sink.requests_to("/slack").len(), 1);
    handler
        .handle(job, &meta(queues::TOOLCTRL_PLUGIN_INVOKE, "redelivery-1"))
        .await
        .unwrap();
    assert_eq!(
        env.sink.requests_to("/slack").len(),
        1,
        "the plugin was invoked once"
    );
}

#[tokio::test]
async fn each_event_invokes_a_plugin_once_under_its_own_message_id() {
    let env = Env::new().await;
    let subscription = env.plugin_subscription("/slack").await;
    let handler = env.plugin_handler().await;
    let (first, second) = (Uuid::now_v7(), Uuid::now_v7());
    // Two events, then a replay of the first (its generation 1).
    for (n, (event_id, generation)) in [(first, 0), (second, 0), (first, 1)]
        .into_iter()
        .enumerate()
    {
        handler
            .handle(
                plugin_job(event_id, generation, subscription),
                &meta(queues::TOOLCTRL_PLUGIN_INVOKE, &format!("task-{n}")),
            )
            .await
            .unwrap();
    }
    let ids: Vec<String> = env
        .sink
        .requests_to("/slack")
        .iter()
        .map(|r| r.header("webhook-id").unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        ids,
        [
            first.to_string(),
            second.to_string(),
            outbox_queue::delivery_id(first, 1),
        ],
        "one invocation per event and generation, each under its own id"
    );
}

/// The task ids waiting on `toolctrl.plugin-invoke` in `namespace`, sorted.
async fn invocation_task_ids(env: &Env, namespace: &QueueNamespace) -> Vec<String> {
    let mut conn = env.redis.conn().await;
    let mut ids: Vec<String> = redis::cmd("HKEYS")
        .arg(format!(
            "{}:data",
            namespace.queue(queues::TOOLCTRL_PLUGIN_INVOKE)
        ))
        .query_async(&mut conn)
        .await
        .unwrap();
    ids.sort();
    ids
}

#[tokio::test]
async fn a_plugin_hook_event_fans_out_one_invocation_per_enabled_subscription_of_its_tenant_and_hook()
 {
    let env = Env::new().await;
    let namespace = QueueNamespace::prefixed(env.redis.prefix().to_owned());
    let (slack, teams) = (Uuid::now_v7(), Uuid::now_v7());
    let others = [
        ("acme", "workflow.executed", false),
        ("globex", "workflow.executed", true),
        ("acme", "workflow.failed", true),
    ];
    for (id, tenant, hook, enabled) in [
        (slack, "acme", "workflow.executed", true),
        (teams, "acme", "workflow.executed", true),
    ]
    .into_iter()
    .chain(others.map(|(t, h, e)| (Uuid::now_v7(), t, h, e)))
    {
        env.sql(&format!(
            "INSERT INTO plugin_hook_subscription (id, tenant_id, plugin, hook, endpoint, secret, enabled)
             VALUES ('{id}', '{tenant}', 'plugin-{id}', '{hook}', 'http://127.0.0.1:9/', 'k', {enabled})"
        ))
        .await;
    }
    let handler = PluginHookHandler::new(
        env.db.pool().clone(),
        env.redis.conn().await,
        namespace.clone(),
    );
    assert_eq!(handler.queue(), queues::PLUGIN_HOOK);
    let event_id = Uuid::now_v7();
    let job: OutboxJob = serde_json::from_str(&format!(
        r#"{{"outbox_event_id": "{event_id}", "tenant_id": "acme",
            "event_type": "plugin.hook.workflow.executed", "payload": {{"workflowId": "w1"}},
            "dispatch_key": null, "created_at": "2026-01-05T10:00:00Z"}}"#
    ))
    .unwrap();

    handler
        .handle(job.clone(), &meta(queues::PLUGIN_HOOK, "outbox:hook"))
        .await
        .unwrap();
    // A redelivery of the hook event fans out to the same task ids: nothing new.
    handler
        .handle(job, &meta(queues::PLUGIN_HOOK, "outbox:hook"))
        .await
        .unwrap();
    let mut expected = vec![
        invoke_task_id(&event_id.to_string(), slack),
        invoke_task_id(&event_id.to_string(), teams),
    ];
    expected.sort();
    assert_eq!(invocation_task_ids(&env, &namespace).await, expected);
}

// Break checked (a mutation run's shard 6 of the subscriber crates): the
// plugin invocation handler consuming another queue (`queue()` answering
// "xyzzy") fails here; so would the webhook or hook handler.
#[tokio::test]
async fn the_handlers_consume_the_queues_the_description_names() {
    let env = Env::new().await;
    let namespace = QueueNamespace::prefixed(env.redis.prefix().to_owned());
    let webhooks = env.webhook_handler().await;
    let invocations = env.plugin_handler().await;
    let hooks = PluginHookHandler::new(env.db.pool().clone(), env.redis.conn().await, namespace);
    let mut consumed = vec![webhooks.queue(), hooks.queue(), invocations.queue()];
    consumed.sort_unstable();
    let mut described = outbox_catalog::built_in::WEBHOOK.queues();
    described.extend(outbox_catalog::built_in::PLUGIN_HOOKS.queues());
    described.sort_unstable();
    assert_eq!(consumed, described);
    assert_eq!(invocations.queue(), queues::TOOLCTRL_PLUGIN_INVOKE);
}

// Break checked: with `Ok(false)` of `complete` ignored again (as it was),
// nothing is logged and the test fails.
#[tokio::test]
async fn a_delivery_whose_claim_ran_out_during_the_call_is_logged_as_not_recorded() {
    let redis = TestRedis::new().await;
    let store = RedisIdempotencyStore::new(redis.conn().await).with_prefix(redis.prefix());
    let settings = OnceSettings {
        lease: std::time::Duration::from_millis(100),
        ..OnceSettings::default()
    };
    let logs = LogCapture::start();
    let key = format!("webhook:{}", Uuid::now_v7());
    let outcome = deliver_once(&store, &key, settings, async || {
        // A receiver slower than the claim's lease: the call ends only
        // once another worker could claim the key.
        outbox_test_support::eventually(
            "the claim's lease to run out",
            std::time::Duration::from_secs(10),
            async || {
                matches!(
                    store.claim(&key, settings.lease).await.unwrap(),
                    outbox_idempotency::Claim::Acquired(_)
                )
            },
        )
        .await;
        Delivery::Delivered { status: 200 }
    })
    .await
    .unwrap();
    assert_eq!(outcome, Once::Delivered);
    assert_eq!(
        logs.count("delivered but could not record it: the claim's lease ran out"),
        1,
        "{}",
        logs.text()
    );
}
