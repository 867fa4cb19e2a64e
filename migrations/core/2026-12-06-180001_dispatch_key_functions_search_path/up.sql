-- The dispatch-key trigger functions run with their owner's rights
-- (SECURITY DEFINER). Created with `SET search_path FROM CURRENT`, their
-- path did not name pg_temp, and Postgres then searches a session's
-- temporary schema first: a producer's temporary table named
-- outbox_dispatch_key would have taken the keys in place of the real one,
-- so that another session could publish a key already held. The schema
-- they were created in first, pg_temp last.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION outbox_dispatch_key_take() SET search_path = %I, pg_temp',
        current_schema());
    EXECUTE format(
        'ALTER FUNCTION outbox_dispatch_key_forget() SET search_path = %I, pg_temp',
        current_schema());
END;
$$;
