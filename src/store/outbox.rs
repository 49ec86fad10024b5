//! **The SQL of the service's own tables**, written once for both dialects:
//! the cancel outbox (`order_timeout_cancel_outbox`: the sweep of rows whose
//! release or event is still due, failed attempts and their backoff, marks
//! of work done, leases, retention) and the watch marks
//! (`order_timeout_watch`). The cancel transaction that writes outbox rows
//! is in `cancel.rs`, written the same way.
//!
//! Each statement is a template in plain SQL with `{slots}`. A slot is
//! either a word of the dialect's [`Vocabulary`] (`{now}`, the pending rows
//! by the index each dialect has, `{order_key}`) or a value, which becomes a placeholder
//! where it stands and is bound in that order ([`render`]), so no template
//! can bind a value in the wrong place: an id list becomes `= ANY($n)` (one
//! array) on PostgreSQL and `IN (?, …)` on MySQL, a duration an interval.
//! A store runs a rendered [`Statement`] with its dialect's driver
//! ([`OwnTables`]).

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::ids::IdValue;
use super::{Dialect, NextAttempt, StoreError, WatchMark};
use crate::settings::StatusValue;

/// `[(name, template), …]` for the named template constants.
macro_rules! templates {
    ($($name:ident),* $(,)?) => {
        [$((stringify!($name), $name)),*]
    };
}

/// The words in which the dialects differ, for the templates here.
pub(crate) trait Vocabulary {
    /// The dialect.
    const DIALECT: Dialect;
    /// The database's clock as a UTC instant: `now()`, `UTC_TIMESTAMP(6)`.
    const NOW: &'static str;
    /// The database's clock as a UTC instant when the statement runs,
    /// not when its transaction began: `clock_timestamp()`,
    /// `UTC_TIMESTAMP(6)`.
    const CLOCK: &'static str;
    /// The outbox's order id read as text.
    const ORDER_ID: &'static str;
    /// The outbox rows whose work is pending and due now, by the index of
    /// pending rows the dialect's migrations built (PostgreSQL: a partial
    /// index whose predicate this repeats; MySQL: a generated column).
    const SWEEP_DUE: &'static str;
    /// What that index orders the pending rows by: when they are due.
    const SWEEP_AT: &'static str;
    /// The outbox's order id in byte order (the history's order, which
    /// the console merges across timers as Rust compares strings).
    const ORDER_KEY: &'static str;
    /// After an `INSERT`: leave a row with the same key as it is (`column`
    /// is a column of the key, which MySQL's no-op update names).
    fn keep_existing(column: &str) -> String;
    /// The `n`th placeholder (from 1).
    fn placeholder(n: usize) -> String;
    /// The `n`th placeholder as microseconds of an interval.
    fn micros(n: usize) -> String;
    /// `= ANY(…)` or `IN (…)` for an id list whose placeholders start at
    /// `first` and run for `len` ids.
    fn in_ids(first: usize, len: usize) -> String;
    /// How many placeholders an id list of `len` ids takes.
    fn id_placeholders(len: usize) -> usize;
    /// The `n`th placeholder as a value of the column type `ty` (bound as
    /// text and cast on PostgreSQL; in its own type on MySQL).
    fn cast(n: usize, ty: &str) -> String;
    /// [`Vocabulary::in_ids`] for ids of the column type `ty`.
    fn in_cast_ids(first: usize, len: usize, ty: &str) -> String;
    /// The `n`th placeholder as a UTC instant in the session's zone, where
    /// it is compared with the shop's deadlines.
    fn shop_time(n: usize) -> String;

    /// The shop's clock, in the session's zone its deadlines are written
    /// in: `now()`, `NOW(6)`. `shifts`: the zone changes its offset during
    /// the year, so a wall-clock time can be ambiguous (the hour repeated
    /// in autumn) or skipped (in spring): then a time no zone-less deadline
    /// at or before it is due before its later instant (`zones`).
    fn shop_now(shifts: bool) -> String;
    /// `expr` as text.
    fn text(expr: &str) -> String;
    /// `expr` as a 64-bit integer.
    fn int8(expr: &str) -> String;
    /// How many rows `condition` holds for, as a 64-bit integer.
    fn count_if(condition: &str) -> String;
    /// The deadline `deadline` (in the session's zone) as UTC microseconds
    /// since the epoch, NULL unless `usable`: never a value the driver
    /// cannot represent. `shifts` as for [`Vocabulary::shop_now`]: then the
    /// instant the deadline is due by [`Vocabulary::shop_now`].
    fn epoch_micros(deadline: &str, usable: &str, shifts: bool) -> String;
    /// A digest of the whole row `o` (whose columns are `columns`): what
    /// tells a row set aside from the same row changed since.
    fn row_digest(columns: &[String]) -> String;

    /// The rows of an insert into the outbox, `len` of them for the timer
    /// `timer` (its name, quoted), whose placeholders start at `first`;
    /// and how many placeholders they take: a `VALUES` list of four a row.
    fn outbox_rows(timer: &str, first: usize, len: usize) -> (String, usize) {
        let row = |i: usize| {
            let p = |k: usize| Self::placeholder(first + 4 * i + k);
            format!("('{timer}', {}, {}, {}, {})", p(0), p(1), p(2), p(3))
        };
        let list: Vec<String> = (0..len).map(row).collect();
        (format!("VALUES {}", list.join(", ")), 4 * len)
    }

    /// How many order ids one cancel transaction can carry: a statement
    /// has at most 65,535 placeholders, and [`Vocabulary::outbox_rows`]
    /// takes four per order (16,383 ids).
    const MAX_BATCH_IDS: usize = 65_535 / 4;
}

/// A row of the service's own tables, as either dialect decodes it.
pub(crate) trait OwnRow:
    for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
    + for<'r> sqlx::FromRow<'r, sqlx::mysql::MySqlRow>
    + Send
    + Unpin
{
}

impl<T> OwnRow for T where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
        + for<'r> sqlx::FromRow<'r, sqlx::mysql::MySqlRow>
        + Send
        + Unpin
{
}

/// A store of one timer, as the statements here need it: its dialect's
/// words, its timer's name (every statement is scoped by it), and a driver
/// that runs a rendered statement.
pub(crate) trait OwnTables: Send + Sync {
    /// The dialect's words.
    type Words: Vocabulary;
    /// The timer's name.
    fn timer_name(&self) -> &str;
    /// Runs a statement; the rows it changed.
    fn execute(
        &self,
        statement: Statement<'_>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// Runs a query; its rows.
    fn fetch<T: OwnRow>(
        &self,
        statement: Statement<'_>,
    ) -> impl Future<Output = Result<Vec<T>, StoreError>> + Send;
}

/// A value a template binds.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Value<'a> {
    /// Text (the timer, an error, a holder).
    Text(&'a str),
    /// A number (a limit).
    Int(i64),
    /// An instant.
    Time(DateTime<Utc>),
    /// A duration, as microseconds of an interval.
    Micros(i64),
    /// Order ids: one array, or one placeholder each.
    Ids(&'a [&'a str]),
    /// Text or NULL.
    MaybeText(Option<&'a str>),
    /// Bytes (a parked body).
    Bytes(&'a [u8]),
    /// Row ids of the service's own tables: one array, or one placeholder
    /// each.
    Nums(&'a [i64]),
    /// A status code of the shop's, in the status column's type.
    Status(&'a StatusValue),
    /// A status code or NULL (a timer without a `paid` code).
    MaybeStatus(Option<&'a StatusValue>),
    /// An order id in the id column's type, or NULL.
    RowId(Option<&'a IdValue>),
    /// Order ids in the id column's type: one array, or one placeholder
    /// each.
    RowIds(&'a [IdValue]),
    /// Order ids in the items table's order id column's type.
    ItemIds(&'a [IdValue]),
    /// An instant (or NULL) compared with the shop's deadlines, which are
    /// written in the session's zone.
    ShopTime(Option<DateTime<Utc>>),
    /// New outbox rows of a timer (its name, written in: `[a-z0-9_]`)
    /// ([`Vocabulary::outbox_rows`]).
    NewOutboxRows(&'a str, &'a [NewOutboxRow<'a>]),
}

/// An outbox row the cancel transaction writes for an order it flipped.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NewOutboxRow<'a> {
    /// The order id.
    pub(crate) order_id: &'a str,
    /// When it was cancelled.
    pub(crate) created_at: DateTime<Utc>,
    /// The end of the lease the cancelling caller holds.
    pub(crate) claimed_until: DateTime<Utc>,
    /// When its stock was released: at once when there is none to release.
    pub(crate) stock_released_at: Option<DateTime<Utc>>,
}

/// A rendered statement: its text in the dialect's words and the values
/// of its placeholders, in order.
#[derive(Debug)]
pub(crate) struct Statement<'a> {
    /// The statement.
    pub(crate) sql: String,
    /// Its values, one per value slot, in the order they appear.
    pub(crate) values: Vec<Value<'a>>,
    /// How many placeholders its text has (an id list may take one per
    /// id): what the schema check expects the server to count.
    pub(crate) placeholders: usize,
}

/// The words of one timer's mapping a template on the shop's tables
/// (`shop.rs`) is written with (`{table}`, `{row_id}`, `{deadline}`, …),
/// rendered in its dialect once the check read the tables, and the column
/// types PostgreSQL casts the bound ids and codes to.
#[derive(Clone, Debug, Default)]
pub(crate) struct Mapped {
    /// Each word and its SQL.
    pub(crate) words: Vec<(&'static str, String)>,
    /// The status column's type.
    pub(crate) status_type: String,
    /// The id column's type without length or precision.
    pub(crate) id_base: String,
    /// The items table's order id column's, likewise.
    pub(crate) items_id_base: String,
}

/// Fills `template`'s slots: dialect words as they are, values (looked up
/// by name in `values`) as placeholders. A slot that is neither is left as
/// it stands, which the unit tests below rule out for every template.
pub(crate) fn render<'a, V: Vocabulary>(
    template: &str,
    values: &[(&str, Value<'a>)],
) -> Statement<'a> {
    render_mapped::<V>(template, &Mapped::default(), values)
}

/// [`render`] with the words of a timer's mapping too (the templates on
/// the shop's tables).
pub(crate) fn render_mapped<'a, V: Vocabulary>(
    template: &str,
    mapped: &Mapped,
    values: &[(&str, Value<'a>)],
) -> Statement<'a> {
    let mut sql = String::with_capacity(template.len() + 32);
    let mut bound = Vec::new();
    let mut next = 1;
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        sql.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let slot = &rest[open + 1..open + close];
        rest = &rest[open + close + 1..];
        let word = match slot {
            "now" => Some(V::NOW),
            "clock" => Some(V::CLOCK),
            "order_id" => Some(V::ORDER_ID),
            "sweep_due" => Some(V::SWEEP_DUE),
            "sweep_at" => Some(V::SWEEP_AT),
            "order_key" => Some(V::ORDER_KEY),
            _ => None,
        };
        if let Some(word) = word {
            sql.push_str(word);
            continue;
        }
        if let Some(column) = slot.strip_prefix("keep_existing:") {
            sql.push_str(&V::keep_existing(column));
            continue;
        }
        if let Some((_, word)) = mapped.words.iter().find(|(name, _)| *name == slot) {
            sql.push_str(word);
            continue;
        }
        let Some(&(_, value)) = values.iter().find(|(name, _)| *name == slot) else {
            sql.push('{');
            sql.push_str(slot);
            sql.push('}');
            continue;
        };
        let (text, taken) = placeholders::<V>(&value, next, mapped);
        sql.push_str(&text);
        next += taken;
        bound.push(value);
    }
    sql.push_str(rest);
    Statement {
        sql,
        values: bound,
        placeholders: next - 1,
    }
}

/// Where `value` stands, its placeholders from the `next`th, and how many
/// they are.
fn placeholders<V: Vocabulary>(value: &Value<'_>, next: usize, mapped: &Mapped) -> (String, usize) {
    match value {
        Value::Ids(ids) => (V::in_ids(next, ids.len()), V::id_placeholders(ids.len())),
        Value::Nums(nums) => (V::in_ids(next, nums.len()), V::id_placeholders(nums.len())),
        Value::RowIds(ids) => (
            V::in_cast_ids(next, ids.len(), &mapped.id_base),
            V::id_placeholders(ids.len()),
        ),
        Value::ItemIds(ids) => (
            V::in_cast_ids(next, ids.len(), &mapped.items_id_base),
            V::id_placeholders(ids.len()),
        ),
        Value::Status(_) | Value::MaybeStatus(_) => (V::cast(next, &mapped.status_type), 1),
        Value::RowId(_) => (V::cast(next, &mapped.id_base), 1),
        Value::ShopTime(_) => (V::shop_time(next), 1),
        Value::NewOutboxRows(timer, rows) => {
            V::outbox_rows(&timer.replace('\'', "''"), next, rows.len())
        }
        Value::Micros(_) => (V::micros(next), 1),
        Value::Text(_) | Value::Int(_) | Value::Time(_) | Value::MaybeText(_) | Value::Bytes(_) => {
            (V::placeholder(next), 1)
        }
    }
}

/// Every value `template` names, for the tests that render and prepare
/// every template: `{ids}` as the template's kind of id list (`ids` of the
/// service's own tables, `row_ids` of the shop's), `code` a status code:
/// what the schema check renders the statements it prepares with.
pub(super) fn sample_values<'a>(
    template: &str,
    ids: &'a [&'a str],
    row_ids: &'a [IdValue],
    code: &'a StatusValue,
) -> Vec<(&'static str, Value<'a>)> {
    let epoch = DateTime::UNIX_EPOCH;
    let shop = template.contains("{table}") || template.contains("{items_table}");
    let id_list = if template.contains("{item_order_id}") {
        Value::ItemIds(row_ids)
    } else if template.contains("{row_id}") {
        Value::RowIds(row_ids)
    } else {
        Value::Ids(ids)
    };
    let after_id = if shop {
        Value::RowId(row_ids.first())
    } else {
        Value::Text("a")
    };
    let until = if shop {
        Value::ShopTime(Some(epoch))
    } else {
        Value::Time(epoch)
    };
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
        ("session", Value::Text("s")),
        ("at", Value::Time(epoch)),
        ("until", until),
        ("after_id", after_id),
        ("after", Value::Text("a")),
        ("ids", id_list),
        ("from", Value::Status(code)),
        ("to", Value::Status(code)),
        ("paid", Value::MaybeStatus(None)),
        ("after_at", Value::ShopTime(None)),
        ("digest", Value::Text("d")),
        ("hourly", Value::Int(24)),
        ("hour", Value::Micros(3_600_000_000)),
        ("day", Value::Micros(86_400_000_000)),
        ("id", Value::Text("7")),
        ("slots", Value::Nums(&[1, 2])),
        ("rows", Value::NewOutboxRows("cancel_unpaid", &SAMPLE_ROWS)),
    ]
}

/// The new outbox rows of [`sample_values`].
static SAMPLE_ROWS: [NewOutboxRow<'static>; 1] = [NewOutboxRow {
    order_id: "7",
    created_at: DateTime::UNIX_EPOCH,
    claimed_until: DateTime::UNIX_EPOCH,
    stock_released_at: None,
}];

/// A duration in whole microseconds (saturating), for [`Value::Micros`].
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A count or limit as a bound number.
fn int(n: u32) -> Value<'static> {
    Value::Int(i64::from(n))
}

/// The sweep's scan: rows with work pending past `grace`, no live lease,
/// due now, the longest due first (a range of the pending rows' index).
const STALE: &str = "\
SELECT {order_id} FROM order_timeout_cancel_outbox \
 WHERE timer = {timer} AND {sweep_due} \
   AND created_at < {now} - {grace} \
   AND (claimed_until IS NULL OR claimed_until <= {now}) \
 ORDER BY {sweep_at} LIMIT {limit}";

/// A failed attempt at the rows `ids`, which failed with `error`.
const COUNT_FAILURE: &str = "\
UPDATE order_timeout_cancel_outbox SET attempts = attempts + 1, last_error = {error} \
 WHERE timer = {timer} AND order_id {ids}";

/// The attempts so far of the rows `ids`.
const ATTEMPTS: &str = "\
SELECT {order_id}, attempts FROM order_timeout_cancel_outbox \
 WHERE timer = {timer} AND order_id {ids}";

/// The rows `ids` are tried again after `delay`.
const RETRY_AFTER: &str = "\
UPDATE order_timeout_cancel_outbox \
   SET next_attempt_at = {now} + {delay}, gave_up_at = NULL, gave_up_reason = NULL \
 WHERE timer = {timer} AND order_id {ids}";

/// The rows `ids` are given up with `reason`.
const GIVE_UP: &str = "\
UPDATE order_timeout_cancel_outbox \
   SET next_attempt_at = NULL, gave_up_at = {now}, gave_up_reason = {reason} \
 WHERE timer = {timer} AND order_id {ids}";

/// Retention on PostgreSQL: a range of the partial index of finished rows
/// (`order_timeout_cancel_outbox_finished`); rows another session is
/// deleting are skipped, not waited for. `= ANY(ARRAY(…))` rather than
/// `IN (…)`: the planner then deletes through the primary key instead of
/// hashing the ids against a scan of the whole table (measured on 205,100
/// rows: 5 ms instead of 30 ms per 1,000 deleted). PostgreSQL has no
/// `DELETE … LIMIT`.
const DELETE_FINISHED_POSTGRES: &str = "\
DELETE FROM order_timeout_cancel_outbox \
 WHERE timer = {timer} \
   AND order_id = ANY(ARRAY( \
       SELECT order_id FROM order_timeout_cancel_outbox \
        WHERE timer = {timer} \
          AND stock_released_at IS NOT NULL AND event_published_at IS NOT NULL \
          AND created_at < {now} - {age} \
        ORDER BY created_at LIMIT {limit} \
          FOR UPDATE SKIP LOCKED))";

/// Retention on MySQL: a range of the `(timer, pending, created_at)`
/// index, oldest first. MySQL has no `LIMIT` in an `IN` subquery.
const DELETE_FINISHED_MYSQL: &str = "\
DELETE FROM order_timeout_cancel_outbox \
 WHERE timer = {timer} AND pending = 0 AND created_at < {now} - {age} \
 ORDER BY created_at LIMIT {limit}";

/// Gives back the leases of the rows `ids`.
pub(super) const RELEASE_LEASES: &str = "\
UPDATE order_timeout_cancel_outbox SET claimed_until = NULL \
 WHERE timer = {timer} AND order_id {ids}";

/// Keeps the leases of `ids` that are still held (their work is in
/// progress) for another `lease` from now: a release or a statement that
/// takes longer than the lease never lets another worker take the work
/// over while it runs.
pub(super) const RENEW_LEASES: &str = "\
UPDATE order_timeout_cancel_outbox SET claimed_until = {now} + {lease} \
 WHERE timer = {timer} AND order_id {ids} AND claimed_until IS NOT NULL";

/// Stock released and event published: both marks in one statement, so a
/// row never has one without the other from the same batch. A released
/// row (a replay finished it) is given up no more.
const MARK_BOTH: &str = "\
UPDATE order_timeout_cancel_outbox \
   SET stock_released_at = coalesce(stock_released_at, {now}), \
       event_published_at = coalesce(event_published_at, {now}), \
       gave_up_at = NULL, gave_up_reason = NULL \
 WHERE timer = {timer} AND order_id {ids}";

/// Stock released (the event still to publish).
const MARK_RELEASED: &str = "\
UPDATE order_timeout_cancel_outbox \
   SET stock_released_at = coalesce(stock_released_at, {now}), \
       gave_up_at = NULL, gave_up_reason = NULL \
 WHERE timer = {timer} AND order_id {ids}";

/// Event published (the stock still to release).
const MARK_PUBLISHED: &str = "\
UPDATE order_timeout_cancel_outbox \
   SET event_published_at = coalesce(event_published_at, {now}) \
 WHERE timer = {timer} AND order_id {ids}";

/// The timer's watch row, created at the database's clock the first time.
const WATCH_CREATE: &str = "\
INSERT INTO order_timeout_watch (timer, scanned_until) VALUES ({timer}, {now}) {keep_existing:timer}";

/// The watch's lease, taken if it is free, ran out, or is the holder's.
pub(super) const WATCH_TAKE: &str = "\
UPDATE order_timeout_watch SET holder = {holder}, lease_until = {now} + {lease} \
 WHERE timer = {timer} \
   AND (holder = {holder} OR lease_until IS NULL OR lease_until <= {now})";

/// Where the holder's watch stands, and the database's clock.
const WATCH_READ: &str = "\
SELECT scanned_until, {now} FROM order_timeout_watch WHERE timer = {timer} AND holder = {holder}";

/// Moves the holder's watch on to `until` (never back).
const WATCH_ADVANCE: &str = "\
UPDATE order_timeout_watch SET scanned_until = greatest(scanned_until, {until}) \
 WHERE timer = {timer} AND holder = {holder}";

/// Gives the holder's watch lease back.
const WATCH_RELEASE: &str = "\
UPDATE order_timeout_watch SET lease_until = NULL WHERE timer = {timer} AND holder = {holder}";

/// The rows set aside, the oldest first.
const SET_ASIDE_ROWS: &str = "\
SELECT {order_id} AS order_id, reason, set_aside_at, attempts, retry_at \
  FROM order_timeout_set_aside WHERE timer = {timer} \
 ORDER BY set_aside_at, order_id LIMIT {limit}";

/// One order's set-aside mark.
const SET_ASIDE_OF: &str = "\
SELECT {order_id} AS order_id, reason, set_aside_at, attempts, retry_at \
  FROM order_timeout_set_aside WHERE timer = {timer} AND order_id {ids}";

/// What the outbox records of one order.
const OUTBOX_FACTS: &str = "\
SELECT created_at, stock_released_at, event_published_at, attempts, last_error, \
       next_attempt_at, gave_up_at \
  FROM order_timeout_cancel_outbox WHERE timer = {timer} AND order_id {ids}";

/// A history statement: what the history shows of this timer's outbox
/// rows (the console's history page) that `$where` also admits, newest
/// first, at most `{limit}`. Every one is a backward range of the index
/// `(timer, created_at, order_id)` (`order_timeout_cancel_outbox_history`),
/// read for `limit` rows and no more, however many rows the table holds.
macro_rules! history {
    ($where:literal) => {
        concat!(
            "SELECT {order_id} AS order_id, created_at, stock_released_at, event_published_at, \
                    attempts, last_error, next_attempt_at, gave_up_at \
               FROM order_timeout_cancel_outbox WHERE timer = {timer}",
            $where,
            " ORDER BY created_at DESC, {order_key} DESC LIMIT {limit}"
        )
    };
}

/// The history's newest rows.
const HISTORY_NEWEST: &str = history!("");

/// The rows cancelled before `at` (the next page, for a timer that sorts
/// after the last row's).
const HISTORY_BEFORE: &str = history!(" AND created_at < {at}");

/// The rows cancelled at `at` or before (the next page, for a timer that
/// sorts before the last row's).
const HISTORY_AT_OR_BEFORE: &str = history!(" AND created_at <= {at}");

/// The rows after the row (`at`, `after_id`) in the history's order (the
/// next page, for the last row's own timer), on PostgreSQL: a row
/// comparison, which its B-tree reads as one range (the `OR` form below
/// would be a filter over every newer row).
const HISTORY_AFTER_ROW_POSTGRES: &str =
    history!(" AND (created_at, {order_key}) < ({at}, {after_id})");

/// The same on MySQL, whose range optimizer makes two ranges of the index
/// of this `OR` (and none of a row comparison with `<`).
const HISTORY_AFTER_ROW_MYSQL: &str =
    history!(" AND (created_at < {at} OR (created_at = {at} AND {order_key} < {after_id}))");

/// How many rows are set aside.
const SET_ASIDE_COUNT: &str = "SELECT count(*) FROM order_timeout_set_aside WHERE timer = {timer}";

/// The next sweep tries every row set aside again.
const RETRY_SET_ASIDE_ALL: &str = "\
UPDATE order_timeout_set_aside SET retry_at = {now} WHERE timer = {timer} AND retry_at > {now}";

/// The next sweep tries the rows set aside `ids` again.
const RETRY_SET_ASIDE: &str = "\
UPDATE order_timeout_set_aside SET retry_at = {now} \
 WHERE timer = {timer} AND order_id {ids} AND retry_at > {now}";

/// Forgets the marks of the rows `ids`.
const FORGET_SET_ASIDE: &str = "\
DELETE FROM order_timeout_set_aside WHERE timer = {timer} AND order_id {ids}";

/// A replica of this release seen now (its row made by [`REPLICA_ADD`]
/// the first time).
const REPLICA_TOUCH: &str = "\
UPDATE order_timeout_replicas SET version = {version}, seen_at = {now} WHERE instance = {instance}";

/// A replica's row, the first time it records itself.
const REPLICA_ADD: &str = "\
INSERT INTO order_timeout_replicas (instance, version, seen_at) \
VALUES ({instance}, {version}, {now}) {keep_existing:instance}";

/// A replica that stopped.
const REPLICA_FORGET: &str = "DELETE FROM order_timeout_replicas WHERE instance = {instance}";

/// The replicas seen within `age`, with their release.
const REPLICAS_LIVE: &str = "\
SELECT instance, version FROM order_timeout_replicas WHERE seen_at > {now} - {age}";

/// A console session logged out (by the MAC of its cookie), refused by
/// every replica until it would have expired.
const LOGOUT_ADD: &str = "\
INSERT INTO order_timeout_logouts (session_mac, expires_at) \
VALUES ({session}, {until}) {keep_existing:session_mac}";

/// Logouts whose sessions have expired anyway: nothing to refuse any more.
const LOGOUTS_FORGET: &str = "DELETE FROM order_timeout_logouts WHERE expires_at <= {now}";

/// The logouts whose sessions have not expired yet.
const LOGOUTS_LIVE: &str = "\
SELECT session_mac, expires_at FROM order_timeout_logouts WHERE expires_at > {now}";

/// Locks the slots of an order's `also_keys` ([`also_lock_slots`]), in
/// ascending order, in its cancel transaction before its `also`
/// statements run (migration `20261205000001`): PostgreSQL locks the rows
/// as the `ORDER BY` emits them, InnoDB as it reads the primary key's
/// range, which is in order.
pub(crate) const ALSO_LOCKS: &str = "\
SELECT slot FROM order_timeout_also_locks WHERE slot {slots} ORDER BY slot FOR UPDATE";

/// How many rows `order_timeout_also_locks` has.
const ALSO_LOCK_SLOTS: u64 = 4_096;

/// The slots of `order_timeout_also_locks` that stand for `keys` (what an
/// order's `also_keys` query returned), each once, in ascending order: the
/// one order in which every cancel transaction takes them. A slot is a
/// hash of the key's text (FNV-1a), the same in every replica and release.
pub(crate) fn also_lock_slots<S: AsRef<str>>(keys: &[S]) -> Vec<i64> {
    let slot = |key: &str| {
        let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        i64::try_from(hash % ALSO_LOCK_SLOTS).unwrap_or(0)
    };
    let slots: std::collections::BTreeSet<i64> = keys.iter().map(|k| slot(k.as_ref())).collect();
    slots.into_iter().collect()
}

/// The timer's name, the value every statement here is scoped by.
fn timer<S: OwnTables>(store: &S) -> Value<'_> {
    Value::Text(store.timer_name())
}

/// Ids of outbox rows with work pending after `grace` and no live lease,
/// oldest due first.
pub(crate) async fn stale<S: OwnTables>(
    store: &S,
    grace: Duration,
    limit: u32,
) -> Result<Vec<String>, StoreError> {
    let statement = render::<S::Words>(
        STALE,
        &[
            ("timer", timer(store)),
            ("grace", Value::Micros(micros(grace))),
            ("limit", int(limit)),
        ],
    );
    let rows: Vec<(String,)> = store.fetch(statement).await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// Counts a failed attempt (`attempts` + 1, `last_error`) for each
/// `(id, error)`, one statement per distinct error (a batch that failed
/// together usually shares one), and returns the rows' attempts so far.
pub(crate) async fn count_failures<S: OwnTables>(
    store: &S,
    failures: &[(&str, &str)],
) -> Result<Vec<(String, i32)>, StoreError> {
    for (error, ids) in grouped(failures.iter().map(|(id, error)| (*error, *id))) {
        let statement = render::<S::Words>(
            COUNT_FAILURE,
            &[
                ("error", Value::Text(error)),
                ("timer", timer(store)),
                ("ids", Value::Ids(&ids)),
            ],
        );
        store.execute(statement).await?;
    }
    let ids: Vec<&str> = failures.iter().map(|(id, _)| *id).collect();
    let statement = render::<S::Words>(
        ATTEMPTS,
        &[("timer", timer(store)), ("ids", Value::Ids(&ids))],
    );
    store.fetch(statement).await
}

/// Plans each row's next attempt: `next_attempt_at` after the delay, or
/// given up with the reason; one statement per distinct plan.
pub(crate) async fn plan_attempts<S: OwnTables>(
    store: &S,
    plans: &[(&str, &NextAttempt)],
) -> Result<(), StoreError> {
    for (plan, ids) in grouped(plans.iter().map(|(id, plan)| (*plan, *id))) {
        let (template, value) = match plan {
            NextAttempt::After(delay) => (RETRY_AFTER, ("delay", Value::Micros(micros(*delay)))),
            NextAttempt::GiveUp(reason) => (GIVE_UP, ("reason", Value::Text(reason))),
        };
        let statement = render::<S::Words>(
            template,
            &[value, ("timer", timer(store)), ("ids", Value::Ids(&ids))],
        );
        store.execute(statement).await?;
    }
    Ok(())
}

/// Deletes at most `limit` finished rows created more than `older_than`
/// ago, oldest first.
pub(crate) async fn delete_finished<S: OwnTables>(
    store: &S,
    older_than: Duration,
    limit: u32,
) -> Result<u64, StoreError> {
    let template = match S::Words::DIALECT {
        Dialect::Postgres => DELETE_FINISHED_POSTGRES,
        Dialect::MySql => DELETE_FINISHED_MYSQL,
    };
    let statement = render::<S::Words>(
        template,
        &[
            ("timer", timer(store)),
            ("age", Value::Micros(micros(older_than))),
            ("limit", int(limit)),
        ],
    );
    store.execute(statement).await
}

/// Clears the leases of the outbox rows `ids`.
pub(crate) async fn release_leases<S: OwnTables>(
    store: &S,
    ids: &[&str],
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let statement = render::<S::Words>(
        RELEASE_LEASES,
        &[("timer", timer(store)), ("ids", Value::Ids(ids))],
    );
    store.execute(statement).await.map(drop)
}

/// Keeps the leases of `ids` for another `lease` ([`RENEW_LEASES`]).
pub(crate) async fn renew_leases<S: OwnTables>(
    store: &S,
    ids: &[&str],
    lease: Duration,
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let statement = render::<S::Words>(
        RENEW_LEASES,
        &[
            ("timer", timer(store)),
            ("ids", Value::Ids(ids)),
            ("lease", Value::Micros(micros(lease))),
        ],
    );
    store.execute(statement).await.map(drop)
}

/// Marks outbox work done: each row's marks in one statement (the rows
/// with both, with only the release, with only the event).
pub(crate) async fn mark_done<S: OwnTables>(
    store: &S,
    released: &[&str],
    published: &[&str],
) -> Result<(), StoreError> {
    // Sets: a batch's lists hold hundreds of ids, on the hot path.
    let was_released: HashSet<&str> = released.iter().copied().collect();
    let was_published: HashSet<&str> = published.iter().copied().collect();
    let (both, only_released): (Vec<&str>, Vec<&str>) =
        released.iter().partition(|id| was_published.contains(*id));
    let only_published: Vec<&str> = published
        .iter()
        .copied()
        .filter(|id| !was_released.contains(id))
        .collect();
    for (template, ids) in [
        (MARK_BOTH, &both),
        (MARK_RELEASED, &only_released),
        (MARK_PUBLISHED, &only_published),
    ] {
        if ids.is_empty() {
            continue;
        }
        let statement = render::<S::Words>(
            template,
            &[("timer", timer(store)), ("ids", Value::Ids(ids))],
        );
        store.execute(statement).await?;
    }
    Ok(())
}

/// Takes the timer's watch lease for `holder` (creating the timer's row
/// at the database's clock the first time) if it is free, ran out, or is
/// the holder's; where the watch stands, or `None` when another holds it.
pub(crate) async fn watch_lease<S: OwnTables>(
    store: &S,
    holder: &str,
    lease: Duration,
) -> Result<Option<WatchMark>, StoreError> {
    store
        .execute(render::<S::Words>(WATCH_CREATE, &[("timer", timer(store))]))
        .await?;
    let take = render::<S::Words>(
        WATCH_TAKE,
        &[
            ("holder", Value::Text(holder)),
            ("lease", Value::Micros(micros(lease))),
            ("timer", timer(store)),
        ],
    );
    store.execute(take).await?;
    let read = render::<S::Words>(
        WATCH_READ,
        &[("timer", timer(store)), ("holder", Value::Text(holder))],
    );
    let rows: Vec<(DateTime<Utc>, DateTime<Utc>)> = store.fetch(read).await?;
    Ok(rows
        .into_iter()
        .next()
        .map(|(scanned_until, db_now)| WatchMark {
            scanned_until,
            db_now,
        }))
}

/// Moves the holder's watch on to `until`; `false`: the holder no longer
/// holds it.
pub(crate) async fn watch_advance<S: OwnTables>(
    store: &S,
    holder: &str,
    until: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let statement = render::<S::Words>(
        WATCH_ADVANCE,
        &[
            ("until", Value::Time(until)),
            ("timer", timer(store)),
            ("holder", Value::Text(holder)),
        ],
    );
    Ok(store.execute(statement).await? == 1)
}

/// Gives the holder's watch lease back.
pub(crate) async fn watch_release<S: OwnTables>(store: &S, holder: &str) -> Result<(), StoreError> {
    let statement = render::<S::Words>(
        WATCH_RELEASE,
        &[("timer", timer(store)), ("holder", Value::Text(holder))],
    );
    store.execute(statement).await.map(drop)
}

/// The rows set aside, the oldest first, at most `limit`.
pub(crate) async fn set_aside_rows<S: OwnTables>(
    store: &S,
    limit: u32,
) -> Result<Vec<super::SetAsideRow>, StoreError> {
    let statement = render::<S::Words>(
        SET_ASIDE_ROWS,
        &[("timer", timer(store)), ("limit", int(limit))],
    );
    store.fetch(statement).await
}

/// The set-aside mark of the order `id`, if it has one.
pub(crate) async fn set_aside_of<S: OwnTables>(
    store: &S,
    id: &str,
) -> Result<Option<super::SetAsideRow>, StoreError> {
    let ids = [id];
    let statement = render::<S::Words>(
        SET_ASIDE_OF,
        &[("timer", timer(store)), ("ids", Value::Ids(&ids))],
    );
    Ok(store.fetch(statement).await?.into_iter().next())
}

/// What the outbox records of the order `id`, if this timer flipped it.
pub(crate) async fn outbox_facts<S: OwnTables>(
    store: &S,
    id: &str,
) -> Result<Option<super::OutboxFacts>, StoreError> {
    let ids = [id];
    let statement = render::<S::Words>(
        OUTBOX_FACTS,
        &[("timer", timer(store)), ("ids", Value::Ids(&ids))],
    );
    Ok(store.fetch(statement).await?.into_iter().next())
}

/// The dialect's statement of the rows after a row of the same timer.
fn history_after_row<V: Vocabulary>() -> &'static str {
    match V::DIALECT {
        Dialect::Postgres => HISTORY_AFTER_ROW_POSTGRES,
        Dialect::MySql => HISTORY_AFTER_ROW_MYSQL,
    }
}

/// This timer's outbox rows after `cursor` in the history's order
/// (newest first; [`super::HistoryCursor`]), at most `limit`: one range of
/// the history index, whatever the table holds.
pub(crate) async fn history<S: OwnTables>(
    store: &S,
    cursor: Option<&super::HistoryCursor>,
    limit: u32,
) -> Result<Vec<super::HistoryRow>, StoreError> {
    let name = store.timer_name();
    let template = match cursor {
        None => HISTORY_NEWEST,
        Some(c) if name < c.timer.as_str() => HISTORY_AT_OR_BEFORE,
        Some(c) if name > c.timer.as_str() => HISTORY_BEFORE,
        Some(_) => history_after_row::<S::Words>(),
    };
    let mut values = vec![("timer", timer(store)), ("limit", int(limit))];
    if let Some(c) = cursor {
        values.push(("at", Value::Time(c.at)));
        values.push(("after_id", Value::Text(&c.order_id)));
    }
    store.fetch(render::<S::Words>(template, &values)).await
}

/// How many rows are set aside.
pub(crate) async fn set_aside_count<S: OwnTables>(store: &S) -> Result<u64, StoreError> {
    let statement = render::<S::Words>(SET_ASIDE_COUNT, &[("timer", timer(store))]);
    let rows: Vec<(i64,)> = store.fetch(statement).await?;
    Ok(rows
        .first()
        .map_or(0, |(n,)| u64::try_from(*n).unwrap_or(0)))
}

/// Forgets the mark of the row set aside `id`.
pub(crate) async fn forget_set_aside<S: OwnTables>(store: &S, id: &str) -> Result<(), StoreError> {
    let ids = [id];
    let statement = render::<S::Words>(
        FORGET_SET_ASIDE,
        &[("timer", timer(store)), ("ids", Value::Ids(&ids))],
    );
    store.execute(statement).await.map(drop)
}

/// Has the next sweep try the rows set aside `ids` (all: `None`) again.
pub(crate) async fn retry_set_aside<S: OwnTables>(
    store: &S,
    ids: Option<&[&str]>,
) -> Result<u64, StoreError> {
    let statement = match ids {
        None => render::<S::Words>(RETRY_SET_ASIDE_ALL, &[("timer", timer(store))]),
        Some([]) => return Ok(0),
        Some(ids) => render::<S::Words>(
            RETRY_SET_ASIDE,
            &[("timer", timer(store)), ("ids", Value::Ids(ids))],
        ),
    };
    store.execute(statement).await
}

/// Records the replica `instance` of release `version` as seen now.
pub(crate) async fn record_replica<S: OwnTables>(
    store: &S,
    instance: &str,
    version: &str,
) -> Result<(), StoreError> {
    let values = [
        ("instance", Value::Text(instance)),
        ("version", Value::Text(version)),
    ];
    let touched = store
        .execute(render::<S::Words>(REPLICA_TOUCH, &values))
        .await?;
    if touched == 0 {
        store
            .execute(render::<S::Words>(REPLICA_ADD, &values))
            .await?;
    }
    Ok(())
}

/// Forgets the replica `instance` (it stopped).
pub(crate) async fn forget_replica<S: OwnTables>(
    store: &S,
    instance: &str,
) -> Result<(), StoreError> {
    let statement = render::<S::Words>(REPLICA_FORGET, &[("instance", Value::Text(instance))]);
    store.execute(statement).await.map(drop)
}

/// The replicas seen within `within`: `(instance, release)`.
pub(crate) async fn live_replicas<S: OwnTables>(
    store: &S,
    within: Duration,
) -> Result<Vec<(String, String)>, StoreError> {
    let statement = render::<S::Words>(REPLICAS_LIVE, &[("age", Value::Micros(micros(within)))]);
    store.fetch(statement).await
}

/// Records the logout of the console session whose MAC is `session`,
/// until `until` (when the session would have expired), and forgets the
/// logouts of sessions that have expired.
pub(crate) async fn record_logout<S: OwnTables>(
    store: &S,
    session: &str,
    until: DateTime<Utc>,
) -> Result<(), StoreError> {
    let values = [
        ("session", Value::Text(session)),
        ("until", Value::Time(until)),
    ];
    store
        .execute(render::<S::Words>(LOGOUT_ADD, &values))
        .await?;
    store
        .execute(render::<S::Words>(LOGOUTS_FORGET, &[]))
        .await
        .map(drop)
}

/// The logouts of console sessions that have not expired: `(MAC, expiry)`.
pub(crate) async fn logouts<S: OwnTables>(
    store: &S,
) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
    store.fetch(render::<S::Words>(LOGOUTS_LIVE, &[])).await
}

/// `(key, id)` pairs grouped by key, in the order keys first appear.
fn grouped<'a, K: PartialEq>(pairs: impl Iterator<Item = (K, &'a str)>) -> Vec<(K, Vec<&'a str>)> {
    let mut groups: Vec<(K, Vec<&'a str>)> = Vec::new();
    for (key, id) in pairs {
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ids)) => ids.push(id),
            None => groups.push((key, vec![id])),
        }
    }
    groups
}

/// The statement of the sweep's outbox scan as the sweeper runs it, with
/// its values written in: for a test that asks the database for the
/// statement's plan ([`super::stale_statement_for_explain`]).
pub(crate) fn stale_written_in<V: Vocabulary>(timer: &str, grace: Duration, limit: u32) -> String {
    let values = [
        ("timer", Value::Text(timer)),
        ("grace", Value::Micros(micros(grace))),
        ("limit", int(limit)),
    ];
    with_values_written_in(V::DIALECT, &render::<V>(STALE, &values))
}

/// The history's statement for the page after `cursor`, with its values
/// written in: for a test that asks the database for its plan
/// ([`super::history_statement_for_explain`]).
pub(crate) fn history_written_in<V: Vocabulary>(
    timer: &str,
    cursor: &super::HistoryCursor,
    limit: u32,
) -> String {
    let values = [
        ("timer", Value::Text(timer)),
        ("limit", int(limit)),
        ("at", Value::Time(cursor.at)),
        ("after_id", Value::Text(&cursor.order_id)),
    ];
    with_values_written_in(V::DIALECT, &render::<V>(history_after_row::<V>(), &values))
}

/// `statement` with its values as literals instead of placeholders.
fn with_values_written_in(dialect: Dialect, statement: &Statement<'_>) -> String {
    let literal = |value: &Value<'_>| match value {
        Value::Text(s) => format!("'{}'", s.replace('\'', "''")),
        Value::Int(n) | Value::Micros(n) => n.to_string(),
        Value::Time(t) => format!("'{}'", t.format("%Y-%m-%d %H:%M:%S%.6f")),
        Value::Ids(ids) => ids
            .iter()
            .map(|id| format!("'{}'", id.replace('\'', "''")))
            .collect::<Vec<_>>()
            .join(", "),
        Value::MaybeText(None) => "NULL".into(),
        Value::MaybeText(Some(s)) => format!("'{}'", s.replace('\'', "''")),
        Value::Bytes(b) => format!(
            "x'{}'",
            b.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
        Value::Nums(nums) => nums
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        Value::Status(code) | Value::MaybeStatus(Some(code)) => {
            format!("'{}'", code.as_text().replace('\'', "''"))
        }
        Value::RowId(Some(id)) => format!("'{}'", id.text().replace('\'', "''")),
        Value::RowIds(ids) | Value::ItemIds(ids) => ids
            .iter()
            .map(|id| format!("'{}'", id.text().replace('\'', "''")))
            .collect::<Vec<_>>()
            .join(", "),
        Value::ShopTime(Some(t)) => format!("'{}'", t.format("%Y-%m-%d %H:%M:%S%.6f")),
        Value::MaybeStatus(None) | Value::RowId(None) | Value::ShopTime(None) => "NULL".into(),
        // Only the cancel transaction writes outbox rows; nothing explains it.
        Value::NewOutboxRows(..) => String::new(),
    };
    let mut out = statement.sql.clone();
    match dialect {
        // From the highest number down, so `$1` does not match in `$10`.
        Dialect::Postgres => {
            for (n, value) in statement.values.iter().enumerate().rev() {
                let text = match value {
                    Value::Ids(_) | Value::Nums(_) | Value::RowIds(_) | Value::ItemIds(_) => {
                        format!("ARRAY[{}]", literal(value))
                    }
                    _ => literal(value),
                };
                out = out.replace(&format!("${}", n + 1), &text);
            }
        }
        Dialect::MySql => {
            for value in &statement.values {
                out = out.replacen('?', &literal(value), 1);
            }
        }
    }
    out
}

/// Every template by name, for the tests that render them on each dialect
/// (`outbox_words_tests.rs`, which also finds every template constant in
/// this file's source and checks that it is here) and the test that
/// prepares every one on both dialects ([`super::SqlStore`]'s
/// `prepare_every_template`).
pub(super) const TEMPLATES: [(&str, &str); 37] = templates![
    HISTORY_NEWEST,
    HISTORY_BEFORE,
    HISTORY_AT_OR_BEFORE,
    HISTORY_AFTER_ROW_POSTGRES,
    HISTORY_AFTER_ROW_MYSQL,
    SET_ASIDE_OF,
    OUTBOX_FACTS,
    STALE,
    COUNT_FAILURE,
    ATTEMPTS,
    RETRY_AFTER,
    GIVE_UP,
    DELETE_FINISHED_POSTGRES,
    DELETE_FINISHED_MYSQL,
    RELEASE_LEASES,
    RENEW_LEASES,
    MARK_BOTH,
    MARK_RELEASED,
    MARK_PUBLISHED,
    WATCH_CREATE,
    WATCH_TAKE,
    WATCH_READ,
    WATCH_ADVANCE,
    WATCH_RELEASE,
    SET_ASIDE_ROWS,
    SET_ASIDE_COUNT,
    RETRY_SET_ASIDE_ALL,
    RETRY_SET_ASIDE,
    FORGET_SET_ASIDE,
    REPLICA_TOUCH,
    REPLICA_ADD,
    REPLICA_FORGET,
    REPLICAS_LIVE,
    LOGOUT_ADD,
    LOGOUTS_FORGET,
    LOGOUTS_LIVE,
    ALSO_LOCKS
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn also_lock_slots_are_sorted_distinct_and_stable() {
        let slots = also_lock_slots(&["sku-2", "sku-1", "sku-2", "7"]);
        assert_eq!(slots.len(), 3, "{slots:?}");
        assert!(slots.windows(2).all(|w| w[0] < w[1]), "{slots:?}");
        assert!(slots.iter().all(|s| (0..4_096).contains(s)), "{slots:?}");
        // The same in every replica and release: a changed hash would let
        // two releases take one key's lock under two slots.
        assert_eq!(also_lock_slots(&["sku-1"]), [3_980]);
        assert!(also_lock_slots::<&str>(&[]).is_empty());
    }

    #[test]
    fn rows_are_grouped_by_what_happens_to_them_in_first_seen_order() {
        let groups = grouped([("x", "1"), ("y", "2"), ("x", "3")].into_iter());
        assert_eq!(groups, vec![("x", vec!["1", "3"]), ("y", vec!["2"])]);
    }
}
