//! outbox-subscriber-mail (work in progress).
