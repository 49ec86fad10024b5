-- The parked store: messages the service gave up on, kept where they can be read without
-- being delivered. They still arrive in the queue order-timeout.parked (the park path and
-- its format are unchanged); each replica moves them from the queue into this table
-- (insert, then ack), and operators list, view, replay and purge them here, so that
-- looking at them never adds to a delivery count, reorders them or loses one at a
-- queue's delivery limit. Messages parked by an earlier release are moved the same way.
--
-- `message_key` is the parked copy's `x-parked-id` (or, for a copy parked before that
-- header existed, a digest of its park record and body): a copy moved twice (a crash
-- between the insert and the ack) is kept once. `properties` is the copy's AMQP
-- properties as JSON (headers included), `body` the original body; a body over 4 MiB
-- (only a `too_large` one can be) keeps its first 4 MiB, and `body_size` says how long
-- it was.
--
-- Additive: a new table, read and written only by this version and later ones.
CREATE TABLE IF NOT EXISTS order_timeout_parked (
    id          BIGSERIAL   PRIMARY KEY,
    message_key TEXT        NOT NULL UNIQUE,
    parked_at   TIMESTAMPTZ NOT NULL,
    moved_at    TIMESTAMPTZ NOT NULL,
    order_id    TEXT,
    timer       TEXT,
    error_kind  TEXT,
    properties  TEXT        NOT NULL,
    body        BYTEA       NOT NULL,
    body_size   BIGINT      NOT NULL
);
CREATE INDEX IF NOT EXISTS order_timeout_parked_order_id ON order_timeout_parked (order_id);
