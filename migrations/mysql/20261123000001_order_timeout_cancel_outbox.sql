-- The service's own table on MySQL/MariaDB: the transactional outbox (see the
-- PostgreSQL migration for what it is for). No foreign key into the shop's
-- tables; the order id is kept as text in its canonical form. Times are UTC.
CREATE TABLE IF NOT EXISTS order_timeout_cancel_outbox (
    order_id           VARCHAR(128) NOT NULL PRIMARY KEY,
    created_at         DATETIME(6)  NOT NULL,
    stock_released_at  DATETIME(6)  NULL,
    event_published_at DATETIME(6)  NULL,
    claimed_until      DATETIME(6)  NULL,
    KEY order_timeout_cancel_outbox_created (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
