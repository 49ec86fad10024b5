-- The locks that order the `also` statements of concurrent cancellations (`also_keys`):
-- before an order's `also` statements run, its cancel transaction locks the rows here
-- whose `slot` is a hash of each key its `also_keys` query returns (its items' SKUs),
-- in ascending order of slot (`SELECT … ORDER BY slot FOR UPDATE`). Two orders whose
-- `also` statements write the same shop rows then take their first common slot one
-- after the other, and never wait for each other in a cycle, whatever order the
-- database's plan visits the shop's rows in. The rows are never written: 4,096 fixed
-- slots (keys sharing a slot wait for each other, briefly, and never deadlock).
--
-- Additive: a new table, read only by this version and later ones.
CREATE TABLE IF NOT EXISTS order_timeout_also_locks (
    slot INTEGER PRIMARY KEY
);
INSERT INTO order_timeout_also_locks (slot)
SELECT s FROM generate_series(0, 4095) AS s
ON CONFLICT DO NOTHING;
