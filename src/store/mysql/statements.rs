//! MySQL's statements, rendered from the mapping ([`Sql`]), and how a
//! value becomes a parameter ([`Arg`], [`args`]).

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::encode::{Encode, IsNull};
use sqlx::error::BoxDynError;
use sqlx::mysql::{MySqlArguments, MySqlTypeInfo};

use super::MySqlStore;
use crate::settings::{StatusValue, Timer};
use crate::store::StoreError;
use crate::store::ids::{IdValue, uuid_text};

/// `?, ?, …` for `n` values.
pub(super) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
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

/// An order id as an argument in the id column's own type (`decimal`: the
/// server's `DECIMAL`, read at the check; every statement on the shop's
/// tables has it, and only those bind ids).
pub(super) fn id_arg<'a>(value: &'a IdValue, decimal: Option<&'a MySqlTypeInfo>) -> Arg<'a> {
    match value {
        IdValue::Text(s) => Arg::Text(s),
        IdValue::I16(n) => Arg::Int(i64::from(*n)),
        IdValue::I32(n) => Arg::Int(i64::from(*n)),
        IdValue::I64(n) => Arg::Int(*n),
        IdValue::U64(n) => Arg::UInt(*n),
        IdValue::Decimal(digits) => match decimal {
            Some(decimal) => Arg::Decimal(digits, decimal),
            None => Arg::Text(digits),
        },
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

/// What the dialect's own statements need of the server and the mapping.
#[derive(Debug)]
pub(crate) struct Sql {
    /// The server skips locked rows (`FOR UPDATE SKIP LOCKED`).
    pub(super) skip_locked: bool,
    /// The timer's `also` statements as they run: on MariaDB each with a
    /// lock wait of [`crate::store::sql::ALSO_LOCK_WAIT`] (rounded up to
    /// its whole second) for that statement alone; on MySQL as written
    /// (they wait `db_lock_timeout`).
    pub(super) also: Vec<String>,
    /// What goes before a statement of the `also` path to give it that
    /// lock wait (the locks of `also_keys` too): empty on MySQL.
    pub(super) also_wait: &'static str,
    /// The server's `DECIMAL`, for decimal ids.
    pub(super) decimal: MySqlTypeInfo,
}

impl Sql {
    pub(super) fn render(
        timer: &Timer,
        decimal: MySqlTypeInfo,
        skip_locked: bool,
        mariadb: bool,
    ) -> Self {
        let also_wait = match mariadb {
            true => "SET STATEMENT innodb_lock_wait_timeout = 1 FOR ",
            false => "",
        };
        Self {
            skip_locked,
            also: (timer.also.iter())
                .map(|statement| format!("{also_wait}{statement}"))
                .collect(),
            also_wait,
            decimal,
        }
    }
}
