//! What must not compile: the publisher only accepts a transaction handle
//! (passing a plain connection or a pool is an error, for the diesel and
//! the sqlx publisher alike), and a typed event's type must follow the
//! naming rule (the derive reports the broken rule).

#[test]
fn publisher_rejects_non_transaction_handles_at_compile_time() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}

/// The sqlx publisher takes `&mut sqlx::Transaction<'_, Postgres>`: a
/// `PgPool`, a bare `PgConnection` or a pooled connection does not compile.
#[cfg(feature = "sqlx")]
#[test]
fn sqlx_publisher_rejects_non_transaction_handles_at_compile_time() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/sqlx/*.rs");
}

/// One case per refusal of `#[derive(OutboxEvent)]`: no attribute, each
/// rule of the event-type naming rule (the rule's own message at the
/// string), a malformed attribute, an unknown key on a field, a priority
/// out of range, an ordering key on two fields, and a type that is not a
/// struct with named fields.
#[test]
fn outbox_event_derive_refuses_each_broken_rule_at_compile_time() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/event_derive/*.rs");
}
