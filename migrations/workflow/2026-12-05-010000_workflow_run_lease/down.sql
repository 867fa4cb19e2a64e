ALTER TABLE workflow_block_execution
    DROP CONSTRAINT workflow_block_execution_attempt_check,
    DROP COLUMN attempt;
-- Claimed blocks whose call never got a result cannot be kept under the old
-- statuses: the rerun that follows calls again.
DELETE FROM workflow_block_execution WHERE status = 'running';
ALTER TABLE workflow_block_execution
    DROP CONSTRAINT workflow_block_execution_status_check,
    ADD CONSTRAINT workflow_block_execution_status_check CHECK (
        status IN ('success', 'error', 'waiting')
    );
COMMENT ON COLUMN workflow_block_execution.status IS '`success`, `error` or `waiting`.';

ALTER TABLE workflow_execution
    DROP COLUMN lease_until,
    DROP COLUMN lease_owner;
