DROP TABLE IF EXISTS webhook_endpoint;
