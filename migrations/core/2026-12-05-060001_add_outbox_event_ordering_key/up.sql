-- Per-key ordered delivery. Events that share an `ordering_key` reach their
-- handler one at a time, in the order they were written; keys never wait
-- for each other. A producer (the publisher, or plain SQL) sets only
-- `ordering_key`; the trigger below numbers the event within its key and
-- decides whether it may be claimed yet.
--
-- Nullable columns without a default, and one boolean with a constant
-- default: adding them rewrites nothing.
ALTER TABLE outbox_event
    ADD COLUMN ordering_key text NULL,
    ADD COLUMN ordering_position bigint NULL,
    ADD COLUMN ordering_blocked boolean NOT NULL DEFAULT false;

-- Not empty, at most 255 characters (text cannot hold NUL at all). Added
-- NOT VALID and validated apart: the validation only takes a SHARE UPDATE
-- EXCLUSIVE lock, so producers keep writing while it reads the table.
ALTER TABLE outbox_event
    ADD CONSTRAINT outbox_event_ordering_key_check
        CHECK (ordering_key <> '' AND char_length(ordering_key) <= 255) NOT VALID;
ALTER TABLE outbox_event VALIDATE CONSTRAINT outbox_event_ordering_key_check;

COMMENT ON COLUMN outbox_event.ordering_key IS 'Events with the same key are handled one at a time in the order they were written; NULL: unordered.';
COMMENT ON COLUMN outbox_event.ordering_position IS 'The event''s place within its key (1, 2, 3, …), set by the insert trigger in commit order.';
COMMENT ON COLUMN outbox_event.ordering_blocked IS 'True while an earlier event of the key is unfinished: the row is not claimable.';

-- One row per ordering key: how far the key was written and how far it was
-- handled, and why it stops when it does.
CREATE TABLE outbox_ordering_key (
    ordering_key  text        PRIMARY KEY,
    last_position bigint      NOT NULL,
    done_position bigint      NOT NULL DEFAULT 0,
    held_event_id uuid        NULL,
    held_since    timestamptz NULL,
    held_reason   text        NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE outbox_ordering_key IS 'Per ordering key: the last position written, the last one finished, and the hold that stops it (outbox ordering list / release).';
COMMENT ON COLUMN outbox_ordering_key.last_position IS 'The position the latest event of the key got.';
COMMENT ON COLUMN outbox_ordering_key.done_position IS 'Every event of the key up to this position is finished (handled, skipped or cancelled).';
COMMENT ON COLUMN outbox_ordering_key.held_event_id IS 'The event the key waits on because it failed for good (dead job or FAILED row); NULL when not held.';
COMMENT ON COLUMN outbox_ordering_key.held_since IS 'When the key was held.';
COMMENT ON COLUMN outbox_ordering_key.held_reason IS 'Why the held event failed.';

-- Held keys are few: counting them (the gauge, outbox health) reads only them.
CREATE INDEX outbox_ordering_key_held_idx ON outbox_ordering_key (held_since)
    WHERE held_event_id IS NOT NULL;

-- The events of one key by position: the next one to unblock, and whether
-- an earlier one is unfinished. Only ordered rows are in it.
CREATE INDEX outbox_event_ordering_idx ON outbox_event (ordering_key, ordering_position)
    WHERE ordering_key IS NOT NULL;

-- The claim index, recreated with one more predicate term: a blocked row is
-- not claimable, and never in the index. The expression is unchanged (the
-- claim in outbox-store repeats it and adds `AND NOT ordering_blocked`).
-- ORDERING: the only change to this index is `AND NOT ordering_blocked`.
DROP INDEX outbox_event_claimable_idx;
CREATE INDEX outbox_event_claimable_idx
    ON outbox_event ((CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END))
    WHERE status IN ('PENDING', 'PROCESSING') AND NOT ordering_blocked;

-- Wakes the dispatchers after a row became claimable, through the same
-- gate as the insert trigger (2026-12-04-220000_wake_gate_in_trigger_condition):
-- notify when a dispatcher waits at advisory lock (1868722040, 1); else
-- hold the lock shared until this transaction ends, so a dispatcher that
-- starts to wait is let in only after this commit and claims once more.
CREATE FUNCTION outbox_ordering_wake() RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(1868722040, 1) THEN
        PERFORM pg_notify('outbox_event', '');
    END IF;
END;
$$;

-- Numbers a new ordered event and decides whether it may be claimed.
--
-- The upsert locks the key's row until the inserting transaction ends: a
-- second writer of the same key waits for the first one's commit (or
-- rollback, which also undoes the first one's increment). So positions are
-- dense (1, 2, 3, …) and their order is the commit order. The one gap is an
-- insert skipped by `ON CONFLICT (dispatch_key) DO NOTHING` after this
-- trigger ran; every reader below steps over missing positions.
--
-- The row is blocked while the key is held or an earlier event of the key
-- is unfinished (a position above done_position that is not CANCELLED).
CREATE FUNCTION outbox_ordering_assign() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    k outbox_ordering_key%ROWTYPE;
BEGIN
    INSERT INTO outbox_ordering_key AS o (ordering_key, last_position)
    VALUES (NEW.ordering_key, 1)
    ON CONFLICT (ordering_key) DO UPDATE
        SET last_position = o.last_position + 1, updated_at = now()
    RETURNING o.* INTO k;
    NEW.ordering_position := k.last_position;
    NEW.ordering_blocked := k.held_event_id IS NOT NULL
        OR (k.last_position > k.done_position + 1 AND EXISTS (
            SELECT 1 FROM outbox_event e
            WHERE e.ordering_key = NEW.ordering_key
              AND e.ordering_position > k.done_position
              AND e.ordering_position < k.last_position
              AND e.status <> 'CANCELLED'));
    RETURN NEW;
END;
$$;

-- Unordered inserts do not call the function at all (the WHEN condition is
-- evaluated without PL/pgSQL).
CREATE TRIGGER outbox_event_ordering_assign
    BEFORE INSERT ON outbox_event
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION outbox_ordering_assign();

-- Moves the key past CANCELLED events at its head and unblocks the first
-- unfinished one (waking the dispatchers when it was blocked). The caller
-- holds the key's row lock.
CREATE FUNCTION outbox_ordering_unblock_head(p_key text) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    done bigint;
    head record;
BEGIN
    SELECT done_position INTO done FROM outbox_ordering_key WHERE ordering_key = p_key;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    LOOP
        SELECT id, ordering_position, status INTO head FROM outbox_event
        WHERE ordering_key = p_key AND ordering_position > done
        ORDER BY ordering_position
        LIMIT 1;
        EXIT WHEN NOT FOUND;
        IF head.status = 'CANCELLED' THEN
            done := head.ordering_position;
            CONTINUE;
        END IF;
        UPDATE outbox_event SET ordering_blocked = false WHERE id = head.id AND ordering_blocked;
        IF FOUND THEN
            PERFORM outbox_ordering_wake();
        END IF;
        EXIT;
    END LOOP;
    UPDATE outbox_ordering_key SET done_position = done, updated_at = now()
    WHERE ordering_key = p_key AND done_position < done;
END;
$$;

-- Records that the event at `p_position` of `p_key` is finished (its
-- handler succeeded, or it was skipped): done_position moves to it, the
-- hold is cleared and the next event is unblocked. Idempotent: returns
-- false and changes nothing when the key is already past the position.
CREATE FUNCTION outbox_ordering_advance(p_key text, p_position bigint) RETURNS boolean
    LANGUAGE plpgsql AS $$
BEGIN
    UPDATE outbox_ordering_key
    SET done_position = p_position, held_event_id = NULL, held_since = NULL,
        held_reason = NULL, updated_at = now()
    WHERE ordering_key = p_key AND done_position < p_position;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM outbox_ordering_unblock_head(p_key);
    RETURN true;
END;
$$;

-- What a change of an ordered row's status does to its key:
-- - CANCELLED (outbox cancel): a cancelled head no longer stops the key
--   (nor holds it);
-- - FAILED (the dispatcher dead-lettered it): the key is held on it;
-- - FAILED to anything else (outbox requeue): the hold on it is lifted, the
--   key still waits for the event to finish.
CREATE FUNCTION outbox_ordering_status_changed() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'CANCELLED' THEN
        UPDATE outbox_ordering_key
        SET held_event_id = NULL, held_since = NULL, held_reason = NULL, updated_at = now()
        WHERE ordering_key = NEW.ordering_key AND held_event_id = NEW.id;
        PERFORM 1 FROM outbox_ordering_key WHERE ordering_key = NEW.ordering_key FOR UPDATE;
        PERFORM outbox_ordering_unblock_head(NEW.ordering_key);
    ELSIF NEW.status = 'FAILED' THEN
        UPDATE outbox_ordering_key
        SET held_event_id = NEW.id, held_since = now(),
            held_reason = coalesce(NEW.last_error, 'dead-lettered by the dispatcher'),
            updated_at = now()
        WHERE ordering_key = NEW.ordering_key AND done_position < NEW.ordering_position;
    ELSE
        UPDATE outbox_ordering_key
        SET held_event_id = NULL, held_since = NULL, held_reason = NULL, updated_at = now()
        WHERE ordering_key = NEW.ordering_key AND held_event_id = NEW.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_event_ordering_status
    AFTER UPDATE OF status ON outbox_event
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status
          AND (NEW.status IN ('FAILED', 'CANCELLED') OR OLD.status = 'FAILED'))
    EXECUTE FUNCTION outbox_ordering_status_changed();

-- `outbox ordering release --skip-event` records itself in the history.
ALTER TABLE outbox_event_requeue DROP CONSTRAINT outbox_event_requeue_action_check;
ALTER TABLE outbox_event_requeue ADD CONSTRAINT outbox_event_requeue_action_check
    CHECK (action IN ('requeue', 'cancel', 'skip'));
COMMENT ON COLUMN outbox_event_requeue.action IS 'requeue (outbox requeue), cancel (outbox cancel: a PENDING or FAILED row set to CANCELLED) or skip (outbox ordering release --skip-event: the key moved past the event).';
