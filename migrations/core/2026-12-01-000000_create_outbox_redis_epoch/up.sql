-- What the dispatchers know about the Redis their jobs live in, so that a
-- Redis that lost data (a restart without persistence, a FLUSHALL, a
-- failover to a replica that lagged) is noticed and the jobs it lost are
-- pushed again. A DONE row only says its job was handed to Redis; these
-- tables say up to when Redis is known to have kept it.
--
-- One row per queue namespace (OUTBOX_QUEUE_PREFIX): the epoch id of the
-- marker the dispatchers keep in that Redis, the server run it was last
-- seen in, and the lease of a dispatcher that is reconciling.
CREATE TABLE outbox_redis_epoch (
    namespace             text        PRIMARY KEY,
    epoch                 uuid        NOT NULL,
    run_id                text        NOT NULL,
    checked_at            timestamptz NOT NULL,
    reconcile_lease_until timestamptz NULL,
    created_at            timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE outbox_redis_epoch IS 'The Redis marker of each queue namespace as the dispatchers last saw it (outbox reconcile, docs/reliability.md).';
COMMENT ON COLUMN outbox_redis_epoch.namespace IS 'The queue key prefix (OUTBOX_QUEUE_PREFIX; empty in production).';
COMMENT ON COLUMN outbox_redis_epoch.epoch IS 'The epoch id of the marker in Redis; a new one is written after every loss.';
COMMENT ON COLUMN outbox_redis_epoch.run_id IS 'The Redis run_id at the last check; another one means the server restarted or was replaced.';
COMMENT ON COLUMN outbox_redis_epoch.checked_at IS 'The last check that found the marker intact.';
COMMENT ON COLUMN outbox_redis_epoch.reconcile_lease_until IS 'Held by the dispatcher reconciling after a loss; others wait until it ends.';

-- Per queue: the safe point (every job handed off before it had finished
-- when last checked, so a loss cannot have taken anything still to do from
-- before it) and the reconciliation still to do after a loss, with its
-- cursor so that an interrupted one resumes.
CREATE TABLE outbox_redis_safe_point (
    namespace        text        NOT NULL REFERENCES outbox_redis_epoch (namespace) ON DELETE CASCADE,
    queue            text        NOT NULL,
    drained_before   timestamptz NOT NULL,
    pending_since    timestamptz NULL,
    pending_after_id uuid        NULL,
    PRIMARY KEY (namespace, queue)
);
COMMENT ON TABLE outbox_redis_safe_point IS 'Per queue: up to when every handed-off job is known to have finished, and a reconciliation still to do after a Redis loss.';
COMMENT ON COLUMN outbox_redis_safe_point.drained_before IS 'Every job of the queue handed off (processed_at) before this had finished at the last check.';
COMMENT ON COLUMN outbox_redis_safe_point.pending_since IS 'A reconciliation is due for DONE rows from here on (NULL: none); it advances as batches are done.';
COMMENT ON COLUMN outbox_redis_safe_point.pending_after_id IS 'With pending_since, the cursor (processed_at, id) of the last row reconciled.';

-- DONE rows of one queue in hand-off order: what the safe-point scan and
-- the reconciliation walk.
CREATE INDEX outbox_event_done_queue_idx ON outbox_event (target_queue, processed_at, id)
    WHERE status = 'DONE';
