-- Wake a dispatcher only when one waits. `NOTIFY` makes each committing
-- transaction take one database-wide lock and hold it through its commit,
-- so publishing transactions that notify commit one after another instead
-- of sharing WAL flushes. A dispatcher with nothing to claim queues for
-- advisory lock (1868722040, 1) exclusively (outbox_model::WAKE_GATE_LOCK);
-- while one holds it or queues for it, this trigger cannot take it shared
-- and notifies. While none does (the dispatchers are busy, or none runs),
-- the inserting transaction takes it shared and sends nothing: the shared
-- lock lasts until the transaction ends, so a dispatcher's request is
-- granted only after this transaction committed, and the dispatcher claims
-- once more when it is.
CREATE OR REPLACE FUNCTION outbox_event_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(1868722040, 1) THEN
        PERFORM pg_notify('outbox_event', '');
    END IF;
    RETURN NULL;
END;
$$;
