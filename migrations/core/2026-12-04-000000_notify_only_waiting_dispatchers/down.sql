CREATE OR REPLACE FUNCTION outbox_event_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_event', '');
    RETURN NULL;
END;
$$;
