DROP TABLE IF EXISTS plugin_hook_subscription;
