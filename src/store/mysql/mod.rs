//! MySQL 5.7/8 and MariaDB 10.x: the cancel transaction written once
//! (`store/cancel.rs`), `SKIP LOCKED` where the server has it (MySQL 8.0.1,
//! MariaDB 10.6 on); each `also` statement with a lock wait of its own on
//! MariaDB.
//!
//! Time: the session `time_zone` is the configured one, so the shop's
//! zone-less `DATETIME` deadlines compare with `NOW(6)` as the shop wrote
//! them; deadlines are read as UTC microseconds (`CONVERT_TZ`), and the
//! service's own outbox keeps UTC (`UTC_TIMESTAMP(6)`).
//!
//! Every value is bound through [`arguments`]: order ids in the id
//! column's own type.

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlStatement};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Executor, SqlSafeStr};

use crate::settings::{SecretUrl, StatusValue, TimerKey};
use crate::store::catalog::{self, Column, Columns};
use crate::store::outbox::{self, OwnRow, Statement, Value, Vocabulary};
use crate::store::releases::{self, Expansion};
use crate::store::shape::{self, OrdersColumns};
use crate::store::sql::{Prepared, SqlDialect, SqlStore, parameter_count, pool_options};
use crate::store::zones::ZoneFacts;
use crate::store::{Dialect, PoolSettings, StoreError};

mod statements;

use statements::{Sql, arguments, marks, skips_locked};

/// MySQL and MariaDB, as a [`SqlDialect`].
#[derive(Debug)]
pub(crate) struct MySql;

/// The store on MySQL or MariaDB.
pub(crate) type MySqlStore = SqlStore<MySql>;

/// What a MySQL error number means to the store, where the generic SQLSTATE
/// `HY000` hides it ([`StoreError::is_permanent`],
/// [`StoreError::is_row_fault`], [`StoreError::is_lock_timeout`] say why
/// each matters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ErrorClass {
    /// A lock waited for in vain: 1205 (`innodb_lock_wait_timeout`), 3572
    /// (`NOWAIT`).
    LockTimeout,
    /// Waiting can fix it: connection and login errors (1040, 1044, 1045,
    /// 1053, 1152, 1158–1161, 1180, 1203, 1226, 1927, 2006, 2013), a
    /// deadlock (1213), a read-only server during a failover (1290, 1836),
    /// a timeout or a killed query (1317, 1969, 3024), 1637 (too many active
    /// transactions).
    Transient,
    /// The row's own values: 1366 incorrect value, 1292 truncated value,
    /// 1364 no default, 1411 incorrect value for a function, 3819 check
    /// constraint, 1048 NULL in a NOT NULL column, 1062 duplicate key,
    /// 1264/1690 out of range, 1406 too long, 1242 a subquery of more than
    /// one row, 1451/1452 foreign keys, 1644 a `SIGNAL` of a trigger.
    Row,
    /// The statement itself, whatever the row: 1093/1442 statements MySQL
    /// refuses (a table both updated and read, a trigger updating the
    /// table of its statement). Permanent, but the world's.
    Statement,
}

/// The [`ErrorClass`] of a MySQL/MariaDB error; `None` for another
/// database's error, or a number the SQLSTATE classifies well enough.
pub(super) fn error_class(e: &dyn sqlx::error::DatabaseError) -> Option<ErrorClass> {
    let my = e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()?;
    match my.number() {
        1205 | 3572 => Some(ErrorClass::LockTimeout),
        1040
        | 1044
        | 1045
        | 1053
        | 1152
        | 1158..=1161
        | 1180
        | 1203
        | 1213
        | 1226
        | 1290
        | 1317
        | 1637
        | 1836
        | 1927
        | 1969
        | 2006
        | 2013
        | 3024 => Some(ErrorClass::Transient),
        1048 | 1062 | 1242 | 1264 | 1292 | 1364 | 1366 | 1406 | 1411 | 1451 | 1452 | 1644
        | 1690 | 3819 => Some(ErrorClass::Row),
        1093 | 1442 => Some(ErrorClass::Statement),
        _ => None,
    }
}

/// `time_zone` as a MySQL session `time_zone`: `UTC` as `+00:00` (named
/// zones need the server's time zone tables, which MariaDB often lacks).
fn mysql_time_zone(time_zone: &str) -> String {
    if time_zone.eq_ignore_ascii_case("utc") {
        "+00:00".into()
    } else {
        time_zone.to_owned()
    }
}

/// Sets the session's lock wait timeout (`innodb_lock_wait_timeout`, whole
/// seconds, rounded up) and statement timeout (MariaDB's
/// `max_statement_time`; MySQL's `max_execution_time`, which bounds only
/// `SELECT`s, where the server has no `max_statement_time`).
async fn set_timeouts(conn: &mut sqlx::MySqlConnection, pool: PoolSettings) -> sqlx::Result<()> {
    let lock_secs = pool.lock_timeout.as_secs() + u64::from(pool.lock_timeout.subsec_nanos() > 0);
    let lock = format!(
        "SET SESSION innodb_lock_wait_timeout = {}",
        lock_secs.max(1)
    );
    conn.execute(AssertSqlSafe(lock)).await?;
    let statement_secs = pool.statement_timeout.as_secs_f64().max(0.001);
    let mariadb = format!("SET SESSION max_statement_time = {statement_secs:.3}");
    match conn.execute(AssertSqlSafe(mariadb)).await {
        Ok(_) => Ok(()),
        // 1193: unknown system variable (MySQL).
        Err(sqlx::Error::Database(e))
            if e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| e.number() == 1193) =>
        {
            let ms = pool.statement_timeout.as_millis().max(1);
            let mysql = format!("SET SESSION max_execution_time = {ms}");
            conn.execute(AssertSqlSafe(mysql)).await.map(drop)
        }
        Err(e) => Err(e),
    }
}

impl SqlDialect for MySql {
    type Db = sqlx::MySql;
    type Statements = Sql;
    /// The generated columns of the sweep's indexes (MySQL has no partial
    /// or expression index).
    const OUTBOX_COLUMNS: &'static [&'static str] = &["pending", "sweep_at"];
    const FRESH: &'static str = "SELECT NOT EXISTS (SELECT 1 FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = 'order_timeout_cancel_outbox')";
    const EXPANSIONS: &'static [Expansion] = &[releases::KEPT_FOR_0_1_0_MYSQL];

    /// `time_zone` set as the session's `time_zone`; `None` sets none, so
    /// that the session keeps the server's (`@@global.time_zone`).
    fn connect_options(
        url: &SecretUrl,
        time_zone: Option<&str>,
    ) -> Result<MySqlConnectOptions, StoreError> {
        super::mysql_options(url).map(|o| {
            o.log_statements(tracing::log::LevelFilter::Trace)
                .timezone(time_zone.map(mysql_time_zone))
        })
    }

    fn pool(
        url: &SecretUrl,
        pool: PoolSettings,
        time_zone: Option<&str>,
    ) -> Result<MySqlPool, StoreError> {
        Ok(pool_options::<Self>(pool)
            // READ COMMITTED: the cancel transaction's locking read of outbox
            // rows that do not exist yet takes no gap locks, so two batches
            // inserting outbox rows do not deadlock each other (measured with
            // the demo on MariaDB 10.11 under REPEATABLE READ: deadlocks,
            // each a retry and a second of lateness). Order rows are still
            // locked one by one, which is all the cancel needs.
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    set_timeouts(conn, pool).await
                })
            })
            .connect_lazy_with(Self::connect_options(url, time_zone)?))
    }

    async fn create_database(url: &SecretUrl) -> Result<(), StoreError> {
        let options = Self::connect_options(url, Some("UTC"))?;
        let Some(name) = options.get_database().map(str::to_owned) else {
            return Ok(());
        };
        let admin = options.database("information_schema");
        let mut conn = sqlx::MySqlConnection::connect_with(&admin).await?;
        let create = format!(
            "CREATE DATABASE IF NOT EXISTS `{}` CHARACTER SET utf8mb4",
            name.replace('`', "``")
        );
        conn.execute(AssertSqlSafe(create)).await?;
        Ok(())
    }

    async fn run_migrations(conn: &mut sqlx::MySqlConnection) -> Result<(), StoreError> {
        let mut migrator = sqlx::migrate!("./migrations/mysql");
        migrator.dangerous_set_table_name("order_timeout_migrations");
        Ok(migrator.run(conn).await?)
    }

    /// The pool's `time_zone` (`SYSTEM` with the server's system zone)
    /// and its offsets; then, on a session opened with no zone set, the
    /// zone it starts in, and the server's `time_zone` when that differs
    /// (an `init_connect` that sets one, which runs for users without
    /// `SUPER` only).
    async fn zone_facts(store: &MySqlStore) -> Result<ZoneFacts, StoreError> {
        const NAMED: &str = "CAST(IF(@@session.time_zone = 'SYSTEM', \
             CONCAT('SYSTEM (', @@system_time_zone, ')'), @@session.time_zone) AS CHAR)";
        let offset = |month: &str| {
            format!(
                "CAST(COALESCE(TIMESTAMPDIFF(SECOND, \
                     CONCAT(YEAR(UTC_TIMESTAMP()), '-{month}-15 12:00:00'), \
                     CONVERT_TZ(CONCAT(YEAR(UTC_TIMESTAMP()), '-{month}-15 12:00:00'), \
                                '+00:00', @@session.time_zone)), 0) AS SIGNED)"
            )
        };
        let (session, january, july): (String, i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {NAMED}, {}, {}",
            offset("01"),
            offset("07")
        )))
        .fetch_one(&store.pool)
        .await?;
        let mut plain = Self::connect_options(&store.url, None)?.connect().await?;
        let (server, global): (String, String) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {NAMED}, CAST(IF(@@global.time_zone = 'SYSTEM', \
                 CONCAT('SYSTEM (', @@system_time_zone, ')'), @@global.time_zone) AS CHAR)"
        )))
        .fetch_one(&mut plain)
        .await?;
        let _ = plain.close().await;
        let others = if global == server {
            Vec::new()
        } else {
            vec![(
                "the server's time_zone, where sessions of users with SUPER start".to_owned(),
                global,
            )]
        };
        let seconds = |s: i64| i32::try_from(s).unwrap_or(0);
        Ok(ZoneFacts {
            session,
            offsets: (seconds(january), seconds(july)),
            server,
            others,
        })
    }

    /// MySQL sets the zone when it connects (sqlx's `timezone`): an
    /// unknown one fails the connection itself, 1298.
    async fn check_zone(_: &MySqlStore) -> Result<(), StoreError> {
        Ok(())
    }

    async fn columns(store: &MySqlStore, table: &str) -> Result<Columns, StoreError> {
        let (schema, name) = shape::split_table(table);
        let columns: Vec<Column> = sqlx::query_as(
            "SELECT CAST(COLUMN_NAME AS CHAR) AS name, CAST(COLUMN_TYPE AS CHAR) AS shown, \
                    CAST(DATA_TYPE AS CHAR) AS type_name, CAST(DATA_TYPE AS CHAR) AS base, \
                    CAST(CHARACTER_MAXIMUM_LENGTH AS SIGNED) AS max_chars, \
                    CAST(NUMERIC_PRECISION AS SIGNED) AS `precision`, \
                    CAST(NUMERIC_SCALE AS SIGNED) AS scale, \
                    COLUMN_TYPE LIKE '%unsigned%' AS `unsigned` \
               FROM information_schema.COLUMNS \
              WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
        )
        .bind(schema)
        .bind(name)
        .fetch_all(&store.pool)
        .await?;
        Ok(catalog::by_name(columns))
    }

    async fn statements(store: &MySqlStore, _: &OrdersColumns) -> Result<Sql, StoreError> {
        let version: String = sqlx::query_scalar("SELECT CAST(VERSION() AS CHAR)")
            .fetch_one(&store.pool)
            .await?;
        let skip_locked = skips_locked(&version);
        if !skip_locked {
            tracing::warn!(%version, "this server has no FOR UPDATE SKIP LOCKED (MySQL 8, MariaDB 10.6 have): a row the shop holds makes its whole batch wait, up to db_lock_timeout");
        }
        let mariadb = version.to_ascii_lowercase().contains("mariadb");
        Ok(Sql::render(&store.timer, skip_locked, mariadb))
    }

    async fn prepare(store: &MySqlStore, statement: String) -> sqlx::Result<MySqlStatement> {
        let mut conn = store.pool.acquire().await?;
        conn.prepare(AssertSqlSafe(statement).into_sql_str()).await
    }

    /// How many `?` the statement has: MySQL gives its parameters no
    /// types, each is sent the id in the id column's own type, and the
    /// server converts it as the statement needs.
    type AlsoParams = usize;

    fn also_parameters(statement: &MySqlStatement) -> Result<usize, String> {
        Ok(parameter_count(statement))
    }

    /// Compared in the status column's character set and collation (a
    /// text column; numbers are compared as numbers).
    async fn same_code(
        store: &MySqlStore,
        _: &OrdersColumns,
        a: &StatusValue,
        b: &StatusValue,
    ) -> Result<bool, StoreError> {
        let t = &store.timer;
        let (schema, name) = shape::split_table(&t.table);
        let collation: Option<(Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT CAST(CHARACTER_SET_NAME AS CHAR), CAST(COLLATION_NAME AS CHAR) \
               FROM information_schema.COLUMNS \
              WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND COLUMN_NAME = ?",
        )
        .bind(schema)
        .bind(name)
        .bind(&t.status)
        .fetch_optional(&store.pool)
        .await?;
        let Some((Some(charset), Some(collation))) = collation else {
            return Ok(false);
        };
        let plain = |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !plain(&charset) || !plain(&collation) {
            return Ok(false);
        }
        let value = format!("CONVERT(? USING {charset}) COLLATE {collation}");
        let sql = format!("SELECT {value} = {value}");
        let same: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(a.as_text())
            .bind(b.as_text())
            .fetch_one(&store.pool)
            .await?;
        Ok(same == Some(1))
    }

    fn skips_locked(sql: &Sql) -> bool {
        sql.skip_locked
    }

    /// Each statement bound the id once per `?`, in the id column's type;
    /// on MariaDB with its own lock wait (`Sql::also`).
    async fn also(
        conn: &mut sqlx::MySqlConnection,
        store: &MySqlStore,
        prepared: &Prepared<Self>,
        id: &str,
    ) -> Result<(), StoreError> {
        let (timer, sql) = (&store.timer, &prepared.sql);
        let id = prepared.id_value(id)?;
        let id_args = |n: usize| arguments(&vec![Value::RowId(Some(&id)); n]);
        if let Some(params) = prepared.also_keys {
            let query = sqlx::query_with(AssertSqlSafe(timer.also_keys.clone()), id_args(params)?);
            let rows = query.fetch_all(&mut *conn).await?;
            let keys = (rows.iter())
                .filter_map(|row| key_text(row).transpose())
                .collect::<Result<Vec<String>, String>>()
                .map_err(|problem| StoreError::Schema {
                    key: timer.key(TimerKey::AlsoKeys),
                    problem,
                })?;
            let slots = outbox::also_lock_slots(&keys);
            if !slots.is_empty() {
                let values = [("slots", Value::Nums(&slots))];
                let mut lock = outbox::render::<MySql>(outbox::ALSO_LOCKS, &values);
                lock.sql.insert_str(0, sql.also_wait);
                Self::execute(conn, lock).await?;
            }
        }
        for (statement, params) in sql.also.iter().zip(&prepared.also_params) {
            let query = sqlx::query_with(AssertSqlSafe(statement.clone()), id_args(*params)?);
            query.execute(&mut *conn).await?;
        }
        Ok(())
    }

    async fn execute(
        conn: &mut sqlx::MySqlConnection,
        statement: Statement<'_>,
    ) -> Result<u64, StoreError> {
        let query = sqlx::query_with(AssertSqlSafe(statement.sql), arguments(&statement.values)?);
        Ok(query.execute(conn).await?.rows_affected())
    }

    async fn fetch<T: OwnRow>(
        conn: &mut sqlx::MySqlConnection,
        statement: Statement<'_>,
    ) -> Result<Vec<T>, StoreError> {
        let query =
            sqlx::query_as_with(AssertSqlSafe(statement.sql), arguments(&statement.values)?);
        Ok(query.fetch_all(conn).await?)
    }
}

/// MySQL's words for the statements of the service's own tables.
impl Vocabulary for MySql {
    const DIALECT: Dialect = Dialect::MySql;
    const NOW: &'static str = "UTC_TIMESTAMP(6)";
    const CLOCK: &'static str = "UTC_TIMESTAMP(6)";
    /// The column is `VARBINARY` (ids compare byte for byte).
    const ORDER_ID: &'static str = "CAST(order_id AS CHAR)";
    /// `sweep_at` is a generated column, set only while the row's work is
    /// pending and not given up: the `(timer, sweep_at)` index holds
    /// exactly the rows to sweep.
    const SWEEP_DUE: &'static str = "sweep_at <= UTC_TIMESTAMP(6)";
    const SWEEP_AT: &'static str = "sweep_at";
    /// `VARBINARY`: byte order already. Named with its table: in `ORDER
    /// BY`, MySQL reads a bare `order_id` as the select list's text of it
    /// (`{order_id} AS order_id`), which no index holds.
    const ORDER_KEY: &'static str = "order_timeout_cancel_outbox.order_id";
    /// A no-op update rather than `INSERT IGNORE`, which would turn every
    /// other error into a warning too.
    fn keep_existing(column: &str) -> String {
        format!("ON DUPLICATE KEY UPDATE {column} = {column}")
    }

    fn placeholder(_n: usize) -> String {
        "?".to_owned()
    }

    fn micros(_n: usize) -> String {
        "INTERVAL ? MICROSECOND".to_owned()
    }

    fn in_ids(_first: usize, len: usize) -> String {
        format!("IN ({})", marks(len))
    }

    fn id_placeholders(len: usize) -> usize {
        len
    }

    fn cast(_n: usize, _ty: &str) -> String {
        "?".to_owned()
    }

    fn in_cast_ids(_first: usize, len: usize, _ty: &str) -> String {
        format!("IN ({})", marks(len))
    }

    /// Bound in UTC, compared in the session's zone, the zone the shop's
    /// `DATETIME`s are written in.
    fn shop_time(_n: usize) -> String {
        "CONVERT_TZ(?, '+00:00', @@session.time_zone)".to_owned()
    }

    /// MySQL compares wall-clock times: where the session's zone shifts,
    /// `NOW(6)` in the first pass of the hour repeated in autumn (01:10
    /// summer time) is after a deadline of 01:40 written in the second pass
    /// (an hour later), and in spring a deadline in the skipped hour
    /// (02:29, written by `NOW() + INTERVAL 30 MINUTE` at 01:59) is before
    /// the first time after the skip (03:00). So the clock it is compared
    /// with is the earliest of now, an hour ahead less an hour and an hour
    /// ago plus an hour, each converted from UTC (which is never
    /// ambiguous): no deadline is due before its later instant; around a
    /// change of offset one is due up to an hour late. A zone without
    /// shifts compares with `NOW(6)`.
    fn shop_now(shifts: bool) -> String {
        if !shifts {
            return "NOW(6)".to_owned();
        }
        "LEAST(NOW(6), \
         CONVERT_TZ(UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, '+00:00', @@session.time_zone) \
           - INTERVAL 1 HOUR, \
         CONVERT_TZ(UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, '+00:00', @@session.time_zone) \
           + INTERVAL 1 HOUR)"
            .to_owned()
    }

    fn text(expr: &str) -> String {
        format!("CAST({expr} AS CHAR)")
    }

    fn int8(expr: &str) -> String {
        format!("CAST({expr} AS SIGNED)")
    }

    fn count_if(condition: &str) -> String {
        format!("CAST(COALESCE(SUM({condition}), 0) AS SIGNED)")
    }

    /// Where the zone shifts, the instant [`Vocabulary::shop_now`] makes
    /// the deadline due: the latest of its conversion to UTC, an hour
    /// later's less an hour and an hour earlier's plus an hour (MySQL
    /// converts an ambiguous time to one of its instants, a skipped one to
    /// the end of the skip), so that a deadline read as not yet due is
    /// never reported past.
    fn epoch_micros(deadline: &str, usable: &str, shifts: bool) -> String {
        let utc = |d: &str| format!("CONVERT_TZ({d}, @@session.time_zone, '+00:00')");
        let instant = if shifts {
            format!(
                "GREATEST({}, {} - INTERVAL 1 HOUR, {} + INTERVAL 1 HOUR)",
                utc(deadline),
                utc(&format!("{deadline} + INTERVAL 1 HOUR")),
                utc(&format!("{deadline} - INTERVAL 1 HOUR"))
            )
        } else {
            utc(deadline)
        };
        format!(
            "CASE WHEN {usable} THEN TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', \
             {instant}) END"
        )
    }

    /// Every column `QUOTE()`d, so that NULL and `'NULL'` differ.
    fn row_digest(columns: &[String]) -> String {
        let quoted: Vec<String> = columns
            .iter()
            .map(|c| format!("QUOTE(o.{})", shape::quote(Dialect::MySql, c)))
            .collect();
        format!("MD5(CONCAT_WS(',', {}))", quoted.join(", "))
    }
}

/// The first column of a row of the `also_keys` query as text (NULL:
/// none), whatever text or integer type it has.
fn key_text(row: &sqlx::mysql::MySqlRow) -> Result<Option<String>, String> {
    use sqlx::Row;
    fn text(n: Option<impl ToString>) -> Option<String> {
        n.map(|n| n.to_string())
    }
    (row.try_get::<Option<String>, _>(0))
        .or_else(|_| row.try_get::<Option<i64>, _>(0).map(text))
        .or_else(|_| row.try_get::<Option<u64>, _>(0).map(text))
        .map_err(|e| {
            format!(
                "a key it returned is neither text nor an integer ({e}): return the keys as \
                 text or integers (CAST(… AS CHAR))"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::skips_locked;

    #[test]
    fn skip_locked_is_known_by_server_version() {
        assert!(skips_locked("10.11.19-MariaDB-0+deb12u1"));
        assert!(skips_locked("10.6.0-MariaDB"));
        assert!(skips_locked("11.4.2-MariaDB-log"));
        assert!(!skips_locked("10.5.23-MariaDB"));
        assert!(skips_locked("8.0.36"));
        assert!(skips_locked("8.4.0-commercial"));
        assert!(!skips_locked("8.0.0-dmr"));
        assert!(!skips_locked("5.7.44-log"));
    }
}
