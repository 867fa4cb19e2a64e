-- The mail set's table: per-tenant mail settings (marketing leads go to
-- the sales inbox).
--
-- Until the migrations came in sets, 2026-11-29-000002 created this table
-- with the other subscribers' tables; a database that applied it has the
-- table already, so every statement here is a no-op there (IF NOT EXISTS;
-- a comment is set again to the same text).

CREATE TABLE IF NOT EXISTS tenant_mail_settings (
    tenant_id    text PRIMARY KEY,
    sales_inbox  text NOT NULL,
    from_address text NULL,
    CONSTRAINT tenant_mail_settings_sales_inbox_check CHECK (sales_inbox LIKE '%@%')
);
COMMENT ON TABLE tenant_mail_settings IS 'Per-tenant mail settings: the sales inbox for marketing leads, an optional sender.';
