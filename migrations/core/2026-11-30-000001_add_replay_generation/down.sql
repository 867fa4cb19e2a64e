ALTER TABLE outbox_event_requeue DROP COLUMN generation;
ALTER TABLE outbox_event DROP COLUMN generation;
