ALTER TABLE outbox_event_requeue DROP COLUMN action;
