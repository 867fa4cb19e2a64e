//! The library side of the operator CLI `outbox`: the requeue policy and
//! its transaction ([`requeue`]), which the `outbox` binary runs for
//! `outbox requeue`, and which tests of other crates call to requeue a row
//! exactly as an operator would.

pub mod requeue;
