DROP INDEX IF EXISTS workflow_execution_workflow_created_idx;
DROP INDEX IF EXISTS workflow_execution_created_idx;
