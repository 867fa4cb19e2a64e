DROP TRIGGER outbox_event_notify_insert ON outbox_event;

CREATE OR REPLACE FUNCTION outbox_event_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(1868722040, 1) THEN
        PERFORM pg_notify('outbox_event', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_event_notify_insert
    AFTER INSERT ON outbox_event
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();
