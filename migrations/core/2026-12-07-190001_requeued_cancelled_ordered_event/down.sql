DROP TRIGGER outbox_event_ordering_requeue ON outbox_event;
DROP FUNCTION outbox_ordering_requeue_cancelled();
