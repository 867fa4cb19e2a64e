//! outbox-worker (work in progress).
