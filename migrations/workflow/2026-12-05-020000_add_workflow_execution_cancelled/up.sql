-- A run can be cancelled by a person (`outbox workflow cancel`, or
-- `store::cancel_execution` from a console): a run that is `queued`,
-- `running` or `waiting` ends `cancelled`, with `error` saying who
-- cancelled it. It is a status of its own, not `error`, because nothing
-- failed: a dashboard counting failed runs must not count runs someone
-- stopped on purpose. The runner re-reads the status under a row lock
-- before every block, so a cancelled run stops at its next block.
--
-- Only the CHECK changes: `cancelled` is a finished status, so it needs no
-- `waiting_block` (the waiting CHECK holds as it is) and stays out of the
-- partial index of stuck runs (`queued`, `running`).
ALTER TABLE workflow_execution DROP CONSTRAINT workflow_execution_status_check;
ALTER TABLE workflow_execution
    ADD CONSTRAINT workflow_execution_status_check CHECK (
        status IN ('queued', 'running', 'waiting', 'success', 'error', 'rejected', 'cancelled')
    );
COMMENT ON COLUMN workflow_execution.status IS '`queued`, `running`, `waiting`, `success`, `error`, `rejected` or `cancelled`.';
COMMENT ON COLUMN workflow_execution.error IS 'Why the run ended in `error` or `rejected`, or who cancelled it (`cancelled by <who>`).';
COMMENT ON COLUMN workflow_execution.finished_at IS 'When the run reached success, error, rejected or cancelled.';
