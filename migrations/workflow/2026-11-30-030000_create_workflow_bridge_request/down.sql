DROP TABLE workflow_bridge_request;
