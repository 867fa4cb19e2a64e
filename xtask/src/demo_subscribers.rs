//! The demo's subscriber stage: both handler groups in process, against an
//! SMTP sink and an HTTP sink, until the expected side effects arrived.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use outbox_queue::{QueueNamespace, RedisSettings, queue_stats};
use outbox_test_support::{HttpSink, SmtpSink};
use outbox_worker::{Group, WorkerConfig, handler_group};
use tokio_util::sync::CancellationToken;

/// Runs `worker-general`'s and `worker-mail`'s handlers until the sinks saw
/// the demo's mails, webhook and plugin call, then prints them.
pub async fn run(
    url: &str,
    redis_url: &str,
    prefix: &str,
    smtp: &SmtpSink,
    http: &HttpSink,
) -> Result<()> {
    println!("\n-- subscribers (the handlers of worker-general and worker-mail, in process) --");
    let vars: HashMap<&str, String> = HashMap::from([
        ("DATABASE_URL", url.to_owned()),
        ("REDIS_URL", redis_url.to_owned()),
        ("SMTP_URL", smtp.url()),
        ("MAIL_FROM", "shop@acme.test".to_owned()),
        ("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "true".to_owned()),
        ("OUTBOX_QUEUE_PREFIX", prefix.to_owned()),
    ]);
    let pool = outbox_model::connect_pool(url, 4).await?;
    let redis = outbox_queue::connect(&RedisSettings::new(redis_url))?;
    let namespace = QueueNamespace::prefixed(prefix);
    let shutdown = CancellationToken::new();
    let mut running = tokio::task::JoinSet::new();
    for group in [Group::General, Group::Mail] {
        let config = WorkerConfig::from_lookup(group, &|name| vars.get(name).cloned())?;
        let handlers = handler_group(group, &config, &pool, &redis, &namespace)?;
        println!(
            "{:<8} consumes {}",
            group.as_str(),
            handlers.queues().join(", ")
        );
        let (redis, namespace, settings, token) = (
            redis.clone(),
            namespace.clone(),
            config.worker.clone(),
            shutdown.clone(),
        );
        let wake = redis::Client::open(redis_url)?;
        running.spawn(async move {
            handlers
                .run_with_wakeups(redis, Some(wake), &namespace, &settings, token)
                .await
        });
    }

    let limit = Duration::from_secs(30);
    let mails = smtp.wait_for_messages(3, limit).await;
    let hooks = http.wait_for_requests("/acme/webhooks", 1, limit).await;
    let plugin = http.wait_for_requests("/plugins/slack", 1, limit).await;
    let mut inspect = redis.clone();
    let deadline = tokio::time::Instant::now() + limit;
    while queue_stats(
        &mut inspect,
        &namespace,
        "outbox.notification",
        Duration::from_secs(60),
    )
    .await?
    .done
        < 2
    {
        if tokio::time::Instant::now() > deadline {
            bail!("the notifications were not processed within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    while let Some(done) = running.join_next().await {
        done.context("a handler group panicked")??;
    }

    for mail in &mails {
        println!(
            "SMTP  to {:<22} subject {:?}",
            mail.to.join(", "),
            mail.header("subject").unwrap_or_default()
        );
    }
    for request in hooks.iter().chain(&plugin) {
        let id = request.header("webhook-id").unwrap_or("-");
        let timestamp: i64 = request
            .header("webhook-timestamp")
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        let secret = if request.path.starts_with("/plugins") {
            "plugin-secret"
        } else {
            "whsec_ZGVtby1zZWNyZXQ="
        };
        let signed = outbox_subscriber_webhook::verify(
            secret,
            id,
            timestamp,
            &request.body,
            request.header("webhook-signature").unwrap_or(""),
        )?;
        println!(
            "HTTP  POST {:<20} type {:<32} signature {}",
            request.path,
            request.json()["type"].as_str().unwrap_or("-"),
            if signed { "valid" } else { "INVALID" }
        );
    }
    println!(
        "\n{:<30} {:>7} {:>5} {:>5}",
        "queue", "backlog", "done", "dead"
    );
    for queue in outbox_dispatch::Router::standard()
        .queues()
        .into_iter()
        .chain(outbox_queue::queues::DOWNSTREAM_QUEUES)
    {
        let s = queue_stats(&mut inspect, &namespace, queue, Duration::from_secs(60)).await?;
        if s.backlog + s.done + s.dead > 0 {
            println!("{queue:<30} {:>7} {:>5} {:>5}", s.backlog, s.done, s.dead);
        }
    }
    println!("(outbox.search-index has no subscriber yet: its jobs wait, visible as backlog)");
    Ok(())
}
