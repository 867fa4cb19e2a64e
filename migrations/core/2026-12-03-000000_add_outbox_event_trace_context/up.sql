-- The W3C trace context (https://www.w3.org/TR/trace-context/) of the
-- transaction that recorded the event, so that the dispatcher, the job and
-- every side effect continue the producer's trace. The publisher fills both
-- columns from the span it runs in; a plain-SQL producer may set
-- `traceparent` (and `tracestate`) itself, as it would send them in HTTP
-- headers. NULL means no trace: the dispatcher starts a new one.
--
-- Plain text with no CHECK: a malformed value must never make a producer's
-- INSERT fail (and abort its transaction) over tracing. Readers validate it
-- and ignore what is not a valid trace context. Nullable without a default:
-- adding the columns rewrites nothing.
ALTER TABLE outbox_event
    ADD COLUMN traceparent text NULL,
    ADD COLUMN tracestate text NULL;

COMMENT ON COLUMN outbox_event.traceparent IS 'W3C traceparent of the producer''s span (`00-<trace id>-<span id>-<flags>`); NULL for no trace. Invalid values are ignored.';
COMMENT ON COLUMN outbox_event.tracestate IS 'W3C tracestate that goes with traceparent; ignored without it.';
