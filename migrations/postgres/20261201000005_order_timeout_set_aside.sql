-- Rows a timer cannot flip, set aside (issue: one row whose flip fails for good, say
-- an `also` statement hitting a unique constraint for that order alone, must not stop
-- the sweeper: it is parked once, `permanent_failure`, and skipped by later sweeps).
-- `row_digest` is the md5 of the whole row as it was when it failed: a sweep skips the
-- row only while the row is unchanged, so that an operator who fixes the row itself has
-- it swept again; fixing something else (the also statement's other table) is followed
-- by replaying the parked message. A mark whose row has left the timer's `from` status
-- (flipped by a replay, paid, deleted) is deleted by the sweeper.
--
-- Additive: a new table, read and written only by this version and later ones; the
-- previous version runs unchanged beside it.
CREATE TABLE IF NOT EXISTS order_timeout_set_aside (
    timer        TEXT        NOT NULL,
    order_id     TEXT        NOT NULL,
    row_digest   TEXT        NOT NULL,
    reason       TEXT        NOT NULL,
    set_aside_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (timer, order_id)
);
