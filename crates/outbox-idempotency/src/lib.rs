//! Receiver-side idempotency for outbox subscribers.
//!
//! Queue delivery is at-least-once: a job can arrive twice (a worker died
//! before acking, the dispatcher retried a hand-off). Wrap a subscriber
//! handler in [`with_outbox_idempotency`] and it runs once per outbox event;
//! later deliveries get the first run's result back as [`Outcome::Cached`].
//!
//! A delivery first *claims* the event for a short lease (default 5 min),
//! runs the handler, then records the result for a long TTL (default
//! 24 h). A handler that fails releases its claim so that the retry runs it;
//! a handler that crashes holds the event only until its lease ends, not for
//! the whole TTL. Recording and releasing are fenced by a random
//! [`ClaimToken`], so a delivery whose lease ran out cannot clobber the one
//! that took over.
//!
//! - [`IdempotencyStore`]: the storage seam (claim, complete, release);
//! - [`RedisIdempotencyStore`]: the store on Redis, one key and one Lua
//!   script per operation;
//! - `conformance` (cargo feature `conformance`): the suite every store
//!   implementation must pass.
//!
//! What it is not: a lock for arbitrary critical sections, or a guarantee
//! across the lease. A handler that outlives its lease may run twice, so the
//! lease must exceed the handler's longest run. Only results are cached, not
//! side effects: a handler that half-succeeds and returns an error runs
//! again. Deduplication on the producer side is `dispatch_key` in
//! `outbox-publish`.

mod handler;
mod redis_store;
mod store;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use handler::{IdempotencyError, IdempotencyOptions, Outcome, with_outbox_idempotency};
pub use redis_store::RedisIdempotencyStore;
pub use store::{Claim, ClaimToken, IdempotencyStore, StoreError};
