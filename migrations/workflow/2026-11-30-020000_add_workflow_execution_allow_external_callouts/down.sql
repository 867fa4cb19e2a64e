ALTER TABLE workflow_execution DROP COLUMN allow_external_callouts;
