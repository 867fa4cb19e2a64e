DROP TABLE application_event;
DROP TABLE entity_row;
DROP TABLE workflow_block_execution;
DROP TABLE workflow_execution;
-- workflow and workflow_version reference each other: drop both at once.
DROP TABLE workflow_version, workflow;
