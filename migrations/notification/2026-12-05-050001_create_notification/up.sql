-- The notification set's table: in-app notifications, one row per
-- notification event.
--
-- Until the migrations came in sets, 2026-11-29-000002 created this table
-- with the other subscribers' tables; a database that applied it has the
-- table already, so every statement here is a no-op there (IF NOT EXISTS;
-- a comment is set again to the same text).

CREATE TABLE IF NOT EXISTS notification (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    outbox_event_id uuid        NOT NULL,
    tenant_id       text        NOT NULL,
    user_id         text        NULL,
    kind            text        NOT NULL,
    title           text        NOT NULL,
    body            text        NULL,
    data            jsonb       NOT NULL,
    read_at         timestamptz NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT notification_outbox_event_id_key UNIQUE (outbox_event_id)
);
CREATE INDEX IF NOT EXISTS notification_tenant_user_idx ON notification (tenant_id, user_id, created_at);
COMMENT ON TABLE notification IS 'In-app notifications; user_id NULL means every member of the tenant.';
