-- Back to table CHECK constraints (2026-12-05-170002 up.sql, in reverse).
DROP TRIGGER outbox_event_ordering_assign ON outbox_event;
DROP TRIGGER outbox_event_ordering_status ON outbox_event;

ALTER TABLE outbox_event
    ALTER COLUMN tenant_id TYPE text,
    ALTER COLUMN event_type TYPE text,
    ALTER COLUMN payload TYPE jsonb,
    ALTER COLUMN status TYPE text,
    ALTER COLUMN retries TYPE integer,
    ALTER COLUMN generation TYPE integer,
    ALTER COLUMN priority TYPE smallint,
    ALTER COLUMN ordering_key TYPE text,
    ADD CONSTRAINT outbox_event_tenant_id_check CHECK (tenant_id <> ''),
    ADD CONSTRAINT outbox_event_event_type_check CHECK (
        char_length(event_type) <= 255
        AND event_type ~ '^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*){2,}$'
    ),
    ADD CONSTRAINT outbox_event_payload_check CHECK (jsonb_typeof(payload) = 'object'),
    ADD CONSTRAINT outbox_event_status_check CHECK (
        status IN ('PENDING', 'PROCESSING', 'DONE', 'FAILED', 'CANCELLED')
    ),
    ADD CONSTRAINT outbox_event_retries_check CHECK (retries >= 0),
    ADD CONSTRAINT outbox_event_generation_check CHECK (generation >= 0),
    ADD CONSTRAINT outbox_event_priority_check CHECK (priority BETWEEN -2 AND 2),
    ADD CONSTRAINT outbox_event_ordering_key_check
        CHECK (ordering_key <> '' AND char_length(ordering_key) <= 255);

DROP DOMAIN outbox_event_tenant_id;
DROP DOMAIN outbox_event_event_type;
DROP DOMAIN outbox_event_payload;
DROP DOMAIN outbox_event_status;
DROP DOMAIN outbox_event_retries;
DROP DOMAIN outbox_event_generation;
DROP DOMAIN outbox_event_priority;
DROP DOMAIN outbox_event_ordering_key;

CREATE TRIGGER outbox_event_ordering_assign
    BEFORE INSERT ON outbox_event
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION outbox_ordering_assign();

CREATE TRIGGER outbox_event_ordering_status
    AFTER UPDATE OF status ON outbox_event
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status
          AND (NEW.status IN ('FAILED', 'CANCELLED') OR OLD.status = 'FAILED'))
    EXECUTE FUNCTION outbox_ordering_status_changed();
