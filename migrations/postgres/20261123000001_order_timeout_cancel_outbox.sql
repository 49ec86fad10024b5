-- The service's own table: the transactional outbox. A row is inserted in the
-- same transaction that flips an order unpaid -> cancelled, so "cancelled" and
-- "stock release + event still to do" commit together. A redelivered message,
-- or the sweeper, finds the pending work here and finishes it; the inventory
-- call is idempotent by order id, so finishing twice releases stock once.
--
-- No foreign key into the shop's orders table: the service never alters the
-- shop's schema, and the shop may keep its orders under any name and key type
-- (the order id is stored as text).
CREATE TABLE IF NOT EXISTS order_timeout_cancel_outbox (
    order_id           TEXT PRIMARY KEY,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    stock_released_at  TIMESTAMPTZ,
    event_published_at TIMESTAMPTZ,
    -- Lease: the worker finishing this row's work. Another delivery for the
    -- same order (a duplicate, another replica) waits for the lease instead
    -- of calling the inventory concurrently; after a crash the lease runs
    -- out and a redelivery takes over.
    claimed_until      TIMESTAMPTZ
);

CREATE INDEX IF NOT EXISTS order_timeout_cancel_outbox_pending
    ON order_timeout_cancel_outbox (created_at)
    WHERE stock_released_at IS NULL OR event_published_at IS NULL;

-- Upgrading from a version that kept the outbox in `cancel_outbox` (with its
-- migrations in `_sqlx_migrations`): carry its rows over, so releases that
-- were pending at the upgrade are still finished. The old table is left in
-- place for the operator to drop.
DO $$
BEGIN
    IF to_regclass('cancel_outbox') IS NOT NULL THEN
        INSERT INTO order_timeout_cancel_outbox
            (order_id, created_at, stock_released_at, event_published_at, claimed_until)
        SELECT order_id, created_at, stock_released_at, event_published_at, claimed_until
          FROM cancel_outbox
        ON CONFLICT (order_id) DO NOTHING;
    END IF;
END
$$;
