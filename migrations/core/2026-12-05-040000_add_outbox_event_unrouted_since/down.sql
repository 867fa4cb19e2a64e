DROP INDEX outbox_event_unrouted_idx;
ALTER TABLE outbox_event DROP COLUMN unrouted_since;
