-- Tables the subscribers write to or read from.

-- Where a tenant's webhook.* events are delivered.
CREATE TABLE webhook_endpoint (
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
CREATE INDEX webhook_endpoint_tenant_idx ON webhook_endpoint (tenant_id) WHERE enabled;
COMMENT ON TABLE webhook_endpoint IS 'Where a tenant''s webhook.* events are delivered, signed.';
COMMENT ON COLUMN webhook_endpoint.secret IS 'Standard Webhooks signing secret (`whsec_<base64>`, or raw text).';
COMMENT ON COLUMN webhook_endpoint.event_types IS 'Filter: exact event types or prefixes ending in `.` or `*`; empty means every webhook.* event.';

-- The append-only audit log, one row per audit.* event.
CREATE TABLE audit_log (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    outbox_event_id uuid        NOT NULL,
    tenant_id       text        NOT NULL,
    event_type      text        NOT NULL,
    actor           text        NULL,
    payload         jsonb       NOT NULL,
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT audit_log_outbox_event_id_key UNIQUE (outbox_event_id)
);
CREATE INDEX audit_log_tenant_occurred_idx ON audit_log (tenant_id, occurred_at);
COMMENT ON TABLE audit_log IS 'Append-only audit log: one row per audit.* event; updates and deletes are refused.';

CREATE FUNCTION audit_log_append_only() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only';
END;
$$;
CREATE TRIGGER audit_log_append_only
    BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();

-- In-app notifications, one row per notification event.
CREATE TABLE notification (
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
CREATE INDEX notification_tenant_user_idx ON notification (tenant_id, user_id, created_at);
COMMENT ON TABLE notification IS 'In-app notifications; user_id NULL means every member of the tenant.';

-- Plugins subscribed to hooks (plugin.hook.<hook> events).
CREATE TABLE plugin_hook_subscription (
    id         uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id  text        NOT NULL,
    plugin     text        NOT NULL,
    hook       text        NOT NULL,
    endpoint   text        NOT NULL,
    secret     text        NOT NULL,
    enabled    boolean     NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT plugin_hook_subscription_key UNIQUE (tenant_id, plugin, hook),
    CONSTRAINT plugin_hook_subscription_endpoint_check CHECK (endpoint ~ '^https?://'),
    CONSTRAINT plugin_hook_subscription_secret_check CHECK (secret <> '')
);
CREATE INDEX plugin_hook_subscription_hook_idx ON plugin_hook_subscription (tenant_id, hook) WHERE enabled;
COMMENT ON TABLE plugin_hook_subscription IS 'Plugins subscribed to a hook; each gets a signed invocation per `plugin.hook.<hook>` event.';

-- Per-tenant mail settings (marketing leads go to the sales inbox).
CREATE TABLE tenant_mail_settings (
    tenant_id    text PRIMARY KEY,
    sales_inbox  text NOT NULL,
    from_address text NULL,
    CONSTRAINT tenant_mail_settings_sales_inbox_check CHECK (sales_inbox LIKE '%@%')
);
COMMENT ON TABLE tenant_mail_settings IS 'Per-tenant mail settings: the sales inbox for marketing leads, an optional sender.';
