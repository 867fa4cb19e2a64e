//! Receiver-side idempotency (work in progress).
