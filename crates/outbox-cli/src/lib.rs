//! The library side of the operator CLI `outbox`: the requeue policy and
//! its transaction ([`requeue`]), which the `outbox` binary runs for
//! `outbox requeue`, the queue checks of `outbox health` ([`health`]), and
//! standard output that ends quietly on a closed pipe ([`stdout`]);
//! tests of other crates call them to act or judge exactly as an operator
//! would.

pub mod health;
pub mod requeue;
pub mod stdout;
