-- Timers (`[[timers]]`): every timer's cancellations (its status flips) keep
-- their outbox rows in this one table, keyed by the timer's name and the row's
-- id (see the PostgreSQL migration of the same name). Rows written before this
-- migration belong to the default timer, `cancel_unpaid`. The sweeper's scan
-- and retention indexes lead with the timer.
ALTER TABLE order_timeout_cancel_outbox
    ADD COLUMN timer VARBINARY(64) NOT NULL DEFAULT 'cancel_unpaid' FIRST,
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (timer, order_id),
    DROP KEY order_timeout_cancel_outbox_sweep,
    ADD KEY order_timeout_cancel_outbox_sweep (timer, sweep_at),
    DROP KEY order_timeout_cancel_outbox_pending,
    ADD KEY order_timeout_cancel_outbox_pending (timer, pending, created_at);

-- Timers with `watch`: the lease of the replica that scans a timer's table,
-- and how far the scans have covered (UTC), as in PostgreSQL.
CREATE TABLE IF NOT EXISTS order_timeout_watch (
    timer         VARBINARY(64) NOT NULL PRIMARY KEY,
    holder        VARCHAR(64)   NULL,
    lease_until   DATETIME(6)   NULL,
    scanned_until DATETIME(6)   NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
