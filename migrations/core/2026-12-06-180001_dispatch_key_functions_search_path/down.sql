ALTER FUNCTION outbox_dispatch_key_take() SET search_path FROM CURRENT;
ALTER FUNCTION outbox_dispatch_key_forget() SET search_path FROM CURRENT;
