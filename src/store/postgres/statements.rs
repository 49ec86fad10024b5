//! PostgreSQL's statements, rendered once from the mapping ([`Sql`]):
//! ids and status codes bound as text and cast to the columns' own types.

use crate::settings::Timer;
use crate::store::Dialect;
use crate::store::shape::{self, OrdersColumns};

/// The pieces of the mapping every statement is rendered from.
pub(super) struct Parts {
    pub(super) table: String,
    pub(super) id: String,
    pub(super) status: String,
    pub(super) deadline: String,
    /// The deadline as the service reads it: a `timestamptz`, NULL when it
    /// is no usable time ([`shape::usable_deadline_sql`]).
    pub(super) expires: String,
    /// The row is due: its deadline is a usable time, and passed.
    pub(super) due: String,
    /// Its deadline is a usable time.
    pub(super) usable: String,
    pub(super) guard: String,
    /// The id column's type without length or precision.
    pub(super) id_base: String,
    pub(super) status_type: String,
}

impl Parts {
    pub(super) fn of(timer: &Timer, orders: &OrdersColumns) -> Self {
        let o = timer;
        let q = |s: &str| shape::quote(Dialect::Postgres, s);
        let deadline = shape::deadline_sql(Dialect::Postgres, o);
        let usable = shape::usable_deadline_sql(&deadline);
        Self {
            table: q(&o.table),
            id: q(&o.id),
            status: q(&o.status),
            expires: format!("CASE WHEN {usable} THEN ({deadline})::timestamptz END"),
            due: format!("({deadline} <= now() AND {usable})"),
            usable,
            deadline,
            guard: shape::guard_sql(o),
            id_base: orders.id_base.clone(),
            status_type: orders.status_type.clone(),
        }
    }

    /// The status code bound as `$n`, in the status column's type.
    pub(super) fn code(&self, n: u8) -> String {
        format!("CAST(${n}::text AS {})", self.status_type)
    }

    /// The rows of `o` whose id is one of the ids bound as `$1`: compared
    /// in the id column's type (its index), and read back as exactly one of
    /// them (`00123` is not `123`, `ABC` is not `abc` in a `citext`
    /// column).
    pub(super) fn matches(&self) -> String {
        let Self { id, id_base, .. } = self;
        format!(
            "o.{id} = ANY(CAST($1::text[] AS {id_base}[])) \
             AND (o.{id}::text COLLATE \"C\") = ANY($1::text[])"
        )
    }
}

/// One row's facts, read without locking it (`explain`): `$1` the id
/// (text[] of one), `$2` to, `$3` paid (text, nullable), `$4` from.
pub(super) fn explain_statement(p: &Parts) -> String {
    let Parts {
        table,
        status,
        expires,
        guard,
        ..
    } = p;
    let (matches, to, paid, from) = (p.matches(), p.code(2), p.code(3), p.code(4));
    format!(
        "SELECT coalesce(o.{status} = {to}, false) AS is_to, \
                coalesce(o.{status} = {paid}, false) AS is_paid, \
                coalesce(o.{status} = {from}, false) AS is_from, \
                coalesce({guard}, false) AS guard_ok, {expires} AS expires_at \
           FROM {table} o WHERE {matches}"
    )
}

pub(super) fn count_statement(p: &Parts) -> String {
    let Parts {
        table,
        status,
        due,
        guard,
        ..
    } = p;
    let unpaid = p.code(1);
    format!(
        "SELECT count(*), count(*) FILTER (WHERE {due}) \
           FROM {table} WHERE {status} = {unpaid} AND {guard}"
    )
}

/// A digest of the whole row `o` (every column, as text): what tells a
/// row set aside from the same row changed since.
pub(super) const ROW_DIGEST: &str = "md5(o::text)";

/// The sweeper's page: overdue rows in (deadline, id) order after the
/// cursor (`$4`, `$5`), leaving out the rows this timer flipped before
/// (their outbox row) and those set aside unchanged. Both are looked up by
/// their primary keys, only for the overdue rows.
pub(super) fn overdue_statement(p: &Parts) -> String {
    let Parts {
        table,
        id,
        status,
        deadline,
        expires,
        usable,
        guard,
        id_base,
        ..
    } = p;
    let unpaid = p.code(1);
    format!(
        "SELECT o.{id}::text, {expires} FROM {table} AS o \
          WHERE o.{status} = {unpaid} AND {deadline} < now() - $2::interval AND {usable} \
            AND {guard} \
            AND ($4::timestamptz IS NULL \
                 OR ({deadline} >= $4::timestamptz \
                     AND ({deadline} > $4::timestamptz \
                          OR ($5::text IS NOT NULL AND o.{id} > CAST($5::text AS {id_base}))))) \
            AND NOT EXISTS (SELECT 1 FROM order_timeout_cancel_outbox AS x \
                             WHERE x.timer = $6 AND x.order_id = o.{id}::text) \
            AND NOT EXISTS (SELECT 1 FROM order_timeout_set_aside AS s \
                             WHERE s.timer = $6 AND s.order_id = o.{id}::text \
                               AND s.row_digest = {ROW_DIGEST} AND s.retry_at > now()) \
          ORDER BY {deadline}, o.{id} LIMIT $3"
    )
}

/// Records the row as set aside, with its digest, and when to try it
/// again (an hour later, a day after [`crate::store::SET_ASIDE_HOURLY_TRIES`]
/// failures of the row as it is); returns the mark's
/// attempts: 1 the first time (or when the row changed since), one more on
/// each later failure of the row as it is.
pub(super) fn set_aside_statement(p: &Parts) -> String {
    let Parts { table, id, .. } = p;
    let matches = p.matches();
    let same = "s.row_digest = EXCLUDED.row_digest";
    format!(
        "INSERT INTO order_timeout_set_aside AS s \
                (timer, order_id, row_digest, reason, attempts, retry_at) \
         SELECT $2, o.{id}::text, {ROW_DIGEST}, $3, 1, now() + interval '1 hour' \
           FROM {table} AS o WHERE {matches} \
         ON CONFLICT (timer, order_id) DO UPDATE \
            SET attempts = CASE WHEN {same} THEN s.attempts + 1 ELSE 1 END, \
                retry_at = now() + CASE WHEN {same} AND s.attempts >= {hourly} \
                                        THEN interval '1 day' ELSE interval '1 hour' END, \
                set_aside_at = CASE WHEN {same} THEN s.set_aside_at ELSE EXCLUDED.set_aside_at END, \
                row_digest = EXCLUDED.row_digest, reason = EXCLUDED.reason \
         RETURNING attempts",
        hourly = crate::store::SET_ASIDE_HOURLY_TRIES,
    )
}

/// Forgets the marks whose row is gone or out of the `from` status.
pub(super) fn prune_statement(p: &Parts) -> String {
    let Parts {
        table,
        id,
        status,
        id_base,
        ..
    } = p;
    let from = p.code(1);
    format!(
        "DELETE FROM order_timeout_set_aside AS s \
          WHERE s.timer = $2 \
            AND NOT EXISTS (SELECT 1 FROM {table} AS o \
                             WHERE o.{id} = CAST(s.order_id AS {id_base}) \
                               AND o.{status} = {from})"
    )
}

/// The rows a watch schedules, in (deadline, id) order: keyset pages, so
/// that any number of rows sharing one deadline (a coupon campaign ending
/// at midnight) are all taken. With an index on `(status, deadline)` (the
/// deadline expression itself, for an expression), a range scan: the
/// plain `>= $2` bound is what the planner turns into the range's start
/// (the keyset `OR` alone only filters, and every page would re-read the
/// rows of the pages before it: `bench-watch` measured page k reading
/// k × 1,000 rows).
pub(super) fn due_statement(p: &Parts) -> String {
    let Parts {
        table,
        id,
        status,
        deadline,
        expires,
        guard,
        id_base,
        ..
    } = p;
    let from = p.code(1);
    format!(
        "SELECT o.{id}::text, {expires} FROM {table} AS o \
          WHERE o.{status} = {from} AND {guard} \
            AND {deadline} >= $2::timestamptz AND {deadline} <= $4::timestamptz \
            AND ({deadline} > $2::timestamptz \
                 OR ({deadline} = $2::timestamptz AND $3::text IS NOT NULL \
                     AND o.{id} > CAST($3::text AS {id_base}))) \
          ORDER BY {deadline}, o.{id} LIMIT $5"
    )
}

pub(super) fn waiting_page_statement(p: &Parts) -> String {
    let Parts {
        table,
        id,
        status,
        expires,
        guard,
        id_base,
        ..
    } = p;
    let unpaid = p.code(1);
    format!(
        "SELECT {id}::text, {expires} FROM {table} \
          WHERE {status} = {unpaid} AND {guard} \
            AND ($2::text IS NULL OR {id} > CAST($2::text AS {id_base})) \
          ORDER BY {id} LIMIT $3"
    )
}

pub(super) fn items_statement(timer: &Timer, order_id_base: &str) -> String {
    let i = &timer.items;
    let q = |s: &str| shape::quote(Dialect::Postgres, s);
    format!(
        "SELECT {oid}::text AS order_id, {sku}::text AS sku, {qty}::int8 AS quantity \
           FROM {table} \
          WHERE {oid} = ANY(CAST($1::text[] AS {order_id_base}[])) ORDER BY 1, 2",
        oid = q(&i.order_id),
        sku = q(&i.sku),
        qty = q(&i.quantity),
        table = q(&i.table),
    )
}
