-- The sweeper's stale-outbox scan reads the rows whose stock release or event
-- is still to do, oldest first. With only an index on created_at it walked
-- every finished row older than the oldest pending one (finished rows stay in
-- the table). MySQL and MariaDB have no partial indexes (PostgreSQL's
-- migration has one): a generated column says whether work is pending, and
-- (pending, created_at) is a range of exactly the pending rows in order.
ALTER TABLE order_timeout_cancel_outbox
    ADD COLUMN pending TINYINT AS (stock_released_at IS NULL OR event_published_at IS NULL) VIRTUAL,
    ADD KEY order_timeout_cancel_outbox_pending (pending, created_at),
    DROP KEY order_timeout_cancel_outbox_created;
