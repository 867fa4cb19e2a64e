-- Partitioning by time, opt in. `outbox_event` stays one table until an
-- operator runs `outbox partition convert`; this migration only installs
-- what a partitioned table needs, and changes nothing for one that is not.
--
-- A partitioned `outbox_event` is partitioned by range on `created_at`.
-- Its primary key is (id, created_at), since a unique index of a
-- partitioned table must hold the partition key, and a unique index on
-- `dispatch_key` alone cannot exist on it. Dispatch keys stay unique
-- across partitions through `outbox_dispatch_key` below: one row per key
-- held by a live row, taken by a BEFORE INSERT trigger whose own
-- `INSERT … ON CONFLICT DO NOTHING` on the key's primary key does what the
-- unique index does on one table (a second writer of a key waits for the
-- first one's commit or rollback, then skips or goes on).

-- One row, written by `outbox partition convert`: the table is partitioned
-- when it exists.
CREATE TABLE outbox_partitioning (
    singleton    boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    -- The width of one partition: hour, day, week or month (date_trunc's unit).
    unit         text        NOT NULL CHECK (unit IN ('hour', 'day', 'week', 'month')),
    -- How many partitions past the current one the dispatcher keeps created.
    ahead        integer     NOT NULL CHECK (ahead BETWEEN 1 AND 1000),
    -- Rows created before this instant live in the partition that was the
    -- whole table before the conversion.
    converted_at timestamptz NOT NULL,
    legacy_until timestamptz NOT NULL
);
COMMENT ON TABLE outbox_partitioning IS 'Present (one row) when outbox_event is partitioned by created_at: the partitions'' width and how many are kept created ahead (outbox partition convert).';

-- The dispatch keys held by live rows of a partitioned outbox_event. Empty
-- and unused while the table is one table (its unique index does the job).
CREATE TABLE outbox_dispatch_key (
    dispatch_key text        PRIMARY KEY,
    event_id     uuid        NOT NULL,
    created_at   timestamptz NOT NULL
);
-- Dropping a partition forgets its keys by creation time.
CREATE INDEX outbox_dispatch_key_created_at_idx ON outbox_dispatch_key (created_at);
COMMENT ON TABLE outbox_dispatch_key IS 'On a partitioned outbox_event: the dispatch key of each row that holds one, so that keys stay unique across partitions.';

-- Both trigger functions run with their owner's rights (the role that
-- migrates), so that producers need no privilege on outbox_dispatch_key.
--
-- BEFORE INSERT (a row with a key): take the key, or skip the row when a
-- live row holds it, as `ON CONFLICT DO NOTHING` would. Runs after
-- outbox_event_release_dispatch_key (triggers fire in name order), so a
-- holder whose dedupe window has passed has given the key up already.
CREATE FUNCTION outbox_dispatch_key_take() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO outbox_dispatch_key (dispatch_key, event_id, created_at)
    VALUES (NEW.dispatch_key, NEW.id, NEW.created_at)
    ON CONFLICT (dispatch_key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END;
$$;

-- AFTER DELETE, or an UPDATE that changed the key (a release sets it NULL):
-- the row no longer holds its old key.
CREATE FUNCTION outbox_dispatch_key_forget() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM outbox_dispatch_key
    WHERE dispatch_key = OLD.dispatch_key AND event_id = OLD.id;
    IF TG_OP = 'UPDATE' AND NEW.dispatch_key IS NOT NULL THEN
        INSERT INTO outbox_dispatch_key (dispatch_key, event_id, created_at)
        VALUES (NEW.dispatch_key, NEW.id, NEW.created_at);
    END IF;
    RETURN NULL;
END;
$$;
