-- Timers (`[[timers]]`): every timer's cancellations (its status flips) keep
-- their outbox rows in this one table, keyed by the timer's name and the row's
-- id, so that one order can be flipped by several timers (auto-complete and a
-- default review of the same order, say) and each finishes its own effects.
-- Rows written before this migration belong to the default timer,
-- `cancel_unpaid`.
--
-- The key changes, so an older version of the service cannot write to the
-- migrated table (its `ON CONFLICT (order_id)` names no unique index): run
-- `migrate` as this version is deployed, not before.
ALTER TABLE order_timeout_cancel_outbox
    ADD COLUMN IF NOT EXISTS timer TEXT NOT NULL DEFAULT 'cancel_unpaid';

ALTER TABLE order_timeout_cancel_outbox
    DROP CONSTRAINT IF EXISTS order_timeout_cancel_outbox_pkey;
ALTER TABLE order_timeout_cancel_outbox
    ADD CONSTRAINT order_timeout_cancel_outbox_pkey PRIMARY KEY (timer, order_id);

-- The sweeper's scan and retention, per timer.
DROP INDEX IF EXISTS order_timeout_cancel_outbox_due;
CREATE INDEX order_timeout_cancel_outbox_due
    ON order_timeout_cancel_outbox (timer, (coalesce(next_attempt_at, created_at)))
    WHERE (stock_released_at IS NULL OR event_published_at IS NULL)
      AND gave_up_at IS NULL;

DROP INDEX IF EXISTS order_timeout_cancel_outbox_finished;
CREATE INDEX order_timeout_cancel_outbox_finished
    ON order_timeout_cancel_outbox (timer, created_at)
    WHERE stock_released_at IS NOT NULL AND event_published_at IS NOT NULL;

-- Timers with `watch`: the service finds the rows falling due within the next
-- window itself. One replica at a time scans a timer's table (the holder of the
-- lease); `scanned_until` is how far the scans have covered, so that a replica
-- taking over goes on where the last one stopped. Duplicates are harmless (the
-- row is the truth), so a lease that runs out mid-scan costs only work.
CREATE TABLE IF NOT EXISTS order_timeout_watch (
    timer         TEXT PRIMARY KEY,
    holder        TEXT,
    lease_until   TIMESTAMPTZ,
    scanned_until TIMESTAMPTZ NOT NULL
);
