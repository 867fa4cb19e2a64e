//! [`WorkerBuilder`]: the worker as a library, for an application's own
//! `main`. It starts from one of the two groups (`general`, `mail`) with
//! its built-in handlers, and adds routing rules, handlers for any queue,
//! mail templates and subscriber descriptions; [`WorkerBuilder::main`] then
//! runs the process exactly as `worker-general` and `worker-mail` do (they
//! are this builder with nothing added): `--help`, configuration from the
//! environment, health, metrics, retention in the general group (and the
//! dispatcher with `OUTBOX_DISPATCHER_ENABLED=true`), supervision of every queue's worker, and a clean stop on
//! SIGTERM.

use std::future::Future;
use std::process::ExitCode;

use anyhow::{Context, Result};
use outbox_catalog::Catalog;
use outbox_dispatch::{RouteError, Router};
use outbox_model::TypedEvent;
use outbox_pg::PgPool;
use outbox_queue::QueueNamespace;
use outbox_queue::RedisConnection;
use outbox_subscriber::{DynHandler, HandlerGroup, SubscriberDescription, TypedHandlers};
#[cfg(feature = "mail")]
use outbox_subscriber_mail::Templates;

use crate::OrderingPolicy;
use crate::http::Readiness;
use crate::{Group, Resources, Schedule, Subscriber, WorkerConfig};

/// The process's name of a [`WorkerBuilder::bare`] worker, unless
/// [`WorkerBuilder::name`] gives another.
pub const BARE_BINARY: &str = "outbox-worker";

/// Adds one handler to the group being assembled.
type AddHandler = Box<dyn FnOnce(HandlerGroup, &Resources<'_>) -> Result<HandlerGroup> + Send>;

/// A worker process to run: a group's built-in handlers plus what an
/// application adds.
///
/// `worker-general` is `WorkerBuilder::new(Group::General).main()`. An
/// application's own worker adds to it:
///
/// ```no_run
/// use outbox_subscriber::{JobError, JobHandler, JobMeta};
/// use outbox_queue::OutboxJob;
/// use outbox_worker::{Group, WorkerBuilder};
///
/// /// Indexes `search.index.*` events (the standard table routes them to
/// /// `outbox.search-index`, which no built-in handler consumes).
/// struct SearchIndexer;
///
/// impl JobHandler for SearchIndexer {
///     type Job = OutboxJob;
///
///     fn queue(&self) -> &str {
///         "outbox.search-index"
///     }
///
///     async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
///         println!("index {} for {}", job.event_type, job.tenant_id);
///         Ok(())
///     }
/// }
///
/// fn main() -> std::process::ExitCode {
///     WorkerBuilder::new(Group::General)
///         .name("search-worker")
///         .route("catalog.product.", "app.catalog")
///         .handler(SearchIndexer)
///         .template("invoice", "Invoice {{number}}", "Your invoice {{number}}.\n", None)
///         .main()
/// }
/// ```
pub struct WorkerBuilder {
    group: Group,
    name: Option<&'static str>,
    routes: Vec<(String, String)>,
    handlers: Vec<AddHandler>,
    /// Whether the group's built-in subscribers are left out
    /// ([`WorkerBuilder::bare`]).
    bare: bool,
    #[cfg(feature = "mail")]
    templates: Templates,
    catalog: Catalog,
    /// The descriptions added with [`WorkerBuilder::subscriber`].
    added: Vec<SubscriberDescription>,
    /// The event types declared with [`WorkerBuilder::typed`] and
    /// [`WorkerBuilder::declare`], checked against the routing table at start.
    declared: Vec<&'static str>,
    /// The periodic events added with [`WorkerBuilder::schedule`].
    schedules: Vec<Schedule>,
    /// Whether the run serves `/healthz`, `/readyz` and `/metrics` on a
    /// listener of its own (`WORKER_HTTP_ADDR`).
    http_listener: bool,
    /// The connections the run's `/readyz` checks, also those of the
    /// routes handed out by [`WorkerBuilder::http_routes`].
    readiness: Readiness,
    /// What a dead ordered job does to its ordering key.
    ordering_policy: OrderingPolicy,
}

impl std::fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut f = f.debug_struct("WorkerBuilder");
        f.field("group", &self.group)
            .field("bare", &self.bare)
            .field("name", &self.binary())
            .field("routes", &self.routes)
            .field("handlers", &self.handlers.len())
            .field("schedules", &self.schedules);
        #[cfg(feature = "mail")]
        f.field("templates", &self.templates);
        f.field("catalog", &self.catalog)
            .field("http_listener", &self.http_listener)
            .finish()
    }
}

impl WorkerBuilder {
    /// The worker of `group` with its built-in handlers, the standard
    /// routing table (plus `OUTBOX_ROUTES_FILE`), the standard mail
    /// templates and the built-in subscribers' descriptions.
    #[must_use]
    pub fn new(group: Group) -> Self {
        Self {
            group,
            name: None,
            routes: Vec::new(),
            handlers: Vec::new(),
            bare: false,
            #[cfg(feature = "mail")]
            templates: Templates::standard(),
            catalog: Catalog::built_in(),
            added: Vec::new(),
            declared: Vec::new(),
            schedules: Vec::new(),
            http_listener: true,
            readiness: Readiness::default(),
            ordering_policy: OrderingPolicy::default(),
        }
    }

    /// A bare worker: the dispatcher (with `OUTBOX_DISPATCHER_ENABLED=true`),
    /// retention and the handlers the application adds, and no built-in
    /// subscriber (no audit, notification, workflow or plugin handlers, no
    /// workflow sweep), whatever features of this crate are compiled in; so
    /// an application whose build turns the features on through another
    /// crate still runs bare. It is the general group (`WORKER_QUEUE_GROUP`
    /// unset or `general`) named `outbox-worker` ([`WorkerBuilder::name`]
    /// renames it); [`WorkerBuilder::group`]`(Group::Mail)` turns it into a
    /// worker of the application's handlers alone, without the dispatcher.
    ///
    /// The routing table is the standard one all the same: an event of a
    /// built-in prefix (`audit.`, `mail.`, ...) is handed to its queue,
    /// where it waits, as backlog in `outbox health`, for a worker that runs
    /// that subscriber. The tables a bare application needs are the core
    /// migration set (`outbox_model::MigrationSet::Core`). Its catalog
    /// ([`WorkerBuilder::catalog`]) holds only the subscribers the
    /// application adds, so reconciliation after a Redis loss never reads a
    /// built-in subscriber's table.
    ///
    /// ```no_run
    /// use outbox_publish::OutboxEvent;
    /// use outbox_subscriber::{EventContext, JobError, TypedHandlers};
    /// use outbox_worker::WorkerBuilder;
    ///
    /// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
    /// #[outbox(event_type = "orders.order.created")]
    /// struct OrderCreated {
    ///     order_id: u64,
    /// }
    ///
    /// async fn order_created(event: OrderCreated, cx: EventContext) -> Result<(), JobError> {
    ///     println!("order {} of {}", event.order_id, cx.tenant_id);
    ///     Ok(())
    /// }
    ///
    /// fn main() -> anyhow::Result<std::process::ExitCode> {
    ///     let orders = TypedHandlers::new("app.orders").on(order_created)?;
    ///     Ok(WorkerBuilder::bare().name("orders-worker").typed(orders).main())
    /// }
    /// ```
    #[must_use]
    pub fn bare() -> Self {
        // Its catalog holds no built-in subscriber either: after a Redis
        // loss, reconciliation asks only the application's receivers, so
        // it never reads a built-in table the core set does not create.
        Self {
            bare: true,
            catalog: Catalog::empty(),
            ..Self::new(Group::General)
        }
    }

    /// Runs the built-in handlers of `group` instead (and, for `general`,
    /// retention, and the dispatcher when `OUTBOX_DISPATCHER_ENABLED=true`); a [`WorkerBuilder::bare`] worker
    /// stays without built-in handlers. `WORKER_QUEUE_GROUP`, when set, must
    /// name the same group.
    #[must_use]
    pub fn group(mut self, group: Group) -> Self {
        self.group = group;
        self
    }

    /// The process's name in `--help`, messages and the `binary` label of
    /// `outbox_build_info`; `worker-general` or `worker-mail` by default,
    /// `outbox-worker` for a [`WorkerBuilder::bare`] worker.
    #[must_use]
    pub fn name(mut self, name: &'static str) -> Self {
        self.name = Some(name);
        self
    }

    /// Adds the routing rule `prefix` → `queue` (longest prefix wins). It is
    /// checked at start like a rule of `OUTBOX_ROUTES_FILE`: a malformed
    /// rule, or a prefix that already routes elsewhere, stops start-up.
    /// Only the dispatcher routes, so this matters in the general group;
    /// give the CLI the same rule through a routes file to see the queue in
    /// `outbox health`.
    #[must_use]
    pub fn route(mut self, prefix: &str, queue: &str) -> Self {
        self.routes.push((prefix.to_owned(), queue.to_owned()));
        self
    }

    /// Adds a handler for its queue ([`outbox_subscriber::JobHandler`], as
    /// the built-in handlers are), run with the same retries, dead-letter
    /// path, heartbeats and supervision. A queue that already has a handler
    /// in the group stops start-up.
    #[must_use]
    pub fn handler(self, handler: impl DynHandler) -> Self {
        self.add(move |group, _| Ok(group.with(handler)?))
    }

    /// Adds a handler made at start from the worker's [`Resources`] (its
    /// Postgres pool, Redis connection, namespace and configuration); an
    /// error stops start-up, with exit code 2 when it is a
    /// [`crate::ConfigError`] (a variable of the application's own that is
    /// missing or malformed).
    #[must_use]
    pub fn handler_with<H, F>(self, make: F) -> Self
    where
        H: DynHandler,
        F: FnOnce(&Resources<'_>) -> Result<H> + Send + 'static,
    {
        self.add(move |group, resources| Ok(group.with(make(resources)?)?))
    }

    /// What a job of an ordered event that goes to the dead set does to its
    /// ordering key: [`OrderingPolicy::Hold`] (the default) stops the key
    /// until the event succeeds on a retry or an operator releases it;
    /// [`OrderingPolicy::Skip`] moves the key past the dead event.
    ///
    /// ```no_run
    /// use outbox_worker::{OrderingPolicy, WorkerBuilder};
    ///
    /// fn main() -> std::process::ExitCode {
    ///     WorkerBuilder::bare().ordering_policy(OrderingPolicy::Skip).main()
    /// }
    /// ```
    #[must_use]
    pub fn ordering_policy(mut self, policy: OrderingPolicy) -> Self {
        self.ordering_policy = policy;
        self
    }

    fn add(
        mut self,
        add: impl FnOnce(HandlerGroup, &Resources<'_>) -> Result<HandlerGroup> + Send + 'static,
    ) -> Self {
        self.handlers.push(Box::new(add));
        self
    }

    /// Replaces the mail templates (the mail group's `outbox.mail` and
    /// `outbox.marketing` handlers render with them); keep
    /// `lead-notification` if marketing leads are mailed. Feature `mail`.
    #[cfg(feature = "mail")]
    #[must_use]
    pub fn templates(mut self, templates: Templates) -> Self {
        self.templates = templates;
        self
    }

    /// Adds or replaces one mail template: subject, text and optional HTML
    /// with `{{name}}` placeholders. Feature `mail`.
    #[cfg(feature = "mail")]
    #[must_use]
    pub fn template(mut self, name: &str, subject: &str, text: &str, html: Option<&str>) -> Self {
        self.templates.insert(name, subject, text, html);
        self
    }

    /// Registers an application's subscriber ([`Subscriber`]): its routes
    /// join the routing table (checked at start like
    /// [`WorkerBuilder::route`]), its handlers run in this worker, its
    /// downstream queues are measured (`outbox_queue_*` gauges) and
    /// trimmed like the built-in ones, reconciliation after a Redis loss
    /// follows what its handlers leave behind, `--help` names its queues,
    /// and the worker records it at start for `outbox health` and `outbox
    /// reconcile`.
    ///
    /// ```no_run
    /// use outbox_subscriber::{ConsumedQueue, HandlerGroup, SubscriberDescription};
    /// use outbox_worker::{Group, Resources, Subscriber, WorkerBuilder};
    /// # use outbox_subscriber::{JobError, JobHandler, JobMeta};
    /// # struct Indexer;
    /// # impl JobHandler for Indexer {
    /// #     type Job = outbox_queue::OutboxJob;
    /// #     fn queue(&self) -> &str { "app.catalog" }
    /// #     async fn handle(&self, _: Self::Job, _: &JobMeta) -> Result<(), JobError> { Ok(()) }
    /// # }
    ///
    /// /// Indexes `catalog.product.*` events.
    /// struct CatalogIndex;
    ///
    /// impl Subscriber for CatalogIndex {
    ///     fn description(&self) -> SubscriberDescription {
    ///         SubscriberDescription {
    ///             name: "app-catalog-index",
    ///             consumes: &[ConsumedQueue {
    ///                 queue: "app.catalog",
    ///                 routes: &["catalog.product."],
    ///                 payload: "`sku`",
    ///             }],
    ///             feeds: &[],
    ///             dedup: &[],
    ///         }
    ///     }
    ///
    ///     fn handlers(self, group: HandlerGroup, _: &Resources<'_>) -> anyhow::Result<HandlerGroup> {
    ///         Ok(group.with(Indexer)?)
    ///     }
    /// }
    ///
    /// fn main() -> std::process::ExitCode {
    ///     WorkerBuilder::new(Group::General).subscriber(CatalogIndex).main()
    /// }
    /// ```
    #[must_use]
    pub fn subscriber(mut self, subscriber: impl Subscriber) -> Self {
        let description = subscriber.description();
        self.catalog = self.catalog.with(description);
        self.added.push(description);
        for (prefix, queue) in description.routes() {
            self.routes.push((prefix.to_owned(), queue.to_owned()));
        }
        self.add(move |group, resources| subscriber.handlers(group, resources))
    }

    /// Adds a typed handler ([`TypedHandlers`]) and routes each event type
    /// it declares to its queue: one rule per event type, for that type
    /// only (it wins over any prefix rule, and takes no other event of the
    /// prefix). Checked at start like [`WorkerBuilder::route`]: a rule for
    /// the same whole event type to another queue stops start-up.
    ///
    /// ```no_run
    /// use outbox_publish::OutboxEvent;
    /// use outbox_subscriber::{EventContext, JobError, TypedHandlers};
    /// use outbox_worker::{Group, WorkerBuilder};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
    /// #[outbox(event_type = "orders.order.created")]
    /// struct OrderCreated {
    ///     order_id: u64,
    /// }
    ///
    /// async fn order_created(event: OrderCreated, cx: EventContext) -> Result<(), JobError> {
    ///     println!("order {} of {}", event.order_id, cx.tenant_id);
    ///     Ok(())
    /// }
    ///
    /// fn main() -> anyhow::Result<std::process::ExitCode> {
    ///     let orders = TypedHandlers::new("app.orders").on(order_created)?;
    ///     Ok(WorkerBuilder::new(Group::General).typed(orders).main())
    /// }
    /// ```
    #[must_use]
    pub fn typed(mut self, handlers: TypedHandlers) -> Self {
        for event_type in handlers.event_types() {
            let queue = outbox_subscriber::JobHandler::queue(&handlers);
            self.routes.push((event_type.to_owned(), queue.to_owned()));
            self.declared.push(event_type);
        }
        self.handler(handlers)
    }

    /// Declares that the application publishes events of type `E`
    /// (consumed elsewhere, by a handler routed by a rule, a routes file or
    /// another worker): start-up stops with [`crate::UnroutedEventTypes`],
    /// naming each declared type that no routing rule matches, instead
    /// of each such event being marked FAILED by the dispatcher later.
    ///
    /// ```no_run
    /// use outbox_publish::OutboxEvent;
    /// use outbox_worker::{Group, WorkerBuilder};
    ///
    /// #[derive(serde::Serialize, OutboxEvent)]
    /// #[outbox(event_type = "crm.lead.won")]
    /// struct LeadWon {
    ///     lead_id: u64,
    /// }
    ///
    /// fn main() -> std::process::ExitCode {
    ///     // Without the rule, the worker refuses to start: "no routing rule
    ///     // matches the event type(s) the application declares: crm.lead.won; …"
    ///     WorkerBuilder::new(Group::General)
    ///         .route("crm.lead.", "app.crm")
    ///         .declare::<LeadWon>()
    ///         .main()
    /// }
    /// ```
    #[must_use]
    pub fn declare<E: TypedEvent>(mut self) -> Self {
        self.declared.push(E::EVENT_TYPE);
        self
    }

    /// Adds a periodic event: at each tick of the schedule, its event is
    /// published once, however many workers run the schedule (the
    /// schedule's row in `outbox_schedule` decides which one does). The
    /// worker runs it in a `schedules` service of its own, in either group
    /// and in a [`WorkerBuilder::bare`] worker, together with the
    /// `[[schedule]]` tables of `OUTBOX_ROUTES_FILE`; two schedules of one
    /// name stop start-up ([`crate::ScheduleError::Duplicate`], exit code
    /// 2), and so does an event type no routing rule matches
    /// ([`crate::UnroutedEventTypes`]).
    ///
    /// ```no_run
    /// use outbox_publish::NewOutboxEvent;
    /// use outbox_worker::{Missed, Schedule, WorkerBuilder};
    ///
    /// fn main() -> anyhow::Result<std::process::ExitCode> {
    ///     let nightly = Schedule::new(
    ///         "nightly-report",
    ///         "0 0 3 * * *",
    ///         "Europe/Berlin",
    ///         NewOutboxEvent::new("acme", "reports.nightly.due", serde_json::json!({ "kind": "daily" })),
    ///     )?
    ///     .missed(Missed::PublishLast);
    ///     Ok(WorkerBuilder::bare()
    ///         .route("reports.", "app.reports")
    ///         .schedule(nightly)
    ///         .main())
    /// }
    /// ```
    #[must_use]
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Leaves the worker's `/healthz`, `/readyz` and `/metrics` to the
    /// application, which serves them with its own router
    /// ([`WorkerBuilder::http_routes`]): the run binds no listener of its
    /// own and `WORKER_HTTP_ADDR` is not used. Without it (the binaries)
    /// the run serves them on `WORKER_HTTP_ADDR`.
    #[must_use]
    pub fn without_http_listener(mut self) -> Self {
        self.http_listener = false;
        self
    }

    /// The worker's `/healthz`, `/readyz` and `/metrics`, as a router the
    /// application merges into its own (see
    /// [`WorkerBuilder::without_http_listener`]). `/healthz` answers `ok`;
    /// `/readyz` answers 200 while the run of this builder
    /// ([`WorkerBuilder::run_until`]) reaches Postgres and Redis, and 503
    /// before that run has connected and after it has stopped.
    ///
    /// `/metrics` is offered only when the metrics go to the worker's own
    /// Prometheus recorder. That is decided here (or at the start of the
    /// run, whichever comes first) for the whole process: when no `metrics`
    /// recorder is installed yet, the worker installs its own, which every
    /// later run keeps; when the application installed its own first, the
    /// worker's metrics go to the application's recorder, the router has no
    /// `/metrics` (so it does not clash with the application's) and the run
    /// says so in its log. Install your own recorder, if any, before this.
    ///
    /// ```no_run
    /// use axum::routing::get;
    /// use outbox_worker::{Group, WorkerBuilder, WorkerConfig};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # async fn example() -> anyhow::Result<()> {
    /// let worker = WorkerBuilder::new(Group::General).without_http_listener();
    /// let app = axum::Router::new()
    ///     .route("/orders", get(|| async { "the application's own route" }))
    ///     .merge(worker.http_routes()?);
    /// let stop = CancellationToken::new();
    /// let config = WorkerConfig::from_env(Group::General)?;
    /// let worker = tokio::spawn(worker.run_until(config, stop.clone().cancelled_owned()));
    /// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
    /// // ... the application cancels `stop` when it shuts down.
    /// axum::serve(listener, app)
    ///     .with_graceful_shutdown(stop.clone().cancelled_owned())
    ///     .await?;
    /// worker.await??;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// When the worker's Prometheus recorder cannot be configured.
    pub fn http_routes(&self) -> Result<axum::Router> {
        Ok(crate::http::routes(
            self.readiness.clone(),
            crate::recorder::prometheus()?,
        ))
    }

    /// The descriptions added with [`WorkerBuilder::subscriber`].
    #[must_use]
    pub fn added_subscribers(&self) -> &[SubscriberDescription] {
        &self.added
    }

    /// What `--help` says the process is: its group's work, and the
    /// queues of the subscribers added to it.
    #[must_use]
    pub fn about(&self) -> String {
        let mut about = crate::built_in::sentence(self.group, self.built_ins());
        let added: Vec<&str> = self
            .added
            .iter()
            .flat_map(SubscriberDescription::queues)
            .collect();
        if !added.is_empty() {
            about.push_str(&format!(
                " Added by the application: the queues {}.",
                added.join(", ")
            ));
        }
        if !self.schedules.is_empty() {
            let schedules: Vec<String> = self
                .schedules
                .iter()
                .map(|s| format!("{} ({} in {})", s.name(), s.cron(), s.zone()))
                .collect();
            about.push_str(&format!(" Schedules: {}.", schedules.join(", ")));
        }
        about
    }

    /// The process's name (see [`WorkerBuilder::name`]).
    #[must_use]
    pub fn binary(&self) -> &'static str {
        self.name.unwrap_or(match (self.bare, self.group) {
            (true, _) => BARE_BINARY,
            (false, Group::General) => "worker-general",
            (false, Group::Mail) => "worker-mail",
        })
    }

    /// The built-in subscribers this worker runs: its group's
    /// ([`crate::built_in_subscribers`], as far as the crate's features
    /// compile them), none for a [`WorkerBuilder::bare`] worker.
    #[must_use]
    pub fn built_ins(&self) -> &'static [crate::BuiltIn] {
        if self.bare {
            &[]
        } else {
            crate::built_in_subscribers(self.group)
        }
    }

    /// Whether this worker runs the workflow subscriber, and with it the
    /// sweep of runs whose lease ran out and the workflow gauges.
    pub(crate) fn runs_workflows(&self) -> bool {
        self.built_ins()
            .iter()
            .any(|s| s.description().name == outbox_catalog::built_in::WORKFLOW.name)
    }

    /// The group whose built-in handlers this worker runs.
    #[must_use]
    pub fn worker_group(&self) -> Group {
        self.group
    }

    /// The subscriber descriptions this worker knows.
    #[must_use]
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// `router` plus the rules added with [`WorkerBuilder::route`] (a rule
    /// already there with the same queue is kept once).
    ///
    /// # Errors
    ///
    /// The first refused rule.
    pub fn routes(&self, mut router: Router) -> Result<Router, RouteError> {
        for (prefix, queue) in &self.routes {
            if router.rules().get(prefix.as_str()) != Some(&queue.as_str()) {
                router = router.with_rule(prefix, queue)?;
            }
        }
        Ok(router)
    }

    /// Runs the whole process: the command line (`--help` lists every
    /// variable), error reports, logging, the configuration, a runtime and
    /// [`WorkerBuilder::run`]; returns the exit code (0 after a clean stop,
    /// 2 for bad configuration or a Redis that may evict keys, 1 for any
    /// other failure).
    #[must_use]
    pub fn main(self) -> ExitCode {
        crate::process_main(self)
    }

    /// Runs the worker with `config` until SIGTERM or Ctrl-C (see
    /// [`crate::run`]); it installs the handlers of both signals, as the
    /// binaries want. An application with signal handling of its own uses
    /// [`WorkerBuilder::run_until`].
    ///
    /// # Errors
    ///
    /// A refused routing rule, a handler that cannot be built or a queue
    /// with two handlers, and everything [`crate::run`] fails on.
    pub async fn run(self, config: WorkerConfig) -> Result<()> {
        self.run_with(config, crate::shutdown_signal()).await
    }

    /// Runs the worker with `config` until `shutdown` resolves, then stops
    /// it as SIGTERM would (no new work, what is in hand finished within
    /// `WORKER_SHUTDOWN_GRACE_MS`). It installs no signal handler and
    /// does not set up logging: for an application that runs the worker
    /// inside its own runtime and owns the process's signals. Its services
    /// (the metrics recorder's upkeep among them) stop with it, and a new
    /// builder may run again in the same process once it returned. The application may serve the
    /// worker's endpoints itself ([`WorkerBuilder::http_routes`]).
    ///
    /// ```no_run
    /// use outbox_worker::{Group, WorkerBuilder, WorkerConfig};
    ///
    /// # async fn example() -> anyhow::Result<()> {
    /// let config = WorkerConfig::from_env(Group::General)?;
    /// let stop = tokio_util::sync::CancellationToken::new();
    /// // ... the application cancels `stop` when it shuts down.
    /// WorkerBuilder::new(Group::General)
    ///     .run_until(config, stop.clone().cancelled_owned())
    ///     .await
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`WorkerBuilder::run`].
    pub async fn run_until(
        self,
        config: WorkerConfig,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<()> {
        self.run_with(config, async {
            shutdown.await;
            "the application"
        })
        .await
    }

    /// [`WorkerBuilder::run`] until `shutdown` says by what it stopped.
    async fn run_with(
        self,
        mut config: WorkerConfig,
        shutdown: impl Future<Output = &'static str>,
    ) -> Result<()> {
        anyhow::ensure!(
            config.group == self.group,
            "the configuration is for the {} group, the worker for the {} group",
            config.group.as_str(),
            self.group.as_str()
        );
        config.router = self
            .routes(config.router)
            .context("a routing rule added to the worker")?;
        config.schedules = crate::schedule::merge(&self.schedules, &config.schedules)?;
        let declared: Vec<&str> = self
            .declared
            .iter()
            .copied()
            .chain(
                config
                    .schedules
                    .iter()
                    .map(|s| s.event().event_type.as_str()),
            )
            .collect();
        crate::declared::check(&declared, &config.router)?;
        crate::serve::serve(self, config, shutdown).await
    }

    /// Whether the run binds `WORKER_HTTP_ADDR` (see
    /// [`WorkerBuilder::without_http_listener`]).
    pub(crate) fn binds_http_listener(&self) -> bool {
        self.http_listener
    }

    /// The connections the run's `/readyz` checks.
    pub(crate) fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// The handler group to run: the handlers of the group's built-in
    /// subscribers ([`crate::built_in_subscribers`]), then the added ones.
    pub(crate) fn assemble(
        &mut self,
        config: &WorkerConfig,
        pool: &PgPool,
        redis: &RedisConnection,
        namespace: &QueueNamespace,
    ) -> Result<HandlerGroup> {
        let resources = Resources {
            config,
            pool,
            redis,
            namespace,
            #[cfg(feature = "mail")]
            templates: &self.templates,
        };
        let mut group = crate::built_in::handlers(self.built_ins(), &resources)?;
        for add in self.handlers.drain(..) {
            group = add(group, &resources)?;
        }
        // Last, so that it wraps every handler, built-in or added.
        Ok(crate::ordering::layer(group, pool, self.ordering_policy))
    }

    /// What this worker runs, for `outbox_worker_registration`.
    pub(crate) fn registration(
        &self,
        config: &WorkerConfig,
        group: &HandlerGroup,
    ) -> Result<outbox_catalog::registration::Registration> {
        let standard = outbox_catalog::standard_router().context("the built-in routing table")?;
        Ok(crate::registration::describe(
            self.binary(),
            config.group.as_str(),
            &group.queues(),
            &config.router,
            &standard,
            &self.added,
        ))
    }
}

#[cfg(test)]
#[path = "builder/tests.rs"]
mod tests;
