-- Rows set aside are tried again on a slow schedule (issue: a row set aside must not be
-- skipped for good just because nothing changes it): `attempts` counts the failures of
-- the row as it is (1 when first set aside; back to 1 when the row changes), and the
-- sweeper skips the row only until `retry_at` (an hour after each of the first 24
-- failures, a day after later ones; `order-timeout set-aside retry` sets it to now).
-- Marks made before this migration are tried again an hour after it.
--
-- Additive: two columns with defaults, read and written only by this version and later
-- ones; the previous version's statements on the table name their columns and run
-- unchanged beside it.
ALTER TABLE order_timeout_set_aside
    ADD COLUMN IF NOT EXISTS attempts INTEGER NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS retry_at TIMESTAMPTZ NOT NULL DEFAULT now() + interval '1 hour';
