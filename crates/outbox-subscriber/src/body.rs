//! The lenient job body: a job whose bytes do not parse must reach the
//! handler layer (and go to the dead set), not kill the worker.
//!
//! apalis decodes each fetched job with the backend's codec *before* any
//! service sees it, and a decode error there is a fatal stream error that
//! stops the worker. [`LenientRedis`] wraps apalis-redis' storage with a codec
//! that never fails: it hands over the raw bytes together with the parse
//! result, and the framework dead-letters what does not parse.

use std::convert::Infallible;
use std::task::{Context, Poll};

use apalis_core::backend::codec::Codec;
use apalis_core::backend::{Backend, BackendConfig, WireFormatBackend};
use apalis_core::worker::context::WorkerContext;
use apalis_redis::{ConnectionManager, RedisStorage};

/// A job as fetched: its raw bytes and whether they are JSON.
#[derive(Debug, Clone)]
pub struct JobBody {
    raw: Vec<u8>,
    parsed: Result<serde_json::Value, String>,
}

impl JobBody {
    /// Wraps raw bytes, parsing them as JSON.
    #[must_use]
    pub fn from_bytes(raw: Vec<u8>) -> Self {
        let parsed = serde_json::from_slice(&raw).map_err(|e| e.to_string());
        Self { raw, parsed }
    }

    /// The JSON value, or why the bytes are not JSON.
    ///
    /// # Errors
    ///
    /// The parser's message when the body is not JSON.
    pub fn json(&self) -> Result<&serde_json::Value, &str> {
        self.parsed.as_ref().map_err(String::as_str)
    }

    /// The raw bytes.
    #[must_use]
    pub fn raw(&self) -> &[u8] {
        &self.raw
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

/// apalis-redis storage whose jobs arrive as [`JobBody`], parse errors included.
#[derive(Debug, Clone)]
pub struct LenientRedis {
    inner: RedisStorage<JobBody>,
    codec: LenientCodec,
}

impl LenientRedis {
    /// The storage of the apalis queue `config.queue`.
    #[must_use]
    pub fn new(conn: ConnectionManager, config: apalis_redis::Config) -> Self {
        Self {
            inner: RedisStorage::new(conn).with_config(config),
            codec: LenientCodec,
        }
    }
}

impl Backend for LenientRedis {
    type Task = <RedisStorage<JobBody> as Backend>::Task;
    type Error = <RedisStorage<JobBody> as Backend>::Error;

    fn poll_ready(
        &mut self,
        cx: &mut Context<'_>,
        worker: &WorkerContext,
    ) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx, worker)
    }

    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
        worker: &WorkerContext,
    ) -> Poll<Option<Result<Self::Task, Self::Error>>> {
        self.inner.poll_next(cx, worker)
    }

    fn poll_close(
        &mut self,
        cx: &mut Context<'_>,
        worker: &WorkerContext,
    ) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_close(cx, worker)
    }
}

impl BackendConfig for LenientRedis {
    type Args = JobBody;
    type Id = <RedisStorage<JobBody> as BackendConfig>::Id;
    type Kind = <RedisStorage<JobBody> as BackendConfig>::Kind;
    type Config = <RedisStorage<JobBody> as BackendConfig>::Config;
    type Layer = <RedisStorage<JobBody> as BackendConfig>::Layer;

    fn config(&self) -> &Self::Config {
        self.inner.config()
    }

    fn middleware(&mut self, worker: &mut WorkerContext) -> Self::Layer {
        self.inner.middleware(worker)
    }
}

impl WireFormatBackend for LenientRedis {
    type Codec = LenientCodec;
    type Compact = Vec<u8>;

    fn codec(&self) -> &Self::Codec {
        &self.codec
    }
}
