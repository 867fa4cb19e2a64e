DROP TRIGGER outbox_event_release_dispatch_key ON outbox_event;
DROP FUNCTION outbox_event_release_dispatch_key();
ALTER TABLE outbox_event DROP COLUMN released_dispatch_key;
ALTER TABLE outbox_event DROP COLUMN dedupe_while_pending;
ALTER TABLE outbox_event DROP COLUMN dedupe_for;
