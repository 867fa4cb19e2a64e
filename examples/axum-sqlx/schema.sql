-- The service's own tables, created at start if missing (src/lib.rs,
-- `migrate`). They sit next to the outbox's in the same database.
CREATE TABLE IF NOT EXISTS orders (
    id bigserial PRIMARY KEY,
    tenant_id text NOT NULL,
    customer text NOT NULL,
    total_cents bigint NOT NULL CHECK (total_cents >= 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Written by the handler of OrderPlaced: one row per order, so a
-- redelivered event changes nothing (delivery is at least once).
CREATE TABLE IF NOT EXISTS order_confirmations (
    order_id bigint PRIMARY KEY REFERENCES orders (id),
    outbox_event_id uuid NOT NULL,
    confirmed_at timestamptz NOT NULL DEFAULT now()
);
