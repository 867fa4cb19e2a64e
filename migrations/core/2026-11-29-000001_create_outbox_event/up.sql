-- The transactional outbox: one row per side effect, written in the same
-- transaction as the business change that causes it.
CREATE TABLE outbox_event (
    id           uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id    text        NOT NULL,
    event_type   text        NOT NULL,
    payload      jsonb       NOT NULL,
    dispatch_key text        NULL,
    status       text        NOT NULL DEFAULT 'PENDING',
    retries      integer     NOT NULL DEFAULT 0,
    scheduled_at timestamptz NOT NULL DEFAULT now(),
    locked_until timestamptz NULL,
    processed_at timestamptz NULL,
    last_error   text        NULL,
    target_queue text        NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT outbox_event_dispatch_key_key UNIQUE (dispatch_key),
    CONSTRAINT outbox_event_tenant_id_check CHECK (tenant_id <> ''),
    -- <domain>.<entity>.<verb>[.<more>]: 3+ lowercase segments of [a-z0-9-],
    -- each starting with a letter, at most 255 characters in all.
    CONSTRAINT outbox_event_event_type_check CHECK (
        char_length(event_type) <= 255
        AND event_type ~ '^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*){2,}$'
    ),
    CONSTRAINT outbox_event_payload_check CHECK (jsonb_typeof(payload) = 'object'),
    CONSTRAINT outbox_event_status_check CHECK (
        status IN ('PENDING', 'PROCESSING', 'DONE', 'FAILED', 'CANCELLED')
    ),
    CONSTRAINT outbox_event_retries_check CHECK (retries >= 0),
    -- A PROCESSING row always carries its lease; the lease is also the fencing
    -- token that the dispatcher's outcome updates compare against.
    CONSTRAINT outbox_event_lease_check CHECK (
        status <> 'PROCESSING' OR locked_until IS NOT NULL
    )
);

-- The claim index. A row is claimable from one instant on: a PENDING row from
-- its scheduled_at, a PROCESSING row from the end of its lease (crash
-- recovery). One partial expression index over that instant lets the claim
-- walk due rows in order with a single index range scan, never touching DONE,
-- FAILED or CANCELLED rows. The dispatcher's claim query repeats this exact
-- expression; `cargo xtask test` checks its plan.
CREATE INDEX outbox_event_claimable_idx
    ON outbox_event ((CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END))
    WHERE status IN ('PENDING', 'PROCESSING');

-- Retention walks DONE rows by age.
CREATE INDEX outbox_event_done_processed_at_idx
    ON outbox_event (processed_at)
    WHERE status = 'DONE';

-- Operators look at failures by time (outbox list / requeue filters).
CREATE INDEX outbox_event_failed_created_at_idx
    ON outbox_event (created_at)
    WHERE status IN ('FAILED', 'CANCELLED');

-- Wake the dispatcher for rows written by any producer, plain SQL included.
-- Statement level: a batch insert sends one notification, not one per row.
CREATE FUNCTION outbox_event_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_event', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_event_notify_insert
    AFTER INSERT ON outbox_event
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();

COMMENT ON TABLE outbox_event IS 'Side effects recorded in the same transaction as the business write that causes them.';
COMMENT ON COLUMN outbox_event.id IS 'UUIDv7 from the publisher; gen_random_uuid() for plain-SQL producers.';
COMMENT ON COLUMN outbox_event.tenant_id IS 'The tenant the event belongs to.';
COMMENT ON COLUMN outbox_event.event_type IS '`<domain>.<entity>.<verb>[.<more>]`; the dispatcher routes on it.';
COMMENT ON COLUMN outbox_event.payload IS 'A JSON object, at most 1 MiB.';
COMMENT ON COLUMN outbox_event.dispatch_key IS 'Optional producer idempotency key, unique while the row exists.';
COMMENT ON COLUMN outbox_event.status IS 'PENDING, PROCESSING, DONE, FAILED or CANCELLED.';
COMMENT ON COLUMN outbox_event.retries IS 'Failed hand-off attempts so far.';
COMMENT ON COLUMN outbox_event.scheduled_at IS 'Not claimable before this instant.';
COMMENT ON COLUMN outbox_event.locked_until IS 'End of the lease of a PROCESSING row; also its fencing token.';
COMMENT ON COLUMN outbox_event.processed_at IS 'When the hand-off to the queue was recorded (DONE).';
COMMENT ON COLUMN outbox_event.last_error IS 'Why the last hand-off attempt failed.';
COMMENT ON COLUMN outbox_event.target_queue IS 'The queue the event was routed to.';
COMMENT ON COLUMN outbox_event.created_at IS 'When the event was recorded.';
