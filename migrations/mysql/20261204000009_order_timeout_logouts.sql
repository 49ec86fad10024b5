-- Console logouts, shared by the replicas: a session cookie is signed, not stored, so a
-- replica cannot know that another one logged it out unless it is written down. Each
-- replica refuses the sessions listed here (it reads them every 2 s) until they would
-- have expired anyway; rows of expired sessions are deleted at the next logout.
--
-- `session_mac` is a MAC of the cookie's value keyed by ADMIN_TOKEN, not the cookie: the
-- table holds nothing that opens a session.
--
-- Additive: a new table, read and written only by this version and later ones.
CREATE TABLE IF NOT EXISTS order_timeout_logouts (
    session_mac VARCHAR(64) NOT NULL PRIMARY KEY,
    expires_at  DATETIME(6) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
