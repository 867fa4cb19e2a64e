DROP TABLE IF EXISTS notification;
