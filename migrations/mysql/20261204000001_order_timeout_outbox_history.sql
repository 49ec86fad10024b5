-- The console's history of cancellations (issue 45): each timer's outbox rows,
-- newest first, a page at a time, with keyset paging (see the PostgreSQL
-- migration of the same name). Each page is one backward range of this index,
-- whatever the outbox holds; the (timer, pending, created_at) index cannot
-- give every row in time order.
--
-- The history keeps what the outbox keeps: finished rows until the sweeper
-- deletes them after `[sweeper] outbox_retention` (default 7d), pending and
-- given-up rows until they are done.
--
-- Additive: a key on the service's own outbox, which the previous release
-- neither reads nor needs. InnoDB adds it in place, with writes going on; the
-- migrating user needs ALTER on order_timeout_cancel_outbox, as for the
-- earlier migrations of the table.
ALTER TABLE order_timeout_cancel_outbox
    ADD KEY order_timeout_cancel_outbox_history (timer, created_at, order_id);
