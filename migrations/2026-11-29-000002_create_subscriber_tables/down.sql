DROP TABLE IF EXISTS tenant_mail_settings;
DROP TABLE IF EXISTS plugin_hook_subscription;
DROP TABLE IF EXISTS notification;
DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log;
DROP TABLE IF EXISTS audit_log;
DROP FUNCTION IF EXISTS audit_log_append_only();
DROP TABLE IF EXISTS webhook_endpoint;
