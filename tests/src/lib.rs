//! End-to-end tests of the transactional outbox. The tests live under
//! `tests/tests/`; each one gets its own Postgres database and Redis
//! namespace from `outbox-test-support`, and talks to real servers. This
//! library itself is empty.
