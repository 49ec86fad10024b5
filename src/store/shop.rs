//! **The SQL of the shop's tables**, written once for both dialects: the
//! count of waiting rows, the sweeper's page of overdue rows, a watch's
//! scan, the console's page of waiting rows, one row's facts (`explain`),
//! the items of orders, and the rows set aside. The cancel transaction's
//! statements are in `cancel.rs`, written the same way.
//!
//! A template is plain SQL with `{slots}`, as in `outbox.rs`: the words of
//! the timer's mapping (`{table}`, `{row_id}`, `{status}`, `{deadline}`,
//! `{guard}`, `{digest_of_row}`, …, rendered in the dialect once the check read the tables:
//! [`mapped`]), the dialect's words (`{now}`), and values bound by name
//! where they stand ([`super::outbox::render_mapped`]). An id or a status
//! code is bound in its column's type (cast from text on PostgreSQL), an
//! instant compared with the shop's deadlines in the session's zone.
//!
//! Rows are matched by id in the column's type (its index), then kept only
//! when their id reads back as exactly one asked about: `00123` is not
//! `123`, and `ABC` is not `abc` in a case-insensitive column.

use std::collections::HashSet;
use std::sync::PoisonError;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::ids::IdValue;
use super::outbox::{self, Mapped, Statement, Value, Vocabulary, micros, render_mapped};
use super::shape::{self, OrdersColumns};
use super::sql::{Check, ItemRow, PageRow, Prepared, SqlDialect, SqlStore};
use super::{RowFacts, SET_ASIDE_HOURLY_TRIES, StoreError};
use crate::settings::{Timer, TimerKey};

/// Rows in the `from` status passing the guard, how many are due, and
/// when the newest is (UTC microseconds).
const COUNT: &str = "\
SELECT count(*), {count_due}, max({expires}) FROM {table} AS o WHERE {status} = {from} AND {guard}";

/// The sweeper's page: overdue rows in (deadline, id) order after the
/// cursor, leaving out the rows this timer flipped before (their outbox
/// row) and those set aside unchanged. Both are looked up by their primary
/// keys, only for the overdue rows.
const OVERDUE: &str = "\
SELECT {row_id_text}, {expires} FROM {table} AS o \
 WHERE {status} = {from} AND {deadline} < {shop_now} - {grace} AND {usable} AND {guard} \
   AND ({after_at} IS NULL \
        OR ({deadline} >= {after_at} \
            AND ({deadline} > {after_at} OR ({after_id} IS NOT NULL AND {row_id} > {after_id})))) \
   AND NOT EXISTS (SELECT 1 FROM order_timeout_cancel_outbox AS x \
                    WHERE x.timer = {timer} AND x.order_id = {row_id_text}) \
   AND NOT EXISTS (SELECT 1 FROM order_timeout_set_aside AS s \
                    WHERE s.timer = {timer} AND s.order_id = {row_id_text} \
                      AND s.row_digest = {digest_of_row} AND s.retry_at > {now}) \
 ORDER BY {deadline}, {row_id} LIMIT {limit}";

/// The rows a watch schedules, in (deadline, id) order: keyset pages, so
/// that any number of rows sharing one deadline (a coupon campaign ending
/// at midnight) are all taken. With an index on `(status, deadline)`, a
/// range scan: the plain `>= {after_at}` bound is what the planner turns
/// into the range's start (the keyset `OR` alone only filters, and every
/// page would re-read the rows of the pages before it).
const DUE: &str = "\
SELECT {row_id_text}, {expires} FROM {table} AS o \
 WHERE {status} = {from} AND {guard} \
   AND {deadline} >= {after_at} AND {deadline} <= {until} \
   AND ({deadline} > {after_at} \
        OR ({deadline} = {after_at} AND {after_id} IS NOT NULL AND {row_id} > {after_id})) \
 ORDER BY {deadline}, {row_id} LIMIT {limit}";

/// Rows in the `from` status after an id, in id order.
const WAITING_PAGE: &str = "\
SELECT {row_id_text}, {expires} FROM {table} AS o \
 WHERE {status} = {from} AND {guard} AND ({after_id} IS NULL OR {row_id} > {after_id}) \
 ORDER BY {row_id} LIMIT {limit}";

/// One row's facts, read without locking it (`explain`).
const ROW_FACTS: &str = "\
SELECT {row_id_text} AS id, COALESCE({status} = {to}, FALSE) AS is_to, \
       COALESCE({status} = {paid}, FALSE) AS is_paid, \
       COALESCE({status} = {from}, FALSE) AS is_from, \
       COALESCE({guard}, FALSE) AS guard_ok, {expires} AS expires_us \
  FROM {table} AS o WHERE {row_id} {ids}";

/// The items of orders, by order id and sku.
const ITEMS: &str = "\
SELECT {item_order_id_text} AS order_id, {item_sku_text} AS sku, {item_quantity} AS quantity \
  FROM {items_table} WHERE {item_order_id} {ids} ORDER BY 1, 2";

/// Which of the rows `ids` are still in the `from` status.
pub(super) const STILL_WAITING: &str = "\
SELECT {row_id_text} FROM {table} AS o WHERE {status} = {from} AND {row_id} {ids}";

/// The digest of the row `ids` (of one).
const ROW_DIGEST: &str = "\
SELECT {row_id_text}, {digest_of_row} FROM {table} AS o WHERE {row_id} {ids}";

/// The mark of a row set aside again: one more attempt when the row is
/// as it was (its digest), else a first one; tried again an hour later, a
/// day after [`SET_ASIDE_HOURLY_TRIES`] failures of the row as it is.
/// MySQL assigns left to right, each assignment seeing the ones before: the
/// old digest and attempts are compared before they are overwritten.
const MARK_AGAIN: &str = "\
UPDATE order_timeout_set_aside \
   SET retry_at = CASE WHEN row_digest = {digest} AND attempts >= {hourly} \
                       THEN {now} + {day} ELSE {now} + {hour} END, \
       set_aside_at = CASE WHEN row_digest = {digest} THEN set_aside_at ELSE {now} END, \
       attempts = CASE WHEN row_digest = {digest} THEN attempts + 1 ELSE 1 END, \
       row_digest = {digest}, reason = {reason} \
 WHERE timer = {timer} AND order_id = {id}";

/// The first mark of a row set aside.
const MARK_NEW: &str = "\
INSERT INTO order_timeout_set_aside \
       (timer, order_id, row_digest, reason, set_aside_at, attempts, retry_at) \
VALUES ({timer}, {id}, {digest}, {reason}, {now}, 1, {now} + {hour}) {keep_existing:timer}";

/// The attempts of a mark.
const MARK_ATTEMPTS: &str = "\
SELECT attempts FROM order_timeout_set_aside WHERE timer = {timer} AND order_id = {id}";

/// A page of the timer's marks after an order id, in the key's order:
/// each sweep prunes one page, the next one goes on from there.
const MARKS: &str = "\
SELECT {order_id} FROM order_timeout_set_aside WHERE timer = {timer} AND order_id > {after} \
 ORDER BY order_id LIMIT {limit}";

/// How many marks one sweep looks at for pruning ([`MARKS`]).
pub(crate) const PRUNE_PAGE: i64 = 1_000;

/// Forgets the marks `ids`.
const FORGET_MARKS: &str = "\
DELETE FROM order_timeout_set_aside WHERE timer = {timer} AND order_id {ids}";

/// Every template by name, for the tests that render them on each dialect
/// (`outbox_words_tests.rs`, which also finds every template constant in
/// this file's source and checks that it is here) and the test that
/// prepares every one on both dialects.
pub(super) const TEMPLATES: [(&str, &str); 13] = templates![
    COUNT,
    OVERDUE,
    DUE,
    WAITING_PAGE,
    ROW_FACTS,
    ITEMS,
    STILL_WAITING,
    ROW_DIGEST,
    MARK_AGAIN,
    MARK_NEW,
    MARK_ATTEMPTS,
    MARKS,
    FORGET_MARKS
];

/// The words of `timer`'s mapping in dialect `D`, over the orders table's
/// `orders` columns and, when the items are read, the base type of the
/// items table's order id column.
///
/// `shifts`: the session's zone changes its offset during the year
/// (`zones::ZoneReport::shifts`), so zone-less deadlines are compared as
/// the dialect compares them there (`Vocabulary::shop_now`).
pub(super) fn mapped<D: Vocabulary>(
    timer: &Timer,
    orders: &OrdersColumns,
    items_id_base: Option<&str>,
    shifts: bool,
) -> Mapped {
    let q = |s: &str| shape::quote(D::DIALECT, s);
    let row_id = format!("o.{}", q(&timer.id));
    let deadline = shape::deadline_sql(D::DIALECT, timer);
    let usable = shape::usable_deadline_sql(&deadline);
    let shop_now = D::shop_now(shifts);
    let due = format!("({deadline} <= {shop_now} AND {usable})");
    let set: String = (timer.set.iter())
        .map(|(column, value)| format!(", {} = {value}", q(column)))
        .collect();
    let i = &timer.items;
    let item_order_id = q(&i.order_id);
    Mapped {
        words: vec![
            ("table", q(&timer.table)),
            ("row_id_text", D::text(&row_id)),
            ("row_id", row_id),
            ("status", format!("o.{}", q(&timer.status))),
            ("status_column", q(&timer.status)),
            ("set", set),
            ("expires", D::epoch_micros(&deadline, &usable, shifts)),
            ("count_due", D::count_if(&due)),
            ("due", due),
            ("deadline", deadline),
            ("usable", usable),
            ("guard", shape::guard_sql(timer)),
            ("digest_of_row", D::row_digest(&orders.all)),
            ("shop_now", shop_now),
            ("items_table", q(&i.table)),
            ("item_order_id_text", D::text(&item_order_id)),
            ("item_order_id", item_order_id),
            ("item_sku_text", D::text(&q(&i.sku))),
            ("item_quantity", D::int8(&q(&i.quantity))),
        ],
        status_type: orders.status_type.clone(),
        id_base: orders.id_base.clone(),
        items_id_base: items_id_base.unwrap_or_default().to_owned(),
    }
}

/// The statements on the shop's tables the check prepares, each rendered
/// with one id and with the config key a failure names.
pub(super) fn checks<D: SqlDialect>(timer: &Timer, mapped: &Mapped, items: bool) -> Vec<Check> {
    let rows = timer.key(TimerKey::DeadlineGuard);
    let one = [IdValue::Text(String::new())];
    let mut templates = vec![
        (timer.key(TimerKey::Flip), super::cancel::FLIP),
        (rows, OVERDUE),
        (rows, WAITING_PAGE),
        (timer.key(TimerKey::Id), ROW_DIGEST),
        (timer.key(TimerKey::Status), ROW_FACTS),
        (timer.key(TimerKey::Status), STILL_WAITING),
        (timer.key(TimerKey::Status), super::cancel::READ_ROWS),
    ];
    if timer.watch.is_some() {
        templates.push((rows, DUE));
    }
    if items {
        templates.push(("[items]", ITEMS));
    }
    templates
        .into_iter()
        .map(|(key, template)| {
            let values = outbox::sample_values(template, &[""], &one, &timer.from);
            let statement = render_mapped::<D>(template, mapped, &values);
            Check {
                key,
                binds: statement.placeholders,
                sql: statement.sql,
            }
        })
        .collect()
}

/// A page's rows as both dialects read them: the id's text, the deadline
/// as UTC microseconds.
type MicrosRow = (String, Option<i64>);

/// `rows` with their deadlines as instants.
fn page_rows(rows: Vec<MicrosRow>) -> Vec<PageRow> {
    rows.into_iter()
        .map(|(id, us)| (id, us.and_then(DateTime::from_timestamp_micros)))
        .collect()
}

impl<D: SqlDialect> SqlStore<D> {
    /// Renders `template` for this timer's mapping and runs it on the
    /// shop's pool; its rows.
    async fn shop_rows<T: outbox::OwnRow>(
        &self,
        prepared: &Prepared<D>,
        template: &str,
        values: &[(&str, Value<'_>)],
    ) -> Result<Vec<T>, StoreError> {
        self.rows_with(&prepared.mapped, template, values).await
    }

    /// [`SqlStore::shop_rows`] with words not yet kept (during the check).
    async fn rows_with<T: outbox::OwnRow>(
        &self,
        mapped: &Mapped,
        template: &str,
        values: &[(&str, Value<'_>)],
    ) -> Result<Vec<T>, StoreError> {
        let statement = render_mapped::<D>(template, mapped, values);
        D::fetch(&mut *self.pool.acquire().await?, statement).await
    }

    /// Runs `statement` (of the service's own tables, with values bound in
    /// the shop's column types) on the shop's pool.
    async fn shop_execute(&self, statement: Statement<'_>) -> Result<u64, StoreError> {
        D::execute(&mut *self.pool.acquire().await?, statement).await
    }

    /// Rows in the `from` status passing the guard, how many of them are
    /// overdue, and the newest one's deadline (UTC microseconds).
    pub(super) async fn count_rows(
        &self,
        mapped: &Mapped,
    ) -> Result<(i64, i64, Option<i64>), StoreError> {
        let values = [("from", Value::Status(&self.timer.from))];
        let rows = self.rows_with(mapped, COUNT, &values).await?;
        Ok(rows.into_iter().next().unwrap_or((0, 0, None)))
    }

    /// `(id, deadline)` of rows in the `from` status overdue by more than
    /// `grace` that the timer may still flip, in (deadline, id) order after
    /// `after` (a deadline and the last id read at it).
    pub(super) async fn overdue_rows(
        &self,
        prepared: &Prepared<D>,
        grace: Duration,
        after: Option<(DateTime<Utc>, Option<&str>)>,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        let after_id = after
            .and_then(|(_, id)| id)
            .map(|id| prepared.id_value(id))
            .transpose()?;
        let values = [
            ("from", Value::Status(&self.timer.from)),
            ("grace", Value::Micros(micros(grace))),
            ("after_at", Value::ShopTime(after.map(|(at, _)| at))),
            ("after_id", Value::RowId(after_id.as_ref())),
            ("timer", Value::Text(self.timer.name.as_str())),
            ("limit", Value::Int(i64::from(limit))),
        ];
        Ok(page_rows(self.shop_rows(prepared, OVERDUE, &values).await?))
    }

    /// `(id, deadline)` of rows in the `from` status due after `after` (a
    /// deadline, and an id at it) and not after `until`, in (deadline, id)
    /// order. Only for timers with a watch.
    pub(super) async fn due_rows(
        &self,
        prepared: &Prepared<D>,
        after: (DateTime<Utc>, Option<&str>),
        until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        if self.timer.watch.is_none() {
            return Ok(Vec::new());
        }
        let after_id = after.1.map(|id| prepared.id_value(id)).transpose()?;
        let values = [
            ("from", Value::Status(&self.timer.from)),
            ("after_at", Value::ShopTime(Some(after.0))),
            ("after_id", Value::RowId(after_id.as_ref())),
            ("until", Value::ShopTime(Some(until))),
            ("limit", Value::Int(i64::from(limit))),
        ];
        Ok(page_rows(self.shop_rows(prepared, DUE, &values).await?))
    }

    /// `(id, deadline)` of rows in the `from` status after the id `after`,
    /// in id order.
    pub(super) async fn waiting_rows(
        &self,
        prepared: &Prepared<D>,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        let after_id = after.map(|id| prepared.id_value(id)).transpose()?;
        let values = [
            ("from", Value::Status(&self.timer.from)),
            ("after_id", Value::RowId(after_id.as_ref())),
            ("limit", Value::Int(i64::from(limit))),
        ];
        Ok(page_rows(
            self.shop_rows(prepared, WAITING_PAGE, &values).await?,
        ))
    }

    /// The facts of the row `id` (canonical), read without locking or
    /// changing anything.
    pub(super) async fn row_facts(
        &self,
        prepared: &Prepared<D>,
        id: &str,
    ) -> Result<Option<RowFacts>, StoreError> {
        let t = &self.timer;
        let ids = [prepared.id_value(id)?];
        let values = [
            ("to", Value::Status(&t.to)),
            ("paid", Value::MaybeStatus(t.paid.as_ref())),
            ("from", Value::Status(&t.from)),
            ("ids", Value::RowIds(&ids)),
        ];
        let rows: Vec<FactsRow> = self.shop_rows(prepared, ROW_FACTS, &values).await?;
        Ok(rows.into_iter().find(|r| r.id == id).map(|r| RowFacts {
            is_to: r.is_to,
            is_paid: r.is_paid,
            is_from: r.is_from,
            guard_ok: r.guard_ok,
            expires_at: r.expires_us.and_then(DateTime::from_timestamp_micros),
        }))
    }

    /// The database's clock (UTC).
    pub(super) async fn db_now(&self, prepared: &Prepared<D>) -> Result<DateTime<Utc>, StoreError> {
        let now: Vec<(DateTime<Utc>,)> = self.shop_rows(prepared, "SELECT {now}", &[]).await?;
        Ok(now.into_iter().next().map_or_else(Utc::now, |(t,)| t))
    }

    /// The items of the orders `ids` (canonical for the items table's
    /// order id column), ordered by order id and sku.
    pub(super) async fn item_rows(
        &self,
        prepared: &Prepared<D>,
        ids: &[&str],
    ) -> Result<Vec<ItemRow>, StoreError> {
        let values: Vec<IdValue> = ids
            .iter()
            .map(|id| prepared.items_id_value(id))
            .collect::<Result<_, _>>()?;
        let values = [("ids", Value::ItemIds(&values))];
        self.shop_rows(prepared, ITEMS, &values).await
    }

    /// Records the row of `id` (canonical) as set aside with `reason`,
    /// with its digest; the mark's attempts (`None`: no such row).
    pub(super) async fn mark_set_aside(
        &self,
        prepared: &Prepared<D>,
        id: &str,
        reason: &str,
    ) -> Result<Option<u32>, StoreError> {
        let ids = [prepared.id_value(id)?];
        let rows: Vec<(String, String)> = self
            .shop_rows(prepared, ROW_DIGEST, &[("ids", Value::RowIds(&ids))])
            .await?;
        let Some((_, digest)) = rows.into_iter().find(|(row, _)| row == id) else {
            return Ok(None);
        };
        let values = [
            ("timer", Value::Text(self.timer.name.as_str())),
            ("id", Value::Text(id)),
            ("digest", Value::Text(&digest)),
            ("reason", Value::Text(reason)),
            ("hourly", Value::Int(i64::from(SET_ASIDE_HOURLY_TRIES))),
            ("hour", Value::Micros(micros(Duration::from_secs(3600)))),
            ("day", Value::Micros(micros(Duration::from_secs(86_400)))),
        ];
        let again = || outbox::render::<D>(MARK_AGAIN, &values);
        // Marked before, or now; a first mark another replica wrote in
        // between is marked again.
        if self.shop_execute(again()).await? == 0
            && self
                .shop_execute(outbox::render::<D>(MARK_NEW, &values))
                .await?
                == 0
        {
            self.shop_execute(again()).await?;
        }
        let attempts: Vec<(i32,)> = self.shop_rows(prepared, MARK_ATTEMPTS, &values).await?;
        Ok(attempts.first().map(|(n,)| u32::try_from(*n).unwrap_or(1)))
    }

    /// Deletes the set-aside marks of the timer whose row is no longer in
    /// the `from` status (or gone), looking up the rows by id in the
    /// column's type: one page of [`PRUNE_PAGE`] marks a call, each call
    /// going on after the last one's page and starting over after the last
    /// page, so that a sweep's work stays bounded however many rows are
    /// set aside, and every mark is looked at in turn (a page whose marks
    /// all still wait never hides the marks behind it).
    pub(super) async fn prune_marks(&self, prepared: &Prepared<D>) -> Result<u64, StoreError> {
        let timer = ("timer", Value::Text(self.timer.name.as_str()));
        let after = self
            .prune_after
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let page = [
            timer,
            ("after", Value::Text(&after)),
            ("limit", Value::Int(PRUNE_PAGE)),
        ];
        let marked: Vec<(String,)> = self.shop_rows(prepared, MARKS, &page).await?;
        // A mark whose id no longer fits the column names no row.
        let fits: Vec<IdValue> = marked
            .iter()
            .filter_map(|(id,)| prepared.id_value(id).ok())
            .collect();
        let mut waiting = HashSet::new();
        if !fits.is_empty() {
            let values = [
                ("from", Value::Status(&self.timer.from)),
                ("ids", Value::RowIds(&fits)),
            ];
            let rows: Vec<(String,)> = self.shop_rows(prepared, STILL_WAITING, &values).await?;
            waiting.extend(rows.into_iter().map(|(id,)| id));
        }
        let gone: Vec<&str> = marked
            .iter()
            .map(|(id,)| id.as_str())
            .filter(|id| !waiting.contains(*id))
            .collect();
        let mut pruned = 0;
        if !gone.is_empty() {
            let values = [timer, ("ids", Value::Ids(&gone))];
            let forget = outbox::render::<D>(FORGET_MARKS, &values);
            pruned = self.shop_execute(forget).await?;
        }
        let full = i64::try_from(marked.len()).is_ok_and(|n| n == PRUNE_PAGE);
        let next = match marked.last() {
            Some((last,)) if full => last.clone(),
            _ => String::new(),
        };
        *self
            .prune_after
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = next;
        Ok(pruned)
    }
}

impl<D: SqlDialect> SqlStore<D> {
    /// Renders every template of `outbox.rs` and `shop.rs` for this timer
    /// and prepares it, checking that it takes exactly the parameters the
    /// service binds: the templates the unit tests found in the sources,
    /// not a list kept by hand (the other dialect's variants, named
    /// `…_POSTGRES` or `…_MYSQL`, left out). How many were prepared.
    pub(super) async fn prepare_every_template(&self) -> Result<usize, StoreError> {
        let prepared = self.prepared().await?;
        let other = match D::DIALECT {
            super::Dialect::Postgres => "_MYSQL",
            super::Dialect::MySql => "_POSTGRES",
        };
        let row_ids = [IdValue::Text(String::new())];
        let templates = (outbox::TEMPLATES.iter())
            .chain(TEMPLATES.iter())
            .chain(super::cancel::TEMPLATES.iter());
        let mut count = 0;
        for (name, template) in templates.filter(|(name, _)| !name.ends_with(other)) {
            let values = outbox::sample_values(template, &["a"], &row_ids, &self.timer.from);
            let statement = outbox::render_mapped::<D>(template, &prepared.mapped, &values);
            let problem = |problem: String| StoreError::Schema {
                key: name,
                problem: format!("{problem}: {}", statement.sql),
            };
            let found =
                (self.parameters(&statement.sql).await).map_err(|e| problem(e.to_string()))?;
            if found != statement.placeholders {
                let binds = statement.placeholders;
                return Err(problem(format!("{found} parameters, {binds} bound")));
            }
            count += 1;
        }
        Ok(count)
    }
}

/// One row's facts as both dialects read them.
#[derive(Debug, sqlx::FromRow)]
struct FactsRow {
    id: String,
    is_to: bool,
    is_paid: bool,
    is_from: bool,
    guard_ok: bool,
    expires_us: Option<i64>,
}
