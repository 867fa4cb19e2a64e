-- A priority per event: among due events a higher one is claimed first, so
-- a password-reset mail does not wait behind a newsletter backlog of the
-- same queue. 0 is normal, positive is more urgent, negative is bulk; five
-- levels (outbox_model::Priority), so the claim can take one index range
-- per level.
--
-- A constant default is stored in the catalog: adding the column rewrites
-- nothing. The CHECK reads every row once, under the lock this migration
-- already holds.
ALTER TABLE outbox_event ADD COLUMN priority smallint NOT NULL DEFAULT 0;

ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_priority_check
    CHECK (priority BETWEEN -2 AND 2);

COMMENT ON COLUMN outbox_event.priority IS
    'Claim order among due events: -2 (bulk) to 2 (most urgent), 0 normal.';

-- The claim index, now led by the priority (same partial predicate as
-- 2026-12-05-060001_add_outbox_event_ordering_key, same due expression as
-- 2026-11-29-000001_create_outbox_event). The claim
-- (outbox_store::CLAIM_SQL) reads one level at a time, highest first, each
-- as an index range scan `priority = p AND due <= now()` in due order: an
-- empty level costs one index descent, and rows scheduled for later are
-- never walked. Every level of the claim repeats the predicate.
DROP INDEX outbox_event_claimable_idx;

CREATE INDEX outbox_event_claimable_idx
    ON outbox_event (priority, (CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END))
    WHERE status IN ('PENDING', 'PROCESSING') AND NOT ordering_blocked;
