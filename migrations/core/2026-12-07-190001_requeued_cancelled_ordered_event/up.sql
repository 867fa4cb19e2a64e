-- A CANCELLED ordered event brought back to PENDING (`outbox requeue`):
-- once its key has moved past it (it was the head when cancelled, or the
-- key reached it while it was cancelled), its old position is one the key
-- counts as finished, so it was never claimed (still blocked) or was
-- acknowledged by the worker without running its handler. It now takes
-- the key's next position, as an event published at that moment would,
-- and runs after the key's events published before the requeue. An event
-- the key has not reached yet keeps its place. Either way it is blocked
-- while the key is held or an earlier event of the key is unfinished.
--
-- The store's requeue locks the keys' rows before the events' rows, the
-- order the worker's `outbox_ordering_advance` takes them in.
CREATE FUNCTION outbox_ordering_requeue_cancelled() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    k outbox_ordering_key%ROWTYPE;
BEGIN
    SELECT * INTO k FROM outbox_ordering_key
    WHERE ordering_key = NEW.ordering_key
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    IF k.done_position >= NEW.ordering_position THEN
        UPDATE outbox_ordering_key
        SET last_position = last_position + 1, updated_at = now()
        WHERE ordering_key = NEW.ordering_key
        RETURNING * INTO k;
        NEW.ordering_position := k.last_position;
    END IF;
    NEW.ordering_blocked := k.held_event_id IS NOT NULL
        OR EXISTS (
            SELECT 1 FROM outbox_event e
            WHERE e.ordering_key = NEW.ordering_key
              AND e.ordering_position > k.done_position
              AND e.ordering_position < NEW.ordering_position
              AND e.status <> 'CANCELLED'
              AND e.id <> NEW.id);
    RETURN NEW;
END;
$$;

CREATE TRIGGER outbox_event_ordering_requeue
    BEFORE UPDATE OF status ON outbox_event
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL AND OLD.status = 'CANCELLED' AND NEW.status = 'PENDING')
    EXECUTE FUNCTION outbox_ordering_requeue_cancelled();
