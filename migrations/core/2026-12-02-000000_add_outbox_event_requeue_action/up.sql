-- `outbox cancel` records what it changed in the same history as `outbox
-- requeue`: when, why, by whom and what the row was before. `action` says
-- which command wrote the entry.
ALTER TABLE outbox_event_requeue
    ADD COLUMN action text NOT NULL DEFAULT 'requeue'
        CONSTRAINT outbox_event_requeue_action_check CHECK (action IN ('requeue', 'cancel'));
COMMENT ON COLUMN outbox_event_requeue.action IS 'requeue (outbox requeue) or cancel (outbox cancel: a PENDING or FAILED row set to CANCELLED).';
