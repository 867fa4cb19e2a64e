DROP INDEX IF EXISTS outbox_event_done_queue_idx;
DROP TABLE IF EXISTS outbox_redis_safe_point;
DROP TABLE IF EXISTS outbox_redis_epoch;
