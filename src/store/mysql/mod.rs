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
//! Every value is bound through [`args`], from a small enum of the values
//! the statements take ([`Arg`]); order ids in the id column's own type
//! (`BIGINT UNSIGNED` as `u64`, `DECIMAL` as a decimal, never a string a
//! comparison would turn into a double).

use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlTypeInfo};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Executor, SqlSafeStr};

use crate::settings::{SecretUrl, StatusValue, TimerKey};
use crate::store::catalog::{self, Column, Columns};
use crate::store::ids::IdValue;
use crate::store::outbox::{self, OwnRow, Statement, Value, Vocabulary};
use crate::store::releases::{Expansion, KEPT_FOR_0_1_0_MARKER, KEPT_FOR_0_1_0_MYSQL, Migrated};
use crate::store::shape::{self, OrdersColumns};
use crate::store::sql::{AlsoCheckError, Prepared, SqlDialect, SqlStore};
use crate::store::{Dialect, PoolSettings, StoreError};

/// Runs `sql` with `values` bound, in `tx` or on the pool.
macro_rules! run {
    ($sql:expr, $values:expr, $on:expr) => {
        sqlx::query_with(AssertSqlSafe($sql), args($values)?).execute($on)
    };
}

mod statements;

use statements::{Arg, Sql, args, decimal_type, id_arg, marks, skips_locked};

/// MySQL and MariaDB, as a [`SqlDialect`].
#[derive(Debug)]
pub(crate) struct MySql;

/// The store on MySQL or MariaDB.
pub(crate) type MySqlStore = SqlStore<MySql>;

/// The service's own migrations for MySQL (`migrations/mysql/`), recorded in
/// `order_timeout_migrations`.
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("./migrations/mysql");
    migrator.dangerous_set_table_name("order_timeout_migrations");
    migrator
}

/// The expansions kept for the previous release present in the database:
/// the marker row of [`KEPT_FOR_0_1_0_MYSQL`].
async fn expansions_on(conn: &mut sqlx::MySqlConnection) -> Result<Vec<Expansion>, StoreError> {
    let there: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM order_timeout_watch WHERE timer = ?)")
            .bind(KEPT_FOR_0_1_0_MARKER)
            .fetch_one(&mut *conn)
            .await?;
    Ok(if there {
        vec![KEPT_FOR_0_1_0_MYSQL]
    } else {
        Vec::new()
    })
}

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

fn connect_options(url: &SecretUrl, time_zone: &str) -> Result<MySqlConnectOptions, StoreError> {
    super::mysql_options(url).map(|o| {
        o.log_statements(tracing::log::LevelFilter::Trace)
            .timezone(Some(mysql_time_zone(time_zone)))
    })
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
    const OUTBOX_COLUMNS: &'static [&'static str] = &[
        "timer",
        "order_id",
        "created_at",
        "stock_released_at",
        "event_published_at",
        "claimed_until",
        "pending",
        "attempts",
        "next_attempt_at",
        "last_error",
        "gave_up_at",
        "gave_up_reason",
        "sweep_at",
    ];

    fn pool(url: &SecretUrl, pool: PoolSettings, time_zone: &str) -> Result<MySqlPool, StoreError> {
        Ok(MySqlPoolOptions::new()
            .max_connections(pool.max_connections)
            .acquire_timeout(Duration::from_secs(5))
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
            // A connection whose operation was abandoned unanswered
            // (store/bounded.rs) is closed, not reused.
            .after_release(|conn, _| Box::pin(crate::store::bounded::release_check(conn)))
            .connect_lazy_with(connect_options(url, time_zone)?))
    }

    async fn create_database(url: &SecretUrl) -> Result<(), StoreError> {
        let options = connect_options(url, "UTC")?;
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

    async fn run_migrations(url: &SecretUrl) -> Result<Migrated, StoreError> {
        let mut conn = sqlx::MySqlConnection::connect_with(&connect_options(url, "UTC")?).await?;
        let fresh: bool = sqlx::query_scalar(
            "SELECT NOT EXISTS (SELECT 1 FROM information_schema.tables \
              WHERE table_schema = DATABASE() AND table_name = ?)",
        )
        .bind(shape::OUTBOX)
        .fetch_one(&mut conn)
        .await?;
        // A database 0.1.0 ran on (none of 0.2.0's migrations applied
        // yet): 0.1.0 replicas may still run beside this release.
        let from_0_1_0: bool = !fresh
            && sqlx::query_scalar(
                "SELECT COALESCE(MAX(version), 0) < 20261201000001 FROM order_timeout_migrations",
            )
            .fetch_one(&mut conn)
            .await?;
        migrator().run(&mut conn).await?;
        if from_0_1_0 {
            sqlx::query(
                "INSERT INTO order_timeout_watch (timer, scanned_until) \
                 VALUES (?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE timer = timer",
            )
            .bind(KEPT_FOR_0_1_0_MARKER)
            .execute(&mut conn)
            .await?;
        }
        let kept = expansions_on(&mut conn).await?;
        Ok(Migrated { fresh, kept })
    }

    /// Deletes the marker that keeps `[[timers]]` refused for 0.1.0
    /// replicas ([`KEPT_FOR_0_1_0_MYSQL`]): MySQL's `ON DUPLICATE KEY` of
    /// 0.1.0 works with the outbox's new key as it is, so nothing else.
    async fn contract(url: &SecretUrl) -> Result<Vec<Expansion>, StoreError> {
        let mut conn = sqlx::MySqlConnection::connect_with(&connect_options(url, "UTC")?).await?;
        let present = expansions_on(&mut conn).await?;
        if !present.is_empty() {
            sqlx::query("DELETE FROM order_timeout_watch WHERE timer = ?")
                .bind(KEPT_FOR_0_1_0_MARKER)
                .execute(&mut conn)
                .await?;
        }
        for e in &present {
            tracing::info!(dropped = e.object, kept_for = e.kept_for, "contracted");
        }
        Ok(present)
    }

    async fn expansions(store: &MySqlStore) -> Result<Vec<Expansion>, StoreError> {
        let mut conn = store.pool.acquire().await?;
        expansions_on(&mut conn).await
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
        let decimal = decimal_type(store).await?;
        let version: String = sqlx::query_scalar("SELECT CAST(VERSION() AS CHAR)")
            .fetch_one(&store.pool)
            .await?;
        let skip_locked = skips_locked(&version);
        if !skip_locked {
            tracing::warn!(%version, "this server has no FOR UPDATE SKIP LOCKED (MySQL 8, MariaDB 10.6 have): a row the shop holds makes its whole batch wait, up to db_lock_timeout");
        }
        let mariadb = version.to_ascii_lowercase().contains("mariadb");
        Ok(Sql::render(&store.timer, decimal, skip_locked, mariadb))
    }

    async fn parameters(store: &MySqlStore, statement: &str) -> Result<usize, sqlx::Error> {
        let mut conn = store.pool.acquire().await?;
        let prepared = conn
            .prepare(AssertSqlSafe(statement.to_owned()).into_sql_str())
            .await?;
        Ok(sqlx::Statement::parameters(&prepared).map_or(0, |p| p.either(|t| t.len(), |n| n)))
    }

    /// How many `?` the statement has: MySQL gives its parameters no
    /// types, each is sent the id in the id column's own type, and the
    /// server converts it as the statement needs.
    type AlsoParams = usize;

    async fn also_parameters(store: &MySqlStore, statement: &str) -> Result<usize, AlsoCheckError> {
        Ok(Self::parameters(store, statement).await?)
    }

    async fn result_type(store: &MySqlStore, query: String) -> Result<String, sqlx::Error> {
        let mut conn = store.pool.acquire().await?;
        let prepared = conn.prepare(AssertSqlSafe(query).into_sql_str()).await?;
        Ok(sqlx::Statement::columns(&prepared)
            .first()
            .map(|column| sqlx::TypeInfo::name(sqlx::Column::type_info(column)).to_owned())
            .unwrap_or_default())
    }

    async fn unvacuumed(_: &MySqlStore, _: &[&str]) -> Result<Vec<String>, sqlx::Error> {
        Ok(Vec::new())
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
        let same: Option<i64> = sqlx::query_scalar_with(
            AssertSqlSafe(sql),
            args([Arg::Text(&a.as_text()), Arg::Text(&b.as_text())])?,
        )
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
        let id_args = |n: usize| args(std::iter::repeat_n(id_arg(&id, Some(&sql.decimal)), n));
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
                let lock = outbox::render::<MySql>(outbox::ALSO_LOCKS, &values);
                let values = lock.values.iter().flat_map(|v| arg(v, None));
                run!(format!("{}{}", sql.also_wait, lock.sql), values, &mut *conn).await?;
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
        sql: Option<&Sql>,
        statement: Statement<'_>,
    ) -> Result<u64, StoreError> {
        let decimal = sql.map(|sql| &sql.decimal);
        let values = statement.values.iter().flat_map(|v| arg(v, decimal));
        Ok(run!(statement.sql, values, conn).await?.rows_affected())
    }

    async fn fetch<T: OwnRow>(
        conn: &mut sqlx::MySqlConnection,
        sql: Option<&Sql>,
        statement: Statement<'_>,
    ) -> Result<Vec<T>, StoreError> {
        let decimal = sql.map(|sql| &sql.decimal);
        let values = statement.values.iter().flat_map(|v| arg(v, decimal));
        let query = sqlx::query_as_with(AssertSqlSafe(statement.sql), args(values)?);
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

    const SHOP_NOW: &'static str = "NOW(6)";

    fn text(expr: &str) -> String {
        format!("CAST({expr} AS CHAR)")
    }

    fn int8(expr: &str) -> String {
        format!("CAST({expr} AS SIGNED)")
    }

    fn count_if(condition: &str) -> String {
        format!("CAST(COALESCE(SUM({condition}), 0) AS SIGNED)")
    }

    fn epoch_micros(deadline: &str, usable: &str) -> String {
        format!(
            "CASE WHEN {usable} THEN TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', \
             CONVERT_TZ({deadline}, @@session.time_zone, '+00:00')) END"
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

/// A value of a rendered statement as MySQL binds it: an id list as one
/// value per id, an id in its column's type (`decimal`: the server's
/// `DECIMAL`, for decimal ids).
fn arg<'a>(value: &Value<'a>, decimal: Option<&'a MySqlTypeInfo>) -> Vec<Arg<'a>> {
    let id = |v: &'a IdValue| id_arg(v, decimal);
    match *value {
        Value::Status(code) => vec![Arg::Status(code)],
        Value::MaybeStatus(code) => vec![Arg::MaybeStatus(code)],
        Value::RowId(v) => vec![v.map_or(Arg::Null, id)],
        Value::RowIds(ids) | Value::ItemIds(ids) => ids.iter().map(id).collect(),
        Value::ShopTime(t) => vec![t.map_or(Arg::Null, Arg::Time)],
        Value::Text(s) => vec![Arg::Text(s)],
        Value::Int(n) | Value::Micros(n) => vec![Arg::Int(n)],
        Value::Time(t) => vec![Arg::Time(t)],
        Value::Ids(ids) => ids.iter().map(|id| Arg::Text(id)).collect(),
        Value::MaybeText(Some(s)) => vec![Arg::Text(s)],
        Value::MaybeText(None) => vec![Arg::Null],
        Value::Bytes(b) => vec![Arg::Bytes(b)],
        Value::Nums(nums) => nums.iter().map(|n| Arg::Int(*n)).collect(),
        Value::NewOutboxRows(_, rows) => (rows.iter())
            .flat_map(|r| {
                [
                    Arg::Text(r.order_id),
                    Arg::Time(r.created_at),
                    Arg::Time(r.claimed_until),
                    r.stock_released_at.map_or(Arg::Null, Arg::Time),
                ]
            })
            .collect(),
    }
}

/// The first column of a row of the `also_keys` query as text (NULL:
/// none), whatever text or integer type it has.
fn key_text(row: &sqlx::mysql::MySqlRow) -> Result<Option<String>, String> {
    use sqlx::Row;
    if let Ok(text) = row.try_get::<Option<String>, _>(0) {
        return Ok(text);
    }
    if let Ok(n) = row.try_get::<Option<i64>, _>(0) {
        return Ok(n.map(|n| n.to_string()));
    }
    match row.try_get::<Option<u64>, _>(0) {
        Ok(n) => Ok(n.map(|n| n.to_string())),
        Err(e) => Err(format!(
            "a key it returned is neither text nor an integer ({e}): return the keys as text \
             or integers (CAST(… AS CHAR))"
        )),
    }
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
