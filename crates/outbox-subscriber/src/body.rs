//! The lenient job body: a job whose bytes do not parse must reach the
//! handler layer (and go to the dead set), not kill the worker.
//!
//! apalis decodes each fetched job with the backend's codec *before* any
//! service sees it, and a decode error there is a fatal stream error that
//! stops the worker. [`LenientRedis`] is the apalis backend of a queue with a
//! codec that never fails: it hands over the raw bytes together with the
//! parse result, and the framework dead-letters what does not parse. Its
//! Redis side is [`outbox_queue::WorkerStore`], whose scripts keep the work
//! per fetch and per job bounded whatever the backlog.

use std::convert::Infallible;
use std::task::{Context, Poll, ready};

use apalis_core::backend::codec::Codec;
use apalis_core::backend::persistence::{Persisted, TaskPersistLayer};
use apalis_core::backend::{Backend, BackendConfig, WireFormatBackend};
use apalis_core::task::Task;
use apalis_core::worker::context::WorkerContext;
use apalis_redis::RedisStorage;
use futures::future::BoxFuture;
use outbox_queue::RedisConnection;
use outbox_queue::{ResponseCodec, WorkerStore};

/// A job as fetched: its raw bytes, never decoded as a whole here. Handlers
/// decode their job type straight from the bytes, so a payload carried as
/// exact text (`outbox_model::RawJson`) keeps its numbers and nesting.
#[derive(Debug, Clone)]
pub struct JobBody {
    raw: Vec<u8>,
}

/// The top-level fields read for log lines; everything else is skipped
/// without being decoded (so any nesting or number is fine).
#[derive(serde::Deserialize)]
struct Head {
    #[serde(default)]
    outbox_event_id: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    tenant_id: Option<Box<serde_json::value::RawValue>>,
}

/// The trace context a job carries (any job type: the envelope and the
/// downstream jobs name it alike); read apart so that nothing else of the
/// body can hide it, and leniently so that it can hide nothing.
#[derive(serde::Deserialize)]
struct Traced {
    #[serde(default, deserialize_with = "outbox_trace::deserialize_lenient")]
    trace_context: Option<outbox_trace::TraceContext>,
}

/// The priority a job carries (the envelope's `priority`), read apart and
/// leniently like the trace context.
#[derive(serde::Deserialize)]
struct Prioritized {
    #[serde(
        default,
        deserialize_with = "outbox_queue::deserialize_priority_lenient"
    )]
    priority: outbox_model::Priority,
}

/// The fields that date a job's first delivery; read apart from [`Head`] so
/// that a malformed date never hides the ids.
#[derive(serde::Deserialize)]
struct Dating {
    created_at: chrono::DateTime<chrono::Utc>,
    #[serde(default)]
    generation: u32,
}

pub use outbox_queue::JobOrdering;

/// A top-level field's value as text: strings without their quotes.
fn field_text(raw: Option<&serde_json::value::RawValue>) -> Option<String> {
    let raw = raw?;
    serde_json::from_str::<String>(raw.get())
        .ok()
        .or_else(|| Some(raw.get().to_owned()))
}

impl JobBody {
    /// Wraps raw bytes.
    #[must_use]
    pub fn from_bytes(raw: Vec<u8>) -> Self {
        Self { raw }
    }

    /// The raw bytes.
    #[must_use]
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// The `outbox_event_id` and `tenant_id` fields, for log lines (`None`
    /// each when absent or `null`, or when the body is not a JSON object).
    #[must_use]
    pub fn ids(&self) -> (Option<String>, Option<String>) {
        if !self.is_object() {
            return (None, None);
        }
        match serde_json::from_slice::<Head>(&self.raw) {
            Ok(head) => (
                field_text(head.outbox_event_id.as_deref()),
                field_text(head.tenant_id.as_deref()),
            ),
            Err(_) => (None, None),
        }
    }

    /// The top-level `trace_context` field (see
    /// [`outbox_queue::OutboxJob::trace_context`]), when it is a valid W3C
    /// trace context; `None` otherwise, for any body.
    #[must_use]
    pub fn trace_context(&self) -> Option<outbox_trace::TraceContext> {
        if !self.is_object() {
            return None;
        }
        serde_json::from_slice::<Traced>(&self.raw)
            .ok()
            .and_then(|traced| traced.trace_context)
    }

    /// The top-level `priority` field (see [`outbox_queue::OutboxJob::priority`]):
    /// normal when absent or invalid, and for a body that is not an object.
    /// A retry copy of the job is pushed at this level.
    #[must_use]
    pub fn priority(&self) -> outbox_model::Priority {
        if !self.is_object() {
            return outbox_model::Priority::NORMAL;
        }
        serde_json::from_slice::<Prioritized>(&self.raw)
            .map(|p| p.priority)
            .unwrap_or_default()
    }

    /// The job's place in its ordering key, when it is an ordered event's
    /// envelope (both `ordering_key` and `ordering_position` present);
    /// `None` for any other body.
    ///
    /// ```
    /// use outbox_subscriber::{JobBody, JobOrdering};
    ///
    /// let body = JobBody::from_bytes(br#"{"ordering_key":"order-7","ordering_position":3}"#.to_vec());
    /// assert_eq!(
    ///     body.ordering(),
    ///     Some(JobOrdering { key: "order-7".into(), position: 3, generation: 0 })
    /// );
    /// assert_eq!(JobBody::from_bytes(b"{}".to_vec()).ordering(), None);
    /// ```
    #[must_use]
    pub fn ordering(&self) -> Option<JobOrdering> {
        JobOrdering::of_body(&self.raw)
    }

    /// Whether the body starts like a JSON object. Serde also reads a
    /// struct from a JSON array, by position: `["a", "b"]` would give
    /// fields "a" and "b". Only an object has named fields.
    fn is_object(&self) -> bool {
        self.raw
            .iter()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            == Some(&b'{')
    }

    /// When the event of a first delivery was recorded (the envelope's
    /// `created_at`, set in the producer's transaction): `None` for a
    /// replay (`generation` above 0), whose event was recorded long before,
    /// and for bodies without a valid `created_at` (jobs that are not
    /// outbox envelopes).
    #[must_use]
    pub fn first_delivery_created_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.ids().0?;
        serde_json::from_slice::<Dating>(&self.raw)
            .ok()
            .filter(|d| d.generation == 0)
            .map(|d| d.created_at)
    }
}

/// The never-failing codec of [`LenientRedis`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LenientCodec;

impl Codec<JobBody> for LenientCodec {
    type Compact = Vec<u8>;
    type Error = Infallible;

    fn encode(&self, input: &JobBody) -> Result<Vec<u8>, Infallible> {
        Ok(input.raw.clone())
    }

    fn decode(&self, compact: &Vec<u8>) -> Result<JobBody, Infallible> {
        Ok(JobBody::from_bytes(compact.clone()))
    }
}

/// An apalis backend on one apalis-redis queue whose jobs arrive as
/// [`JobBody`], parse errors included. Its Redis side is
/// [`outbox_queue::WorkerStore`]: fetching, acknowledging and recovering
/// jobs in bounded work per call, so a queue drains from any backlog.
pub struct LenientRedis {
    persisted: Persisted<WorkerStore>,
    codec: LenientCodec,
    retire: Option<BoxFuture<'static, Result<(), apalis_redis::Error>>>,
}

impl std::fmt::Debug for LenientRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LenientRedis")
            .field("queue", &self.persisted.config().queue)
            .finish_non_exhaustive()
    }
}

impl Clone for LenientRedis {
    fn clone(&self) -> Self {
        Self {
            persisted: self.persisted.clone(),
            codec: self.codec,
            retire: None,
        }
    }
}

impl LenientRedis {
    /// The backend of the apalis queue `config.queue`.
    #[must_use]
    pub fn new(conn: RedisConnection, config: apalis_redis::Config) -> Self {
        Self::with_store(WorkerStore::new(conn, config))
    }

    /// The backend of the apalis queue `config.queue` whose fetches heed
    /// the queue's wake-up count (see [`WorkerStore::with_wake_count`]).
    #[must_use]
    pub fn with_wake_count(
        conn: RedisConnection,
        config: apalis_redis::Config,
        count: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        Self::with_store(WorkerStore::new(conn, config).with_wake_count(count))
    }

    fn with_store(store: WorkerStore) -> Self {
        Self {
            persisted: Persisted::new(store),
            codec: LenientCodec,
            retire: None,
        }
    }
}

impl Backend for LenientRedis {
    type Task = Task<Vec<u8>>;
    type Error = apalis_redis::Error;

    fn poll_ready(
        &mut self,
        cx: &mut Context<'_>,
        worker: &WorkerContext,
    ) -> Poll<Result<(), Self::Error>> {
        let heartbeat = self.persisted.config().heartbeat_interval;
        self.persisted.poll_ready(cx, worker, heartbeat)
    }

    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
        worker: &WorkerContext,
    ) -> Poll<Option<Result<Self::Task, Self::Error>>> {
        self.persisted.poll_next(cx, worker)
    }

    fn poll_close(
        &mut self,
        cx: &mut Context<'_>,
        worker: &WorkerContext,
    ) -> Poll<Result<(), Self::Error>> {
        if self.retire.is_none() {
            ready!(self.persisted.poll_close(cx, worker))?;
            let mut conn = self.persisted.connection();
            let config = self.persisted.config().clone();
            let worker = worker.clone();
            self.retire = Some(Box::pin(async move {
                outbox_queue::retire_worker(&mut conn, &config, &worker)
                    .await
                    .map(|_| ())
            }));
        }
        match self.retire.as_mut() {
            Some(retire) => retire.as_mut().poll(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

impl BackendConfig for LenientRedis {
    type Args = JobBody;
    type Id = <RedisStorage<JobBody> as BackendConfig>::Id;
    type Kind = <RedisStorage<JobBody> as BackendConfig>::Kind;
    type Config = apalis_redis::Config;
    type Layer = TaskPersistLayer<ResponseCodec, serde_json::Value>;

    fn config(&self) -> &Self::Config {
        self.persisted.config()
    }

    fn middleware(&mut self, _worker: &mut WorkerContext) -> Self::Layer {
        // Fetching marks a job running, so no lock events are needed; the
        // results are what records done, rescheduled and dead jobs.
        let batch = self.persisted.config().batch_size;
        self.persisted
            .layer(ResponseCodec, batch)
            .persist_results(true)
            .lock_tasks(false)
    }
}

impl WireFormatBackend for LenientRedis {
    type Codec = LenientCodec;
    type Compact = Vec<u8>;

    fn codec(&self) -> &Self::Codec {
        &self.codec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Break checked: `trace_context` returning `None` fails here (the job's
    // span would start a new trace instead of continuing the producer's).
    // The ordering step of the workers reads this for every job: an
    // ordered envelope gives its key, position and generation; a body
    // without both fields, or not an object, gives none.
    #[test]
    fn an_ordered_envelope_gives_its_place_and_other_bodies_none() {
        let ordered = JobBody::from_bytes(
            br#"{"ordering_key":"order-7","ordering_position":3,"generation":2}"#.to_vec(),
        );
        assert_eq!(
            ordered.ordering(),
            Some(JobOrdering {
                key: "order-7".into(),
                position: 3,
                generation: 2
            })
        );
        for other in [
            &br#"{"ordering_key":"order-7"}"#[..],
            br#"{"ordering_position":3}"#,
            br#"[{"ordering_key":"order-7","ordering_position":3}]"#,
            b"not json",
        ] {
            assert_eq!(JobBody::from_bytes(other.to_vec()).ordering(), None);
        }
    }

    #[test]
    fn a_body_gives_its_trace_context_when_it_carries_a_valid_one() {
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let body = |raw: String| JobBody::from_bytes(raw.into_bytes());
        let traced = body(format!(
            r#"{{"outbox_event_id":"x","trace_context":{{"traceparent":"{traceparent}"}}}}"#
        ));
        assert_eq!(
            traced.trace_context().map(|cx| cx.traceparent().to_owned()),
            Some(traceparent.to_owned())
        );
        for raw in [
            r#"{"outbox_event_id":"x"}"#,
            r#"{"trace_context":{"traceparent":"not one"}}"#,
            r#"["trace_context"]"#,
            "not json",
        ] {
            assert_eq!(body(raw.to_owned()).trace_context(), None, "{raw}");
        }
    }

    #[test]
    fn a_body_gives_the_priority_its_retry_copy_is_pushed_at_and_normal_otherwise() {
        use outbox_model::Priority;
        let priority = |raw: &str| JobBody::from_bytes(raw.as_bytes().to_vec()).priority();
        assert_eq!(
            priority(r#"{"outbox_event_id":"x","priority":2}"#),
            Priority::HIGHEST
        );
        assert_eq!(priority(r#"{"priority":-1}"#), Priority::LOW);
        for raw in [
            r#"{"outbox_event_id":"x"}"#,
            r#"{"priority":7}"#,
            r#"{"priority":"high"}"#,
            "[2]",
            "not json",
        ] {
            assert_eq!(priority(raw), Priority::NORMAL, "{raw}");
        }
    }

    #[test]
    fn ids_come_from_an_object_only() {
        let ids = |raw: &str| JobBody::from_bytes(raw.as_bytes().to_vec()).ids();
        assert_eq!(
            ids(r#" {"tenant_id": 7, "outbox_event_id": "e\u0031", "x": [[]]}"#),
            (Some("e1".to_owned()), Some("7".to_owned()))
        );
        assert_eq!(ids(r#"{"outbox_event_id": null}"#), (None, None));
        // A struct also deserializes from an array, by position.
        assert_eq!(ids(r#"["e1", "t1"]"#), (None, None));
        assert_eq!(ids(r#" [""]"#), (None, None));
        assert_eq!(ids("\"e1\""), (None, None));
        assert_eq!(ids("{"), (None, None));
    }

    #[test]
    fn the_codec_keeps_the_exact_bytes_both_ways() {
        // Bytes that are not JSON, and JSON whose text a decode-and-encode
        // would change (the big number, the spacing): both come back as
        // they were, so a job handed back to the queue is the job fetched.
        for raw in [
            b"\xff not json".to_vec(),
            br#"{"n": 12345678901234567890123, "a" : [ 1 ]}"#.to_vec(),
            Vec::new(),
        ] {
            let body = LenientCodec.decode(&raw).unwrap();
            assert_eq!(body.raw(), raw.as_slice());
            assert_eq!(LenientCodec.encode(&body).unwrap(), raw);
        }
    }

    #[tokio::test]
    async fn a_backend_in_a_log_line_names_its_queue() {
        let redis = outbox_test_support::TestRedis::new().await;
        let namespace = outbox_queue::QueueNamespace::prefixed(redis.prefix());
        let config = outbox_queue::apalis_config(&namespace, "outbox.audit");
        let backend = LenientRedis::new(redis.conn().await, config);
        let shown = format!("{backend:?}");
        assert!(
            shown.starts_with("LenientRedis") && shown.contains("outbox.audit"),
            "{shown}"
        );
    }

    #[tokio::test]
    async fn the_backend_reports_the_keys_of_its_own_queue() {
        // apalis reads the worker's keys (registration, running and dead
        // jobs) from this configuration: a default one would register the
        // worker on another queue's keys.
        let redis = outbox_test_support::TestRedis::new().await;
        let namespace = outbox_queue::QueueNamespace::prefixed(redis.prefix());
        let config = outbox_queue::apalis_config(&namespace, "outbox.audit");
        let backend = LenientRedis::new(redis.conn().await, config.clone());
        let reported = BackendConfig::config(&backend);
        assert_eq!(reported.workers_set(), config.workers_set());
        assert_eq!(reported.active_jobs_list(), config.active_jobs_list());
        assert_eq!(reported.dead_jobs_set(), config.dead_jobs_set());
        assert!(reported.workers_set().starts_with(redis.prefix()));
    }

    #[test]
    fn only_a_first_delivery_of_an_envelope_has_a_commit_time() {
        let at =
            |raw: &str| JobBody::from_bytes(raw.as_bytes().to_vec()).first_delivery_created_at();
        let first = at(r#"{"outbox_event_id":"e","created_at":"2026-11-30T01:02:03Z","x":1}"#);
        assert_eq!(
            first.map(|t| t.to_rfc3339()),
            Some("2026-11-30T01:02:03+00:00".to_owned())
        );
        assert_eq!(
            at(r#"{"outbox_event_id":"e","created_at":"2026-11-30T01:02:03Z","generation":2}"#),
            None
        );
        assert_eq!(
            at(r#"{"outbox_event_id":"e","created_at":"yesterday"}"#),
            None
        );
        assert_eq!(at(r#"{"created_at":"2026-11-30T01:02:03Z"}"#), None);
    }
}
