DROP INDEX outbox_event_claimable_idx;

CREATE INDEX outbox_event_claimable_idx
    ON outbox_event ((CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END))
    WHERE status IN ('PENDING', 'PROCESSING') AND NOT ordering_blocked;

ALTER TABLE outbox_event DROP CONSTRAINT outbox_event_priority_check;
ALTER TABLE outbox_event DROP COLUMN priority;
