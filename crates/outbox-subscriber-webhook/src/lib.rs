//! outbox-subscriber-webhook (work in progress).
