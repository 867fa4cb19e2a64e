//! The publisher only accepts a transaction handle: passing a plain
//! connection or a pool must not compile.

#[test]
fn publisher_rejects_non_transaction_handles_at_compile_time() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
