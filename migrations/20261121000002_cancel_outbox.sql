-- Transactional outbox: the row is inserted in the same statement that flips
-- an order UNPAID -> CANCELLED, so "cancelled" and "stock release + event
-- still to do" commit together. A redelivered message, or the sweeper, finds
-- the pending work here and finishes it; the inventory call is idempotent by
-- order id, so finishing twice releases stock once.
CREATE TABLE IF NOT EXISTS cancel_outbox (
    order_id           TEXT PRIMARY KEY REFERENCES orders (id) ON DELETE CASCADE,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    stock_released_at  TIMESTAMPTZ,
    event_published_at TIMESTAMPTZ,
    -- Lease: the worker finishing this row's work. Another delivery for the
    -- same order (a duplicate, another replica) waits for the lease instead
    -- of calling the inventory concurrently; after a crash the lease runs
    -- out and a redelivery takes over.
    claimed_until      TIMESTAMPTZ
);

CREATE INDEX IF NOT EXISTS cancel_outbox_pending ON cancel_outbox (created_at)
    WHERE stock_released_at IS NULL OR event_published_at IS NULL;
