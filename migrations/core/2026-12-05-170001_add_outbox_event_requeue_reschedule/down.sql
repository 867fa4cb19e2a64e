-- The reschedule entries go with the action they need: the older CHECK
-- refuses them.
ALTER TABLE outbox_event_requeue DROP CONSTRAINT outbox_event_requeue_action_check;
DELETE FROM outbox_event_requeue WHERE action = 'reschedule';
ALTER TABLE outbox_event_requeue ADD CONSTRAINT outbox_event_requeue_action_check
    CHECK (action IN ('requeue', 'cancel', 'skip'));
COMMENT ON COLUMN outbox_event_requeue.action IS 'requeue (outbox requeue), cancel (outbox cancel: a PENDING or FAILED row set to CANCELLED) or skip (outbox ordering release --skip-event: the key moved past the event).';

ALTER TABLE outbox_event_requeue DROP COLUMN previous_scheduled_at;
COMMENT ON TABLE outbox_event_requeue IS 'History of operator requeues (outbox requeue): when, why, and what the row was before.';
