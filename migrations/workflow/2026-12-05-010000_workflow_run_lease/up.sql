-- One writer per run (docs/workflows.md, "One writer per run"). Every job
-- that advances a run (trigger, run request, answer, timeout, redelivery,
-- the sweep's resume) first takes the run's lease: it writes a fresh
-- `lease_owner` and a `lease_until` in the future, and only when the lease is
-- free (never taken, released, or expired). Every later write of that job
-- (each block's transaction, the wait, the end) locks the row and checks
-- that `lease_owner` is still its own: a job whose lease was taken over
-- writes nothing more. A job that finds the lease live leaves the run alone.
ALTER TABLE workflow_execution
    ADD COLUMN lease_owner uuid NULL,
    ADD COLUMN lease_until timestamptz NULL;

COMMENT ON COLUMN workflow_execution.lease_owner IS 'The job holding the run (a fresh id per take); the fence every block write checks.';
COMMENT ON COLUMN workflow_execution.lease_until IS 'Until when the holder may write without renewing; NULL or past: anyone may take the run. The sweep resumes running runs whose lease ran out.';

-- A block whose work happens before its transaction (an httpRequest call, a
-- code block on the bridge) is claimed first: a `running` row committed
-- before the call, so that the call happens only under a live lease and a
-- rerun can tell a call that may have been made (the row is `running`) from
-- one that never was (no row). The rerun updates that row, counting the
-- attempt, instead of adding one.
ALTER TABLE workflow_block_execution
    DROP CONSTRAINT workflow_block_execution_status_check,
    ADD CONSTRAINT workflow_block_execution_status_check CHECK (
        status IN ('running', 'success', 'error', 'waiting')
    ),
    ADD COLUMN attempt integer NOT NULL DEFAULT 1,
    ADD CONSTRAINT workflow_block_execution_attempt_check CHECK (attempt >= 1);

COMMENT ON COLUMN workflow_block_execution.status IS '`running` (claimed before its call), `success`, `error` or `waiting`.';
COMMENT ON COLUMN workflow_block_execution.attempt IS 'How many times the block was claimed: 2 or more means an earlier holder died after claiming it (its call may have been made).';
