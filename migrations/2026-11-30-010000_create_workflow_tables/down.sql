DROP TABLE application_event;
DROP TABLE entity_row;
DROP TABLE workflow_block_execution;
DROP TABLE workflow_execution;
DROP TABLE workflow_version;
DROP TABLE workflow;
