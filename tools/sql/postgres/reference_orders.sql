-- The reference shop schema (demo, bench, tests). A real shop has its own
-- tables; order-timeout's `migrate` never creates or alters these.
--
-- Orders as the order service writes them. `expires_at` is the source of
-- truth for the payment deadline: order-timeout only cancels an order whose
-- row says UNPAID and whose expires_at has passed.
CREATE TABLE IF NOT EXISTS orders (
    id            TEXT PRIMARY KEY,
    status        TEXT NOT NULL DEFAULT 'UNPAID'
                  CHECK (status IN ('UNPAID', 'PAID', 'CANCELLED')),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at    TIMESTAMPTZ NOT NULL,
    cancelled_at  TIMESTAMPTZ,
    cancel_reason TEXT
);

-- The sweeper (safety net for orders whose timeout message was never
-- published) looks for overdue UNPAID rows; keep that cheap.
CREATE INDEX IF NOT EXISTS orders_status_expires_at ON orders (status, expires_at);

CREATE TABLE IF NOT EXISTS order_items (
    order_id TEXT   NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    sku      TEXT   NOT NULL,
    quantity BIGINT NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (order_id, sku)
);
