//! **The parked store** (`order_timeout_parked`): the messages the service
//! gave up on, kept where an operator can read them any number of times
//! without delivering them. They still arrive in the queue
//! `order-timeout.parked` (the park path and its format are unchanged);
//! `pipeline::keep_parked` moves each one from the queue into this table
//! (insert, then ack), and `ops::parked` lists, shows, replays and purges
//! them here. Reading a row changes nothing: no delivery count, no order,
//! no delivery limit that could drop it.
//!
//! The statements are templates over the dialects' vocabulary, like
//! `outbox.rs`; which rows an operation touches is a [`ParkedFilter`],
//! rendered into the statement's `WHERE` in one place ([`filter_sql`]).

use chrono::{DateTime, Utc};

use super::StoreError;
use super::outbox::{OwnTables, Statement, Value, Vocabulary, render};

/// The longest body the store keeps whole: a longer one (only a
/// `too_large` message can be longer than `max_body_bytes`, which is far
/// smaller) keeps its first this many bytes, and
/// [`ParkedRow::body_size`] says how long it was. Under MariaDB's default
/// `max_allowed_packet` (16 MiB) with room to spare.
pub(crate) const KEPT_BODY_BYTES: usize = 4 * 1024 * 1024;

/// A parked message as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ParkedRow {
    /// The row's id: the order the messages arrived in, and how an
    /// operator names one (`parked show ID`, the console's links).
    pub id: i64,
    /// The copy's `x-parked-id` (or a digest of an older copy's park
    /// record and body): a copy moved twice is kept once.
    pub message_key: String,
    /// When it was parked (`x-parked-at`, else when it was moved here).
    pub parked_at: DateTime<Utc>,
    /// When it was moved from the queue into the store.
    pub moved_at: DateTime<Utc>,
    /// The order it names, if it names a valid one.
    pub order_id: Option<String>,
    /// The timer its body is for, if it is a timeout message at all.
    pub timer: Option<String>,
    /// Its short reason (`x-error-kind`).
    pub error_kind: Option<String>,
    /// Its AMQP properties (headers included) as JSON.
    pub properties: String,
    /// Its body: whole, or as much of it as the query asked for (an
    /// excerpt for a listing), at most [`KEPT_BODY_BYTES`].
    pub body: Vec<u8>,
    /// The original body's length in bytes.
    pub body_size: i64,
}

/// A parked message to keep ([`keep`]).
#[derive(Clone, Copy, Debug)]
pub struct NewParked<'a> {
    /// See [`ParkedRow::message_key`].
    pub key: &'a str,
    /// See [`ParkedRow::parked_at`].
    pub parked_at: DateTime<Utc>,
    /// See [`ParkedRow::order_id`].
    pub order_id: Option<&'a str>,
    /// See [`ParkedRow::timer`].
    pub timer: Option<&'a str>,
    /// See [`ParkedRow::error_kind`].
    pub error_kind: Option<&'a str>,
    /// See [`ParkedRow::properties`].
    pub properties: &'a str,
    /// The whole body; the store keeps at most [`KEPT_BODY_BYTES`] of it.
    pub body: &'a [u8],
}

/// Which parked messages an operation reads or acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParkedFilter {
    /// Every one.
    All,
    /// Those naming this order id.
    OrderId(String),
    /// Those for this timer (the body's `"timer"`, `cancel_unpaid` when it
    /// names none).
    Timer(String),
    /// Those with this short reason (`x-error-kind`).
    Reason(String),
    /// Those parked at or before this instant.
    ParkedBefore(DateTime<Utc>),
    /// Those with these row ids.
    Ids(Vec<i64>),
}

/// `filter` as a condition of a statement's `WHERE`, and its values.
fn filter_sql(filter: &ParkedFilter) -> (&'static str, Vec<(&'static str, Value<'_>)>) {
    match filter {
        ParkedFilter::All => ("1 = 1", vec![]),
        ParkedFilter::OrderId(id) => (
            "order_id = {for_order}",
            vec![("for_order", Value::Text(id))],
        ),
        ParkedFilter::Timer(name) => (
            "timer = {for_timer}",
            vec![("for_timer", Value::Text(name))],
        ),
        ParkedFilter::Reason(kind) => ("error_kind = {kind}", vec![("kind", Value::Text(kind))]),
        ParkedFilter::ParkedBefore(at) => {
            ("parked_at <= {before}", vec![("before", Value::Time(*at))])
        }
        ParkedFilter::Ids(ids) if ids.is_empty() => ("1 = 0", vec![]),
        ParkedFilter::Ids(ids) => ("id {ids}", vec![("ids", Value::Nums(ids))]),
    }
}

/// Keeps a parked message, unless one with the same key is kept already.
const ADD: &str = "\
INSERT INTO order_timeout_parked \
       (message_key, parked_at, moved_at, order_id, timer, error_kind, properties, body, body_size) \
VALUES ({key}, {parked_at}, {now}, {for_order}, {for_timer}, {kind}, {properties}, {body}, {size}) \
{keep_existing:message_key}";

/// Every column but the body, which each query reads as it needs it.
const COLUMNS: &str =
    "id, message_key, parked_at, moved_at, order_id, timer, error_kind, properties, body_size";

/// The messages by reason (`NULL`: none recorded).
const COUNTS: &str = "\
SELECT error_kind, count(*) AS n FROM order_timeout_parked GROUP BY error_kind ORDER BY error_kind";

/// Keeps `message`; `true` if it was not kept before.
pub(crate) async fn keep<S: OwnTables>(
    store: &S,
    message: &NewParked<'_>,
) -> Result<bool, StoreError> {
    let added = store.execute(add_statement::<S::Words>(message)).await?;
    Ok(added > 0)
}

/// [`ADD`] for `message`, its body cut to [`KEPT_BODY_BYTES`].
fn add_statement<'a, V: Vocabulary>(message: &NewParked<'a>) -> Statement<'a> {
    let kept = &message.body[..message.body.len().min(KEPT_BODY_BYTES)];
    let size = i64::try_from(message.body.len()).unwrap_or(i64::MAX);
    let values = [
        ("key", Value::Text(message.key)),
        ("parked_at", Value::Time(message.parked_at)),
        ("for_order", Value::MaybeText(message.order_id)),
        ("for_timer", Value::MaybeText(message.timer)),
        ("kind", Value::MaybeText(message.error_kind)),
        ("properties", Value::Text(message.properties)),
        ("body", Value::Bytes(kept)),
        ("size", Value::Int(size)),
    ];
    render::<V>(ADD, &values)
}

/// The messages `filter` names after the row id `after`, in the order they
/// arrived, at most `limit`, each with the first `excerpt` bytes of its
/// body (`None`: the whole body kept).
pub(crate) async fn page<S: OwnTables>(
    store: &S,
    filter: &ParkedFilter,
    after: i64,
    limit: u32,
    excerpt: Option<usize>,
) -> Result<Vec<ParkedRow>, StoreError> {
    store
        .fetch(page_statement::<S::Words>(filter, after, limit, excerpt))
        .await
}

/// The statement of [`page`].
fn page_statement<V: Vocabulary>(
    filter: &ParkedFilter,
    after: i64,
    limit: u32,
    excerpt: Option<usize>,
) -> Statement<'_> {
    let (condition, mut values) = filter_sql(filter);
    let body = match excerpt {
        // A number of ours, written in: both dialects take this form.
        Some(n) => format!("SUBSTRING(body FROM 1 FOR {})", n.max(1)),
        None => "body".to_owned(),
    };
    let template = format!(
        "SELECT {COLUMNS}, {body} AS body FROM order_timeout_parked \
          WHERE id > {{after}} AND {condition} ORDER BY id LIMIT {{limit}}"
    );
    values.push(("after", Value::Int(after)));
    values.push(("limit", Value::Int(i64::from(limit))));
    render::<V>(&template, &values)
}

/// The row ids `filter` names, at most `upto` (the messages kept when an
/// operation began), in the order they arrived.
pub(crate) async fn ids<S: OwnTables>(
    store: &S,
    filter: &ParkedFilter,
    upto: i64,
) -> Result<Vec<i64>, StoreError> {
    let rows: Vec<(i64,)> = store.fetch(ids_statement::<S::Words>(filter, upto)).await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// The statement of [`ids`].
fn ids_statement<V: Vocabulary>(filter: &ParkedFilter, upto: i64) -> Statement<'_> {
    let (condition, mut values) = filter_sql(filter);
    let template = format!(
        "SELECT id FROM order_timeout_parked WHERE id <= {{upto}} AND {condition} ORDER BY id"
    );
    values.push(("upto", Value::Int(upto)));
    render::<V>(&template, &values)
}

/// The highest row id kept now (0: none).
pub(crate) async fn last_id<S: OwnTables>(store: &S) -> Result<i64, StoreError> {
    let rows: Vec<(Option<i64>,)> = store
        .fetch(render::<S::Words>(
            "SELECT max(id) FROM order_timeout_parked",
            &[],
        ))
        .await?;
    Ok(rows.first().and_then(|(id,)| *id).unwrap_or(0))
}

/// How many messages are kept, by reason (`None`: none recorded).
pub(crate) async fn counts<S: OwnTables>(
    store: &S,
) -> Result<Vec<(Option<String>, u64)>, StoreError> {
    let rows: Vec<(Option<String>, i64)> = store.fetch(render::<S::Words>(COUNTS, &[])).await?;
    Ok(rows
        .into_iter()
        .map(|(kind, n)| (kind, u64::try_from(n).unwrap_or(0)))
        .collect())
}

/// Deletes the messages with these row ids; how many it deleted.
pub(crate) async fn delete<S: OwnTables>(store: &S, ids: &[i64]) -> Result<u64, StoreError> {
    let mut deleted = 0;
    // MySQL binds one placeholder per id: keep statements short.
    for chunk in ids.chunks(500) {
        let statement = render::<S::Words>(
            "DELETE FROM order_timeout_parked WHERE id {ids}",
            &[("ids", Value::Nums(chunk))],
        );
        deleted += store.execute(statement).await?;
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mysql::MySql;
    use crate::store::postgres::Postgres;

    #[test]
    fn every_statement_with_every_filter_fills_its_slots_on_both_dialects() {
        let filters = [
            ParkedFilter::All,
            ParkedFilter::OrderId("o".into()),
            ParkedFilter::Timer("t".into()),
            ParkedFilter::Reason("r".into()),
            ParkedFilter::ParkedBefore(DateTime::UNIX_EPOCH),
            ParkedFilter::Ids(vec![]),
            ParkedFilter::Ids(vec![1, 2]),
        ];
        let message = NewParked {
            key: "k",
            parked_at: DateTime::UNIX_EPOCH,
            order_id: None,
            timer: Some("t"),
            error_kind: None,
            properties: "{}",
            body: b"x",
        };
        for filter in &filters {
            for excerpt in [None, Some(10)] {
                let pg = page_statement::<Postgres>(filter, 0, 5, excerpt);
                let my = page_statement::<MySql>(filter, 0, 5, excerpt);
                let ids_pg = ids_statement::<Postgres>(filter, 9);
                let ids_my = ids_statement::<MySql>(filter, 9);
                for sql in [&pg.sql, &my.sql, &ids_pg.sql, &ids_my.sql] {
                    assert!(!sql.contains('{') && !sql.contains('}'), "{sql}");
                }
            }
        }
        for sql in [
            add_statement::<Postgres>(&message).sql,
            add_statement::<MySql>(&message).sql,
            render::<Postgres>(COUNTS, &[]).sql,
        ] {
            assert!(!sql.contains('{') && !sql.contains('}'), "{sql}");
        }
        let three = ParkedFilter::Ids(vec![3]);
        let pg = page_statement::<Postgres>(&three, 2, 5, Some(7));
        assert!(
            pg.sql.contains("SUBSTRING(body FROM 1 FOR 7) AS body"),
            "{}",
            pg.sql
        );
        assert!(
            pg.sql.contains("WHERE id > $1 AND id = ANY($2)"),
            "{}",
            pg.sql
        );
    }
}
