-- The wake gate's test moves from the trigger function's body into the
-- trigger's WHEN condition; what it decides is unchanged (see
-- 2026-12-04-000000_notify_only_waiting_dispatchers): an insert tries to
-- take advisory lock (1868722040, 1) shared, keeps it until its
-- transaction ends when it gets it, and notifies when it cannot (a
-- dispatcher holds the lock or queues for it).
--
-- Why: the condition of a statement-level AFTER trigger is evaluated at
-- the end of the statement, where the function body ran before, but
-- without calling PL/pgSQL. While the dispatchers are busy (no one waits
-- at the gate) the function is not called at all. On a table of this
-- schema, the PL/pgSQL call was about 3 % of Postgres' CPU at 2,000 events
-- a second (one call per publishing statement).
DROP TRIGGER outbox_event_notify_insert ON outbox_event;

CREATE OR REPLACE FUNCTION outbox_event_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_event', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_event_notify_insert
    AFTER INSERT ON outbox_event
    FOR EACH STATEMENT
    WHEN (NOT pg_try_advisory_xact_lock_shared(1868722040, 1))
    EXECUTE FUNCTION outbox_event_notify();
