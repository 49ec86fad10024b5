-- The locks that order the `also` statements of concurrent cancellations (`also_keys`):
-- before an order's `also` statements run, its cancel transaction locks the rows here
-- whose `slot` is a hash of each key its `also_keys` query returns (its items' SKUs),
-- in ascending order of slot (`SELECT … WHERE slot IN (…) FOR UPDATE` reads the primary
-- key in order). Two orders whose `also` statements write the same shop rows then take
-- their first common slot one after the other, and never wait for each other in a
-- cycle, whatever order the server's plan visits the shop's rows in. The rows are never
-- written: 4,096 fixed slots (keys sharing a slot wait for each other, briefly, and
-- never deadlock).
--
-- Additive: a new table, read only by this version and later ones. The slots come from
-- a cross join of constants (MySQL 5.7 has no recursive common table expression).
CREATE TABLE IF NOT EXISTS order_timeout_also_locks (
    slot INT NOT NULL PRIMARY KEY
) ENGINE = InnoDB;
INSERT IGNORE INTO order_timeout_also_locks (slot)
SELECT a.n + 8 * b.n + 64 * c.n + 512 * d.n
  FROM (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
        UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7) a
 CROSS JOIN (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
        UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7) b
 CROSS JOIN (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
        UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7) c
 CROSS JOIN (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
        UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7) d;
