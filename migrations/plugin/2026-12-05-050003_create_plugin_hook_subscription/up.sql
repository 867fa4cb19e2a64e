-- The plugin set's table: plugins subscribed to hooks (plugin.hook.<hook>
-- events).
--
-- Until the migrations came in sets, 2026-11-29-000002 created this table
-- with the other subscribers' tables; a database that applied it has the
-- table already, so every statement here is a no-op there (IF NOT EXISTS;
-- a comment is set again to the same text).

CREATE TABLE IF NOT EXISTS plugin_hook_subscription (
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
CREATE INDEX IF NOT EXISTS plugin_hook_subscription_hook_idx ON plugin_hook_subscription (tenant_id, hook) WHERE enabled;
COMMENT ON TABLE plugin_hook_subscription IS 'Plugins subscribed to a hook; each gets a signed invocation per `plugin.hook.<hook>` event.';
