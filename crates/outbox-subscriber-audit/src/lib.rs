//! outbox-subscriber-audit (work in progress).
