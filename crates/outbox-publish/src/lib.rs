//! The transactional publisher: what an application depends on to record a
//! side effect (a mail, a webhook, an audit entry, a workflow trigger) in the
//! same Postgres transaction as the business write that causes it.
//!
//! [`publish_outbox_event`] and [`publish_outbox_events`] only accept an
//! [`OutboxTx`], a handle that proves a transaction is open; a plain
//! connection or a pool does not compile. If the transaction rolls back, the
//! event is gone with the business row; if it commits, the dispatcher
//! (`outbox-dispatch`) will hand the event to its queue, however the process
//! dies afterwards.
//!
//! This crate only writes rows. It does not route, enqueue or deliver.
//!
//! # Transactions and locks
//!
//! Publishing is one `INSERT … ON CONFLICT (dispatch_key) DO NOTHING`, so a
//! duplicate dispatch key never raises an error that would abort the caller's
//! transaction. Two concurrent transactions that publish the same dispatch
//! key serialize on the unique index: the second waits for the first to
//! commit or roll back, then reports [`PublishOutcome::Duplicate`] (or
//! inserts, if the first rolled back). The insert trigger sends a
//! `NOTIFY outbox_event` that Postgres delivers at commit, waking the
//! dispatcher; nothing is sent for a rolled-back transaction.

mod error;
mod event;
mod publish;
mod tx;

pub use error::PublishError;
pub use event::NewOutboxEvent;
pub use publish::{PublishOutcome, publish_outbox_event, publish_outbox_events};
pub use tx::{NotInTransaction, OutboxTx};

/// The README's publishing example, compiled as a doctest so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
