//! The routing table in the README is the code's: every rule of
//! `outbox_catalog::standard_router()`, the worker binary whose handler group consumes its
//! queue (built here exactly as the binaries build it), and the payload
//! fields that handler reads (from the subscriber crates' descriptions, as
//! `outbox_catalog` lists them). The built-in groups consume exactly the
//! queues those descriptions name.
//! And `OUTBOX_ROUTES_FILE` adds rules to it without code.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, Stack};
use outbox_catalog::Catalog;
use outbox_dispatch::Router;
use outbox_publish::NewOutboxEvent;
use outbox_queue::QueueNamespace;
use outbox_subscriber::{ConsumedQueue, SubscriberDescription};
use outbox_test_support::{TestDatabase, TestRedis};
use outbox_worker::{Group, WorkerConfig, handler_group};

const README: &str = include_str!("../../../README.md");
const BEGIN: &str = "<!-- routing table: generated from the subscriber crates' descriptions (outbox_catalog::standard_router); checked by crates/outbox-worker/tests/routing_table.rs -->";
const END: &str = "<!-- end of routing table -->";

/// The built-in subscriber crates' descriptions (without the contract's
/// queues left to applications, which no built-in handler consumes).
fn built_in_crates() -> Vec<SubscriberDescription> {
    Catalog::built_in()
        .descriptions()
        .iter()
        .filter(|d| **d != outbox_catalog::FOR_APPLICATIONS)
        .copied()
        .collect()
}

/// What every built-in subscriber crate says it consumes.
fn consumed() -> Vec<ConsumedQueue> {
    built_in_crates()
        .iter()
        .flat_map(|d| d.consumes.iter().copied())
        .collect()
}

/// The queues the binary of `group` consumes.
async fn group_queues(group: Group, db: &TestDatabase, redis: &TestRedis) -> Vec<String> {
    let vars = [
        ("DATABASE_URL", db.url()),
        ("REDIS_URL", redis.url()),
        ("SMTP_URL", "smtp://localhost:25"),
    ];
    let config = WorkerConfig::from_lookup(group, &|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    })
    .unwrap();
    let conn = outbox_queue::connect(&outbox_queue::RedisSettings::new(redis.url())).unwrap();
    let namespace = QueueNamespace::prefixed(redis.prefix());
    handler_group(group, &config, db.pool(), &conn, &namespace)
        .unwrap()
        .queues()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// The Markdown table of `router`.
fn render(router: &Router, groups: &[(&str, Vec<String>)], consumed: &[ConsumedQueue]) -> String {
    let mut table = String::from(
        "| event type prefix | queue | consumed by | payload fields the handler reads |\n|---|---|---|---|\n",
    );
    for (prefix, queue) in router.rules() {
        let binary = groups
            .iter()
            .find(|(_, queues)| queues.iter().any(|q| q == queue))
            .map(|(binary, _)| format!("`{binary}`"));
        let payload = consumed
            .iter()
            .find(|c| c.queue == queue)
            .map(|c| c.payload);
        let (binary, payload) = match (binary, payload) {
            (Some(binary), Some(payload)) => (binary, payload.to_owned()),
            (None, None) => (
                "no built-in handler".to_owned(),
                "yours to define: jobs wait on the queue until a handler of yours consumes it"
                    .to_owned(),
            ),
            (Some(_), None) => {
                panic!("{queue} is consumed but no subscriber crate describes it in CONSUMES")
            }
            (None, Some(_)) => panic!("{queue} is described in CONSUMES but no worker consumes it"),
        };
        table.push_str(&format!(
            "| `{prefix}*` | `{queue}` | {binary} | {payload} |\n"
        ));
    }
    table
}

#[tokio::test]
async fn the_readme_routing_table_is_the_standard_router() {
    let (db, redis) = (TestDatabase::new().await, TestRedis::new().await);
    let groups = [
        (
            "worker-general",
            group_queues(Group::General, &db, &redis).await,
        ),
        ("worker-mail", group_queues(Group::Mail, &db, &redis).await),
    ];
    let expected = render(
        &outbox_catalog::standard_router().unwrap(),
        &groups,
        &consumed(),
    );
    let section = README
        .split_once(BEGIN)
        .and_then(|(_, rest)| rest.split_once(END))
        .map(|(table, _)| table.trim())
        .unwrap_or_else(|| panic!("README.md has no section between {BEGIN:?} and {END:?}"));
    assert_eq!(
        section,
        expected.trim(),
        "README.md's routing table is out of date; replace it with:\n{expected}"
    );
}

#[tokio::test]
async fn the_built_in_groups_consume_exactly_the_described_queues() {
    let (db, redis) = (TestDatabase::new().await, TestRedis::new().await);
    let mut consumed = group_queues(Group::General, &db, &redis).await;
    consumed.extend(group_queues(Group::Mail, &db, &redis).await);
    consumed.sort();
    let mut described: Vec<String> = built_in_crates()
        .iter()
        .flat_map(|d| d.queues())
        .map(str::to_owned)
        .collect();
    described.sort();
    assert_eq!(consumed, described);
}

/// A routes file in the system's temporary directory, removed on drop.
struct RoutesFile(std::path::PathBuf);

impl RoutesFile {
    fn new(text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("routes-{}.toml", uuid::Uuid::new_v4()));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for RoutesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_file_routes_an_application_prefix_to_its_queue() {
    let stack = Stack::new().await;
    let routes = RoutesFile::new("[[route]]\nprefix = \"orders.\"\nqueue = \"app.orders\"\n");
    let _worker = stack
        .start(GENERAL, &[("OUTBOX_ROUTES_FILE", routes.path())])
        .await;
    let id = stack
        .publish(NewOutboxEvent::new(
            "acme",
            "orders.order.shipped",
            serde_json::json!({ "orderId": 7 }),
        ))
        .await;
    stack
        .wait_count(
            &format!(
                "SELECT count(*) FROM outbox_event WHERE id = '{id}' AND status = 'DONE' AND target_queue = 'app.orders'"
            ),
            1,
        )
        .await;
    let stats = stack.stats("app.orders").await;
    assert_eq!(stats.backlog, 1, "the job waits on the application's queue");
}

#[tokio::test]
async fn a_bad_routes_file_stops_start_up_naming_the_variable() {
    let stack = Stack::new().await;
    let taken = RoutesFile::new("[[route]]\nprefix = \"mail.\"\nqueue = \"app.mail\"\n");
    for (path, why) in [
        (taken.path(), "already routes to"),
        ("/nonexistent/routes.toml", "cannot be read"),
    ] {
        let mut worker = stack.spawn(GENERAL, &[("OUTBOX_ROUTES_FILE", path)]);
        let status = worker.wait_exit(Duration::from_secs(30)).await;
        assert_eq!(status.code(), Some(2));
        let output = worker.wait_output("OUTBOX_ROUTES_FILE").await;
        assert!(output.contains(why), "{output}");
    }
}

/// `worker-general --help` and `worker-mail --help` name exactly the queues
/// their group consumes (the help text is made from the group's list of
/// built-in subscribers).
#[tokio::test]
async fn each_binarys_help_names_the_queues_its_group_consumes() {
    let (db, redis) = (TestDatabase::new().await, TestRedis::new().await);
    let general = group_queues(Group::General, &db, &redis).await;
    let mail = group_queues(Group::Mail, &db, &redis).await;
    for (group, own, other) in [
        (Group::General, &general, &mail),
        (Group::Mail, &mail, &general),
    ] {
        let about = outbox_worker::variables::command(group)
            .get_about()
            .unwrap()
            .to_string();
        for queue in own {
            assert!(
                about.contains(queue.as_str()),
                "{queue} missing from: {about}"
            );
        }
        for queue in other {
            assert!(
                !about.contains(&format!("{queue},")) && !about.contains(&format!("{queue}.")),
                "{queue} of the other group named in: {about}"
            );
        }
    }
}
