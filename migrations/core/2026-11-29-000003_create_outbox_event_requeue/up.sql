-- Every operator requeue, kept as history of the row it touched. No foreign
-- key: the history is an audit trail and outlives the retention of DONE rows.
CREATE TABLE outbox_event_requeue (
    id                  uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    outbox_event_id     uuid        NOT NULL,
    requeued_at         timestamptz NOT NULL DEFAULT now(),
    reason              text        NOT NULL,
    requested_by        text        NULL,
    previous_status     text        NOT NULL,
    previous_retries    integer     NOT NULL,
    previous_last_error text        NULL,
    replay              boolean     NOT NULL DEFAULT false
);
CREATE INDEX outbox_event_requeue_event_idx ON outbox_event_requeue (outbox_event_id, requeued_at);
COMMENT ON TABLE outbox_event_requeue IS 'History of operator requeues (outbox requeue): when, why, and what the row was before.';
