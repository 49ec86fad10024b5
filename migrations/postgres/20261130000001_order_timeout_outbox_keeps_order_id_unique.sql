-- Expand (0.2.0): keep the outbox's order ids unique on their own while a
-- 0.1.0 replica may still run.
--
-- 0.1.0 writes outbox rows with `ON CONFLICT (order_id) DO NOTHING`, which
-- PostgreSQL resolves through a unique index on `order_id` alone. The timers
-- migration after this one (20261201000004) re-keys the outbox by
-- `(timer, order_id)`; with this index in place a 0.1.0 replica goes on
-- cancelling against the migrated table during a rolling upgrade (its rows
-- belong to the default timer, `cancel_unpaid`, through the column's default).
--
-- Its version sorts before the timers migration, so on a 0.1.0 database it
-- runs first, while `order_id` is still the primary key (the table is
-- already unique by it, so the index always builds). A database that the
-- timers migration re-keyed before this file existed (a build between the
-- releases) is left as it is: a 0.1.0 replica could not have run against it.
--
-- Contract: `order-timeout migrate --contract` drops the index once no 0.1.0
-- replica runs (docs/upgrading.md); a timer other than `cancel_unpaid`
-- needs that, since one order id can then have a row per timer. `migrate`
-- on a database that had none of the service's tables contracts at once:
-- no earlier release ever ran against it.
--
-- Locks only the service's outbox (a unique index build on the outbox, no
-- shop table), for as long as building the index takes.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM information_schema.columns
         WHERE table_schema = current_schema()
           AND table_name = 'order_timeout_cancel_outbox'
           AND column_name = 'timer'
    ) THEN
        CREATE UNIQUE INDEX IF NOT EXISTS order_timeout_cancel_outbox_order_id
            ON order_timeout_cancel_outbox (order_id);
    END IF;
END
$$;
