//! What MySQL's statements need of the server and the mapping ([`Sql`]),
//! and how a value becomes a parameter ([`arguments`]).

use std::str::FromStr;

use sqlx::encode::Encode;
use sqlx::error::BoxDynError;
use sqlx::mysql::MySqlArguments;
use sqlx::types::BigDecimal;
use sqlx::{Arguments, MySql, Type};

use crate::settings::{StatusValue, Timer};
use crate::store::StoreError;
use crate::store::ids::{IdValue, uuid_text};
use crate::store::outbox::Value;

/// `?, ?, …` for `n` values.
pub(super) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Binds `values`, in order: the one place a value becomes a parameter.
/// An id list is one value per id; an id is in its column's own type
/// (`BIGINT UNSIGNED` as `u64`, `DECIMAL` as a decimal, never a string a
/// comparison would turn into a double: `12345678901234567890` would match
/// `…891`); NULL is a NULL string.
pub(super) fn arguments(values: &[Value<'_>]) -> Result<MySqlArguments, StoreError> {
    let mut out = MySqlArguments::default();
    for value in values {
        add(&mut out, *value).map_err(|e| StoreError::Sql(sqlx::Error::Encode(e)))?;
    }
    Ok(out)
}

fn add(out: &mut MySqlArguments, value: Value<'_>) -> Result<(), BoxDynError> {
    match value {
        Value::Status(code) | Value::MaybeStatus(Some(code)) => match code {
            StatusValue::Int(n) => out.add(*n),
            StatusValue::Text(s) => out.add(s.as_str()),
        },
        Value::MaybeStatus(None) => maybe(out, None::<&str>),
        Value::RowId(id) => match id {
            Some(id) => add_id(out, id),
            None => maybe(out, None::<&str>),
        },
        Value::RowIds(ids) | Value::ItemIds(ids) => ids.iter().try_for_each(|id| add_id(out, id)),
        Value::ShopTime(t) => maybe(out, t),
        Value::Text(s) => out.add(s),
        Value::MaybeText(s) => maybe(out, s),
        Value::Int(n) | Value::Micros(n) => out.add(n),
        Value::Time(t) => out.add(t),
        Value::Ids(ids) => ids.iter().try_for_each(|id| out.add(*id)),
        Value::Bytes(b) => out.add(b),
        Value::Nums(nums) => nums.iter().try_for_each(|n| out.add(*n)),
        Value::NewOutboxRows(_, rows) => rows.iter().try_for_each(|r| {
            out.add(r.order_id)?;
            out.add(r.created_at)?;
            out.add(r.claimed_until)?;
            maybe(out, r.stock_released_at)
        }),
    }
}

/// `value`, or a NULL string.
fn maybe<'q, T: Encode<'q, MySql> + Type<MySql>>(
    out: &mut MySqlArguments,
    value: Option<T>,
) -> Result<(), BoxDynError> {
    match value {
        Some(value) => out.add(value),
        None => out.add(None::<&str>),
    }
}

/// An order id in the id column's own type (MariaDB's `UUID` as its
/// canonical text).
fn add_id(out: &mut MySqlArguments, id: &IdValue) -> Result<(), BoxDynError> {
    match id {
        IdValue::Text(s) => out.add(s.as_str()),
        IdValue::I16(n) => out.add(i64::from(*n)),
        IdValue::I32(n) => out.add(i64::from(*n)),
        IdValue::I64(n) => out.add(*n),
        IdValue::U64(n) => out.add(*n),
        IdValue::Decimal(digits) => out.add(BigDecimal::from_str(digits)?),
        IdValue::Uuid(bytes) => out.add(uuid_text(bytes)),
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

/// What the dialect's own statements need of the server and the mapping.
#[derive(Debug)]
pub(crate) struct Sql {
    /// The server skips locked rows (`FOR UPDATE SKIP LOCKED`).
    pub(super) skip_locked: bool,
    /// What goes before a statement of the `also` path to give it a lock
    /// wait of [`crate::store::sql::ALSO_LOCK_WAIT`] (rounded up to its
    /// whole second) for that statement alone: on MariaDB; empty on MySQL,
    /// where they wait `db_lock_timeout`.
    pub(super) also_wait: &'static str,
    /// The timer's `also` statements as they run (after `also_wait`).
    pub(super) also: Vec<String>,
}

impl Sql {
    pub(super) fn render(timer: &Timer, skip_locked: bool, mariadb: bool) -> Self {
        let also_wait = match mariadb {
            true => "SET STATEMENT innodb_lock_wait_timeout = 1 FOR ",
            false => "",
        };
        let also = timer.also.iter().map(|s| format!("{also_wait}{s}"));
        Self {
            skip_locked,
            also_wait,
            also: also.collect(),
        }
    }
}
