-- When a row went FAILED. Operators select dead letters by it (`outbox list /
-- requeue --failed-after 2h` after a Redis outage); no other column holds that
-- instant: scheduled_at is when the row was last due, which for an unroutable
-- row is its creation and for a row out of retries is the last backoff step.
-- The dispatcher sets it in every statement that moves a row to FAILED; a
-- requeue clears it. Nullable without a default: adding it rewrites nothing.
ALTER TABLE outbox_event ADD COLUMN failed_at timestamptz NULL;

-- Rows that failed before this column existed get the best instant there is:
-- their last attempt was made once they were due, so scheduled_at is a lower
-- bound. Without it, `--failed-after` would miss every failure older than the
-- deploy. FAILED rows are few (the operators' partial index on created_at
-- covers them), so this touches little.
UPDATE outbox_event SET failed_at = scheduled_at WHERE status = 'FAILED';

-- No index of its own: a failed_at filter always comes with status = 'FAILED',
-- and outbox_event_failed_created_at_idx already narrows the scan to FAILED
-- and CANCELLED rows.

COMMENT ON COLUMN outbox_event.failed_at IS 'When the row went FAILED: set by the dispatcher, cleared by a requeue.';
