//! The statements of the service's own tables (`outbox.rs`) in each
//! dialect's words: every slot filled, values bound where they stand.

use std::collections::BTreeSet;

use super::catalog::Column;
use super::ids::{IdColumn, IdValue};
use super::mysql::MySql;
use super::outbox::{self, Mapped, Value, Vocabulary};
use super::postgres::Postgres;
use super::shape::OrdersColumns;
use super::{cancel, shop};
use crate::settings::{ItemsMapping, OrdersMapping, Release, StatusValue, Timer};

const IDS: &[&str] = &["a", "b", "c"];

/// Every value `template` names ([`outbox::sample_values`]).
fn values(template: &str) -> Vec<(&'static str, Value<'static>)> {
    static ROW_IDS: [IdValue; 2] = [IdValue::I64(7), IdValue::I64(8)];
    static CODE: StatusValue = StatusValue::Int(0);
    outbox::sample_values(template, IDS, &ROW_IDS, &CODE)
}

#[test]
fn every_slot_of_every_template_is_filled_on_both_dialects() {
    for (_, template) in outbox::TEMPLATES {
        for sql in [
            outbox::render::<Postgres>(template, &values(template)).sql,
            outbox::render::<MySql>(template, &values(template)).sql,
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
        "lease_until = now() + ($2::int8 * interval '1 microsecond')",
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

/// The names of the `&str` constants declared in `source`: the templates
/// a file writes, found in its text rather than in a list kept by hand.
fn template_constants(source: &str) -> BTreeSet<&str> {
    source
        .lines()
        .filter_map(|line| {
            let rest = line
                .strip_prefix("const ")
                .or_else(|| line.strip_prefix("pub(super) const "))
                .or_else(|| line.strip_prefix("pub(crate) const "))?;
            let (name, ty) = rest.split_once(':')?;
            ty.trim_start().starts_with("&str =").then_some(name)
        })
        .collect()
}

#[test]
fn every_template_constant_of_the_sources_is_rendered_by_these_tests() {
    let sources = [
        (include_str!("outbox.rs"), &outbox::TEMPLATES[..]),
        (include_str!("shop.rs"), &shop::TEMPLATES[..]),
        (include_str!("cancel.rs"), &cancel::TEMPLATES[..]),
    ];
    for (source, listed) in sources {
        let found = template_constants(source);
        let listed: BTreeSet<&str> = listed.iter().map(|(name, _)| *name).collect();
        assert!(found.len() > 5, "{found:?}");
        assert_eq!(found, listed, "a template missing from TEMPLATES");
    }
}

/// A timer with items and a watch, on an orders table of an integer id.
fn mapped<V: Vocabulary>() -> (Timer, Mapped) {
    let mut timer = Timer::cancel_unpaid(
        &OrdersMapping::default(),
        &ItemsMapping::default(),
        Release::Grpc,
    );
    timer.watch = Some(std::time::Duration::from_secs(60));
    let column = Column {
        name: "id".into(),
        shown: "bigint".into(),
        type_name: "int8".into(),
        base: "bigint".into(),
        max_chars: None,
        precision: None,
        scale: None,
        unsigned: false,
    };
    let orders = OrdersColumns {
        id: IdColumn::of("[orders].id", &column).unwrap(),
        id_type: "bigint".into(),
        id_base: "bigint".into(),
        status_type: "text".into(),
        all: vec!["id".into(), "status".into()],
    };
    let mapped = shop::mapped::<V>(&timer, &orders, Some("bigint"), false);
    (timer, mapped)
}

#[test]
fn every_slot_of_every_shop_template_is_filled_on_both_dialects() {
    let (_, pg) = mapped::<Postgres>();
    let (_, my) = mapped::<MySql>();
    for (name, template) in shop::TEMPLATES.iter().chain(&cancel::TEMPLATES) {
        let values = values(template);
        for statement in [
            outbox::render_mapped::<Postgres>(template, &pg, &values),
            outbox::render_mapped::<MySql>(template, &my, &values),
        ] {
            let sql = &statement.sql;
            assert!(!sql.contains('{') && !sql.contains('}'), "{name}: {sql}");
        }
    }
}

#[test]
fn shop_values_are_cast_to_their_columns_on_postgres_and_bound_as_they_are_on_mysql() {
    let values = values(shop::STILL_WAITING);
    let (_, pg) = mapped::<Postgres>();
    let statement = outbox::render_mapped::<Postgres>(shop::STILL_WAITING, &pg, &values);
    assert!(
        statement.sql.ends_with(
            "WHERE o.\"status\" = CAST($1::text AS text) \
             AND o.\"id\" = ANY(CAST($2::text[] AS bigint[]))"
        ),
        "{}",
        statement.sql
    );
    assert_eq!(statement.placeholders, 2);
    let (_, my) = mapped::<MySql>();
    let statement = outbox::render_mapped::<MySql>(shop::STILL_WAITING, &my, &values);
    assert!(
        statement
            .sql
            .ends_with("WHERE o.`status` = ? AND o.`id` IN (?, ?)"),
        "{}",
        statement.sql
    );
    assert_eq!(statement.placeholders, 3);
}

#[test]
fn no_value_is_named_as_a_word_of_the_mapping() {
    let (_, mapped) = mapped::<Postgres>();
    let names: BTreeSet<&str> = values(shop::STILL_WAITING)
        .iter()
        .map(|(name, _)| *name)
        .collect();
    for (word, _) in &mapped.words {
        assert!(
            !names.contains(word),
            "{{{word}}} is both a word and a value"
        );
    }
}
