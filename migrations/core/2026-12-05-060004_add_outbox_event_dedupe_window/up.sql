-- Dedupe windows: how long a dispatch key keeps out a second event with the
-- same key. Without a window (both columns at their defaults) the key is
-- held while the row exists, until retention deletes it (DONE rows) or
-- forever (FAILED and CANCELLED rows are never deleted). With
-- `dedupe_while_pending` the key is free again once the event has left
-- PENDING and PROCESSING (handed off, failed or cancelled); with
-- `dedupe_for` once `created_at + dedupe_for` has passed; with both, at the
-- first of the two. The publisher sets them (outbox_publish::Dedupe); a
-- plain-SQL producer may set them itself.
--
-- Nullable without a default, and a constant default: adding the columns
-- rewrites nothing.
ALTER TABLE outbox_event
    ADD COLUMN dedupe_for interval NULL;
ALTER TABLE outbox_event
    ADD COLUMN dedupe_while_pending boolean NOT NULL DEFAULT false;
ALTER TABLE outbox_event
    ADD COLUMN released_dispatch_key text NULL;

COMMENT ON COLUMN outbox_event.dedupe_for IS
    'Dedupe window: the dispatch key is free again once created_at + dedupe_for has passed; NULL for no time limit.';
COMMENT ON COLUMN outbox_event.dedupe_while_pending IS
    'Dedupe window: the dispatch key is free again once the event is no longer PENDING or PROCESSING.';
COMMENT ON COLUMN outbox_event.released_dispatch_key IS
    'The dispatch key the row held until a newer event with the same key was recorded after the row''s dedupe window; NULL otherwise.';

-- The window is enforced where the key is taken: before a keyed row is
-- inserted, a holder of its key whose window has passed gives the key up
-- (dispatch_key NULL, the key kept in released_dispatch_key so operators
-- can still find the row), and the insert then takes it. So every
-- producer, plain SQL included, gets the windows, and `ON CONFLICT
-- (dispatch_key)` sees only a live holder. The trigger's condition is
-- evaluated without calling PL/pgSQL: unkeyed inserts pay nothing; a keyed
-- insert pays one lookup on the unique index of dispatch_key.
--
-- `now()` is the inserting transaction's start, as created_at is. Two
-- transactions inserting the same released key serialize on the holder's
-- row lock: the second one's update then finds the key gone from the
-- holder, and its insert meets the first one's row (a duplicate).
CREATE FUNCTION outbox_event_release_dispatch_key() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    UPDATE outbox_event
    SET released_dispatch_key = dispatch_key, dispatch_key = NULL
    WHERE dispatch_key = NEW.dispatch_key
      AND ((dedupe_while_pending AND status NOT IN ('PENDING', 'PROCESSING'))
           OR created_at + dedupe_for <= now());
    RETURN NEW;
END;
$$;

CREATE TRIGGER outbox_event_release_dispatch_key
    BEFORE INSERT ON outbox_event
    FOR EACH ROW
    WHEN (NEW.dispatch_key IS NOT NULL)
    EXECUTE FUNCTION outbox_event_release_dispatch_key();
