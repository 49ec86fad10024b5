-- Rows set aside are tried again on a slow schedule (issue: a row set aside must not be
-- skipped for good just because nothing changes it): `attempts` counts the failures of
-- the row as it is (1 when first set aside; back to 1 when the row changes), and the
-- sweeper skips the row only until `retry_at` (UTC: an hour after each of the first 24
-- failures, a day after later ones; `order-timeout set-aside retry` sets it to now).
-- Marks made before this migration are tried again by the first sweep after it (a
-- constant default: MySQL before 8.0.13 has no expression defaults), parked no second
-- time if they still fail. One statement, needing only ALTER on the table.
--
-- Additive: two columns with defaults, read and written only by this version and later
-- ones; the previous version's statements on the table name their columns and run
-- unchanged beside it.
ALTER TABLE order_timeout_set_aside
    ADD COLUMN attempts INT NOT NULL DEFAULT 1,
    ADD COLUMN retry_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00';
