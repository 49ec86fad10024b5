//! Ids are compared exactly, in every id column type a shop uses: an id
//! that cannot be a value of the column is rejected with the reason and
//! never reaches the database (it neither matches a row its truncation or
//! rounding would name, nor fails the batch it is in); an id spelled
//! differently from a row's (case, trailing spaces on MySQL's default
//! collations) matches nothing; the `also` statements are bound the id in
//! the column's own type. The same cases run through a `[[timers]]`
//! table's store ([`Flip::Timer`], from `tests/e2e/store/timers.rs`).

use std::collections::BTreeMap;

use order_timeout::settings::{OrdersMapping, Release};
use order_timeout::testing::store::{PoolSettings, connect_timer};

use super::*;

/// What an id asked about comes to.
#[derive(Clone, Debug)]
enum Expect {
    /// Accepted as this canonical id and cancelled.
    Cancelled(String),
    /// Accepted, and no row has it.
    Unknown,
    /// Rejected: the reason contains this.
    Rejected(&'static str),
}
use Expect::*;

/// One id column type: the rows (overdue, unpaid) and the ids asked about.
struct IdCase {
    ty: &'static str,
    rows: Vec<String>,
    asks: Vec<(String, Expect)>,
}

fn case(ty: &'static str, rows: &[&str], asks: &[(&str, Expect)]) -> IdCase {
    IdCase {
        ty,
        rows: rows.iter().map(|r| r.to_string()).collect(),
        asks: asks
            .iter()
            .map(|(a, e)| (a.to_string(), e.clone()))
            .collect(),
    }
}

fn c(id: &str) -> Expect {
    Cancelled(id.into())
}

/// 100 due orders and a row at `3000000000` wrapped to 32 bits
/// (`-1294967296`); asked about: 99 of the 100 (not `first + 49`), an id
/// out of the column's range (`3000000000`), and the unasked one spelled
/// as a decimal (`{first + 49}.0`). Only the 99 are cancelled.
fn hundred_and_one_out_of_range(ty: &'static str, first: u32, reason: &'static str) -> IdCase {
    let skip = (first + 49).to_string();
    let mut rows: Vec<String> = (first..first + 100).map(|n| n.to_string()).collect();
    let mut asks: Vec<(String, Expect)> = rows
        .iter()
        .filter(|r| **r != skip)
        .map(|r| (r.clone(), c(r)))
        .collect();
    asks.insert(40, ("3000000000".into(), Rejected(reason)));
    asks.insert(60, (format!("{skip}.0"), Rejected("not an integer")));
    rows.push("-1294967296".into());
    IdCase { ty, rows, asks }
}

const UUID: &str = "5f0e2a4c-9b1d-4e8f-a2c3-6d7e8f901a2b";
const UUID_UPPER: &str = "5F0E2A4C9B1D4E8FA2C36D7E8F901A2B";

fn postgres_cases() -> Vec<IdCase> {
    vec![
        case(
            "text",
            &["t-1", "T-2"],
            &[
                ("t-1", c("t-1")),
                ("T-1", Unknown),
                ("t-1 ", Unknown),
                ("T-2", c("T-2")),
            ],
        ),
        case(
            "varchar(8)",
            &["ORD00001", "ORD00002"],
            &[
                (
                    "ORD00001-not-this-order",
                    Rejected("23 characters, column character varying(8) holds at most 8"),
                ),
                ("ORD00002", c("ORD00002")),
            ],
        ),
        case(
            "char(8)",
            &["c-abc"],
            &[
                ("c-abc ", Rejected("ends with a space")),
                ("c-abcdefgh", Rejected("10 characters")),
                ("c-abc", c("c-abc")),
            ],
        ),
        case(
            "int2",
            &["101"],
            &[
                ("40000", Rejected("40000 is out of range for smallint")),
                ("0101", c("101")),
                ("x101", Rejected("not an integer")),
            ],
        ),
        hundred_and_one_out_of_range("int4", 201, "3000000000 is out of range for integer"),
        case(
            "int8",
            &["9223372036854775807"],
            &[
                (
                    "9223372036854775808",
                    Rejected("9223372036854775808 is out of range for bigint"),
                ),
                ("9223372036854775807", c("9223372036854775807")),
            ],
        ),
        case(
            "numeric(20,0)",
            &["12345678901234567890", "12345678901234567800"],
            &[
                (
                    "123456789012345678901",
                    Rejected("21 digits, column numeric(20,0) holds at most 20"),
                ),
                ("12345678901234567891", Unknown),
                ("0012345678901234567800", c("12345678901234567800")),
            ],
        ),
        case(
            "numeric",
            &["31"],
            &[("31.0", Rejected("not an integer")), ("31", c("31"))],
        ),
        case(
            "uuid",
            &[UUID],
            &[
                (UUID_UPPER, c(UUID)),
                ("not-a-uuid", Rejected("not a uuid")),
            ],
        ),
    ]
}

fn mysql_cases() -> Vec<IdCase> {
    vec![
        // The default collation: case-insensitive, pads with spaces.
        case(
            "varchar(8)",
            &["ORD00001", "abc"],
            &[
                (
                    "ORD00001-not-this-order",
                    Rejected("23 characters, column varchar(8) holds at most 8"),
                ),
                ("ABC", Unknown),
                ("abc ", Unknown),
                ("abc", c("abc")),
            ],
        ),
        // A case-sensitive column: two orders whose ids differ in case only,
        // each with its own outbox row.
        case(
            "varchar(8) COLLATE utf8mb4_bin",
            &["xY1", "Xy1"],
            &[("xY1", c("xY1")), ("Xy1", c("Xy1")), ("xy1", Unknown)],
        ),
        case(
            "char(8)",
            &["c-abc"],
            &[
                ("c-abc ", Rejected("ends with a space")),
                ("C-ABC", Unknown),
                ("c-abc", c("c-abc")),
            ],
        ),
        case(
            "varchar(64) COLLATE utf8mb4_general_ci",
            &["tx-1"],
            &[("TX-1", Unknown), ("tx-1  ", Unknown), ("tx-1", c("tx-1"))],
        ),
        case(
            "tinyint",
            &["101"],
            &[
                ("128", Rejected("128 is out of range for tinyint")),
                ("0101", c("101")),
            ],
        ),
        case(
            "smallint",
            &["1101"],
            &[
                ("40000", Rejected("40000 is out of range for smallint")),
                ("+1101", c("1101")),
            ],
        ),
        case(
            "mediumint unsigned",
            &["16777215"],
            &[
                ("16777216", Rejected("out of range for mediumint")),
                ("-1", Rejected("-1 is out of range")),
                ("16777215", c("16777215")),
            ],
        ),
        hundred_and_one_out_of_range("int", 3001, "3000000000 is out of range for int"),
        case(
            "bigint",
            &["9223372036854775807"],
            &[
                ("9223372036854775808", Rejected("out of range for bigint")),
                ("9223372036854775807", c("9223372036854775807")),
            ],
        ),
        case(
            "int unsigned",
            &["4294967295"],
            &[
                ("-1", Rejected("out of range for int")),
                ("4294967295", c("4294967295")),
            ],
        ),
        case(
            "bigint unsigned",
            &["18446744073709551615"],
            &[
                ("18446744073709551616", Rejected("out of range for bigint")),
                ("18446744073709551615", c("18446744073709551615")),
            ],
        ),
        case(
            "decimal(20,0)",
            &["12345678901234567890"],
            &[
                (
                    "123456789012345678901",
                    Rejected("21 digits, column decimal(20,0) holds at most 20"),
                ),
                ("0012345678901234567890", c("12345678901234567890")),
            ],
        ),
        // Beyond 64 bits, and equal as doubles: compared as decimals.
        case(
            "decimal(30,0)",
            &[
                "123456789012345678901234567890",
                "123456789012345678901234567800",
            ],
            &[
                ("123456789012345678901234567891", Unknown),
                (
                    "123456789012345678901234567800",
                    c("123456789012345678901234567800"),
                ),
            ],
        ),
        case(
            "uuid",
            &[UUID],
            &[
                (UUID_UPPER, c(UUID)),
                ("not-a-uuid", Rejected("not a uuid")),
            ],
        ),
    ]
}

pub(super) async fn ids_are_compared_exactly_in_every_id_column_type(f: &Fixture) {
    every_id_column_type(f, Flip::Cancel).await;
}

/// Whose flip the cases go through.
#[derive(Clone, Copy, Debug)]
pub(super) enum Flip {
    /// The default timer: `[orders]`, `UNPAID → CANCELLED`.
    Cancel,
    /// A `[[timers]]` table per case (`receive_{n}`), `UNPAID → RECEIVED`:
    /// its store, its `also`, its outbox rows under its own name.
    Timer,
}

impl Flip {
    /// The status a flipped row has.
    fn to(self) -> &'static str {
        match self {
            Flip::Cancel => "CANCELLED",
            Flip::Timer => "RECEIVED",
        }
    }
}

/// Every case of the fixture's dialect through `flip`; the failures of all
/// cases are reported together.
pub(super) async fn every_id_column_type(f: &Fixture, flip: Flip) {
    let cases = match f.dialect() {
        Dialect::Postgres => postgres_cases(),
        Dialect::MySql => mysql_cases(),
    };
    let mut failures = Vec::new();
    for (n, case) in cases.iter().enumerate() {
        if let Err(e) = check(f, n, case, flip).await {
            failures.push(format!("{}: {e}", case.ty));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The shop's tables for `case`: orders keyed by the type, their lines
/// (the order id in the same type, not indexed, as mall's are), and a log
/// the `also` statement writes the lines' order ids into.
async fn create_tables(f: &Fixture, table: &str, case: &IdCase) {
    let my = f.dialect() == Dialect::MySql;
    let (time, ago) = if my {
        ("DATETIME(6)", "UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE")
    } else {
        ("timestamptz", "now() - interval '1 minute'")
    };
    let ty = case.ty;
    f.exec(&format!(
        "CREATE TABLE {table} (id {ty} NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL, \
                              expires_at {time} NOT NULL); \
         CREATE TABLE {table}_lines (order_id {ty} NOT NULL); \
         CREATE TABLE {table}_also (order_id {ty} NOT NULL)"
    ))
    .await;
    let values: Vec<String> = case
        .rows
        .iter()
        .map(|id| {
            let id = if my {
                format!("'{id}'")
            } else {
                format!("CAST('{id}' AS {ty})")
            };
            format!("({id}, 'UNPAID', {ago})")
        })
        .collect();
    f.exec(&format!(
        "INSERT INTO {table} (id, status, expires_at) VALUES {}; \
         INSERT INTO {table}_lines (order_id) SELECT id FROM {table}",
        values.join(", ")
    ))
    .await;
}

/// The store `flip` goes through for the case's `table`, with an `also`
/// statement copying the lines' order ids into the log: a comparison with
/// an unindexed column, where the bound value's own type decides it (a
/// string against a DECIMAL is compared as a double on MySQL). Returns it
/// and the name its outbox rows carry.
fn store_for(f: &Fixture, table: &str, n: usize, flip: Flip) -> (Store, String) {
    let mark = if f.dialect() == Dialect::MySql {
        "?"
    } else {
        "$1"
    };
    let also = format!(
        "INSERT INTO {table}_also (order_id) \
         SELECT order_id FROM {table}_lines WHERE order_id = {mark}"
    );
    match flip {
        Flip::Cancel => {
            let schema = ShopSchema {
                orders: OrdersMapping {
                    table: table.into(),
                    set: BTreeMap::new(),
                    also: vec![also],
                    ..OrdersMapping::default()
                },
                release: Release::None,
                ..ShopSchema::default()
            };
            (f.store_with(&schema), settings::DEFAULT_TIMER.to_owned())
        }
        Flip::Timer => {
            let name = format!("receive_{n}");
            let timer = super::timers::timer_of(&format!(
                r#"
                [[timers]]
                name = "{name}"
                table = "{table}"
                from = "UNPAID"
                to = "RECEIVED"
                deadline = "expires_at"
                also = ["{also}"]
                "#
            ));
            let store = connect_timer(f.url(), PoolSettings::new(2), &timer).unwrap();
            (store, name)
        }
    }
}

/// One case: canonical ids and their reasons, then one cancel batch with
/// every id asked about (the rejected ones as they came), then the rows,
/// the `also` log and the outbox.
async fn check(f: &Fixture, n: usize, case: &IdCase, flip: Flip) -> Result<(), String> {
    let table = format!("ids_{n}");
    create_tables(f, &table, case).await;
    let (store, timer) = store_for(f, &table, n, flip);
    store.prepare().await.map_err(|e| format!("prepare: {e}"))?;
    let mut batch = Vec::new();
    for (ask, expect) in &case.asks {
        let got = store.canonical(&id(ask));
        match (expect, &got) {
            (Cancelled(want), Ok(canonical)) if canonical.as_str() == want => {}
            (Unknown, Ok(_)) => {}
            (Rejected(reason), Err(why)) if why.to_string().contains(reason) => {}
            _ => return Err(format!("{ask:?}: expected {expect:?}, got {got:?}")),
        }
        batch.push(got.unwrap_or_else(|_| id(ask)));
    }
    let states = store
        .cancel_due(&batch, LEASE)
        .await
        .map_err(|e| format!("the batch failed: {e}"))?;
    if states.len() != batch.len() {
        return Err(format!("{} states for {} ids", states.len(), batch.len()));
    }
    for ((ask, expect), (asked, state)) in case.asks.iter().zip(order_like(&batch, states)) {
        let ok = match expect {
            Cancelled(_) => matches!(&state, OrderState::Cancelled(c) if c.just_now),
            Unknown | Rejected(_) => state == OrderState::Unknown,
        };
        if !ok {
            return Err(format!(
                "{ask:?} (asked as {asked}): {expect:?} but {state:?}"
            ));
        }
    }
    check_effects(f, &table, case, flip, &timer).await
}

/// `states` in the order of `batch`.
fn order_like(batch: &[OrderId], states: Vec<(OrderId, OrderState)>) -> Vec<(OrderId, OrderState)> {
    batch
        .iter()
        .map(|asked| {
            states
                .iter()
                .find(|(id, _)| id == asked)
                .cloned()
                .unwrap_or_else(|| panic!("no state for {asked}"))
        })
        .collect()
}

/// Exactly the expected rows are flipped, each with one `also` effect and
/// one outbox row under `timer`; every other row is still unpaid.
async fn check_effects(
    f: &Fixture,
    table: &str,
    case: &IdCase,
    flip: Flip,
    timer: &str,
) -> Result<(), String> {
    let text = |column: &str| match f.dialect() {
        Dialect::MySql => format!("CAST({column} AS CHAR)"),
        Dialect::Postgres => format!("{column}::text"),
    };
    let mut expected: Vec<String> = case
        .asks
        .iter()
        .filter_map(|(_, e)| match e {
            Cancelled(id) => Some(id.clone()),
            _ => None,
        })
        .collect();
    expected.sort();
    let (id, order_id) = (text("id"), text("order_id"));
    let to = flip.to();
    let cancelled = f
        .texts(&format!(
            "SELECT {id} FROM {table} WHERE status = '{to}' ORDER BY 1"
        ))
        .await;
    let unpaid = f
        .texts(&format!("SELECT {id} FROM {table} WHERE status = 'UNPAID'"))
        .await
        .len();
    let mut also = f
        .texts(&format!("SELECT {order_id} FROM {table}_also"))
        .await;
    also.sort();
    let mut outbox = Vec::new();
    for id in &expected {
        let rows = f
            .texts(&format!(
                "SELECT {} FROM order_timeout_cancel_outbox \
                  WHERE timer = '{timer}' AND order_id = '{id}'",
                super::timers::outbox_id(f)
            ))
            .await;
        outbox.extend((rows.len() == 1).then(|| id.clone()));
    }
    if cancelled != expected || also != expected || outbox != expected {
        return Err(format!(
            "expected {expected:?} {to} with one effect each; \
             {to} {cancelled:?}, also {also:?}, outbox {outbox:?}"
        ));
    }
    if unpaid + cancelled.len() != case.rows.len() {
        return Err(format!(
            "{unpaid} rows unpaid and {} {to} of {}",
            cancelled.len(),
            case.rows.len()
        ));
    }
    Ok(())
}
