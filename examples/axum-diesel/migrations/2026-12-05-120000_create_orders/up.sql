-- The service's own tables. They sit next to the outbox's in the same
-- database and the same __diesel_schema_migrations table; the version
-- (20261205120000) differs from every outbox migration's.
CREATE TABLE orders (
    id bigserial PRIMARY KEY,
    tenant_id text NOT NULL,
    customer text NOT NULL,
    total_cents bigint NOT NULL CHECK (total_cents >= 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Written by the handler of OrderPlaced: one row per order, so a
-- redelivered event changes nothing (delivery is at least once).
CREATE TABLE order_confirmations (
    order_id bigint PRIMARY KEY REFERENCES orders (id),
    outbox_event_id uuid NOT NULL,
    confirmed_at timestamptz NOT NULL DEFAULT now()
);
