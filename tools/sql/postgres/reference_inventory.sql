-- Schema of the reference inventory server (`order-timeout inventory-server`),
-- used by the demo and the tests. Production points INVENTORY_URL at the
-- real inventory service and never reads these tables.
CREATE SCHEMA IF NOT EXISTS inventory;

CREATE TABLE IF NOT EXISTS inventory.stock (
    sku       TEXT PRIMARY KEY,
    available BIGINT NOT NULL
);

-- One row per order whose stock was reserved / released: the idempotency
-- keys that make ReserveStock and ReleaseStock safe to call more than once.
CREATE TABLE IF NOT EXISTS inventory.reservations (
    order_id    TEXT PRIMARY KEY,
    reserved_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS inventory.releases (
    order_id    TEXT PRIMARY KEY,
    released_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- how many ReleaseStock calls arrived for this order (1 = no duplicates)
    calls       BIGINT NOT NULL DEFAULT 1
);
