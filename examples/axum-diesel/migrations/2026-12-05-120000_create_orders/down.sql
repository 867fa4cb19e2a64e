DROP TABLE order_confirmations;
DROP TABLE orders;
