DROP TABLE IF EXISTS tenant_mail_settings;
