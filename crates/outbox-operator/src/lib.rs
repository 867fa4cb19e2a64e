//! The operator's policy, shared by the CLI (`outbox`) and the console
//! (`outbox-console`): which rows a requeue changes and which it refuses,
//! and the transaction that requeues them ([`requeue`]), the same for a
//! cancel ([`cancel`]), putting dead jobs back with their history entries
//! ([`dead`]), the guard of actions on many rows or jobs ([`confirm`]), and
//! which queue figures raise an alert ([`health`]). Both front ends act and judge
//! through these functions, so `outbox requeue <id>` and the console's
//! requeue button refuse and record the same things, and the console shows
//! the alerts `outbox health` exits 1 on.
//!
//! Not a front end and not an owner of tables: no parsing of arguments, no
//! rendering, no SQL (the statements are `outbox-store`'s, the Redis reads
//! `outbox-queue`'s). It depends on neither the dispatcher nor the workflow
//! crates, so a crate that embeds the console compiles none of them.
//!
//! # Example
//!
//! ```no_run
//! # async fn run(conn: &mut diesel_async::AsyncPgConnection, id: uuid::Uuid) -> Result<(), outbox_store::StoreError> {
//! use outbox_operator::requeue::{execute, plan};
//! let rows = outbox_store::candidate(conn, id).await?.into_iter().collect();
//! let plan = plan(rows, false);
//! for refused in &plan.refused {
//!     println!("refused: {}", refused.refused.as_deref().unwrap_or_default());
//! }
//! let done = execute(conn, &plan, "the queue is back", Some("ana"), false).await?;
//! println!("requeued {}", done.requeued.len());
//! # Ok(()) }
//! ```

mod batches;
pub mod cancel;
pub mod confirm;
pub mod dead;
pub mod health;
pub mod requeue;
