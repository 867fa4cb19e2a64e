-- Replay generations. `outbox requeue --replay` of a DONE row starts a new
-- delivery generation of the event instead of deleting what the previous
-- run left in Redis: the new generation has its own task id and its own
-- receiver idempotency keys, so its side effects run once more while every
-- protection of the earlier generations stays in place, and a replay whose
-- transaction fails changes nothing anywhere. Generation 0 is the first
-- delivery and keeps the task id `outbox:<event id>`.
ALTER TABLE outbox_event
    ADD COLUMN generation integer NOT NULL DEFAULT 0
        CONSTRAINT outbox_event_generation_check CHECK (generation >= 0);
COMMENT ON COLUMN outbox_event.generation IS 'Delivery generation: 0 for the first delivery, n after the n-th replay (outbox requeue --replay). Task ids and receiver idempotency keys include it from 1 on.';

ALTER TABLE outbox_event_requeue ADD COLUMN generation integer NULL;
COMMENT ON COLUMN outbox_event_requeue.generation IS 'The generation a replay started; NULL for a requeue of a FAILED or CANCELLED row (same generation).';
