//! MySQL 5.7/8 and MariaDB 10.x: no `UPDATE … RETURNING` in a CTE, so the
//! cancel is a transaction: the order rows and their outbox rows read with
//! `SELECT … FOR UPDATE` (order rows `SKIP LOCKED` where the server has it,
//! MySQL 8 and MariaDB 10.6 on: a row the shop holds is skipped, read
//! without a lock and reported held, so it delays only itself), a
//! conditional `UPDATE … WHERE id IN (…)` of the eligible ones, those rows
//! read again (the UPDATE may flip fewer: see [`flip`]), the `also`
//! statements and the outbox rows for exactly the rows it flipped, expired
//! leases taken, then one commit. The facts read are turned into order
//! states by the same mapping as PostgreSQL's (`state.rs`).
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
//!
//! Ids compare exactly: the collations shops use are case-insensitive and
//! pad with spaces (`'abc ' = 'ABC'` is true), so `id IN (…)` may find a
//! row spelled differently from the id asked about. Every row is read back
//! by its id's text, and only the rows whose id is exactly one asked about
//! are acted on; the outbox keys ids as bytes.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::encode::{Encode, IsNull};
use sqlx::error::BoxDynError;
use sqlx::mysql::{
    MySqlArguments, MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlTypeInfo,
};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Executor, Row, SqlSafeStr};

use super::outbox::{OwnRow, Statement, Value, Vocabulary};
use super::ids::{IdColumn, IdValue, uuid_text};
use super::catalog::{self, Column, Columns};
use super::shape::{self, OrdersColumns};
use super::releases::{Expansion, Migrated};
use super::sql::{
    AlsoCheckError, Check, ItemRow, PageRow, Prepared, SqlDialect, SqlStore, commit_or_roll_back,
};
use super::state::StateRow;
use super::{Dialect, PoolSettings, StoreError};
use crate::settings::{Release, SecretUrl, StatusValue, Timer, TimerKey};

/// MySQL and MariaDB, as a [`SqlDialect`].
#[derive(Debug)]
pub(crate) struct MySql;

/// The store on MySQL or MariaDB.
pub(crate) type MySqlStore = SqlStore<MySql>;

/// A transaction on MySQL.
type Tx = sqlx::Transaction<'static, sqlx::MySql>;

/// The service's own migrations for MySQL (`migrations/mysql/`), recorded in
/// `order_timeout_migrations`.
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("./migrations/mysql");
    migrator.dangerous_set_table_name("order_timeout_migrations");
    migrator
}

/// What a MySQL error number means to the store, where the generic SQLSTATE
/// `HY000` hides it ([`StoreError::is_permanent`],
/// [`StoreError::is_lock_timeout`] say why each matters).
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
    /// Waiting cannot fix it: 1366 incorrect value, 1292 truncated value,
    /// 1364 no default, 1411 incorrect value for a function, 3819 check
    /// constraint, 1093/1442 statements MySQL refuses.
    Permanent,
}

/// The [`ErrorClass`] of a MySQL/MariaDB error; `None` for another
/// database's error, or a number the SQLSTATE classifies well enough.
pub(super) fn error_class(e: &dyn sqlx::error::DatabaseError) -> Option<ErrorClass> {
    let my = e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()?;
    match my.number() {
        1205 | 3572 => Some(ErrorClass::LockTimeout),
        1040 | 1044 | 1045 | 1053 | 1152 | 1158..=1161 | 1180 | 1203 | 1213 | 1226 | 1290
        | 1317 | 1637 | 1836 | 1927 | 1969 | 2006 | 2013 | 3024 => Some(ErrorClass::Transient),
        1093 | 1292 | 1364 | 1366 | 1411 | 1442 | 3819 => Some(ErrorClass::Permanent),
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

/// The most placeholders one MySQL statement can have.
const PLACEHOLDERS: usize = 65_535;

/// Placeholders per order id in the cancel transaction's statement with
/// the most (the outbox insert: id, created, lease end, released).
const PLACEHOLDERS_PER_ID: usize = 4;

/// `?, ?, …` for `n` values.
fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Microseconds since the epoch as a UTC instant.
fn from_micros(us: Option<i64>) -> Option<DateTime<Utc>> {
    us.and_then(DateTime::from_timestamp_micros)
}

/// A duration in microseconds, for `INTERVAL ? MICROSECOND`.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A value bound to a statement.
#[derive(Clone, Copy, Debug)]
enum Arg<'a> {
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
}

/// Binds `values`, in order: the one place a value becomes a parameter.
fn args<'a>(values: impl IntoIterator<Item = Arg<'a>>) -> Result<MySqlArguments, StoreError> {
    let mut out = MySqlArguments::default();
    for value in values {
        add(&mut out, value).map_err(|e| StoreError::Sql(sqlx::Error::Encode(e)))?;
    }
    Ok(out)
}

fn add(out: &mut MySqlArguments, value: Arg<'_>) -> Result<(), BoxDynError> {
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
    }
}

/// An order id as an argument in the id column's own type.
fn id_arg<'a>(value: &'a IdValue, sql: &'a Sql) -> Arg<'a> {
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
struct DecimalArg<'a>(&'a str, &'a MySqlTypeInfo);

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
fn skips_locked(version: &str) -> bool {
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
async fn decimal_type(store: &MySqlStore) -> Result<MySqlTypeInfo, StoreError> {
    let row = sqlx::query("SELECT CAST(0 AS DECIMAL(65, 0))")
        .fetch_one(&store.pool)
        .await?;
    Ok(sqlx::Column::type_info(&row.columns()[0]).clone())
}

/// The `(id, deadline)` rows of a scan (`SELECT CAST(id AS CHAR),
/// deadline_us …`), deadlines read as UTC microseconds.
async fn page_rows<'a>(
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

/// Runs `sql` with `values` bound, in `tx` or on the pool.
macro_rules! run {
    ($sql:expr, $values:expr, $on:expr) => {
        sqlx::query_with(AssertSqlSafe($sql), args($values)?).execute($on)
    };
}

/// Statement parts rendered from the mapping; the `{ids}` place is filled
/// with one `?` per id.
#[derive(Debug)]
pub(crate) struct Sql {
    /// Binds cancelled, paid, unpaid, then the ids. `SKIP LOCKED` when
    /// `skip_locked`.
    lock_orders: String,
    /// The same read without a lock (the last committed versions): the
    /// rows `lock_orders` skipped. Binds as `lock_orders`.
    read_orders: String,
    /// The server skips locked rows (`FOR UPDATE SKIP LOCKED`).
    skip_locked: bool,
    /// Binds cancelled, the ids, then unpaid.
    update: String,
    /// Binds unpaid.
    count: String,
    /// Binds the ids.
    items: Option<String>,
    /// Binds unpaid, grace (µs), the cursor's deadline (UTC, or NULL)
    /// three times, its id twice, the timer twice, limit.
    overdue: String,
    /// Binds the timer, the reason, the id (in the column's type), the id
    /// (text).
    set_aside: String,
    /// Binds unpaid, then the ids: which of them are still waiting.
    still_waiting: String,
    /// Binds unpaid, after id twice, limit.
    waiting_page: String,
    /// A watch's scan (only for a timer with a watch): binds from, until
    /// (UTC), after (UTC) twice, the after id twice, limit.
    due: Option<String>,
    /// The server's `DECIMAL`, for decimal ids.
    decimal: MySqlTypeInfo,
}

/// A digest of the whole row `o` (every column, `QUOTE()`d so that NULL
/// and `'NULL'` differ): what tells a row set aside from the same row
/// changed since.
fn row_digest(columns: &[String]) -> String {
    let quoted: Vec<String> = columns
        .iter()
        .map(|c| format!("QUOTE(o.{})", shape::quote(Dialect::MySql, c)))
        .collect();
    format!("MD5(CONCAT_WS(',', {}))", quoted.join(", "))
}

impl Sql {
    fn render(
        timer: &Timer,
        orders: &OrdersColumns,
        with_items: bool,
        decimal: MySqlTypeInfo,
        skip_locked: bool,
    ) -> Self {
        let o = timer;
        let q = |s: &str| shape::quote(Dialect::MySql, s);
        let (table, id, status) = (q(&o.table), q(&o.id), q(&o.status));
        let deadline = shape::deadline_sql(Dialect::MySql, o);
        let guard = shape::guard_sql(o);
        let deadline_us = format!(
            "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', \
             CONVERT_TZ({deadline}, @@session.time_zone, '+00:00'))"
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
                    {deadline} <= NOW(6) AS due \
               FROM {table} WHERE {id} IN ({{ids}})"
        );
        let skip = if skip_locked { " SKIP LOCKED" } else { "" };
        Self {
            lock_orders: format!("{read_orders} FOR UPDATE{skip}"),
            read_orders,
            skip_locked,
            update: format!(
                "UPDATE {table} SET {status} = ?{set} \
                  WHERE {id} IN ({{ids}}) AND {status} = ? AND {deadline} <= NOW(6) AND {guard}"
            ),
            count: format!(
                "SELECT COUNT(*), CAST(COALESCE(SUM({deadline} <= NOW(6)), 0) AS SIGNED) \
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
fn overdue_statement(timer: &Timer, columns: &[String], deadline_us: &str) -> String {
    let q = |s: &str| shape::quote(Dialect::MySql, s);
    let (table, id, status) = (q(&timer.table), q(&timer.id), q(&timer.status));
    let deadline = shape::deadline_sql(Dialect::MySql, timer);
    let guard = shape::guard_sql(timer);
    let utc = "CONVERT_TZ(?, '+00:00', @@session.time_zone)";
    let digest = row_digest(columns);
    format!(
        "SELECT CAST(o.{id} AS CHAR), {deadline_us} FROM {table} AS o \
          WHERE o.{status} = ? AND {deadline} < NOW(6) - INTERVAL ? MICROSECOND \
            AND {guard} \
            AND (? IS NULL \
                 OR ({deadline} >= {utc} \
                     AND ({deadline} > {utc} OR (? IS NOT NULL AND o.{id} > ?)))) \
            AND NOT EXISTS (SELECT 1 FROM order_timeout_cancel_outbox AS x \
                             WHERE x.timer = ? AND x.order_id = CAST(o.{id} AS CHAR)) \
            AND NOT EXISTS (SELECT 1 FROM order_timeout_set_aside AS s \
                             WHERE s.timer = ? AND s.order_id = CAST(o.{id} AS CHAR) \
                               AND s.row_digest = {digest}) \
          ORDER BY {deadline}, o.{id} LIMIT ?"
    )
}

/// Records the row as set aside, with its digest (replacing an older mark
/// of the same order): the row whose id is exactly the one asked about.
fn set_aside_statement(timer: &Timer, columns: &[String]) -> String {
    let q = |s: &str| shape::quote(Dialect::MySql, s);
    let (table, id) = (q(&timer.table), q(&timer.id));
    let digest = row_digest(columns);
    format!(
        "INSERT INTO order_timeout_set_aside \
                (timer, order_id, row_digest, reason, set_aside_at) \
         SELECT ?, CAST(o.{id} AS CHAR), {digest}, ?, UTC_TIMESTAMP(6) FROM {table} AS o \
          WHERE o.{id} = ? AND BINARY CAST(o.{id} AS CHAR) = ? \
         ON DUPLICATE KEY UPDATE row_digest = VALUES(row_digest), \
            reason = VALUES(reason), set_aside_at = VALUES(set_aside_at)"
    )
}

fn items_statement(timer: &Timer) -> String {
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

/// One order row as the cancel transaction locked it.
#[derive(Debug, sqlx::FromRow)]
struct LockedOrder {
    /// The id, as text.
    id: String,
    /// Its status is `cancelled`.
    is_cancelled: Option<bool>,
    /// Its status is `paid`.
    is_paid: Option<bool>,
    /// Its status is `unpaid`.
    is_unpaid: Option<bool>,
    /// Its deadline, in UTC microseconds since the epoch.
    expires_us: Option<i64>,
    /// It passes the guard.
    guard_ok: Option<bool>,
    /// Its deadline has passed.
    due: Option<bool>,
}

impl LockedOrder {
    /// Unpaid, passing the guard and overdue: what the UPDATE flips.
    fn cancellable(&self) -> bool {
        [self.is_unpaid, self.guard_ok, self.due]
            .iter()
            .all(|fact| fact.unwrap_or(false))
    }
}

/// One outbox row as the cancel transaction locked it.
#[derive(Debug, sqlx::FromRow)]
struct LockedOutbox {
    /// The order id.
    order_id: String,
    /// When the order was cancelled.
    created_at: DateTime<Utc>,
    /// The lease's end, if any.
    claimed_until: Option<DateTime<Utc>>,
    /// The stock release is done.
    released: bool,
    /// The event is published.
    published: bool,
    /// No live lease.
    free: bool,
}

impl LockedOutbox {
    /// Work pending and no live lease: this caller takes it over.
    fn to_take_over(&self) -> bool {
        self.free && !(self.released && self.published)
    }
}

/// What the cancel transaction found and did, per order asked about.
struct Findings {
    orders: HashMap<String, LockedOrder>,
    /// Rows another transaction holds, as last committed: skipped.
    held: HashMap<String, LockedOrder>,
    outbox: HashMap<String, LockedOutbox>,
    /// Flipped to cancelled by this transaction, and when.
    cancelled: HashMap<String, DateTime<Utc>>,
    /// Outbox leases taken over by this transaction.
    taken: Vec<String>,
    /// The transaction's clock.
    db_now: DateTime<Utc>,
}

impl Findings {
    /// When this transaction cancelled `id`: its clock after the locks,
    /// and never before the deadline it cancelled for (the clocks the
    /// deadline check and this one read are a statement apart).
    fn cancelled_at(&self, id: &str) -> DateTime<Utc> {
        let expires_at = self.orders.get(id).and_then(|r| from_micros(r.expires_us));
        expires_at.map_or(self.db_now, |deadline| deadline.max(self.db_now))
    }

    /// The facts about `id`, for the shared mapping to an order state.
    fn state_row(&self, id: &str, nothing_to_release: bool) -> StateRow {
        let held = self.held.get(id);
        let order = self.orders.get(id).or(held);
        let ob = self.outbox.get(id);
        let cancelled_at = self.cancelled.get(id).copied();
        let just = cancelled_at.is_some();
        let fact = |f: fn(&LockedOrder) -> Option<bool>| order.and_then(f).unwrap_or(false);
        StateRow {
            id: id.to_owned(),
            found: order.is_some(),
            is_cancelled: just || fact(|r| r.is_cancelled),
            is_paid: !just && fact(|r| r.is_paid),
            is_unpaid: fact(|r| r.is_unpaid),
            guard_ok: fact(|r| r.guard_ok),
            expires_at: order.and_then(|r| from_micros(r.expires_us)),
            cancelled_at: cancelled_at.or(ob.map(|r| r.created_at)),
            just_cancelled: just,
            locked: held.is_some_and(LockedOrder::cancellable),
            leased: just || self.taken.iter().any(|t| t == id),
            claimed_until: ob.and_then(|r| r.claimed_until),
            has_outbox: just || ob.is_some(),
            stock_released: if just {
                nothing_to_release
            } else {
                ob.is_some_and(|r| r.released)
            },
            event_published: ob.is_some_and(|r| r.published),
            db_now: self.db_now,
        }
    }
}

/// The cancel transaction's statements on `tx` (see the module docs); the
/// caller commits, or rolls back at once when they fail.
async fn cancel_in(
    tx: &mut Tx,
    store: &MySqlStore,
    prepared: &Prepared<MySql>,
    ids: &[&str],
    lease: Duration,
) -> Result<Vec<StateRow>, StoreError> {
    let mut orders = lock_orders(tx, store, prepared, ids).await?;
    // The rows `SKIP LOCKED` left out, as last committed: which of them
    // exist, and which another transaction holds while they are due.
    let skipped: Vec<&str> = match prepared.sql.skip_locked {
        true => ids
            .iter()
            .copied()
            .filter(|id| !orders.contains_key(*id))
            .collect(),
        false => Vec::new(),
    };
    let held = match skipped.is_empty() {
        true => HashMap::new(),
        false => {
            let sql = &prepared.sql.read_orders;
            read_orders(tx, store, prepared, &skipped, sql).await?
        }
    };
    let outbox = lock_outbox(tx, &store.timer, ids).await?;
    // After the locks: a cancel that waited for a row the shop held is
    // timed when it happened, not when it began waiting.
    let db_now = utc_now(tx).await?;
    let eligible = eligible(ids, &orders, &outbox);
    let mut flipped = Vec::new();
    if !eligible.is_empty() {
        flipped = flip(tx, store, prepared, &eligible, &mut orders).await?;
    }
    let mut findings = Findings {
        orders,
        held,
        outbox,
        cancelled: HashMap::new(),
        taken: Vec::new(),
        db_now,
    };
    // In id order, as the rows were locked.
    let flipped: Vec<(String, DateTime<Utc>)> = (flipped.into_iter())
        .map(|id| {
            let at = findings.cancelled_at(&id);
            (id, at)
        })
        .collect();
    if !flipped.is_empty() {
        record_effects(tx, store, prepared, &flipped, lease).await?;
    }
    findings.cancelled = flipped.into_iter().collect();
    findings.taken = take_over(tx, &store.timer, ids, &findings.outbox, lease).await?;
    let none = store.timer.release == Release::None;
    Ok(ids.iter().map(|id| findings.state_row(id, none)).collect())
}

/// The database's UTC clock.
async fn utc_now(tx: &mut Tx) -> Result<DateTime<Utc>, StoreError> {
    Ok(sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
        .fetch_one(&mut **tx)
        .await?)
}

/// Locks the order rows `ids` and reads their facts, by id (skipping rows
/// another transaction holds, where the server can).
async fn lock_orders(
    tx: &mut Tx,
    store: &MySqlStore,
    prepared: &Prepared<MySql>,
    ids: &[&str],
) -> Result<HashMap<String, LockedOrder>, StoreError> {
    read_orders(tx, store, prepared, ids, &prepared.sql.lock_orders).await
}

/// Reads the facts of the order rows `ids` with `sql` (`lock_orders` or
/// `read_orders`), by id.
async fn read_orders(
    tx: &mut Tx,
    store: &MySqlStore,
    prepared: &Prepared<MySql>,
    ids: &[&str],
    sql: &str,
) -> Result<HashMap<String, LockedOrder>, StoreError> {
    let o = &store.timer;
    let statuses = [
        Arg::Status(&o.to),
        Arg::MaybeStatus(o.paid.as_ref()),
        Arg::Status(&o.from),
    ];
    let id_values = id_values(prepared, ids)?;
    let id_args = id_values.iter().map(|v| id_arg(v, &prepared.sql));
    let values = args(statuses.into_iter().chain(id_args))?;
    let sql = sql.replace("{ids}", &marks(ids.len()));
    let rows: Vec<LockedOrder> = sqlx::query_as_with(AssertSqlSafe(sql), values)
        .fetch_all(&mut **tx)
        .await?;
    // Exactly the rows asked about: a case-insensitive or space-padding
    // collation also finds `abc` for `ABC` or `abc `.
    Ok(rows
        .into_iter()
        .filter(|r| ids.contains(&r.id.as_str()))
        .map(|r| (r.id.clone(), r))
        .collect())
}

/// `ids` as values of the id column's type.
fn id_values(prepared: &Prepared<MySql>, ids: &[&str]) -> Result<Vec<IdValue>, StoreError> {
    ids.iter().map(|id| prepared.id_value(id)).collect()
}

/// Locks the timer's outbox rows of `ids` and reads them, by order id.
async fn lock_outbox(
    tx: &mut Tx,
    timer: &Timer,
    ids: &[&str],
) -> Result<HashMap<String, LockedOutbox>, StoreError> {
    let sql = format!(
        "SELECT CAST(order_id AS CHAR) AS order_id, created_at, claimed_until, \
                stock_released_at IS NOT NULL AS released, \
                event_published_at IS NOT NULL AS published, \
                claimed_until IS NULL OR claimed_until <= UTC_TIMESTAMP(6) AS free \
           FROM order_timeout_cancel_outbox \
          WHERE timer = ? AND order_id IN ({}) FOR UPDATE",
        marks(ids.len())
    );
    let values =
        std::iter::once(Arg::Text(timer.name.as_str())).chain(ids.iter().map(|id| Arg::Text(id)));
    let rows: Vec<LockedOutbox> = sqlx::query_as_with(AssertSqlSafe(sql), args(values)?)
        .fetch_all(&mut **tx)
        .await?;
    Ok(rows.into_iter().map(|r| (r.order_id.clone(), r)).collect())
}

/// The orders the UPDATE is for: locked unpaid, overdue and passing the
/// guard, and never cancelled by this service before (no outbox row).
fn eligible<'a>(
    ids: &[&'a str],
    orders: &HashMap<String, LockedOrder>,
    outbox: &HashMap<String, LockedOutbox>,
) -> Vec<&'a str> {
    ids.iter()
        .copied()
        .filter(|id| orders.get(*id).is_some_and(LockedOrder::cancellable))
        .filter(|id| !outbox.contains_key(*id))
        .collect()
}

/// Runs the conditional UPDATE over the eligible (locked) orders, then
/// reads them again: the UPDATE evaluates the deadline and the guard anew,
/// and what their sub-selects read (a cancel switch, a settings row) other
/// sessions may have changed since the locking read, so it may flip fewer
/// rows than were eligible. This transaction holds the rows' locks and they
/// were unpaid, so a row that reads cancelled now was flipped by it. The
/// facts read again replace the locked ones; returns the ids flipped.
async fn flip(
    tx: &mut Tx,
    store: &MySqlStore,
    prepared: &Prepared<MySql>,
    eligible: &[&str],
    orders: &mut HashMap<String, LockedOrder>,
) -> Result<Vec<String>, StoreError> {
    let o = &store.timer;
    let sql = &prepared.sql;
    let id_values = id_values(prepared, eligible)?;
    let update = sql.update.replace("{ids}", &marks(eligible.len()));
    let values = std::iter::once(Arg::Status(&o.to))
        .chain(id_values.iter().map(|v| id_arg(v, sql)))
        .chain([Arg::Status(&o.from)]);
    run!(update, values, &mut **tx).await?;
    let after = lock_orders(tx, store, prepared, eligible).await?;
    let flipped = eligible
        .iter()
        .filter(|id| {
            after
                .get(**id)
                .is_some_and(|r| r.is_cancelled == Some(true))
        })
        .map(|id| (*id).to_owned())
        .collect();
    orders.extend(after);
    Ok(flipped)
}

/// For each order this transaction flipped, with the time it was
/// cancelled: its `also` statements, and its outbox row leased to this
/// caller.
async fn record_effects(
    tx: &mut Tx,
    store: &MySqlStore,
    prepared: &Prepared<MySql>,
    flipped: &[(String, DateTime<Utc>)],
    lease: Duration,
) -> Result<(), StoreError> {
    let o = &store.timer;
    let sql = &prepared.sql;
    for (id, _) in flipped {
        let id = prepared.id_value(id)?;
        for (statement, params) in o.also.iter().zip(&prepared.also_params) {
            let values = std::iter::repeat_n(id_arg(&id, sql), *params);
            run!(statement.clone(), values, &mut **tx).await?;
        }
    }
    // PLACEHOLDERS_PER_ID per row: the statement with the most per id.
    // The timer's name is written in: `[a-z0-9_]{1,64}` (TimerName).
    let insert = format!(
        "INSERT INTO order_timeout_cancel_outbox \
                (timer, order_id, created_at, claimed_until, stock_released_at) VALUES {} \
         ON DUPLICATE KEY UPDATE order_id = order_id",
        vec![format!("('{}', ?, ?, ?, ?)", o.name); flipped.len()].join(", ")
    );
    let none = o.release == Release::None;
    // The time reported now, so what is reported and what is read back
    // later is one instant.
    let values = flipped.iter().flat_map(|(id, at)| {
        [
            Arg::Text(id),
            Arg::Time(*at),
            Arg::Time(lease_end(*at, lease)),
            none.then_some(*at).map_or(Arg::Null, Arg::Time),
        ]
    });
    run!(insert, values, &mut **tx).await?;
    Ok(())
}

/// The end of a lease of `lease` taken at `at`, within `DATETIME`'s range.
fn lease_end(at: DateTime<Utc>, lease: Duration) -> DateTime<Utc> {
    let latest = DateTime::from_timestamp(253_402_300_799, 0).unwrap_or(at); // 9999-12-31
    chrono::TimeDelta::from_std(lease)
        .ok()
        .and_then(|lease| at.checked_add_signed(lease))
        .map_or(latest, |end| end.min(latest))
}

/// Takes over the expired leases of earlier cancellations with work
/// pending; returns their ids.
async fn take_over(
    tx: &mut Tx,
    timer: &Timer,
    ids: &[&str],
    outbox: &HashMap<String, LockedOutbox>,
    lease: Duration,
) -> Result<Vec<String>, StoreError> {
    let taken: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| outbox.get(*id).is_some_and(LockedOutbox::to_take_over))
        .collect();
    if !taken.is_empty() {
        let take = format!(
            "UPDATE order_timeout_cancel_outbox \
                SET claimed_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
              WHERE timer = ? AND order_id IN ({})",
            marks(taken.len())
        );
        let values = [Arg::Int(micros(lease)), Arg::Text(timer.name.as_str())]
            .into_iter()
            .chain(taken.iter().map(|id| Arg::Text(id)));
        run!(take, values, &mut **tx).await?;
    }
    Ok(taken.into_iter().map(str::to_owned).collect())
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
    const DIALECT: Dialect = Dialect::MySql;
    type Db = sqlx::MySql;
    type Statements = Sql;
    /// Its statements bind one placeholder per id, the outbox insert four.
    const MAX_BATCH_IDS: usize = PLACEHOLDERS / PLACEHOLDERS_PER_ID;
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
        migrator().run(&mut conn).await?;
        Ok(Migrated {
            fresh,
            kept: Vec::new(),
        })
    }

    /// Nothing to contract: MySQL's `ON DUPLICATE KEY` of 0.1.0 works
    /// with the outbox's new key as it is.
    async fn contract(_url: &SecretUrl) -> Result<Vec<Expansion>, StoreError> {
        Ok(Vec::new())
    }

    async fn expansions(_store: &MySqlStore) -> Result<Vec<Expansion>, StoreError> {
        Ok(Vec::new())
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

    async fn statements(
        store: &MySqlStore,
        orders: &OrdersColumns,
        items: Option<&(IdColumn, String)>,
    ) -> Result<Sql, StoreError> {
        let decimal = decimal_type(store).await?;
        let version: String = sqlx::query_scalar("SELECT CAST(VERSION() AS CHAR)")
            .fetch_one(&store.pool)
            .await?;
        let skip_locked = skips_locked(&version);
        if !skip_locked {
            tracing::warn!(%version, "this server has no FOR UPDATE SKIP LOCKED (MySQL 8, MariaDB 10.6 have): a row the shop holds makes its whole batch wait, up to db_lock_timeout");
        }
        Ok(Sql::render(
            &store.timer,
            orders,
            items.is_some(),
            decimal,
            skip_locked,
        ))
    }

    /// With one id: the flip binds cancelled, the id, unpaid; the items
    /// the id; a watch's scan seven values; the sweeper's page ten.
    fn to_check(timer: &Timer, sql: &Sql) -> Vec<Check> {
        let check = |key, sql: String, binds| Check { key, sql, binds };
        let mut checks = vec![check(
            timer.key(TimerKey::Flip),
            sql.update.replace("{ids}", "?"),
            3,
        )];
        if let Some(items) = &sql.items {
            checks.push(check("[items]", items.replace("{ids}", "?"), 1));
        }
        if let Some(due) = &sql.due {
            checks.push(check(timer.key(TimerKey::DeadlineGuard), due.clone(), 7));
        }
        let rows = timer.key(TimerKey::DeadlineGuard);
        checks.push(check(rows, sql.overdue.clone(), 10));
        checks.push(check(timer.key(TimerKey::Id), sql.set_aside.clone(), 4));
        let waiting = sql.still_waiting.replace("{ids}", "?");
        checks.push(check(timer.key(TimerKey::Status), waiting, 2));
        checks
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

    async fn count_waiting(store: &MySqlStore, sql: &Sql) -> Result<(i64, i64), sqlx::Error> {
        let values = args([Arg::Status(&store.timer.from)]);
        let values = values.map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
        sqlx::query_as_with(AssertSqlSafe(sql.count.clone()), values)
            .fetch_one(&store.pool)
            .await
    }

    /// The cancel transaction (see the module docs).
    async fn cancel(
        store: &MySqlStore,
        prepared: &Prepared<Self>,
        ids: &[&str],
        lease: Duration,
    ) -> Result<Vec<StateRow>, StoreError> {
        let mut tx = store.pool.begin().await?;
        let result = cancel_in(&mut tx, store, prepared, ids, lease).await;
        commit_or_roll_back(tx, result).await
    }

    async fn items(
        store: &MySqlStore,
        prepared: &Prepared<Self>,
        ids: &[&str],
    ) -> Result<Vec<ItemRow>, StoreError> {
        let Some(sql) = &prepared.sql.items else {
            return Ok(Vec::new());
        };
        let values: Vec<IdValue> = ids
            .iter()
            .map(|id| prepared.items_id_value(id))
            .collect::<Result<_, _>>()?;
        let values = values.iter().map(|v| id_arg(v, &prepared.sql));
        let sql = sql.replace("{ids}", &marks(ids.len()));
        Ok(sqlx::query_as_with(AssertSqlSafe(sql), args(values)?)
            .fetch_all(&store.pool)
            .await?)
    }

    async fn overdue(
        store: &MySqlStore,
        prepared: &Prepared<Self>,
        grace: Duration,
        after: Option<(DateTime<Utc>, Option<&str>)>,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        let deadline = after.map_or(Arg::Null, |(at, _)| Arg::Time(at));
        let id = after
            .and_then(|(_, id)| id)
            .map(|id| prepared.id_value(id))
            .transpose()?;
        let id = id.as_ref().map_or(Arg::Null, |v| id_arg(v, &prepared.sql));
        let timer = Arg::Text(store.timer.name.as_str());
        let values = [
            Arg::Status(&store.timer.from),
            Arg::Int(micros(grace)),
            deadline,
            deadline,
            deadline,
            id,
            id,
            timer,
            timer,
            Arg::Int(i64::from(limit)),
        ];
        let sql = prepared.sql.overdue.clone();
        page_rows(store, sql, values).await
    }

    async fn set_aside(
        store: &MySqlStore,
        prepared: &Prepared<Self>,
        id: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let value = prepared.id_value(id)?;
        let values = [
            Arg::Text(store.timer.name.as_str()),
            Arg::Text(reason),
            id_arg(&value, &prepared.sql),
            Arg::Text(id),
        ];
        let done = run!(prepared.sql.set_aside.clone(), values, &store.pool).await?;
        Ok(done.rows_affected() > 0)
    }

    /// The marks, then which of their rows are still waiting (ids bound
    /// in the column's type, as everywhere), then the others deleted.
    async fn prune_set_aside(
        store: &MySqlStore,
        prepared: &Prepared<Self>,
    ) -> Result<u64, StoreError> {
        let timer = Arg::Text(store.timer.name.as_str());
        let marked: Vec<String> = sqlx::query_scalar_with(
            "SELECT CAST(order_id AS CHAR) FROM order_timeout_set_aside WHERE timer = ? LIMIT 1000",
            args([timer])?,
        )
        .fetch_all(&store.pool)
        .await?;
        // A mark whose id no longer fits the column names no row.
        let fits: Vec<(&str, IdValue)> = marked
            .iter()
            .filter_map(|id| Some((id.as_str(), prepared.id_value(id).ok()?)))
            .collect();
        let mut waiting: Vec<String> = Vec::new();
        if !fits.is_empty() {
            let sql = prepared.sql.still_waiting.replace("{ids}", &marks(fits.len()));
            let values = std::iter::once(Arg::Status(&store.timer.from))
                .chain(fits.iter().map(|(_, v)| id_arg(v, &prepared.sql)));
            waiting = sqlx::query_scalar_with(AssertSqlSafe(sql), args(values)?)
                .fetch_all(&store.pool)
                .await?;
        }
        let gone: Vec<&str> = marked
            .iter()
            .map(String::as_str)
            .filter(|id| !waiting.iter().any(|w| w == id))
            .collect();
        if gone.is_empty() {
            return Ok(0);
        }
        let delete = format!(
            "DELETE FROM order_timeout_set_aside WHERE timer = ? AND order_id IN ({})",
            marks(gone.len())
        );
        let values = std::iter::once(timer).chain(gone.iter().map(|id| Arg::Text(id)));
        Ok(run!(delete, values, &store.pool).await?.rows_affected())
    }

    async fn waiting_page(
        store: &MySqlStore,
        prepared: &Prepared<Self>,
        from: Option<&str>,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        let from = from.map(|id| prepared.id_value(id)).transpose()?;
        let after = from
            .as_ref()
            .map_or(Arg::Null, |v| id_arg(v, &prepared.sql));
        let values = [
            Arg::Status(&store.timer.from),
            after,
            after,
            Arg::Int(i64::from(limit)),
        ];
        let sql = prepared.sql.waiting_page.clone();
        page_rows(store, sql, values).await
    }

    async fn due_between(
        store: &MySqlStore,
        prepared: &Prepared<Self>,
        after: (DateTime<Utc>, Option<&str>),
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        let Some(sql) = &prepared.sql.due else {
            return Ok(Vec::new());
        };
        let after_id = after.1.map(|id| prepared.id_value(id)).transpose()?;
        let after_id = after_id
            .as_ref()
            .map_or(Arg::Null, |v| id_arg(v, &prepared.sql));
        let values = [
            Arg::Status(&store.timer.from),
            Arg::Time(until),
            Arg::Time(after.0),
            Arg::Time(after.0),
            after_id,
            after_id,
            Arg::Int(i64::from(limit)),
        ];
        page_rows(store, sql.clone(), values).await
    }


    async fn execute(store: &MySqlStore, statement: Statement<'_>) -> Result<u64, StoreError> {
        let values = statement.values.iter().flat_map(arg);
        Ok(run!(statement.sql, values, &store.pool).await?.rows_affected())
    }

    async fn fetch<T: OwnRow>(store: &MySqlStore, statement: Statement<'_>) -> Result<Vec<T>, StoreError> {
        let values = statement.values.iter().flat_map(arg);
        let query = sqlx::query_as_with(AssertSqlSafe(statement.sql), args(values)?);
        Ok(query.fetch_all(&store.pool).await?)
    }
}

/// MySQL's words for the statements of the service's own tables.
impl Vocabulary for MySql {
    const NOW: &'static str = "UTC_TIMESTAMP(6)";
    /// The column is `VARBINARY` (ids compare byte for byte).
    const ORDER_ID: &'static str = "CAST(order_id AS CHAR)";
    /// `sweep_at` is a generated column, set only while the row's work is
    /// pending and not given up: the `(timer, sweep_at)` index holds
    /// exactly the rows to sweep.
    const SWEEP_DUE: &'static str = "sweep_at <= UTC_TIMESTAMP(6)";
    const SWEEP_AT: &'static str = "sweep_at";
    /// A no-op update rather than `INSERT IGNORE`, which would turn every
    /// other error into a warning too.
    const KEEP_EXISTING: &'static str = "ON DUPLICATE KEY UPDATE timer = timer";

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
}

/// A value of a statement of the service's own tables as MySQL binds it:
/// an id list as one value per id.
fn arg<'a>(value: &Value<'a>) -> Vec<Arg<'a>> {
    match *value {
        Value::Text(s) => vec![Arg::Text(s)],
        Value::Int(n) | Value::Micros(n) => vec![Arg::Int(n)],
        Value::Time(t) => vec![Arg::Time(t)],
        Value::Ids(ids) => ids.iter().map(|id| Arg::Text(id)).collect(),
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
