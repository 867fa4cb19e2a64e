-- Request ids the workflow bridge accepted, so that a captured request
-- replayed inside the signature window is refused. Rows older than the
-- window are pruned by the bridge.
CREATE TABLE workflow_bridge_request (
    request_id  uuid        PRIMARY KEY,
    received_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX workflow_bridge_request_received_at ON workflow_bridge_request (received_at);
