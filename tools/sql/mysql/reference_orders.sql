-- The reference shop schema on MySQL/MariaDB (tests): the same shape as the
-- PostgreSQL one. A real shop has its own tables; order-timeout's `migrate`
-- never creates or alters these. Times are UTC (the default `time_zone`).
CREATE TABLE IF NOT EXISTS orders (
    id            VARCHAR(128) NOT NULL PRIMARY KEY,
    status        VARCHAR(16)  NOT NULL DEFAULT 'UNPAID',
    created_at    DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    expires_at    DATETIME(6)  NOT NULL,
    cancelled_at  DATETIME(6)  NULL,
    cancel_reason VARCHAR(255) NULL,
    KEY orders_status_expires_at (status, expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS order_items (
    order_id VARCHAR(128) NOT NULL,
    sku      VARCHAR(128) NOT NULL,
    quantity BIGINT       NOT NULL,
    PRIMARY KEY (order_id, sku)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Stock kept in the shop's own database, for `bench --stock also`: given back by
-- an `[orders].also` statement in the cancel transaction instead of over gRPC.
CREATE TABLE IF NOT EXISTS shop_stock (
    sku       VARCHAR(128) NOT NULL PRIMARY KEY,
    available BIGINT       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
