-- The console's history of cancellations (issue 45): each timer's outbox rows,
-- newest first, a page at a time, with keyset paging (the next page starts
-- after the last row shown: its flip time, then its order id). This index makes
-- each page one backward range of `limit` rows whatever the outbox holds, for
-- every row (finished, pending or given up; the retention index
-- order_timeout_cancel_outbox_finished holds the finished ones only). Order ids
-- in byte order (COLLATE "C"), whatever the database's collation: rows flipped
-- in one transaction share their time, and the console merges the timers' pages
-- comparing ids byte for byte.
--
-- The history keeps what the outbox keeps: finished rows until the sweeper
-- deletes them after `[sweeper] outbox_retention` (default 7d), pending and
-- given-up rows until they are done.
--
-- Additive: an index on the service's own outbox, which the previous release
-- neither reads nor needs; its statements run unchanged beside it. Building it
-- makes writes to the outbox wait (not the shop's tables), for as long as the
-- build takes (one pass over the outbox, itself bounded by the retention).
CREATE INDEX IF NOT EXISTS order_timeout_cancel_outbox_history
    ON order_timeout_cancel_outbox (timer, created_at, order_id COLLATE "C");
