//! The library side of the operator CLI `outbox`: the requeue policy and
//! its transaction ([`requeue`]) and the queue checks of `outbox health`
//! ([`health`]), both `outbox-operator`'s (re-exported here, where tests
//! of other crates have always found them, to act or judge exactly as an
//! operator would), and standard output that ends quietly on a closed pipe
//! ([`stdout`]).

pub use outbox_operator::{health, requeue};
pub mod stdout;
