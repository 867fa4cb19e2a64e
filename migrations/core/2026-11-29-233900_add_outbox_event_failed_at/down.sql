ALTER TABLE outbox_event DROP COLUMN IF EXISTS failed_at;
