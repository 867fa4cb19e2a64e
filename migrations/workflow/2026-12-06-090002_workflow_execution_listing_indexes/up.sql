-- The listings of runs newest first that name no tenant: every run (the
-- console's executions page without filters, `outbox workflow executions`) and
-- one workflow's runs (its page). Without these, such a listing read and
-- sorted every matching run; along them it reads the newest ones and
-- stops, and pages by keyset on (created_at, id).
--
-- Each index costs every run's insert a little; a run writes its blocks'
-- rows too, so the share is small. On a large table, create them first
-- with CREATE INDEX CONCURRENTLY under these names: the migration then
-- finds them and takes no lock.
CREATE INDEX IF NOT EXISTS workflow_execution_created_idx
    ON workflow_execution (created_at, id);
CREATE INDEX IF NOT EXISTS workflow_execution_workflow_created_idx
    ON workflow_execution (workflow_id, created_at, id);
