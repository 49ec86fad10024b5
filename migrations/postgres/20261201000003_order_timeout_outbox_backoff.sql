-- Fairness and visibility for outbox work that keeps failing, and what the
-- retention of finished rows needs.
--
-- attempts / next_attempt_at / last_error: every failed release or publish
-- counts an attempt and puts the row's next try off (exponentially, capped),
-- so the sweeper's scan, which takes the rows that are due first, reaches
-- newer rows instead of retrying the same oldest ones over and over.
-- gave_up_at / gave_up_reason: a release that can never succeed (the
-- inventory refused it for good, or it failed too often) is set aside: the
-- sweeper no longer takes the row, and the order is parked for an operator.
ALTER TABLE order_timeout_cancel_outbox
    ADD COLUMN IF NOT EXISTS attempts        INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS next_attempt_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS last_error      TEXT,
    ADD COLUMN IF NOT EXISTS gave_up_at      TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS gave_up_reason  TEXT;

-- The sweeper's scan: pending rows not given up, by when they are due
-- (their next attempt, or their creation if none failed yet).
CREATE INDEX IF NOT EXISTS order_timeout_cancel_outbox_due
    ON order_timeout_cancel_outbox ((coalesce(next_attempt_at, created_at)))
    WHERE (stock_released_at IS NULL OR event_published_at IS NULL)
      AND gave_up_at IS NULL;

-- Retention: finished rows, oldest first.
CREATE INDEX IF NOT EXISTS order_timeout_cancel_outbox_finished
    ON order_timeout_cancel_outbox (created_at)
    WHERE stock_released_at IS NOT NULL AND event_published_at IS NOT NULL;

-- The scan above replaces the one by creation time.
DROP INDEX IF EXISTS order_timeout_cancel_outbox_pending;
