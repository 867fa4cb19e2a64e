DROP TABLE IF EXISTS outbox_event_requeue;
