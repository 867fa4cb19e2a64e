-- Putting dead jobs back on their queue (`outbox retry-dead`, the console's
-- dead jobs page) records itself in the events' history, as a requeue does:
-- when, why, who, which job on which queue, and what the event row was
-- then. The row itself does not change (the job was handed off; only its
-- job in Redis runs again).
--
-- Nullable columns without a default: adding them rewrites nothing.
ALTER TABLE outbox_event_requeue ADD COLUMN queue text NULL;
ALTER TABLE outbox_event_requeue ADD COLUMN task_id text NULL;
COMMENT ON COLUMN outbox_event_requeue.queue IS 'retry_dead: the queue the dead job went back on; NULL for the other actions.';
COMMENT ON COLUMN outbox_event_requeue.previous_scheduled_at IS 'The row''s scheduled_at before the change; NULL for entries written before the column existed, and for retry_dead entries of a row that was gone (previous_status REMOVED).';
COMMENT ON COLUMN outbox_event_requeue.task_id IS 'retry_dead: the task id of the job put back (the event''s own job, a derived job or a retry copy of one); NULL for the other actions.';

ALTER TABLE outbox_event_requeue DROP CONSTRAINT outbox_event_requeue_action_check;
ALTER TABLE outbox_event_requeue ADD CONSTRAINT outbox_event_requeue_action_check
    CHECK (action IN ('requeue', 'cancel', 'skip', 'reschedule', 'retry_dead'));
COMMENT ON COLUMN outbox_event_requeue.action IS 'requeue (outbox requeue), cancel (outbox cancel or outbox_publish::cancel: a PENDING or FAILED row set to CANCELLED), skip (outbox ordering release --skip-event: the key moved past the event), reschedule (outbox_publish::reschedule: a PENDING row''s scheduled_at moved) or retry_dead (outbox retry-dead or the console: a dead job of the event put back on its queue; the row is unchanged).';
COMMENT ON TABLE outbox_event_requeue IS 'History of the changes made to outbox_event rows and their jobs by operators and from code (requeue, cancel, skip, reschedule, retry_dead): when, why, who, and what the row was before.';
