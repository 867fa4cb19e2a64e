DROP TRIGGER IF EXISTS outbox_event_notify_insert ON outbox_event;
DROP FUNCTION IF EXISTS outbox_event_notify();
DROP TABLE IF EXISTS outbox_event;
