//! The shop's own schema, described in the config file (`[orders]`,
//! `[items]`, `[inventory]`): which table holds the orders, which columns
//! and status codes mean what, how the deadline is computed, what else the
//! cancel transaction does. The defaults describe the reference schema, so a
//! config without these sections behaves as before.
//!
//! Identifiers (tables, columns) are quoted per dialect by the store;
//! `deadline` (when not a plain column name), `guard`, the `set` values and
//! the `also` statements are SQL written by the operator and used as they
//! are: trusted configuration, like the database URL.

use std::collections::BTreeMap;

use serde::Deserialize;

/// A status code as the shop writes it: text (`"UNPAID"`) or an integer
/// (`0`), compared with the status column in the column's own type.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum StatusValue {
    /// An integer code (mall: 0 unpaid, 1 paid, 4 closed).
    Int(i64),
    /// A text code (`UNPAID`, saleor's `unconfirmed`).
    Text(String),
}

impl StatusValue {
    /// The code as text (`0`, `UNPAID`): how it is bound and compared
    /// across column types.
    pub fn as_text(&self) -> String {
        match self {
            Self::Int(n) => n.to_string(),
            Self::Text(s) => s.clone(),
        }
    }
}

impl std::fmt::Display for StatusValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Int(n) => write!(f, "{n}"),
            Self::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// `[orders]`: the shop's orders table.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrdersMapping {
    /// The table, optionally schema-qualified (`shop.orders`).
    pub table: String,
    /// The column that messages' `order_id` matches (text, integer or uuid).
    pub id: String,
    /// The status column.
    pub status: String,
    /// The status of an order that may still be cancelled.
    pub unpaid: StatusValue,
    /// The status of a paid order; only tells "already paid" apart in the
    /// metrics (any other status is left alone too).
    pub paid: Option<StatusValue>,
    /// The status the cancel writes.
    pub cancelled: StatusValue,
    /// The deadline: a column, or an SQL expression over the row in the
    /// database's dialect (`create_time + INTERVAL 30 MINUTE`).
    pub deadline: String,
    /// What `deadline` is: `time` (a timestamp or datetime, with or without
    /// a zone, or a date), or a number of seconds (`s`) or milliseconds
    /// (`ms`) since the epoch (shops with integer Unix-time columns).
    pub deadline_unit: DeadlineUnit,
    /// An extra SQL condition an order must meet to be cancelled
    /// (`delete_status = 0`); empty for none.
    pub guard: String,
    /// The zone the shop writes its zone-less deadlines in (`DATETIME`,
    /// `timestamp without time zone`, and what `NOW()` makes of epochs):
    /// `UTC`, an offset such as `+08:00`, or a name (`America/New_York`),
    /// set as the service's session zone. `None` (not set): the database's
    /// own default for new sessions, the zone its `NOW()` writes in
    /// (`store::zones` reads it, and refuses when the server's sessions do
    /// not agree on one).
    pub time_zone: Option<String>,
    /// Extra columns set by the cancelling UPDATE; values are SQL
    /// expressions.
    pub set: BTreeMap<String, String>,
    /// Statements run in the cancel transaction once per order it cancels,
    /// the order id their only parameter (`$1` in PostgreSQL, `?` in MySQL):
    /// stock, coupons, points given back in this database, exactly once.
    pub also: Vec<String>,
    /// A query, the order id its only parameter, returning the keys of the
    /// shop's rows the `also` statements write for that order (its items'
    /// SKUs); empty for none. Each order's keys are locked in one sorted
    /// order before its `also` statements run, so that two orders' `also`
    /// statements, which take rows in whatever order the database's plan
    /// visits them, never wait for each other in a cycle (a deadlock).
    pub also_keys: String,
}

impl Default for OrdersMapping {
    /// The reference schema.
    fn default() -> Self {
        Self {
            table: "orders".into(),
            id: "id".into(),
            status: "status".into(),
            unpaid: StatusValue::Text("UNPAID".into()),
            paid: Some(StatusValue::Text("PAID".into())),
            cancelled: StatusValue::Text("CANCELLED".into()),
            deadline: "expires_at".into(),
            deadline_unit: DeadlineUnit::Time,
            guard: String::new(),
            time_zone: None,
            set: BTreeMap::from([
                ("cancelled_at".to_owned(), "now()".to_owned()),
                ("cancel_reason".to_owned(), "'payment timeout'".to_owned()),
            ]),
            also: Vec::new(),
            also_keys: String::new(),
        }
    }
}

/// What a timer's `deadline` evaluates to (`deadline_unit`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum DeadlineUnit {
    /// A timestamp, datetime or date (with or without a zone), or an
    /// expression of them.
    #[default]
    #[serde(rename = "time")]
    Time,
    /// Whole (or fractional) seconds since the Unix epoch.
    #[serde(rename = "s")]
    Seconds,
    /// Milliseconds since the Unix epoch.
    #[serde(rename = "ms")]
    Milliseconds,
}

impl DeadlineUnit {
    /// As written in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Time => "time",
            Self::Seconds => "s",
            Self::Milliseconds => "ms",
        }
    }
}

/// `[items]`: where `ReleaseStock`'s lines come from (read only when
/// `inventory.release = "grpc"`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ItemsMapping {
    /// The table, optionally schema-qualified.
    pub table: String,
    /// The column holding the order id.
    pub order_id: String,
    /// The SKU column (text or integer).
    pub sku: String,
    /// The quantity column.
    pub quantity: String,
}

impl Default for ItemsMapping {
    /// The reference schema.
    fn default() -> Self {
        Self {
            table: "order_items".into(),
            order_id: "order_id".into(),
            sku: "sku".into(),
            quantity: "quantity".into(),
        }
    }
}

/// How cancelled orders' stock goes back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Release {
    /// `ReleaseStock` over `INVENTORY_URL`, from the outbox, exactly once.
    #[default]
    Grpc,
    /// No gRPC call: stock is given back by `orders.also`, or not at all.
    None,
}

/// `[inventory]`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InventorySettings {
    /// How stock goes back.
    pub release: Release,
}

/// `true` for a plain (unquoted) SQL identifier: such a `deadline` is a
/// column, quoted per dialect; anything else is an expression.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        orders: OrdersMapping,
        #[serde(default)]
        items: ItemsMapping,
        #[serde(default)]
        inventory: InventorySettings,
    }

    #[test]
    fn a_mall_like_mapping_parses_with_integer_codes() {
        let f: File = toml::from_str(
            r#"
            [orders]
            table = "oms_order"
            unpaid = 0
            paid = 1
            cancelled = 4
            deadline = "create_time + INTERVAL (SELECT normal_order_overtime FROM oms_order_setting LIMIT 1) MINUTE"
            guard = "delete_status = 0"
            time_zone = "+08:00"
            set = { modify_time = "now()" }
            also = ["UPDATE pms_sku_stock s JOIN oms_order_item i ON i.product_sku_id = s.id SET s.lock_stock = s.lock_stock - i.product_quantity WHERE i.order_id = ?"]
            [inventory]
            release = "none"
            "#,
        )
        .unwrap();
        assert_eq!(f.orders.unpaid, StatusValue::Int(0));
        assert_eq!(f.orders.paid, Some(StatusValue::Int(1)));
        assert_eq!(f.orders.id, "id", "unset keys keep their defaults");
        assert_eq!(f.orders.set.len(), 1, "set replaces the default map");
        assert_eq!(f.inventory.release, Release::None);
        assert_eq!(f.items.table, "order_items");
        assert!(!is_identifier(&f.orders.deadline));
        assert!(is_identifier("expires_at"));
        assert!(!is_identifier("1x") && !is_identifier("") && !is_identifier("a-b"));
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err = toml::from_str::<File>("[orders]\nstatuss = \"s\"")
            .err()
            .unwrap();
        assert!(err.to_string().contains("statuss"), "{err}");
        assert!(toml::from_str::<File>("[inventory]\nrelease = \"http\"").is_err());
    }
}
