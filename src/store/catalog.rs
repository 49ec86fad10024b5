//! A shop's table as the database's catalog describes it: its columns and
//! how their types classify. The bottom of the store's schema code: the id
//! columns ([`super::ids`]) and the mapping's checks ([`super::shape`])
//! both read it.

use std::collections::HashMap;

/// One column of a shop's table, as the dialect's catalog describes it.
#[derive(Clone, Debug, Default, sqlx::FromRow)]
pub(crate) struct Column {
    /// Its name.
    pub(crate) name: String,
    /// Its type as the database shows it (`character varying(8)`,
    /// `bigint(20) unsigned`).
    pub(crate) shown: String,
    /// Its type's name, to classify (`pg_type.typname`, MySQL's
    /// `data_type`).
    pub(crate) type_name: String,
    /// Its type without length or precision (`character varying`,
    /// `numeric`): what PostgreSQL's statements cast values to, so that a
    /// cast never truncates.
    pub(crate) base: String,
    /// A character type's length.
    pub(crate) max_chars: Option<i64>,
    /// A decimal type's precision.
    pub(crate) precision: Option<i64>,
    /// A decimal type's scale.
    pub(crate) scale: Option<i64>,
    /// An `UNSIGNED` MySQL type.
    pub(crate) unsigned: bool,
}

/// A table's columns by name.
pub(crate) type Columns = HashMap<String, Column>;

/// A table's columns by name, from the catalog's rows.
pub(crate) fn by_name(columns: Vec<Column>) -> Columns {
    columns.into_iter().map(|c| (c.name.clone(), c)).collect()
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
}
