//! What the dialects share about the shop's schema: the kinds of order id
//! column, how column types classify, quoting, the checks of the mapping,
//! and the report `schema check` prints.

use std::fmt;

use chrono::{DateTime, Utc};

use super::catalog::{Columns, TypeClass};
use super::ids::IdColumn;
use super::zones::{self, DeadlineKind, ZoneReport};
use super::{Dialect, Page, RowCursor, StoreError};
use crate::message::OrderId;
use crate::settings::{
    DeadlineUnit, ItemsMapping, Release, StatusValue, Timer, TimerKey, is_identifier,
};

/// The type of the shop's order id column, which decides what an order id
/// from a message can be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdKind {
    /// Text (`VARCHAR`, `TEXT`): any id, as it is.
    #[default]
    Text,
    /// An integer or decimal column: decimal digits, canonical without
    /// leading zeros.
    Integer,
    /// A uuid column: canonical in lower case with hyphens.
    Uuid,
}

/// Checks that a configured status code fits the status column's type.
pub(crate) fn check_status(
    key: &'static str,
    value: &StatusValue,
    column: &str,
    class: TypeClass,
    data_type: &str,
) -> Result<(), StoreError> {
    let fits = match (value, class) {
        (StatusValue::Int(_), TypeClass::Integer) => true,
        (StatusValue::Text(_), TypeClass::Integer) => false,
        (StatusValue::Int(_), _) => false,
        (StatusValue::Text(_), _) => true,
    };
    if fits {
        Ok(())
    } else {
        Err(StoreError::Schema {
            key,
            problem: format!(
                "{value} does not fit the status column {column:?} of type {data_type} \
                 (write integer codes as numbers, text codes as strings)"
            ),
        })
    }
}

/// A table path (`orders`, `shop.orders`) split into schema and table.
pub(crate) fn split_table(path: &str) -> (Option<&str>, &str) {
    match path.split_once('.') {
        Some((schema, table)) => (Some(schema), table),
        None => (None, path),
    }
}

/// Checks that the identifiers of the mapping are plain identifiers (they
/// are quoted, so anything else would name a column that does not exist).
pub(crate) fn check_identifiers(
    pairs: &[(&'static str, &str)],
    allow_path: bool,
) -> Result<(), StoreError> {
    for (key, value) in pairs {
        let ok = if allow_path && value.contains('.') {
            value.split('.').all(is_identifier) && value.split('.').count() == 2
        } else {
            is_identifier(value)
        };
        if !ok {
            return Err(StoreError::Schema {
                key,
                problem: format!("{value:?} is not a plain identifier"),
            });
        }
    }
    Ok(())
}

/// Quotes an identifier, or a `schema.table` path, for `dialect`.
pub(crate) fn quote(dialect: Dialect, path: &str) -> String {
    let q = match dialect {
        Dialect::Postgres => '"',
        Dialect::MySql => '`',
    };
    path.split('.')
        .map(|part| format!("{q}{part}{q}"))
        .collect::<Vec<_>>()
        .join(".")
}

/// The deadline as SQL: a quoted column, or the operator's expression.
pub(crate) fn deadline_sql(dialect: Dialect, timer: &Timer) -> String {
    let raw = raw_deadline_sql(dialect, timer);
    // Seconds since the epoch a timestamp can hold (PostgreSQL: years 1 to
    // 9999; its `to_timestamp` fails past them, for the whole statement),
    // a `DATETIME` from the year 1000. A count before 1970, or 0, is an
    // instant like any other (due long ago) on both dialects: MySQL's
    // `FROM_UNIXTIME` answers NULL for a negative one (never due), so the
    // instant is counted from 1970 in UTC, where adding is exact, and then
    // shown in the session's zone as every zone-less time is.
    let (min, max) = (-62_135_596_800_i64, 253_402_300_799_i64);
    let mysql_min = -30_610_224_000_i64;
    let mysql = |bound: &str, per_unit: &str| {
        format!(
            "(CASE WHEN {raw} BETWEEN {mysql_min}{bound} AND {max}{bound} THEN \
             CONVERT_TZ(TIMESTAMP'1970-01-01 00:00:00' + INTERVAL (({raw}) * {per_unit}) MICROSECOND, \
                        '+00:00', @@session.time_zone) END)"
        )
    };
    match (dialect, timer.deadline_unit) {
        (_, DeadlineUnit::Time) => raw,
        (Dialect::Postgres, DeadlineUnit::Seconds) => {
            format!("(CASE WHEN {raw} BETWEEN {min} AND {max} THEN to_timestamp({raw}) END)")
        }
        (Dialect::Postgres, DeadlineUnit::Milliseconds) => format!(
            "(CASE WHEN {raw} BETWEEN {min}000 AND {max}000 THEN to_timestamp({raw} / 1000.0) END)"
        ),
        (Dialect::MySql, DeadlineUnit::Seconds) => mysql("", "1000000"),
        (Dialect::MySql, DeadlineUnit::Milliseconds) => mysql("000", "1000"),
    }
}

/// The deadline as configured (a quoted column, or the expression in
/// parentheses), before `deadline_unit` makes a time of it.
pub(crate) fn raw_deadline_sql(dialect: Dialect, timer: &Timer) -> String {
    if is_identifier(&timer.deadline) {
        quote(dialect, &timer.deadline)
    } else {
        format!("({})", timer.deadline)
    }
}

/// What the database's type name `type_name` of a deadline expression
/// (as the driver describes it) is: a time, a number, or something else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeadlineType {
    /// A timestamp, datetime or date.
    Time,
    /// An integer, decimal or floating-point number.
    Number,
    /// Text, a boolean, or anything else that is no time.
    Other,
    /// A type the driver does not name (an untyped NULL): not refused.
    Unknown,
}

impl DeadlineType {
    /// The class of a type name as sqlx names it on either dialect
    /// (`TIMESTAMPTZ`, `DATETIME`, `INT8`, `BIGINT UNSIGNED`, `NUMERIC`…).
    pub(crate) fn of(type_name: &str) -> Self {
        let name = type_name.to_ascii_uppercase();
        let base = name.split([' ', '(']).next().unwrap_or("");
        match base {
            "TIMESTAMPTZ" | "TIMESTAMP" | "DATETIME" | "DATE" => Self::Time,
            "INT2" | "INT4" | "INT8" | "SMALLINT" | "INT" | "INTEGER" | "BIGINT" | "TINYINT"
            | "MEDIUMINT" | "NUMERIC" | "DECIMAL" | "FLOAT4" | "FLOAT8" | "FLOAT" | "DOUBLE"
            | "REAL" => Self::Number,
            "" | "NULL" | "UNKNOWN" | "VOID" => Self::Unknown,
            _ => Self::Other,
        }
    }
}

/// What a deadline of the type `type_name` (as the driver names it) is on
/// `dialect`: an instant (`timestamptz`, MySQL's `TIMESTAMP`, a count
/// since the epoch), or a wall-clock time with no zone (`DATETIME`,
/// PostgreSQL's `timestamp`, a `date`; also a type the driver does not
/// name, to be safe).
pub(crate) fn deadline_kind(dialect: Dialect, timer: &Timer, type_name: &str) -> DeadlineKind {
    let name = type_name.to_ascii_uppercase();
    let base = name.split([' ', '(']).next().unwrap_or("");
    match (timer.deadline_unit, dialect, base) {
        (DeadlineUnit::Seconds | DeadlineUnit::Milliseconds, _, _)
        | (DeadlineUnit::Time, Dialect::Postgres, "TIMESTAMPTZ")
        | (DeadlineUnit::Time, Dialect::MySql, "TIMESTAMP") => DeadlineKind::Instant,
        (DeadlineUnit::Time, _, _) => DeadlineKind::ZoneLess,
    }
}

/// Refuses a deadline whose type does not fit `deadline_unit`: a number
/// taken for a time (`UNIX_TIMESTAMP(create_time) + 1800` passed the
/// check, then every order failed with "Truncated incorrect datetime
/// value"), a time taken for a number, or text.
pub(crate) fn check_deadline_type(timer: &Timer, type_name: &str) -> Result<(), StoreError> {
    let unit = timer.deadline_unit;
    let problem = match (DeadlineType::of(type_name), unit) {
        (DeadlineType::Unknown, _)
        | (DeadlineType::Time, DeadlineUnit::Time)
        | (DeadlineType::Number, DeadlineUnit::Seconds | DeadlineUnit::Milliseconds) => {
            return Ok(());
        }
        (DeadlineType::Number, DeadlineUnit::Time) => format!(
            "{:?} evaluates to a number ({type_name}), not a time: if it counts seconds (or \
             milliseconds) since the Unix epoch, set {} = \"s\" (or \"ms\")",
            timer.deadline,
            timer.key(TimerKey::DeadlineUnit)
        ),
        (DeadlineType::Time, _) => format!(
            "{:?} evaluates to a time ({type_name}), but {} = {:?} says it counts since the \
             epoch: remove {}",
            timer.deadline,
            timer.key(TimerKey::DeadlineUnit),
            unit.as_str(),
            timer.key(TimerKey::DeadlineUnit)
        ),
        (DeadlineType::Other, _) => format!(
            "{:?} evaluates to {type_name}, which is neither a time (timestamp, datetime, date) \
             nor a number of seconds or milliseconds since the epoch",
            timer.deadline
        ),
    };
    Err(StoreError::Schema {
        key: timer.key(TimerKey::Deadline),
        problem,
    })
}

/// Whether the deadline `deadline` (SQL) holds a time the service works
/// with: from the year 1000 to the end of 9999. A value outside (PostgreSQL's
/// `'infinity'` and `'-infinity'`, which shops use for "never"; MariaDB's
/// zero date `0000-00-00`, which its default `sql_mode` accepts; a year
/// typed wrong) is no deadline, as NULL is: never due, never swept, never
/// decoded (the driver cannot represent some of them, and panicked on
/// them), and a message naming such an order leaves it alone with a
/// warning. A range on the column itself, so an index on it still serves.
pub(crate) fn usable_deadline_sql(deadline: &str) -> String {
    format!("({deadline} >= '1000-01-01' AND {deadline} <= '9999-12-31 23:59:59')")
}

/// The guard as SQL (`TRUE` when none is configured).
pub(crate) fn guard_sql(timer: &Timer) -> String {
    if timer.guard.trim().is_empty() {
        "TRUE".into()
    } else {
        format!("({})", timer.guard)
    }
}

/// What the orders table's columns told about the mapping.
#[derive(Clone, Debug)]
pub(crate) struct OrdersColumns {
    /// The id column.
    pub(crate) id: IdColumn,
    /// The id column's type, as the dialect shows it.
    pub(crate) id_type: String,
    /// The id column's type without length or precision.
    pub(crate) id_base: String,
    /// The status column's type, as the dialect shows it.
    pub(crate) status_type: String,
    /// Every column of the table, by name: what a row's digest reads.
    pub(crate) all: Vec<String>,
}

/// Checks that the timer's table and column names are plain identifiers.
pub(crate) fn check_orders_identifiers(t: &Timer) -> Result<(), StoreError> {
    check_identifiers(&[(t.key(TimerKey::Table), &t.table)], true)?;
    check_identifiers(
        &[
            (t.key(TimerKey::Id), &t.id),
            (t.key(TimerKey::Status), &t.status),
        ],
        false,
    )?;
    for column in t.set.keys() {
        check_identifiers(&[(t.key(TimerKey::Set), column)], false)?;
    }
    Ok(())
}

/// Checks a timer's mapping (`[orders]` for the default one) against its
/// table's columns: the table exists, the id, status and `set` columns
/// exist, the status codes fit the status column, and the id column can
/// hold order ids exactly.
pub(crate) fn check_orders_columns(
    t: &Timer,
    columns: &Columns,
) -> Result<OrdersColumns, StoreError> {
    if columns.is_empty() {
        return Err(StoreError::Schema {
            key: t.key(TimerKey::Table),
            problem: format!("no table {:?} (or it has no columns)", t.table),
        });
    }
    let column = |key: &'static str, name: &str| {
        columns.get(name).ok_or_else(|| StoreError::Schema {
            key,
            problem: format!("table {:?} has no column {name:?}", t.table),
        })
    };
    let id = column(t.key(TimerKey::Id), &t.id)?;
    let status = column(t.key(TimerKey::Status), &t.status)?;
    for name in t.set.keys() {
        column(t.key(TimerKey::Set), name)?;
    }
    let class = TypeClass::of(&status.type_name);
    let shown = &status.shown;
    check_status(t.key(TimerKey::From), &t.from, &t.status, class, shown)?;
    check_status(t.key(TimerKey::To), &t.to, &t.status, class, shown)?;
    if let Some(paid) = &t.paid {
        check_status(t.key(TimerKey::Paid), paid, &t.status, class, shown)?;
    }
    Ok(OrdersColumns {
        id: IdColumn::of(t.key(TimerKey::Id), id)?,
        id_type: id.shown.clone(),
        id_base: id.base.clone(),
        status_type: status.shown.clone(),
        all: {
            let mut all: Vec<String> = columns.keys().cloned().collect();
            all.sort();
            all
        },
    })
}

/// Checks that `[items]` names plain identifiers, before its table is read.
pub(crate) fn check_items_identifiers(i: &ItemsMapping) -> Result<(), StoreError> {
    check_identifiers(&[("[items].table", &i.table)], true)?;
    check_identifiers(
        &[
            ("[items].order_id", &i.order_id),
            ("[items].sku", &i.sku),
            ("[items].quantity", &i.quantity),
        ],
        false,
    )
}

/// Checks `[items]` against the items table's columns; returns its order
/// id column as ids compare with it, and its type without modifiers.
pub(crate) fn check_items_columns(
    i: &ItemsMapping,
    columns: &Columns,
) -> Result<(IdColumn, String), StoreError> {
    if columns.is_empty() {
        return Err(StoreError::Schema {
            key: "[items].table",
            problem: format!("no table {:?} (or it has no columns)", i.table),
        });
    }
    for (key, name) in [
        ("[items].order_id", &i.order_id),
        ("[items].sku", &i.sku),
        ("[items].quantity", &i.quantity),
    ] {
        if !columns.contains_key(name.as_str()) {
            return Err(StoreError::Schema {
                key,
                problem: format!("table {:?} has no column {name:?}", i.table),
            });
        }
    }
    let order_id = &columns[&i.order_id];
    Ok((
        IdColumn::of("[items].order_id", order_id)?,
        order_id.base.clone(),
    ))
}

/// The outbox table's columns this version's statements use (older
/// versions' tables lack some): checked before anything else, so that a
/// database nobody migrated says what to do.
pub(crate) fn check_outbox_columns(columns: &Columns, own: &[&str]) -> Result<(), StoreError> {
    const RUN_MIGRATE: &str = "run `order-timeout migrate` against this database first";
    if columns.is_empty() {
        return Err(StoreError::Schema {
            key: "DATABASE_URL",
            problem: format!(
                "the database has no table {OUTBOX} (the service's own outbox): {RUN_MIGRATE}"
            ),
        });
    }
    let mut needed = OUTBOX_COLUMNS.iter().chain(own);
    match needed.find(|c| !columns.contains_key(**c)) {
        Some(missing) => Err(StoreError::Schema {
            key: "DATABASE_URL",
            problem: format!(
                "the table {OUTBOX} has no column {missing} (it was made by an older \
                 version): {RUN_MIGRATE}"
            ),
        }),
        None => Ok(()),
    }
}

/// The service's own outbox table.
pub(crate) const OUTBOX: &str = "order_timeout_cancel_outbox";

/// The columns of the outbox table this version's statements use on every
/// dialect (the last migration's among them).
const OUTBOX_COLUMNS: &[&str] = &[
    "timer",
    "order_id",
    "created_at",
    "stock_released_at",
    "event_published_at",
    "claimed_until",
    "attempts",
    "next_attempt_at",
    "last_error",
    "gave_up_at",
    "gave_up_reason",
];

/// The service's table of rows set aside (a flip that failed for good).
pub(crate) const SET_ASIDE: &str = "order_timeout_set_aside";

/// Checks that the table of rows set aside exists (made by `migrate`).
pub(crate) fn check_set_aside(columns: &Columns) -> Result<(), StoreError> {
    if columns.is_empty() {
        return Err(StoreError::Schema {
            key: "DATABASE_URL",
            problem: format!(
                "the database has no table {SET_ASIDE} (it was made by an older version): \
                 run `order-timeout migrate` against this database first"
            ),
        });
    }
    if let Some(missing) = ["attempts", "retry_at"]
        .into_iter()
        .find(|column| !columns.contains_key(*column))
    {
        return Err(StoreError::Schema {
            key: "DATABASE_URL",
            problem: format!(
                "the table {SET_ASIDE} has no column {missing} (it was made by an older version): \
                 run `order-timeout migrate` against this database first"
            ),
        });
    }
    Ok(())
}

/// What [`super::OrderStore::prepare`] found: one timer's table as the
/// store uses it, for `schema check` and the start-up log.
#[derive(Clone, Debug)]
pub struct SchemaReport {
    /// The dialect.
    pub dialect: Dialect,
    /// The timer (`cancel_unpaid` for `[orders]`).
    pub timer: String,
    /// The status a row must have to be flipped, and the one it gets.
    pub flip: (StatusValue, StatusValue),
    /// The table, as configured.
    pub table: String,
    /// The id column's type.
    pub id_type: String,
    /// What ids can be.
    pub id_kind: IdKind,
    /// The status column's type.
    pub status_type: String,
    /// The deadline, as configured.
    pub deadline: String,
    /// The guard, as configured (empty: none).
    pub guard: String,
    /// Rows in the `from` status (unpaid orders) passing the guard when
    /// checked, and how many of them are overdue.
    pub waiting: (i64, i64),
    /// `also` statements prepared.
    pub also: usize,
    /// How stock goes back, and the items table when it is read.
    pub release: Release,
    /// The items table, when `release = "grpc"`.
    pub items: Option<String>,
    /// The orders table and the outbox when nothing vacuums them
    /// (PostgreSQL with autovacuum off, for the server or the table): the
    /// start-up log warns, and `schema check` says so.
    pub unvacuumed: Vec<String>,
    /// Which zone the deadline is read in, and why.
    pub zone: ZoneReport,
    /// The warning when every waiting row is overdue by an hour or more
    /// although the deadline has no zone (`zones::overdue_warning`).
    pub zone_warning: Option<String>,
}

impl SchemaReport {
    /// The report of a successful check.
    pub(crate) fn new(
        dialect: Dialect,
        timer: &Timer,
        columns: OrdersColumns,
        waiting: (i64, i64),
        unvacuumed: Vec<String>,
        zone: ZoneReport,
        newest_us: Option<i64>,
    ) -> Self {
        let o = timer;
        let now_us = chrono::Utc::now().timestamp_micros();
        let zone_warning = zones::overdue_warning(&zone, waiting.0, newest_us, now_us);
        Self {
            dialect,
            timer: timer.name.to_string(),
            flip: (timer.from.clone(), timer.to.clone()),
            table: o.table.clone(),
            id_kind: columns.id.kind(),
            id_type: columns.id_type,
            status_type: columns.status_type,
            deadline: o.deadline.clone(),
            guard: o.guard.clone(),
            waiting,
            also: o.also.len(),
            release: timer.release,
            items: (timer.release == Release::Grpc).then(|| timer.items.table.clone()),
            unvacuumed,
            zone,
            zone_warning,
        }
    }
}

impl fmt::Display for SchemaReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "timer:    {} ({} -> {})",
            self.timer, self.flip.0, self.flip.1
        )?;
        writeln!(f, "dialect:  {:?}", self.dialect)?;
        writeln!(
            f,
            "table:    {} (id {}: {:?} ids; status {})",
            self.table, self.id_type, self.id_kind, self.status_type
        )?;
        writeln!(f, "deadline: {}", self.deadline)?;
        writeln!(f, "zone:     {}", self.zone)?;
        if !self.guard.is_empty() {
            writeln!(f, "guard:    {}", self.guard)?;
        }
        writeln!(
            f,
            "waiting:  {} rows in status {}, {} of them overdue",
            self.waiting.0, self.flip.0, self.waiting.1
        )?;
        if let Some(warning) = &self.zone_warning {
            writeln!(f, "WARNING:  {warning}")?;
        }
        if self.zone.differs_from_utc_default() {
            writeln!(
                f,
                "note:     before 0.3.0 these deadlines were read in UTC (the old default); \
                 set time_zone = \"UTC\" to keep that reading"
            )?;
        }
        writeln!(f, "also:     {} statement(s) prepared", self.also)?;
        match (&self.release, &self.items) {
            (Release::Grpc, Some(items)) => write!(f, "release:  gRPC, items from {items}")?,
            _ => write!(f, "release:  none (no inventory calls)")?,
        }
        if !self.unvacuumed.is_empty() {
            write!(
                f,
                "\nvacuum:   nothing vacuums {} (autovacuum is off): schedule VACUUM (ANALYZE) of them",
                self.unvacuumed.join(", ")
            )?;
        }
        Ok(())
    }
}

/// The order ids a sweeper query returned. An id that is not a valid
/// order id (the shop's table may hold anything) is skipped with a warning:
/// no message could name it either.
pub(crate) fn order_ids(ids: Vec<String>) -> Vec<OrderId> {
    ids.iter()
        .filter_map(|id| match OrderId::parse(id) {
            Ok(id) => Some(id),
            Err(e) => {
                tracing::warn!(order_id = ?id, error = %e, "skipping a row whose id is not a valid order id");
                None
            }
        })
        .collect()
}

/// A page of raw `(id, deadline)` rows, read with a limit of `limit`, as
/// a [`Page`]: rows whose id is not a valid order id or whose deadline is
/// NULL are skipped with a warning; the cursor is `cursor` of the last row
/// read, when the page was full (more may follow).
pub(crate) fn page<C>(
    rows: Vec<(String, Option<DateTime<Utc>>)>,
    limit: u32,
    cursor: impl FnOnce(&(String, Option<DateTime<Utc>>)) -> Option<C>,
) -> Page<C> {
    let full = rows.len() >= limit as usize;
    let next = rows.last().filter(|_| full).and_then(cursor);
    let rows = rows
        .into_iter()
        .filter_map(|(id, deadline)| match (OrderId::parse(&id), deadline) {
            (Ok(order_id), Some(deadline)) => Some((order_id, deadline)),
            (Err(e), _) => {
                tracing::warn!(order_id = ?id, error = %e, "skipping a row whose id is not a valid order id");
                None
            }
            (Ok(_), None) => {
                tracing::warn!(order_id = ?id, "skipping a row whose deadline is NULL");
                None
            }
        })
        .collect();
    Page { rows, next }
}

/// A page of a scan in (deadline, id) order: the next one starts after
/// the last row read.
pub(crate) fn due_page(rows: Vec<(String, Option<DateTime<Utc>>)>, limit: u32) -> Page<RowCursor> {
    page(rows, limit, |(id, deadline)| {
        Some(RowCursor {
            deadline: (*deadline)?,
            id: Some(id.clone()),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_must_fit_the_column() {
        let int = StatusValue::Int(0);
        let text = StatusValue::Text("UNPAID".into());
        assert!(check_status("k", &int, "s", TypeClass::Integer, "int").is_ok());
        assert!(check_status("k", &text, "s", TypeClass::Text, "text").is_ok());
        let err = check_status(
            "[orders].unpaid",
            &text,
            "status",
            TypeClass::Integer,
            "int",
        )
        .unwrap_err();
        assert!(err.to_string().contains("[orders].unpaid"), "{err}");
        assert!(check_status("k", &int, "s", TypeClass::Text, "varchar").is_err());
    }

    #[test]
    fn a_deadline_must_be_a_time_or_a_number_of_its_unit() {
        let mut timer = Timer::cancel_unpaid(
            &crate::settings::OrdersMapping::default(),
            &ItemsMapping::default(),
            Release::Grpc,
        );
        for time in ["TIMESTAMPTZ", "timestamp", "DATETIME", "DATE", "NULL"] {
            assert!(check_deadline_type(&timer, time).is_ok(), "{time}");
        }
        timer.deadline = "UNIX_TIMESTAMP(create_time) + 1800".into();
        for number in ["BIGINT", "INT8", "DECIMAL", "BIGINT UNSIGNED", "NUMERIC"] {
            let err = check_deadline_type(&timer, number).unwrap_err().to_string();
            assert!(
                err.starts_with("config [orders].deadline: ")
                    && err.contains("[orders].deadline_unit = \"s\""),
                "{err}"
            );
        }
        let err = check_deadline_type(&timer, "VARCHAR")
            .unwrap_err()
            .to_string();
        assert!(err.contains("neither a time"), "{err}");
        timer.deadline_unit = DeadlineUnit::Seconds;
        assert!(check_deadline_type(&timer, "BIGINT").is_ok());
        let err = check_deadline_type(&timer, "DATETIME")
            .unwrap_err()
            .to_string();
        assert!(err.contains("remove [orders].deadline_unit"), "{err}");
        let mysql = deadline_sql(Dialect::MySql, &timer);
        assert!(
            mysql.contains(
                "INTERVAL (((UNIX_TIMESTAMP(create_time) + 1800)) * 1000000) MICROSECOND"
            ) && mysql.contains("BETWEEN -30610224000 AND 253402300799"),
            "{mysql}"
        );
        timer.deadline = "add_time".into();
        timer.deadline_unit = DeadlineUnit::Milliseconds;
        assert!(
            deadline_sql(Dialect::Postgres, &timer).contains("to_timestamp(\"add_time\" / 1000.0)")
        );
    }

    #[test]
    fn identifiers_are_quoted_per_dialect() {
        assert_eq!(
            quote(Dialect::Postgres, "shop.orders"),
            "\"shop\".\"orders\""
        );
        assert_eq!(quote(Dialect::MySql, "order"), "`order`");
        assert!(check_identifiers(&[("k", "shop.orders")], true).is_ok());
        assert!(check_identifiers(&[("k", "shop.orders")], false).is_err());
        assert!(check_identifiers(&[("k", "a;drop")], true).is_err());
    }
}
