-- Runs started by a workflow's own row events make no external callouts
-- (docs/workflows.md, "Runner and subscriber"). The trigger event carries
-- `allowExternalCallouts`; the execution keeps it, so the runner sees it on
-- the first run, on a rerun after a crash and on a resumed wait alike.
-- Existing runs were started by requests or people: they keep callouts.
ALTER TABLE workflow_execution
    ADD COLUMN allow_external_callouts boolean NOT NULL DEFAULT true;
COMMENT ON COLUMN workflow_execution.allow_external_callouts IS 'False for runs started by an event a workflow''s own row block caused: their httpRequest blocks fail instead of calling out.';
