//! [`ConsumedQueue`]: how a subscriber crate says which queues it consumes
//! and what it reads from an event's payload there, so that the routing
//! table users read (the README's, checked by a test) comes from the crates
//! that own the handlers.

/// One queue a subscriber crate's handler consumes, and the payload fields
/// that handler reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumedQueue {
    /// The queue name (`outbox.audit`).
    pub queue: &'static str,
    /// The payload fields the handler reads, in a few words for a table
    /// cell (Markdown).
    pub payload: &'static str,
}
