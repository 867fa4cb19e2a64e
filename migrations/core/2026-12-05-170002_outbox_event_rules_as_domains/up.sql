-- The single-column rules of outbox_event move from table CHECK
-- constraints into domains, one per column, each with its rule under the
-- constraint name the table's check had (an error still names
-- outbox_event_event_type_check, outbox_event_status_check, …). What is
-- refused does not change.
--
-- Why: Postgres reads and plans every CHECK constraint of a table again for
-- each statement that writes a row of it, while a domain's constraints are
-- planned once per connection and kept. With the nine table checks a
-- one-row insert took 55.8 µs of the server's CPU, with the rules in
-- domains 35.6 µs (`cargo xtask bench --only publish_overhead
-- --publish-arms all`, publish_overhead_server_us); the dispatcher's
-- updates paid the checks too.
--
-- The rule that spans two columns (a PROCESSING row carries its lease)
-- stays a table check.
--
-- How: a column changes to a domain that has no constraint yet (the same
-- storage: the table is not rewritten), then the domain gets its rule NOT
-- VALID (no scan: the table check it replaces has held for every row), and
-- the table check goes. Postgres still rebuilds the six indexes whose
-- expression or predicate names a changed column and checks the lease rule
-- again, one read of the table each, under this migration's exclusive
-- lock: on a large table, run it when a short stop of the producers is
-- acceptable. The two triggers whose conditions name ordering_key or status
-- are dropped for the change and created again unchanged.
DROP TRIGGER outbox_event_ordering_assign ON outbox_event;
DROP TRIGGER outbox_event_ordering_status ON outbox_event;

CREATE DOMAIN outbox_event_tenant_id AS text;
CREATE DOMAIN outbox_event_event_type AS text;
CREATE DOMAIN outbox_event_payload AS jsonb;
CREATE DOMAIN outbox_event_status AS text;
CREATE DOMAIN outbox_event_retries AS integer;
CREATE DOMAIN outbox_event_generation AS integer;
CREATE DOMAIN outbox_event_priority AS smallint;
CREATE DOMAIN outbox_event_ordering_key AS text;

ALTER TABLE outbox_event
    DROP CONSTRAINT outbox_event_tenant_id_check,
    DROP CONSTRAINT outbox_event_event_type_check,
    DROP CONSTRAINT outbox_event_payload_check,
    DROP CONSTRAINT outbox_event_status_check,
    DROP CONSTRAINT outbox_event_retries_check,
    DROP CONSTRAINT outbox_event_generation_check,
    DROP CONSTRAINT outbox_event_priority_check,
    DROP CONSTRAINT outbox_event_ordering_key_check,
    ALTER COLUMN tenant_id TYPE outbox_event_tenant_id,
    ALTER COLUMN event_type TYPE outbox_event_event_type,
    ALTER COLUMN payload TYPE outbox_event_payload,
    ALTER COLUMN status TYPE outbox_event_status,
    ALTER COLUMN retries TYPE outbox_event_retries,
    ALTER COLUMN generation TYPE outbox_event_generation,
    ALTER COLUMN priority TYPE outbox_event_priority,
    ALTER COLUMN ordering_key TYPE outbox_event_ordering_key;

-- The rules, as the table's checks had them
-- (2026-11-29-000001_create_outbox_event, 2026-11-30-000001_add_replay_generation,
-- 2026-12-05-060001_add_outbox_event_ordering_key, 2026-12-05-060002_add_outbox_event_priority).
ALTER DOMAIN outbox_event_tenant_id
    ADD CONSTRAINT outbox_event_tenant_id_check CHECK (VALUE <> '') NOT VALID;
-- <domain>.<entity>.<verb>[.<more>]: 3+ lowercase segments of [a-z0-9-],
-- each starting with a letter, at most 255 characters in all.
ALTER DOMAIN outbox_event_event_type
    ADD CONSTRAINT outbox_event_event_type_check CHECK (
        char_length(VALUE) <= 255
        AND VALUE ~ '^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*){2,}$'
    ) NOT VALID;
ALTER DOMAIN outbox_event_payload
    ADD CONSTRAINT outbox_event_payload_check CHECK (jsonb_typeof(VALUE) = 'object') NOT VALID;
ALTER DOMAIN outbox_event_status
    ADD CONSTRAINT outbox_event_status_check CHECK (
        VALUE IN ('PENDING', 'PROCESSING', 'DONE', 'FAILED', 'CANCELLED')
    ) NOT VALID;
ALTER DOMAIN outbox_event_retries
    ADD CONSTRAINT outbox_event_retries_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN outbox_event_generation
    ADD CONSTRAINT outbox_event_generation_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN outbox_event_priority
    ADD CONSTRAINT outbox_event_priority_check CHECK (VALUE BETWEEN -2 AND 2) NOT VALID;
-- Not empty, at most 255 characters (text cannot hold NUL at all).
ALTER DOMAIN outbox_event_ordering_key
    ADD CONSTRAINT outbox_event_ordering_key_check CHECK (
        VALUE <> '' AND char_length(VALUE) <= 255
    ) NOT VALID;

-- As 2026-12-05-060001_add_outbox_event_ordering_key created them.
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
