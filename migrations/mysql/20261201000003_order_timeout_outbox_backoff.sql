-- Fairness and visibility for outbox work that keeps failing (see the
-- PostgreSQL migration of the same name for what the columns are for).
--
-- MySQL and MariaDB have no partial or expression indexes: `sweep_at` is a
-- generated column that is the time a pending, not given-up row is due
-- (its next attempt, or its creation if none failed yet) and NULL for every
-- other row, so an index on it is a range of exactly the rows the sweeper
-- may take, in the order it takes them. Retention deletes finished rows
-- through the existing (pending, created_at) index.
ALTER TABLE order_timeout_cancel_outbox
    ADD COLUMN attempts        INT NOT NULL DEFAULT 0,
    ADD COLUMN next_attempt_at DATETIME(6) NULL,
    ADD COLUMN last_error      TEXT NULL,
    ADD COLUMN gave_up_at      DATETIME(6) NULL,
    ADD COLUMN gave_up_reason  TEXT NULL,
    ADD COLUMN sweep_at DATETIME(6) AS (
        CASE WHEN (stock_released_at IS NULL OR event_published_at IS NULL)
                  AND gave_up_at IS NULL
             THEN COALESCE(next_attempt_at, created_at) END
    ) VIRTUAL,
    ADD KEY order_timeout_cancel_outbox_sweep (sweep_at);
