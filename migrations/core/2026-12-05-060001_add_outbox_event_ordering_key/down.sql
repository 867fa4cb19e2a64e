ALTER TABLE outbox_event_requeue DROP CONSTRAINT outbox_event_requeue_action_check;
DELETE FROM outbox_event_requeue WHERE action = 'skip';
ALTER TABLE outbox_event_requeue ADD CONSTRAINT outbox_event_requeue_action_check
    CHECK (action IN ('requeue', 'cancel'));
COMMENT ON COLUMN outbox_event_requeue.action IS 'requeue (outbox requeue) or cancel (outbox cancel: a PENDING or FAILED row set to CANCELLED).';

DROP TRIGGER outbox_event_ordering_status ON outbox_event;
DROP FUNCTION outbox_ordering_status_changed();
DROP FUNCTION outbox_ordering_advance(text, bigint);
DROP FUNCTION outbox_ordering_unblock_head(text);
DROP TRIGGER outbox_event_ordering_assign ON outbox_event;
DROP FUNCTION outbox_ordering_assign();
DROP FUNCTION outbox_ordering_wake();

DROP INDEX outbox_event_claimable_idx;
CREATE INDEX outbox_event_claimable_idx
    ON outbox_event ((CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END))
    WHERE status IN ('PENDING', 'PROCESSING');

DROP INDEX outbox_event_ordering_idx;
DROP TABLE outbox_ordering_key;
ALTER TABLE outbox_event
    DROP CONSTRAINT outbox_event_ordering_key_check,
    DROP COLUMN ordering_blocked,
    DROP COLUMN ordering_position,
    DROP COLUMN ordering_key;
