-- The dispatch-key trigger functions run with their owner's rights
-- (SECURITY DEFINER). Created with `SET search_path FROM CURRENT`, their
-- path did not name pg_temp, and Postgres then searches a session's
-- temporary schema first: a producer's temporary table named
-- outbox_dispatch_key would have taken the keys in place of the real one,
-- so that another session could publish a key already held. Now: the
-- schema each function lives in (where migration 2026-12-06-000001 made
-- outbox_dispatch_key beside it), then pg_temp.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY['outbox_dispatch_key_take()'::regprocedure,
                             'outbox_dispatch_key_forget()'::regprocedure] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f,
                       (SELECT n.nspname FROM pg_proc p
                        JOIN pg_namespace n ON n.oid = p.pronamespace
                        WHERE p.oid = f));
    END LOOP;
END;
$$;
