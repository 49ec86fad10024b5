//! Every statement the README allows binds its parameters correctly, in
//! every id column type, on every connection of the pool: each form of an
//! `also` statement (the id cast to text, assigned to a text column,
//! compared with a column of the id's own type, compared with a wider
//! integer column, cast to another type), a guard and a deadline with
//! sub-selects, and an items table keyed in the id's type, prepared by the
//! start-up check and then run order by order on a pool of one connection
//! (the one the check prepared them on) and on a pool of four, one order
//! per transaction, many times.
//!
//! sqlx caches a prepared statement per connection by its text, with the
//! parameter types of its first preparation: the check's preparation
//! (types inferred by the server) and an execution's (types declared by the
//! bound values) must agree, or one connection reads the id as the bytes
//! of another type (`invalid byte sequence for encoding "UTF8": 0x00` for
//! an `int4` sent to a parameter inferred as `text`).

use std::collections::{BTreeMap, BTreeSet};

use futures_util::{StreamExt, stream};
use order_timeout::settings::{ItemsMapping, OrdersMapping, Release};
use order_timeout::testing::store::{OrderItem, PoolSettings, connect_timer};

use super::*;

/// Orders per id type: half cancelled one by one on a pool of one
/// connection, half four at a time on a pool of four.
const ORDERS: usize = 24;

/// One id column type, how its ids look, and whether a wider integer
/// column can hold them.
struct IdType {
    ty: &'static str,
    /// The `i`-th order's id of case `n`, as the column spells it (ids
    /// differ across cases: the outbox is shared).
    id: fn(usize, usize) -> String,
    /// The type of a wider integer column, for integer ids.
    wider: Option<&'static str>,
}

fn number(n: usize, i: usize) -> String {
    (1000 * (n + 1) + i).to_string()
}

fn text_id(n: usize, i: usize) -> String {
    format!("o{n}-{i:04}")
}

fn uuid_id(n: usize, i: usize) -> String {
    format!("5f0e2a4c-9b1d-4e8f-a2c3-{n:04x}{i:08x}")
}

impl IdType {
    /// An integer type, whose ids a `wider` integer column holds too.
    fn int(ty: &'static str, wider: &'static str) -> Self {
        Self {
            ty,
            id: number,
            wider: Some(wider),
        }
    }

    /// Another type, with ids `id`.
    fn other(ty: &'static str, id: fn(usize, usize) -> String) -> Self {
        Self {
            ty,
            id,
            wider: None,
        }
    }
}

fn postgres_types() -> Vec<IdType> {
    vec![
        IdType::int("int2", "bigint"),
        IdType::int("int4", "bigint"),
        IdType::int("int8", "numeric(30,0)"),
        IdType::int("numeric(20,0)", "numeric(30,0)"),
        IdType::other("uuid", uuid_id),
        IdType::other("text", text_id),
        IdType::other("varchar(32)", text_id),
    ]
}

fn mysql_types() -> Vec<IdType> {
    vec![
        IdType::int("int", "bigint"),
        IdType::int("bigint", "decimal(30,0)"),
        IdType::int("bigint unsigned", "decimal(30,0)"),
        IdType::int("decimal(20,0)", "decimal(30,0)"),
        IdType::other("uuid", uuid_id),
        IdType::other("varchar(32)", text_id),
        IdType::other("char(16)", text_id),
    ]
}

pub(super) async fn parameters_bind_in_every_form_on_every_connection(f: &Fixture) {
    let types = match f.dialect() {
        Dialect::Postgres => postgres_types(),
        Dialect::MySql => mysql_types(),
    };
    let mut failures = Vec::new();
    for (n, ty) in types.iter().enumerate() {
        if let Err(e) = check(f, n, ty).await {
            failures.push(format!("{}: {e}", ty.ty));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The `also` forms for `ty`, each writing `(id as text, form)` into the
/// log once per order it runs for.
fn also_forms(f: &Fixture, table: &str, ty: &IdType) -> Vec<(&'static str, String)> {
    let log = format!("INSERT INTO {table}_log (order_id, form)");
    let mut forms = match f.dialect() {
        Dialect::Postgres => vec![
            ("cast_text", format!("{log} VALUES ($1::text, 'cast_text')")),
            ("assigned", format!("{log} VALUES ($1, 'assigned')")),
            (
                "own_type",
                format!(
                    "{log} SELECT order_id::text, 'own_type' FROM {table}_lines WHERE order_id = $1"
                ),
            ),
            (
                "cast_as",
                format!("{log} SELECT CAST($1 AS varchar(64)), 'cast_as'"),
            ),
            (
                "twice",
                format!("{log} SELECT $1::text, 'twice' WHERE $1::text IS NOT NULL"),
            ),
        ],
        Dialect::MySql => vec![
            (
                "cast_text",
                format!("{log} VALUES (CAST(? AS CHAR), 'cast_text')"),
            ),
            ("assigned", format!("{log} VALUES (?, 'assigned')")),
            (
                "own_type",
                format!(
                    "{log} SELECT CAST(order_id AS CHAR), 'own_type' FROM {table}_lines \
                      WHERE order_id = ?"
                ),
            ),
            (
                "cast_as",
                format!("{log} SELECT CAST(CAST(? AS CHAR(64)) AS CHAR), 'cast_as'"),
            ),
            (
                "twice",
                format!("{log} SELECT CAST(? AS CHAR), 'twice' FROM DUAL WHERE ? IS NOT NULL"),
            ),
        ],
    };
    if ty.wider.is_some() {
        let text = match f.dialect() {
            Dialect::Postgres => "order_id::text",
            Dialect::MySql => "CAST(order_id AS CHAR)",
        };
        let mark = match f.dialect() {
            Dialect::Postgres => "$1",
            Dialect::MySql => "?",
        };
        forms.push((
            "wider",
            format!("{log} SELECT {text}, 'wider' FROM {table}_wide WHERE order_id = {mark}"),
        ));
    }
    forms
}

/// The shop's tables for `ty`: orders keyed by it (due from their creation
/// time and a settings row, soft-deleted or not), their lines, a wider
/// copy of the ids (integer ids), and the log the `also` forms write.
async fn create_tables(f: &Fixture, n: usize, table: &str, ty: &IdType) {
    let my = f.dialect() == Dialect::MySql;
    let (time, text, ago) = if my {
        (
            "DATETIME(6)",
            "VARCHAR(64)",
            "UTC_TIMESTAMP(6) - INTERVAL 2 HOUR",
        )
    } else {
        ("timestamptz", "text", "now() - interval '2 hours'")
    };
    let t = ty.ty;
    let mut ddl = format!(
        "CREATE TABLE {table} (id {t} NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL, \
                              created_at {time} NOT NULL, deleted INT NOT NULL DEFAULT 0); \
         CREATE TABLE {table}_lines (order_id {t} NOT NULL, sku {text} NOT NULL, \
                                     quantity INT NOT NULL); \
         CREATE TABLE {table}_log (order_id {text} NOT NULL, form {text} NOT NULL); \
         CREATE TABLE {table}_settings (minutes INT NOT NULL); \
         INSERT INTO {table}_settings (minutes) VALUES (30);"
    );
    if let Some(wider) = ty.wider {
        ddl.push_str(&format!(
            "CREATE TABLE {table}_wide (order_id {wider} NOT NULL);"
        ));
    }
    f.exec(&ddl).await;
    let ids: Vec<String> = (0..ORDERS).map(|i| (ty.id)(n, i)).collect();
    let value = |id: &str| {
        if my {
            format!("'{id}'")
        } else {
            format!("CAST('{id}' AS {t})")
        }
    };
    let rows: Vec<String> = ids
        .iter()
        .map(|id| format!("({}, 'UNPAID', {ago})", value(id)))
        .collect();
    let lines: Vec<String> = ids
        .iter()
        .map(|id| format!("({}, 'sku-{id}', 2)", value(id)))
        .collect();
    let mut insert = format!(
        "INSERT INTO {table} (id, status, created_at) VALUES {}; \
         INSERT INTO {table}_lines (order_id, sku, quantity) VALUES {};",
        rows.join(", "),
        lines.join(", ")
    );
    if ty.wider.is_some() {
        insert.push_str(&format!(
            "INSERT INTO {table}_wide (order_id) SELECT id FROM {table};"
        ));
    }
    f.exec(&insert).await;
}

/// The mapping: the deadline and the guard with sub-selects, the `also`
/// forms, the items from the lines table (read over gRPC's path).
fn schema(f: &Fixture, table: &str, ty: &IdType) -> ShopSchema {
    let deadline = match f.dialect() {
        Dialect::Postgres => {
            format!("created_at + (SELECT minutes FROM {table}_settings) * interval '1 minute'")
        }
        Dialect::MySql => {
            format!("created_at + INTERVAL (SELECT minutes FROM {table}_settings) MINUTE")
        }
    };
    ShopSchema {
        orders: OrdersMapping {
            table: table.into(),
            deadline,
            guard: format!("deleted = 0 AND id IN (SELECT order_id FROM {table}_lines)"),
            set: BTreeMap::new(),
            also: also_forms(f, table, ty)
                .into_iter()
                .map(|(_, sql)| sql)
                .collect(),
            ..OrdersMapping::default()
        },
        items: ItemsMapping {
            table: format!("{table}_lines"),
            ..ItemsMapping::default()
        },
        release: Release::Grpc,
    }
}

/// A store of `schema` on a pool of `connections`, checked at start-up as
/// `serve` checks it (which prepares every statement).
async fn checked_store(f: &Fixture, schema: &ShopSchema, connections: u32) -> Store {
    let timer = schema.timer();
    let store = connect_timer(f.url(), PoolSettings::new(connections), &timer).unwrap();
    store.prepare().await.expect("the start-up check");
    store
}

/// Cancels `ids` one per transaction, `at_once` at a time; the failures.
async fn cancel_one_by_one(store: &Store, ids: &[String], at_once: usize) -> Vec<String> {
    stream::iter(ids)
        .map(|order| async move {
            let got = store.cancel_due(&[id(order)], LEASE).await;
            let items = store.items(&[&id(order)]).await;
            match (got, items) {
                (Ok(states), Ok(items)) => {
                    let cancelled = matches!(
                        states.as_slice(),
                        [(_, OrderState::Cancelled(c))] if c.just_now
                    );
                    let want = vec![OrderItem {
                        sku: format!("sku-{order}"),
                        quantity: 2,
                    }];
                    match (cancelled, items.get(order.as_str()) == Some(&want)) {
                        (true, true) => None,
                        _ => Some(format!("{order}: {states:?}, items {items:?}")),
                    }
                }
                (Err(e), _) | (_, Err(e)) => Some(format!("{order}: {e}")),
            }
        })
        .buffer_unordered(at_once)
        .filter_map(|failure| async move { failure })
        .collect()
        .await
}

async fn check(f: &Fixture, n: usize, ty: &IdType) -> Result<(), String> {
    let table = format!("binds_{n}");
    create_tables(f, n, &table, ty).await;
    let schema = schema(f, &table, ty);
    let ids: Vec<String> = (0..ORDERS).map(|i| (ty.id)(n, i)).collect();
    let (first, second) = ids.split_at(ORDERS / 2);
    // The check prepares on the pool's one connection, which then runs
    // every order.
    let one = checked_store(f, &schema, 1).await;
    let mut failures = cancel_one_by_one(&one, first, 1).await;
    let four = checked_store(f, &schema, 4).await;
    failures.extend(cancel_one_by_one(&four, second, 4).await);
    if !failures.is_empty() {
        return Err(format!(
            "{} of {ORDERS} failed: {failures:#?}",
            failures.len()
        ));
    }
    // Each form ran once per order, bound its canonical id.
    let text = match f.dialect() {
        Dialect::Postgres => "order_id || ' ' || form",
        Dialect::MySql => "CONCAT(order_id, ' ', form)",
    };
    let logged: Vec<String> = f.texts(&format!("SELECT {text} FROM {table}_log")).await;
    let logged_set: BTreeSet<&String> = logged.iter().collect();
    let expected: BTreeSet<String> = ids
        .iter()
        .flat_map(|id| {
            also_forms(f, &table, ty)
                .into_iter()
                .map(move |(form, _)| format!("{id} {form}"))
        })
        .collect();
    if logged.len() != expected.len() || logged_set != expected.iter().collect() {
        let missing: Vec<&String> = expected
            .iter()
            .filter(|e| !logged_set.contains(e))
            .collect();
        return Err(format!(
            "{} log rows for {} expected; missing {missing:?}; logged {logged:?}",
            logged.len(),
            expected.len()
        ));
    }
    Ok(())
}

/// What would bind a parameter wrongly is refused by the start-up check,
/// naming the key: a placeholder in the guard (it would shift every value
/// bound after it), and an `also` parameter of a type no order id is.
pub(super) async fn a_misplaced_or_unbindable_parameter_is_refused_at_the_check(f: &Fixture) {
    let (mark, date) = match f.dialect() {
        Dialect::Postgres => ("$4", "SELECT $1::date"),
        Dialect::MySql => ("?", "SELECT ?"),
    };
    let guard = ShopSchema {
        orders: OrdersMapping {
            guard: format!("status <> {mark}"),
            ..OrdersMapping::default()
        },
        ..ShopSchema::default()
    };
    let err = f
        .store_with(&guard)
        .prepare()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("config [orders].set / [orders].deadline / [orders].guard:")
            && err.contains("where the service binds"),
        "{err}"
    );
    if f.dialect() == Dialect::Postgres {
        let also = ShopSchema {
            orders: OrdersMapping {
                also: vec![date.to_owned()],
                ..OrdersMapping::default()
            },
            ..ShopSchema::default()
        };
        let err = f.store_with(&also).prepare().await.unwrap_err().to_string();
        assert!(
            err.starts_with("config [orders].also: parameter $1 is of type date"),
            "{err}"
        );
    }
    // The `also_keys` query: it must take the id, and return keys the
    // cancel transaction can read (a statement returning nothing cannot).
    let (id_mark, decimal) = match f.dialect() {
        Dialect::Postgres => ("$1", "SELECT $1::text"),
        Dialect::MySql => ("?", "SELECT CAST(? AS DECIMAL(10, 2))"),
    };
    let keys = |query: String| ShopSchema {
        orders: OrdersMapping {
            also: vec![format!(
                "UPDATE orders SET status = status WHERE id = {id_mark}"
            )],
            also_keys: query,
            ..OrdersMapping::default()
        },
        ..ShopSchema::default()
    };
    let refusals = [
        (
            format!("SELECT sku FROM no_such_items WHERE order_id = {id_mark}"),
            "no_such_items",
        ),
        (
            format!("UPDATE orders SET status = status WHERE id = {id_mark}"),
            "returns a first column of type \"\"",
        ),
    ];
    for (query, refusal) in refusals {
        let err = f
            .store_with(&keys(query.clone()))
            .prepare()
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(refusal), "{query}: {err}");
        assert!(
            err.starts_with("config [orders].also_keys:"),
            "{query}: {err}"
        );
    }
    let typed = f.store_with(&keys(decimal.to_owned())).prepare().await;
    match f.dialect() {
        // PostgreSQL reads any type as text.
        Dialect::Postgres => drop(typed.unwrap()),
        Dialect::MySql => assert!(
            typed
                .unwrap_err()
                .to_string()
                .contains("return the keys as text or integers"),
            "a DECIMAL key column"
        ),
    }
}

/// Status codes that differ as written but are one code in the status
/// column's own comparison (MySQL's default collation ignores letter case;
/// a `char(n)` column ignores trailing spaces) are refused by the check,
/// naming the key: a flip from one to the other would change nothing.
pub(super) async fn codes_one_in_the_status_columns_comparison_are_refused(f: &Fixture) {
    use order_timeout::settings::StatusValue::Text;
    f.exec("CREATE TABLE codes (id VARCHAR(64) NOT NULL PRIMARY KEY, status CHAR(8) NOT NULL, expires_at TIMESTAMP NULL)")
        .await;
    let with = |table: &str, unpaid: &str, cancelled: &str| ShopSchema {
        orders: OrdersMapping {
            table: table.into(),
            unpaid: Text(unpaid.into()),
            cancelled: Text(cancelled.into()),
            paid: None,
            set: BTreeMap::new(),
            ..OrdersMapping::default()
        },
        release: Release::None,
        ..ShopSchema::default()
    };
    // Trailing spaces, in a char(8) column: one code on both dialects.
    let err = f
        .store_with(&with("codes", "OPEN", "OPEN  "))
        .prepare()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("config [orders].cancelled: ") && err.contains("one code"),
        "{err}"
    );
    // Letter case, in the reference table's VARCHAR status: one code under
    // MySQL's default collation, two on PostgreSQL.
    let case = f
        .store_with(&with("orders", "UNPAID", "unpaid"))
        .prepare()
        .await;
    match f.dialect() {
        Dialect::MySql => {
            let err = case.unwrap_err().to_string();
            assert!(
                err.starts_with("config [orders].cancelled: ") && err.contains("one code"),
                "{err}"
            );
        }
        Dialect::Postgres => {
            case.unwrap();
        }
    }
}
