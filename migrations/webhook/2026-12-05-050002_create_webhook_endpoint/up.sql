-- The webhook set's table: where a tenant's webhook.* events are delivered.
--
-- Until the migrations came in sets, 2026-11-29-000002 created this table
-- with the other subscribers' tables; a database that applied it has the
-- table already, so every statement here is a no-op there (IF NOT EXISTS;
-- a comment is set again to the same text).

CREATE TABLE IF NOT EXISTS webhook_endpoint (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id   text        NOT NULL,
    url         text        NOT NULL,
    secret      text        NOT NULL,
    event_types text[]      NOT NULL DEFAULT '{}',
    enabled     boolean     NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_endpoint_url_check CHECK (url ~ '^https?://'),
    CONSTRAINT webhook_endpoint_secret_check CHECK (secret <> '')
);
CREATE INDEX IF NOT EXISTS webhook_endpoint_tenant_idx ON webhook_endpoint (tenant_id) WHERE enabled;
COMMENT ON TABLE webhook_endpoint IS 'Where a tenant''s webhook.* events are delivered, signed.';
COMMENT ON COLUMN webhook_endpoint.secret IS 'Standard Webhooks signing secret (`whsec_<base64>`, or raw text).';
COMMENT ON COLUMN webhook_endpoint.event_types IS 'Filter: exact event types or prefixes ending in `.` or `*`; empty means every webhook.* event.';
