ALTER TABLE outbox_event DROP COLUMN tracestate, DROP COLUMN traceparent;
