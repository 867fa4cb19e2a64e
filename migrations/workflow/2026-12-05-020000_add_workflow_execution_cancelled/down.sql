-- Back to the six statuses. Cancelled runs cannot keep their status under
-- the old CHECK; they become `error` (their `error` still says who
-- cancelled them), the nearest status the old code knows as finished.
UPDATE workflow_execution SET status = 'error' WHERE status = 'cancelled';
ALTER TABLE workflow_execution DROP CONSTRAINT workflow_execution_status_check;
ALTER TABLE workflow_execution
    ADD CONSTRAINT workflow_execution_status_check CHECK (
        status IN ('queued', 'running', 'waiting', 'success', 'error', 'rejected')
    );
COMMENT ON COLUMN workflow_execution.status IS '`queued`, `running`, `waiting`, `success`, `error` or `rejected`.';
COMMENT ON COLUMN workflow_execution.error IS 'Why the run ended in `error` or `rejected`.';
COMMENT ON COLUMN workflow_execution.finished_at IS 'When the run reached success, error or rejected.';
