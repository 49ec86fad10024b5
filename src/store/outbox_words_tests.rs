//! The statements of the service's own tables (`outbox.rs`) in each
//! dialect's words: every slot filled, values bound where they stand.

use chrono::DateTime;

use super::mysql::MySql;
use super::outbox::{self, Value};
use super::postgres::Postgres;

/// Every value any template names.
fn values() -> Vec<(&'static str, Value<'static>)> {
    const IDS: &[&str] = &["a", "b", "c"];
    vec![
        ("timer", Value::Text("cancel_unpaid")),
        ("grace", Value::Micros(1)),
        ("age", Value::Micros(2)),
        ("delay", Value::Micros(3)),
        ("lease", Value::Micros(4)),
        ("limit", Value::Int(5)),
        ("error", Value::Text("e")),
        ("reason", Value::Text("r")),
        ("holder", Value::Text("h")),
        ("instance", Value::Text("i")),
        ("version", Value::Text("v")),
        ("until", Value::Time(DateTime::UNIX_EPOCH)),
        ("session", Value::Text("s")),
        ("at", Value::Time(DateTime::UNIX_EPOCH)),
        ("after_id", Value::Text("a")),
        ("ids", Value::Ids(IDS)),
    ]
}

#[test]
fn every_slot_of_every_template_is_filled_on_both_dialects() {
    for template in outbox::TEMPLATES {
        for sql in [
            outbox::render::<Postgres>(template, &values()).sql,
            outbox::render::<MySql>(template, &values()).sql,
        ] {
            assert!(!sql.contains('{') && !sql.contains('}'), "{sql}");
        }
    }
}

#[test]
fn values_are_bound_in_the_order_their_placeholders_stand() {
    let values = [
        ("holder", Value::Text("me")),
        ("lease", Value::Micros(7)),
        ("timer", Value::Text("t")),
    ];
    let pg = outbox::render::<Postgres>(outbox::WATCH_TAKE, &values);
    for part in [
        "SET holder = $1,",
        "lease_until = now() + ($2 * interval '1 microsecond')",
        "WHERE timer = $3",
        "(holder = $4 OR",
    ] {
        assert!(pg.sql.contains(part), "{part} in {}", pg.sql);
    }
    let names: Vec<String> = pg.values.iter().map(|v| format!("{v:?}")).collect();
    assert_eq!(
        names,
        ["Text(\"me\")", "Micros(7)", "Text(\"t\")", "Text(\"me\")"]
    );
    let my = outbox::render::<MySql>(outbox::WATCH_TAKE, &values);
    assert_eq!(my.sql.matches('?').count(), my.values.len());
    assert!(my.sql.contains("UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"));
}

#[test]
fn an_id_list_is_one_array_on_postgres_and_a_placeholder_each_on_mysql() {
    let ids = ["a", "b", "c"];
    let values = [("timer", Value::Text("t")), ("ids", Value::Ids(&ids))];
    let pg = outbox::render::<Postgres>(outbox::RELEASE_LEASES, &values);
    assert!(
        pg.sql.ends_with("WHERE timer = $1 AND order_id = ANY($2)"),
        "{}",
        pg.sql
    );
    let my = outbox::render::<MySql>(outbox::RELEASE_LEASES, &values);
    assert!(
        my.sql
            .ends_with("WHERE timer = ? AND order_id IN (?, ?, ?)"),
        "{}",
        my.sql
    );
}
