-- Each replica of this release and later ones records itself here every 10 s while it
-- serves (and deletes its row when it stops): what `migrate --contract` compares with
-- the consumers of order-timeout.due, so that it refuses to contract while a replica of
-- an earlier release (which does not record itself) still consumes. Times in UTC.
--
-- Additive: a new table, read and written only by this version and later ones.
CREATE TABLE IF NOT EXISTS order_timeout_replicas (
    instance VARCHAR(128) NOT NULL PRIMARY KEY,
    version  VARCHAR(32)  NOT NULL,
    seen_at  DATETIME(6)  NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
