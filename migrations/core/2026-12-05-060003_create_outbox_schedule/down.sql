DROP TABLE outbox_schedule;
