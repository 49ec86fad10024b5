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
-- (only a `too_large` one can be) keeps its first 4 MiB (under MariaDB's default
-- max_allowed_packet of 16 MiB), and `body_size` says how long it was. Times in UTC.
--
-- Additive: a new table, read and written only by this version and later ones.
CREATE TABLE IF NOT EXISTS order_timeout_parked (
    id          BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    message_key VARCHAR(128)  NOT NULL,
    parked_at   DATETIME(6)   NOT NULL,
    moved_at    DATETIME(6)   NOT NULL,
    order_id    VARCHAR(512),
    timer       VARCHAR(64),
    error_kind  VARCHAR(64),
    properties  MEDIUMTEXT    NOT NULL,
    body        LONGBLOB      NOT NULL,
    body_size   BIGINT        NOT NULL,
    UNIQUE KEY order_timeout_parked_key (message_key),
    KEY order_timeout_parked_order_id (order_id(191))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
