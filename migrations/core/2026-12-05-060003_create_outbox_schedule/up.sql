-- One row per periodic event (a schedule declared on a worker or in the
-- routes file): the newest tick of the schedule that is settled, i.e.
-- published, or passed over when the schedule first started. Every worker
-- that runs the schedule tries to advance the row to the tick it is about
-- to publish, in the transaction that inserts the tick's event; the
-- conditional upsert (`... WHERE outbox_schedule.last_tick <
-- EXCLUDED.last_tick`) lets exactly one of them through, however many race.
-- The row, not the event, remembers a tick: retention may delete the event
-- and the tick is still not published again.
--
-- A schedule removed from the code leaves its row behind until
-- `DELETE FROM outbox_schedule WHERE name = '...'`.
CREATE TABLE outbox_schedule (
    name       text        PRIMARY KEY,
    last_tick  timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE outbox_schedule IS 'Periodic events: the newest settled tick of each schedule; the row that advances decides which worker publishes a tick.';
COMMENT ON COLUMN outbox_schedule.last_tick IS 'The newest tick published (or passed over at the schedule''s first start), in UTC.';
COMMENT ON COLUMN outbox_schedule.updated_at IS 'When the row last advanced.';
