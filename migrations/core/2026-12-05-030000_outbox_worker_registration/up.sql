-- What each worker process runs, as it said at start: the queues its
-- handlers consume, the routing rules it adds to the standard table and the
-- descriptions of its subscribers (queues, routes, fed queues, keys). The
-- operator CLI reads it, so that `outbox health`, `outbox dead` and
-- `outbox reconcile` also follow an application's own subscribers, which
-- the CLI's own code does not know.
--
-- One row per worker name and queue prefix (several replicas of one worker
-- write the same row); a worker writes its row again at every start, so
-- the row says what the latest start ran. A worker that is retired leaves
-- its row behind until `DELETE FROM outbox_worker_registration WHERE worker
-- = '...'` (its queues then stop appearing).
CREATE TABLE outbox_worker_registration (
    queue_prefix  text        NOT NULL,
    worker        text        NOT NULL,
    worker_group  text        NOT NULL,
    version       text        NOT NULL,
    -- The queues the worker's handlers consume.
    handlers      text[]      NOT NULL,
    -- Its routing rules beyond the standard table: [{"prefix", "queue"}].
    routes        jsonb       NOT NULL,
    -- Its subscribers' descriptions (see outbox_catalog::registration).
    subscribers   jsonb       NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_prefix, worker)
);

COMMENT ON TABLE outbox_worker_registration IS 'What each worker runs, written at its start: its handlers'' queues, its own routing rules and its subscribers'' descriptions; the operator CLI reads it.';
COMMENT ON COLUMN outbox_worker_registration.handlers IS 'The queues the worker''s handlers consume.';
COMMENT ON COLUMN outbox_worker_registration.routes IS 'Its routing rules beyond the standard table: [{"prefix", "queue"}].';
COMMENT ON COLUMN outbox_worker_registration.subscribers IS 'Its subscribers'' descriptions: [{"name", "consumes", "feeds", "dedup"}].';
