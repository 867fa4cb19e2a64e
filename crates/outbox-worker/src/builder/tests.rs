//! The builder's own rules: added routes, names and templates.

use super::*;

#[test]
fn added_routes_join_the_table_and_a_taken_prefix_is_refused() {
    let builder = WorkerBuilder::new(Group::General)
        .route("search.index.urgent.", "app.search-urgent")
        .route("orders.", "app.orders");
    let router = builder
        .routes(outbox_catalog::standard_router().unwrap())
        .unwrap();
    assert_eq!(
        router.route("search.index.urgent.takedown"),
        Some("app.search-urgent")
    );
    assert_eq!(
        router.route("search.index.page.updated"),
        Some("outbox.search-index")
    );
    assert_eq!(router.route("orders.order.placed"), Some("app.orders"));
    // Applied twice (main, then run), the same rules are kept once.
    assert_eq!(builder.routes(router.clone()).unwrap(), router);

    let taken = WorkerBuilder::new(Group::General).route("mail.", "app.mail");
    assert!(matches!(
        taken.routes(outbox_catalog::standard_router().unwrap()),
        Err(RouteError::Collision { .. })
    ));
    let malformed = WorkerBuilder::new(Group::General).route("Orders", "app.orders");
    assert!(matches!(
        malformed.routes(outbox_catalog::standard_router().unwrap()),
        Err(RouteError::InvalidPrefix(_))
    ));
}

#[test]
#[cfg(feature = "mail")]
fn the_binaries_are_the_builder_with_nothing_added() {
    assert_eq!(
        WorkerBuilder::new(Group::General).binary(),
        "worker-general"
    );
    assert_eq!(WorkerBuilder::new(Group::Mail).binary(), "worker-mail");
    let custom = WorkerBuilder::new(Group::Mail)
        .group(Group::General)
        .name("search-worker")
        .template("invoice", "Invoice {{n}}", "Invoice {{n}}.\n", None);
    assert_eq!(custom.binary(), "search-worker");
    assert_eq!(custom.worker_group(), Group::General);
    let vars = serde_json::json!({ "n": 7, "name": "Ada" });
    let (subject, _, _) = custom.templates.render("invoice", &vars).unwrap();
    assert_eq!(subject, "Invoice 7");
    // Added to the standard templates, not instead of them.
    assert!(custom.templates.render("welcome", &vars).is_ok());
    assert_eq!(custom.catalog(), &Catalog::built_in());
}

#[test]
fn a_bare_worker_reconciles_with_no_built_in_receiver() {
    use outbox_dispatch::Receiver;
    // The general group's catalog: reconciliation reads audit_log for a
    // lost audit job.
    let general = WorkerBuilder::new(Group::General);
    assert_ne!(
        general.catalog().receivers().of("outbox.audit"),
        &Receiver::Plain
    );
    // A bare worker's: no built-in subscriber, so nothing reads audit_log
    // or the workflow tables, which a core-only database lacks.
    let bare = WorkerBuilder::bare();
    assert_eq!(bare.catalog(), &Catalog::empty());
    for queue in Catalog::built_in().queues() {
        assert_eq!(
            bare.catalog().receivers().of(queue),
            &Receiver::Plain,
            "{queue}"
        );
    }
}

#[test]
fn help_names_the_schedules_added_in_code() {
    let nightly = crate::Schedule::new(
        "nightly-report",
        "0 0 3 * * *",
        "Europe/Berlin",
        outbox_publish::NewOutboxEvent::new("acme", "reports.nightly.due", serde_json::json!({})),
    )
    .unwrap();
    let about = WorkerBuilder::bare().schedule(nightly).about();
    assert!(
        about.ends_with(" Schedules: nightly-report (0 0 3 * * * in Europe/Berlin)."),
        "{about}"
    );
    assert!(!WorkerBuilder::bare().about().contains("Schedules"));
}
