//! MySQL's statements, rendered from the mapping ([`Sql`]), and how a
//! value becomes a parameter ([`Arg`], [`args`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::encode::{Encode, IsNull};
use sqlx::error::BoxDynError;
use sqlx::mysql::{MySqlArguments, MySqlTypeInfo};
use sqlx::{AssertSqlSafe, Row};

use super::MySqlStore;
use crate::settings::{StatusValue, Timer};
use crate::store::ids::{IdValue, uuid_text};
use crate::store::shape::{self, OrdersColumns};
use crate::store::sql::PageRow;
use crate::store::{Dialect, StoreError};

/// The most placeholders one MySQL statement can have.
pub(super) const PLACEHOLDERS: usize = 65_535;

/// Placeholders per order id in the cancel transaction's statement with
/// the most (the outbox insert: id, created, lease end, released).
pub(super) const PLACEHOLDERS_PER_ID: usize = 4;

/// `?, ?, …` for `n` values.
pub(super) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Microseconds since the epoch as a UTC instant.
pub(super) fn from_micros(us: Option<i64>) -> Option<DateTime<Utc>> {
    us.and_then(DateTime::from_timestamp_micros)
}

/// A duration in microseconds, for `INTERVAL ? MICROSECOND`.
pub(super) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A value bound to a statement.
#[derive(Clone, Copy, Debug)]
pub(super) enum Arg<'a> {
    /// A status code, in its own type.
    Status(&'a StatusValue),
    /// A status code or NULL.
    MaybeStatus(Option<&'a StatusValue>),
    /// Text (character ids, the outbox's order ids).
    Text(&'a str),
    /// NULL.
    Null,
    /// A number (integer ids, limits, microseconds).
    Int(i64),
    /// A `BIGINT UNSIGNED` id.
    UInt(u64),
    /// A decimal id, sent as `DECIMAL` (the type is the server's own).
    Decimal(&'a str, &'a MySqlTypeInfo),
    /// A uuid id (MariaDB's `UUID`), as its canonical text.
    Uuid(&'a [u8; 16]),
    /// An instant (the outbox's UTC times).
    Time(DateTime<Utc>),
    /// Bytes (a parked body).
    Bytes(&'a [u8]),
}

/// Binds `values`, in order: the one place a value becomes a parameter.
pub(super) fn args<'a>(
    values: impl IntoIterator<Item = Arg<'a>>,
) -> Result<MySqlArguments, StoreError> {
    let mut out = MySqlArguments::default();
    for value in values {
        add(&mut out, value).map_err(|e| StoreError::Sql(sqlx::Error::Encode(e)))?;
    }
    Ok(out)
}

pub(super) fn add(out: &mut MySqlArguments, value: Arg<'_>) -> Result<(), BoxDynError> {
    use sqlx::Arguments;
    match value {
        Arg::Status(StatusValue::Int(n)) => out.add(*n),
        Arg::Status(StatusValue::Text(s)) => out.add(s.as_str()),
        Arg::MaybeStatus(Some(status)) => add(out, Arg::Status(status)),
        Arg::MaybeStatus(None) | Arg::Null => out.add(None::<&str>),
        Arg::Text(s) => out.add(s),
        Arg::Int(n) => out.add(n),
        Arg::UInt(n) => out.add(n),
        Arg::Decimal(digits, decimal) => out.add(DecimalArg(digits, decimal)),
        Arg::Uuid(bytes) => out.add(uuid_text(bytes)),
        Arg::Time(t) => out.add(t),
        Arg::Bytes(b) => out.add(b),
    }
}

/// An order id as an argument in the id column's own type.
pub(super) fn id_arg<'a>(value: &'a IdValue, sql: &'a Sql) -> Arg<'a> {
    match value {
        IdValue::Text(s) => Arg::Text(s),
        IdValue::I16(n) => Arg::Int(i64::from(*n)),
        IdValue::I32(n) => Arg::Int(i64::from(*n)),
        IdValue::I64(n) => Arg::Int(*n),
        IdValue::U64(n) => Arg::UInt(*n),
        IdValue::Decimal(digits) => Arg::Decimal(digits, &sql.decimal),
        IdValue::Uuid(bytes) => Arg::Uuid(bytes),
    }
}

/// A whole number sent as `MYSQL_TYPE_NEWDECIMAL` (a length-encoded
/// string of its digits): compared with a `DECIMAL` column as a decimal.
/// Sent as a string, it would be compared as a double, and
/// `12345678901234567890` would match `…891`.
pub(super) struct DecimalArg<'a>(&'a str, &'a MySqlTypeInfo);

impl sqlx::Type<sqlx::MySql> for DecimalArg<'_> {
    fn type_info() -> MySqlTypeInfo {
        <str as sqlx::Type<sqlx::MySql>>::type_info()
    }
}

impl Encode<'_, sqlx::MySql> for DecimalArg<'_> {
    fn encode_by_ref(&self, buf: &mut Vec<u8>) -> Result<IsNull, BoxDynError> {
        // Order ids are at most 128 bytes: a one-byte length.
        let len = u8::try_from(self.0.len()).ok().filter(|n| *n < 251);
        buf.push(len.ok_or("a decimal id over 250 digits")?);
        buf.extend_from_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }

    fn produces(&self) -> Option<MySqlTypeInfo> {
        Some(self.1.clone())
    }
}

/// Whether a server of `version` (`SELECT VERSION()`) has `FOR UPDATE SKIP
/// LOCKED`: MariaDB from 10.6, MySQL from 8.0.1. Older ones lock (and wait
/// for) every row asked about, bounded by `db_lock_timeout`.
pub(super) fn skips_locked(version: &str) -> bool {
    let mut numbers = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let major = numbers.next().unwrap_or(0);
    let minor = numbers.next().unwrap_or(0);
    let patch = numbers.next().unwrap_or(0);
    if version.to_ascii_lowercase().contains("mariadb") {
        (major, minor) >= (10, 6)
    } else {
        (major, minor, patch) >= (8, 0, 1)
    }
}

/// The server's `DECIMAL` type, as a parameter type (sqlx has no public
/// constructor for it): read off a result column.
pub(super) async fn decimal_type(store: &MySqlStore) -> Result<MySqlTypeInfo, StoreError> {
    let row = sqlx::query("SELECT CAST(0 AS DECIMAL(65, 0))")
        .fetch_one(&store.pool)
        .await?;
    Ok(sqlx::Column::type_info(&row.columns()[0]).clone())
}

/// The `(id, deadline)` rows of a scan (`SELECT CAST(id AS CHAR),
/// deadline_us …`), deadlines read as UTC microseconds.
pub(super) async fn page_rows<'a>(
    store: &MySqlStore,
    sql: String,
    values: impl IntoIterator<Item = Arg<'a>>,
) -> Result<Vec<PageRow>, StoreError> {
    let rows: Vec<(String, Option<i64>)> = sqlx::query_as_with(AssertSqlSafe(sql), args(values)?)
        .fetch_all(&store.pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, us)| (id, from_micros(us)))
        .collect())
}

/// Statement parts rendered from the mapping; the `{ids}` place is filled
/// with one `?` per id.
#[derive(Debug)]
pub(crate) struct Sql {
    /// Binds cancelled, paid, unpaid, then the ids. `SKIP LOCKED` when
    /// `skip_locked`.
    pub(super) lock_orders: String,
    /// The same read without a lock (the last committed versions): the
    /// rows `lock_orders` skipped. Binds as `lock_orders`.
    pub(super) read_orders: String,
    /// The server skips locked rows (`FOR UPDATE SKIP LOCKED`).
    pub(super) skip_locked: bool,
    /// The timer's `also` statements as they run: on MariaDB each with a
    /// lock wait of [`crate::store::sql::ALSO_LOCK_WAIT`] (rounded up to
    /// its whole second) for that statement alone; on MySQL as written
    /// (they wait `db_lock_timeout`).
    pub(super) also: Vec<String>,
    /// Binds cancelled, the ids, then unpaid.
    pub(super) update: String,
    /// Binds unpaid.
    pub(super) count: String,
    /// Binds the ids.
    pub(super) items: Option<String>,
    /// Binds unpaid, grace (µs), the cursor's deadline (UTC, or NULL)
    /// three times, its id twice, the timer twice, limit.
    pub(super) overdue: String,
    /// Binds the timer, the reason, the id (in the column's type), the id
    /// (text).
    pub(super) set_aside: String,
    /// Binds unpaid, then the ids: which of them are still waiting.
    pub(super) still_waiting: String,
    /// Binds unpaid, after id twice, limit.
    pub(super) waiting_page: String,
    /// A watch's scan (only for a timer with a watch): binds from, until
    /// (UTC), after (UTC) twice, the after id twice, limit.
    pub(super) due: Option<String>,
    /// The server's `DECIMAL`, for decimal ids.
    pub(super) decimal: MySqlTypeInfo,
}

/// A digest of the whole row `o` (every column, `QUOTE()`d so that NULL
/// and `'NULL'` differ): what tells a row set aside from the same row
/// changed since.
pub(super) fn row_digest(columns: &[String]) -> String {
    let quoted: Vec<String> = columns
        .iter()
        .map(|c| format!("QUOTE(o.{})", shape::quote(Dialect::MySql, c)))
        .collect();
    format!("MD5(CONCAT_WS(',', {}))", quoted.join(", "))
}

/// The deadline `deadline` (SQL, in the session's zone) as UTC
/// microseconds since the epoch: what the service reads of it, NULL when
/// it is no usable time ([`shape::usable_deadline_sql`]: a zero date, a
/// year out of range), never a value the driver cannot represent.
pub(super) fn deadline_us(deadline: &str) -> String {
    format!(
        "CASE WHEN {usable} THEN TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', \
             CONVERT_TZ({deadline}, @@session.time_zone, '+00:00')) END",
        usable = shape::usable_deadline_sql(deadline)
    )
}

/// The timer's `also` statements as they run ([`Sql::also`]).
fn also_statements(timer: &Timer, mariadb: bool) -> Vec<String> {
    let prefix = if mariadb {
        "SET STATEMENT innodb_lock_wait_timeout = 1 FOR "
    } else {
        ""
    };
    timer
        .also
        .iter()
        .map(|statement| format!("{prefix}{statement}"))
        .collect()
}

impl Sql {
    pub(super) fn render(
        timer: &Timer,
        orders: &OrdersColumns,
        with_items: bool,
        decimal: MySqlTypeInfo,
        skip_locked: bool,
        mariadb: bool,
    ) -> Self {
        let o = timer;
        let q = |s: &str| shape::quote(Dialect::MySql, s);
        let (table, id, status) = (q(&o.table), q(&o.id), q(&o.status));
        let deadline = shape::deadline_sql(Dialect::MySql, o);
        let guard = shape::guard_sql(o);
        let deadline_us = deadline_us(&deadline);
        // Due: a usable time (`shape::usable_deadline_sql`), and passed.
        let due = format!(
            "({deadline} <= NOW(6) AND {})",
            shape::usable_deadline_sql(&deadline)
        );
        let set: String = o
            .set
            .iter()
            .map(|(column, value)| format!(", {} = {value}", q(column)))
            .collect();
        let read_orders = format!(
            "SELECT CAST({id} AS CHAR) AS id, {status} = ? AS is_cancelled, \
                    {status} = ? AS is_paid, {status} = ? AS is_unpaid, \
                    {deadline_us} AS expires_us, COALESCE({guard}, FALSE) AS guard_ok, \
                    {due} AS due \
               FROM {table} WHERE {id} IN ({{ids}})"
        );
        let skip = if skip_locked { " SKIP LOCKED" } else { "" };
        Self {
            lock_orders: format!("{read_orders} FOR UPDATE{skip}"),
            read_orders,
            skip_locked,
            also: also_statements(o, mariadb),
            update: format!(
                "UPDATE {table} SET {status} = ?{set} \
                  WHERE {id} IN ({{ids}}) AND {status} = ? AND {due} AND {guard}"
            ),
            count: format!(
                "SELECT COUNT(*), CAST(COALESCE(SUM({due}), 0) AS SIGNED) \
                   FROM {table} WHERE {status} = ? AND {guard}"
            ),
            overdue: overdue_statement(o, &orders.all, &deadline_us),
            set_aside: set_aside_statement(o, &orders.all),
            still_waiting: format!(
                "SELECT CAST({id} AS CHAR) FROM {table} WHERE {status} = ? AND {id} IN ({{ids}})"
            ),
            waiting_page: format!(
                "SELECT CAST({id} AS CHAR), {deadline_us} FROM {table} \
                  WHERE {status} = ? AND {guard} AND (? IS NULL OR {id} > ?) \
                  ORDER BY {id} LIMIT ?"
            ),
            due: timer.watch.map(|_| {
                // Instants are bound in UTC and compared in the session's
                // zone, the zone the shop's DATETIMEs are written in.
                let utc = "CONVERT_TZ(?, '+00:00', @@session.time_zone)";
                format!(
                    "SELECT CAST({id} AS CHAR), {deadline_us} FROM {table} \
                      WHERE {status} = ? AND {guard} AND {deadline} <= {utc} \
                        AND ({deadline} > {utc} \
                             OR ({deadline} = {utc} AND ? IS NOT NULL AND {id} > ?)) \
                      ORDER BY {deadline}, {id} LIMIT ?"
                )
            }),
            items: with_items.then(|| items_statement(timer)),
            decimal,
        }
    }
}

/// The sweeper's page: overdue rows in (deadline, id) order after the
/// cursor, leaving out the rows this timer flipped before (their outbox
/// row) and those set aside unchanged. The cursor's instant is bound in
/// UTC and compared in the session's zone, as a watch's scan does.
pub(super) fn overdue_statement(timer: &Timer, columns: &[String], deadline_us: &str) -> String {
    let q = |s: &str| shape::quote(Dialect::MySql, s);
    let (table, id, status) = (q(&timer.table), q(&timer.id), q(&timer.status));
    let deadline = shape::deadline_sql(Dialect::MySql, timer);
    let guard = shape::guard_sql(timer);
    let utc = "CONVERT_TZ(?, '+00:00', @@session.time_zone)";
    let digest = row_digest(columns);
    let usable = shape::usable_deadline_sql(&deadline);
    format!(
        "SELECT CAST(o.{id} AS CHAR), {deadline_us} FROM {table} AS o \
          WHERE o.{status} = ? AND {deadline} < NOW(6) - INTERVAL ? MICROSECOND \
            AND {usable} AND {guard} \
            AND (? IS NULL \
                 OR ({deadline} >= {utc} \
                     AND ({deadline} > {utc} OR (? IS NOT NULL AND o.{id} > ?)))) \
            AND NOT EXISTS (SELECT 1 FROM order_timeout_cancel_outbox AS x \
                             WHERE x.timer = ? AND x.order_id = CAST(o.{id} AS CHAR)) \
            AND NOT EXISTS (SELECT 1 FROM order_timeout_set_aside AS s \
                             WHERE s.timer = ? AND s.order_id = CAST(o.{id} AS CHAR) \
                               AND s.row_digest = {digest} AND s.retry_at > UTC_TIMESTAMP(6)) \
          ORDER BY {deadline}, o.{id} LIMIT ?"
    )
}

/// Records the row as set aside, with its digest, and when to try it
/// again: the row whose id is exactly the one asked about. The `UPDATE`
/// part's assignments run left to right, each seeing the ones before:
/// `attempts` and `set_aside_at` compare the old digest, so the digest
/// comes last. The mark's attempts are read back by
/// [`SET_ASIDE_ATTEMPTS`].
pub(super) fn set_aside_statement(timer: &Timer, columns: &[String]) -> String {
    let q = |s: &str| shape::quote(Dialect::MySql, s);
    let (table, id) = (q(&timer.table), q(&timer.id));
    let digest = row_digest(columns);
    let same = "row_digest = VALUES(row_digest)";
    format!(
        "INSERT INTO order_timeout_set_aside \
                (timer, order_id, row_digest, reason, set_aside_at, attempts, retry_at) \
         SELECT ?, CAST(o.{id} AS CHAR), {digest}, ?, UTC_TIMESTAMP(6), 1, \
                UTC_TIMESTAMP(6) + INTERVAL 1 HOUR FROM {table} AS o \
          WHERE o.{id} = ? AND BINARY CAST(o.{id} AS CHAR) = ? \
         ON DUPLICATE KEY UPDATE \
            attempts = IF({same}, attempts + 1, 1), \
            retry_at = UTC_TIMESTAMP(6) + INTERVAL IF(attempts > {hourly}, 24, 1) HOUR, \
            set_aside_at = IF({same}, set_aside_at, VALUES(set_aside_at)), \
            reason = VALUES(reason), row_digest = VALUES(row_digest)",
        hourly = crate::store::SET_ASIDE_HOURLY_TRIES,
    )
}

/// The attempts of a mark [`set_aside_statement`] just wrote: binds the
/// timer, the id.
pub(super) const SET_ASIDE_ATTEMPTS: &str =
    "SELECT attempts FROM order_timeout_set_aside WHERE timer = ? AND order_id = ?";

pub(super) fn items_statement(timer: &Timer) -> String {
    let i = &timer.items;
    let q = |s: &str| shape::quote(Dialect::MySql, s);
    format!(
        "SELECT CAST({oid} AS CHAR) AS order_id, CAST({sku} AS CHAR) AS sku, \
                CAST({qty} AS SIGNED) AS quantity \
           FROM {table} WHERE {oid} IN ({{ids}}) ORDER BY 1, 2",
        oid = q(&i.order_id),
        sku = q(&i.sku),
        qty = q(&i.quantity),
        table = q(&i.table),
    )
}
