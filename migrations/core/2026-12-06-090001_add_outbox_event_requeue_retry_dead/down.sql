-- The retry_dead entries go with the action they need: the older CHECK
-- refuses them.
ALTER TABLE outbox_event_requeue DROP CONSTRAINT outbox_event_requeue_action_check;
DELETE FROM outbox_event_requeue WHERE action = 'retry_dead';
ALTER TABLE outbox_event_requeue ADD CONSTRAINT outbox_event_requeue_action_check
    CHECK (action IN ('requeue', 'cancel', 'skip', 'reschedule'));
COMMENT ON COLUMN outbox_event_requeue.action IS 'requeue (outbox requeue), cancel (outbox cancel or outbox_publish::cancel: a PENDING or FAILED row set to CANCELLED), skip (outbox ordering release --skip-event: the key moved past the event) or reschedule (outbox_publish::reschedule: a PENDING row''s scheduled_at moved).';
COMMENT ON TABLE outbox_event_requeue IS 'History of the changes made to outbox_event rows by operators and from code (requeue, cancel, skip, reschedule): when, why, and what the row was before.';

COMMENT ON COLUMN outbox_event_requeue.previous_scheduled_at IS 'The row''s scheduled_at before the change (every action); NULL for entries written before the column existed.';

ALTER TABLE outbox_event_requeue DROP COLUMN task_id;
ALTER TABLE outbox_event_requeue DROP COLUMN queue;
