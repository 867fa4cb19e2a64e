-- The audit set's table. This migration once created every subscriber's
-- table; since the migrations come in sets (the core and one per feature)
-- it creates the audit log only, under the same version, so a database
-- that applied it keeps it. The other tables it made moved to a migration
-- of their own set each (2026-12-05-05000n), written to be a no-op where
-- this one already made them.

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
