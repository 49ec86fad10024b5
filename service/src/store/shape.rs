//! What the dialects share about the shop's schema: the kinds of order id
//! column, how column types classify, quoting, the checks of the mapping,
//! and the report `schema check` prints.

use std::fmt;

use chrono::{DateTime, Utc};

use std::collections::HashMap;

use super::{Dialect, ShopSchema, StoreError};
use crate::message::OrderId;
use crate::settings::{OrdersMapping, Release, StatusValue, is_identifier};

/// The type of the shop's order id column, which decides what an order id
/// from a message can be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdKind {
    /// Text (`VARCHAR`, `TEXT`): any id, as it is.
    #[default]
    Text,
    /// An integer column: decimal digits, canonical without leading zeros.
    Integer,
    /// A uuid column: canonical in lower case with hyphens.
    Uuid,
}

impl IdKind {
    /// `id` as the column spells it, or `None` if no row can have it.
    pub fn canonical(self, id: &OrderId) -> Option<OrderId> {
        match self {
            Self::Text => Some(id.clone()),
            Self::Integer => {
                let n: i64 = id.as_str().parse().ok()?;
                OrderId::parse(&n.to_string()).ok()
            }
            Self::Uuid => {
                let hex: String = id.as_str().chars().filter(|c| *c != '-').collect();
                if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                    return None;
                }
                let h = hex.to_ascii_lowercase();
                let text = format!(
                    "{}-{}-{}-{}-{}",
                    &h[0..8],
                    &h[8..12],
                    &h[12..16],
                    &h[16..20],
                    &h[20..32]
                );
                OrderId::parse(&text).ok()
            }
        }
    }
}

/// How a column's type classifies, for the status and id checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TypeClass {
    /// An integer type.
    Integer,
    /// A character type.
    Text,
    /// PostgreSQL's `uuid`.
    Uuid,
    /// Anything else (an enum, say): compared as text.
    Other,
}

impl TypeClass {
    /// Classifies a type name: PostgreSQL's `pg_type.typname`, MySQL's
    /// `information_schema.columns.data_type`.
    pub(crate) fn of(type_name: &str) -> Self {
        match type_name.to_ascii_lowercase().as_str() {
            "int2" | "int4" | "int8" | "smallint" | "integer" | "int" | "bigint" | "tinyint"
            | "mediumint" | "numeric" | "decimal" => Self::Integer,
            "varchar" | "bpchar" | "char" | "text" | "tinytext" | "mediumtext" | "longtext"
            | "name" | "citext" => Self::Text,
            "uuid" => Self::Uuid,
            _ => Self::Other,
        }
    }

    /// The id kind of an id column of this class.
    pub(crate) fn id_kind(self) -> IdKind {
        match self {
            Self::Integer => IdKind::Integer,
            Self::Uuid => IdKind::Uuid,
            Self::Text | Self::Other => IdKind::Text,
        }
    }
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
pub(crate) fn deadline_sql(dialect: Dialect, orders: &OrdersMapping) -> String {
    if is_identifier(&orders.deadline) {
        quote(dialect, &orders.deadline)
    } else {
        format!("({})", orders.deadline)
    }
}

/// The guard as SQL (`TRUE` when none is configured).
pub(crate) fn guard_sql(orders: &OrdersMapping) -> String {
    if orders.guard.trim().is_empty() {
        "TRUE".into()
    } else {
        format!("({})", orders.guard)
    }
}

/// What the orders table's columns told about the mapping.
#[derive(Clone, Debug)]
pub(crate) struct OrdersColumns {
    /// The id column's type, as the dialect shows it.
    pub(crate) id_type: String,
    /// What ids can be.
    pub(crate) id_kind: IdKind,
    /// The status column's type, as the dialect shows it.
    pub(crate) status_type: String,
}

/// Checks that the mapping's table and column names are plain identifiers.
pub(crate) fn check_orders_identifiers(o: &OrdersMapping) -> Result<(), StoreError> {
    check_identifiers(&[("[orders].table", &o.table)], true)?;
    check_identifiers(
        &[("[orders].id", &o.id), ("[orders].status", &o.status)],
        false,
    )?;
    for column in o.set.keys() {
        check_identifiers(&[("[orders].set", column)], false)?;
    }
    Ok(())
}

/// Checks `[orders]` against the orders table's columns (name → (type as
/// shown, type name to classify)): the table exists, the id, status and
/// `set` columns exist, and the status codes fit the status column.
pub(crate) fn check_orders_columns(
    o: &OrdersMapping,
    columns: &HashMap<String, (String, String)>,
) -> Result<OrdersColumns, StoreError> {
    if columns.is_empty() {
        return Err(StoreError::Schema {
            key: "[orders].table",
            problem: format!("no table {:?} (or it has no columns)", o.table),
        });
    }
    let column = |key: &'static str, name: &str| {
        columns
            .get(name)
            .cloned()
            .ok_or_else(|| StoreError::Schema {
                key,
                problem: format!("table {:?} has no column {name:?}", o.table),
            })
    };
    let (id_type, id_type_name) = column("[orders].id", &o.id)?;
    let (status_type, status_type_name) = column("[orders].status", &o.status)?;
    for name in o.set.keys() {
        column("[orders].set", name)?;
    }
    let class = TypeClass::of(&status_type_name);
    check_status("[orders].unpaid", &o.unpaid, &o.status, class, &status_type)?;
    check_status(
        "[orders].cancelled",
        &o.cancelled,
        &o.status,
        class,
        &status_type,
    )?;
    if let Some(paid) = &o.paid {
        check_status("[orders].paid", paid, &o.status, class, &status_type)?;
    }
    Ok(OrdersColumns {
        id_type,
        id_kind: TypeClass::of(&id_type_name).id_kind(),
        status_type,
    })
}

/// What [`super::OrderStore::prepare`] found: the shop's schema as the
/// store uses it, for `schema check` and the start-up log.
#[derive(Clone, Debug)]
pub struct SchemaReport {
    /// The dialect.
    pub dialect: Dialect,
    /// The orders table, as configured.
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
    /// Unpaid rows passing the guard when checked, and how many of them
    /// are overdue.
    pub unpaid: (i64, i64),
    /// `also` statements prepared.
    pub also: usize,
    /// How stock goes back, and the items table when it is read.
    pub release: Release,
    /// The items table, when `release = "grpc"`.
    pub items: Option<String>,
}

impl SchemaReport {
    /// The report of a successful check.
    pub(crate) fn new(
        dialect: Dialect,
        schema: &ShopSchema,
        columns: OrdersColumns,
        unpaid: (i64, i64),
    ) -> Self {
        let o = &schema.orders;
        Self {
            dialect,
            table: o.table.clone(),
            id_type: columns.id_type,
            id_kind: columns.id_kind,
            status_type: columns.status_type,
            deadline: o.deadline.clone(),
            guard: o.guard.clone(),
            unpaid,
            also: o.also.len(),
            release: schema.release,
            items: (schema.release == Release::Grpc).then(|| schema.items.table.clone()),
        }
    }
}

impl fmt::Display for SchemaReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "dialect:  {:?}", self.dialect)?;
        writeln!(
            f,
            "orders:   {} (id {}: {:?} ids; status {})",
            self.table, self.id_type, self.id_kind, self.status_type
        )?;
        writeln!(f, "deadline: {}", self.deadline)?;
        if !self.guard.is_empty() {
            writeln!(f, "guard:    {}", self.guard)?;
        }
        writeln!(
            f,
            "unpaid:   {} orders, {} of them overdue",
            self.unpaid.0, self.unpaid.1
        )?;
        writeln!(f, "also:     {} statement(s) prepared", self.also)?;
        match (&self.release, &self.items) {
            (Release::Grpc, Some(items)) => write!(f, "release:  gRPC, items from {items}"),
            _ => write!(f, "release:  none (no inventory calls)"),
        }
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

/// A page of `(id, deadline)` rows as order ids; rows whose id is not a
/// valid order id or whose deadline is NULL are skipped with a warning.
pub(crate) fn page(rows: Vec<(String, Option<DateTime<Utc>>)>) -> Vec<(OrderId, DateTime<Utc>)> {
    rows.into_iter()
        .filter_map(|(id, deadline)| match (OrderId::parse(&id), deadline) {
            (Ok(order_id), Some(deadline)) => Some((order_id, deadline)),
            (Err(e), _) => {
                tracing::warn!(order_id = ?id, error = %e, "skipping a row whose id is not a valid order id");
                None
            }
            (Ok(_), None) => {
                tracing::warn!(order_id = ?id, "skipping an unpaid order whose deadline is NULL");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_canonical_for_their_column() {
        let id = |s: &str| OrderId::parse(s).unwrap();
        assert_eq!(IdKind::Integer.canonical(&id("00123")), Some(id("123")));
        assert_eq!(IdKind::Integer.canonical(&id("abc")), None);
        assert_eq!(IdKind::Integer.canonical(&id("99999999999999999999")), None);
        assert_eq!(IdKind::Text.canonical(&id("00123")), Some(id("00123")));
        assert_eq!(
            IdKind::Uuid.canonical(&id("A1B2C3D4E5F60718293A4B5C6D7E8F90")),
            Some(id("a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90"))
        );
        assert_eq!(IdKind::Uuid.canonical(&id("not-a-uuid")), None);
    }

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
