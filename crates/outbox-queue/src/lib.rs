//! What the dispatcher and the subscriber workers agree on: the job envelope
//! ([`OutboxJob`]), the queue names ([`queues`]), the deterministic task id
//! ([`task_id`]), and how an apalis-redis queue is addressed and connected
//! ([`QueueNamespace`], [`connect`], [`redis_client`] for `redis://` and
//! `rediss://`, [`push_jobs`]), and how URLs are shown
//! without their secrets ([`redact_url`], [`endpoint_origin`],
//! [`redact_urls_in`], [`redact_json`]), which every crate above this one uses.
//!
//! For noticing and repairing a Redis that lost data (see
//! `docs/reliability.md`): what a server says about its run and persistence
//! ([`read_server_info`], [`Persistence`]), the marker the dispatchers keep
//! in it ([`marker_key`], [`read_marker`], [`write_marker`]), whether jobs
//! are still there ([`job_states`]), which have not finished
//! ([`unfinished_jobs`], [`event_of_task`]), running a finished job again
//! ([`rerun_finished`]), and the task ids of derived jobs, as a
//! subscriber describes them ([`DerivedTaskIds`]) and as the built-in ones
//! form them ([`email_task_id`], [`plugin_invoke_task_id`]).
//!
//! A job of a [`outbox_model::Priority`] other than normal waits in its
//! level's own ready list ([`ready_list`], [`push_raw_at_priority`]); the
//! workers' fetch takes higher levels first.
//!
//! This crate neither claims rows nor runs handlers: the dispatcher
//! (`outbox-dispatch`) pushes with it, the workers consume with it.

mod connection;
mod derived;
mod envelope;
mod inspect;
mod levels;
mod presence;
mod redact;
mod redis_queue;
mod server;
mod worker_store;

pub use connection::RedisConnection;
pub use derived::{
    DerivedTaskIds, EMAIL_TASK_IDS, PLUGIN_INVOKE_TASK_IDS, email_task_id, plugin_invoke_task_id,
};
pub use envelope::{
    JobOrdering, OutboxJob, delivery_id, deserialize_priority_lenient, generation_task_id,
    stored_trace_context, task_id,
};
pub use inspect::{
    DEFAULT_DONE_RETENTION_HOURS, DeadJob, JobRecord, QUEUE_DONE_RETENTION_HOURS, QueueStats,
    dead_jobs, dead_task_ids, job_orderings, job_record, queue_stats, trim_finished,
};
pub use levels::{push_raw_at_priority, ready_list, scheduled_set};
pub use presence::{
    JobState, JobStateKind, Unfinished, event_of_task, job_states, rerun_finished, retry_dead,
    unfinished_jobs,
};
pub use redact::{INVALID_URL, REDACTED, endpoint_origin, redact_json, redact_url, redact_urls_in};
pub use redis_queue::{
    CLUSTER_MARKER, InvalidQueuePrefix, MAX_RETRY_ROUNDS, OUTBOX_QUEUE_PREFIX, PubSubClients,
    PushReport, QUEUE_PREFIX_SEPARATOR, QueueError, QueueNamespace, REDIS_CA_CERT, REDIS_URL,
    RedisSettings, apalis_config, cluster_nodes, connect, idempotency_prefix, pubsub_clients,
    push_jobs, push_raw, push_raw_at, redis_client, redis_from_lookup, retry_round, retry_task_id,
    storage, wake_channel,
};
pub use server::{
    Fsync, Marker, Persistence, ServerInfo, confirm_marker_run, marker_key, parse_info,
    queue_marker_key, read_marker, read_persistence, read_run_id, read_server_info, write_marker,
};
pub use worker_store::{
    QUEUE_RESCHEDULE_ATTEMPTS, ResponseCodec, ResponseCodecError, WorkerStore, retire_worker,
};

/// Queue names of the contract. An outbox queue receives dispatched events;
/// a downstream queue receives jobs that subscribers derive from them.
/// Which events go where, and which queues are routed or fed, the
/// subscriber crates describe (see `outbox-catalog`, which lists them).
pub mod queues {
    /// Notifications, `tenant.subscription.*` and `billing.*`.
    pub const NOTIFICATION: &str = "outbox.notification";
    /// Mails (`mail.*`).
    pub const MAIL: &str = "outbox.mail";
    /// Signed webhooks (`webhook.*`).
    pub const WEBHOOK: &str = "outbox.webhook";
    /// The audit log (`audit.*`).
    pub const AUDIT: &str = "outbox.audit";
    /// Workflow triggers and executions (`workflow.*`).
    pub const WORKFLOW: &str = "outbox.workflow";
    /// Search indexing (`search.index.*`).
    pub const SEARCH_INDEX: &str = "outbox.search-index";
    /// RAG indexing (`rag.index.*`).
    pub const RAG_INDEX: &str = "outbox.rag-index";
    /// AI cost accounting (`ai.cost.*`).
    pub const AI_COST: &str = "outbox.ai-cost";
    /// Marketing leads (`marketing.lead.*`).
    pub const MARKETING: &str = "outbox.marketing";
    /// Form submission routing (`form.submission.*`).
    pub const FORM_SUBMISSION_ROUTE: &str = "outbox.form-submission-route";
    /// Plugin hook fan-out (`plugin.hook.*`).
    pub const PLUGIN_HOOK: &str = "outbox.plugin-hook";
    /// Plugin capability use (`plugin.capability-use.*`).
    pub const PLUGIN_CAPABILITY_USE: &str = "outbox.plugin-capability-use";
    /// Downstream: mails to send over SMTP.
    pub const TOOLCTRL_EMAIL: &str = "toolctrl.email";
    /// Downstream: one plugin invocation per subscription.
    pub const TOOLCTRL_PLUGIN_INVOKE: &str = "toolctrl.plugin-invoke";
}
