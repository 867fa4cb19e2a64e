-- An event whose type no routing rule of the claiming dispatcher matches is
-- not dead-lettered at once: during a rolling deploy the old dispatcher
-- claims events whose route only the new version has. The row goes back to
-- PENDING, due again a little later, and `unrouted_since` records when a
-- dispatcher first found no route for it; after the grace period
-- (OUTBOX_UNROUTED_GRACE_SECONDS) it goes FAILED and keeps the stamp, so a
-- dispatcher that has a route for the type later hands it off again without
-- an operator. Any other outcome clears it.
--
-- Adding a nullable column without a default rewrites nothing.
ALTER TABLE outbox_event ADD COLUMN unrouted_since timestamptz;

COMMENT ON COLUMN outbox_event.unrouted_since IS
    'When a dispatcher first found no route for the event: set while it waits for one (PENDING) and on a FAILED (unrouted) row; NULL otherwise.';

-- Rows waiting for a route, or dead-lettered for the lack of one, are few:
-- this index holds only them, so counting them (the gauge, outbox health)
-- and finding the types a new route may serve never scan the table. No
-- hot-path statement changes the column of a row that has it NULL, so the
-- hand-off's updates stay heap-only.
CREATE INDEX outbox_event_unrouted_idx ON outbox_event (event_type)
    WHERE unrouted_since IS NOT NULL;
