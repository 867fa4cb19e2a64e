-- Only for a table that was never converted: a partitioned outbox_event
-- needs these (convert it back first; see docs/operations.md).
DROP FUNCTION outbox_dispatch_key_forget();
DROP FUNCTION outbox_dispatch_key_take();
DROP TABLE outbox_dispatch_key;
DROP TABLE outbox_partitioning;
