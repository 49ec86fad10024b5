//! PostgreSQL: the cancel transaction as one statement (CTEs with
//! `UPDATE … RETURNING` over `unnest($1::text[])`), so a batch costs one
//! round trip and one commit; with `also` statements, that statement and
//! the statements for each order it cancelled in one transaction.
//!
//! Every statement is rendered once from the mapping ([`Sql::render`]) after
//! the shop's table was read: ids and status codes are bound as text and
//! cast to the columns' own types, so integer, uuid and text columns (and
//! enums) all work with their indexes. Ids are cast to the id column's type
//! without its length or precision (`character varying`, not
//! `character varying(8)`, which would truncate), only after the shared
//! flow checked that the column can hold them, and a row matches only if
//! its id reads back as exactly the id asked about. The `also` statements
//! are bound the id in the column's own type ([`IdValue`]).

use std::time::Duration;

use sqlx::encode::{Encode, IsNull};
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{
    PgArgumentBuffer, PgConnectOptions, PgPool, PgPoolOptions, PgTypeInfo, PgTypeKind,
};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Executor, SqlSafeStr};

use super::catalog::{self, Column, Columns};
use super::ids::{IdColumn, IdValue};
use super::outbox::{OwnRow, Statement, Value, Vocabulary};
use super::releases::{self, Expansion, Migrated};
use super::shape::{self, OrdersColumns};
use super::sql::{
    AlsoCheckError, Check, ItemRow, PageRow, Prepared, SqlDialect, SqlStore, commit_or_roll_back,
};
use super::state::StateRow;
use super::{Dialect, PoolSettings, StoreError};
use crate::settings::{Release, SecretUrl, StatusValue, Timer, TimerKey};

/// PostgreSQL, as a [`SqlDialect`].
#[derive(Debug)]
pub(crate) struct Postgres;

/// The store on PostgreSQL.
pub(crate) type PgStore = SqlStore<Postgres>;

/// The service's own migrations for PostgreSQL (`migrations/postgres/`),
/// recorded in their own table, `order_timeout_migrations`, so they never
/// mix with the shop's own sqlx migrations in a shared database.
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("./migrations/postgres");
    migrator.dangerous_set_table_name("order_timeout_migrations");
    migrator
}

/// The cancel statement `query` and the timer's `also` statements for each
/// order it flipped, on `tx`; the caller commits, or rolls back at once
/// when they fail.
async fn cancel_with_also(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    store: &PgStore,
    prepared: &Prepared<Postgres>,
    query: sqlx::query::QueryAs<'_, sqlx::Postgres, StateRow, sqlx::postgres::PgArguments>,
) -> Result<Vec<StateRow>, StoreError> {
    let o = &store.timer;
    let rows = query.fetch_all(&mut **tx).await?;
    for row in rows.iter().filter(|r| r.just_cancelled) {
        for (statement, params) in o.also.iter().zip(&prepared.also_params) {
            let mut also = sqlx::query(AssertSqlSafe(statement.clone()));
            for param in params {
                also = also.bind(param.bind(&row.id).map_err(|problem| StoreError::Schema {
                    key: o.key(TimerKey::Also),
                    problem,
                })?);
            }
            also.execute(&mut **tx).await?;
        }
    }
    Ok(rows)
}

/// What the migrations keep for the previous release ([`super::releases`]).
const EXPANSIONS: [Expansion; 1] = [releases::OUTBOX_ORDER_ID_UNIQUE];

/// The [`EXPANSIONS`] present in the database.
async fn expansions_on(conn: &mut sqlx::PgConnection) -> Result<Vec<Expansion>, StoreError> {
    let mut present = Vec::new();
    for e in EXPANSIONS {
        let there: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(e.object)
            .fetch_one(&mut *conn)
            .await?;
        if there {
            present.push(e);
        }
    }
    Ok(present)
}

/// Drops the [`EXPANSIONS`] present (indexes of the service's own tables:
/// a short lock on them, none on the shop's).
async fn contract_on(conn: &mut sqlx::PgConnection) -> Result<Vec<Expansion>, StoreError> {
    let present = expansions_on(conn).await?;
    for e in &present {
        let drop = format!("DROP INDEX IF EXISTS \"{}\"", e.object);
        conn.execute(AssertSqlSafe(drop)).await?;
        tracing::info!(dropped = e.object, kept_for = e.kept_for, "contracted");
    }
    Ok(present)
}

/// `time_zone` as PostgreSQL's `TimeZone` setting: names as they are; an
/// ISO offset (`+08:00`) in POSIX form (`<+08:00>-08:00`), whose sign is
/// the other way round.
fn pg_time_zone(time_zone: &str) -> String {
    match time_zone
        .strip_prefix('+')
        .map(|r| ('-', r))
        .or_else(|| time_zone.strip_prefix('-').map(|r| ('+', r)))
    {
        Some((posix_sign, rest)) => format!("<{time_zone}>{posix_sign}{rest}"),
        None => time_zone.to_owned(),
    }
}

fn connect_options(url: &SecretUrl, time_zone: &str) -> Result<PgConnectOptions, StoreError> {
    super::pg_options(url).map(|o| {
        o.log_statements(tracing::log::LevelFilter::Trace)
            // Plan every execution with its real parameters. With cached
            // generic plans, a connection that prepared the cancel
            // statement while `orders`/the outbox were nearly empty
            // kept seq-scanning them as they grew (measured with `bench`
            // on a fresh database: one seq scan of each table per batch,
            // cancellations capped near 700/s). Planning costs well under
            // a millisecond per statement.
            .options([
                ("plan_cache_mode", "force_custom_plan"),
                // Zone-less `timestamp` columns are read in this zone.
                ("TimeZone", &pg_time_zone(time_zone)),
            ])
    })
}

/// A timeout as PostgreSQL's milliseconds, at least 1 (0 would mean no
/// timeout at all).
fn millis(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

/// A status code as the text bound for it (cast to the column's type).
fn text(value: &StatusValue) -> String {
    match value {
        StatusValue::Int(n) => n.to_string(),
        StatusValue::Text(s) => s.clone(),
    }
}

impl SqlDialect for Postgres {
    const DIALECT: Dialect = Dialect::Postgres;
    type Db = sqlx::Postgres;
    type Statements = Sql;
    /// The ids travel as one array parameter: no placeholder limit.
    const MAX_BATCH_IDS: usize = usize::MAX;
    const OUTBOX_COLUMNS: &'static [&'static str] = &[
        "timer",
        "order_id",
        "created_at",
        "stock_released_at",
        "event_published_at",
        "claimed_until",
        "attempts",
        "next_attempt_at",
        "last_error",
        "gave_up_at",
        "gave_up_reason",
    ];

    /// The timeouts are session settings given at connection start-up, so
    /// every statement of the pool has them (and `migrate`'s own
    /// connections do not).
    fn pool(url: &SecretUrl, pool: PoolSettings, time_zone: &str) -> Result<PgPool, StoreError> {
        let options = connect_options(url, time_zone)?.options([
            ("lock_timeout", millis(pool.lock_timeout)),
            ("statement_timeout", millis(pool.statement_timeout)),
        ]);
        Ok(PgPoolOptions::new()
            .max_connections(pool.max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(options))
    }

    async fn create_database(url: &SecretUrl) -> Result<(), StoreError> {
        let options = connect_options(url, "UTC")?;
        let name = options.get_database().unwrap_or("postgres").to_owned();
        let admin = options.database("postgres");
        let mut conn = sqlx::PgConnection::connect_with(&admin).await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await?;
        if exists {
            return Ok(());
        }
        let create = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        match conn.execute(AssertSqlSafe(create)).await {
            Ok(_) => tracing::info!(database = %name, "created database"),
            // Another process created it between our check and now.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    async fn run_migrations(url: &SecretUrl) -> Result<Migrated, StoreError> {
        let mut conn = sqlx::PgConnection::connect_with(&connect_options(url, "UTC")?).await?;
        let fresh: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NULL")
            .bind(shape::OUTBOX)
            .fetch_one(&mut conn)
            .await?;
        migrator().run(&mut conn).await?;
        if fresh {
            contract_on(&mut conn).await?;
        }
        let kept = expansions_on(&mut conn).await?;
        Ok(Migrated { fresh, kept })
    }

    async fn contract(url: &SecretUrl) -> Result<Vec<Expansion>, StoreError> {
        let mut conn = sqlx::PgConnection::connect_with(&connect_options(url, "UTC")?).await?;
        contract_on(&mut conn).await
    }

    async fn expansions(store: &PgStore) -> Result<Vec<Expansion>, StoreError> {
        let mut conn = store.pool.acquire().await?;
        expansions_on(&mut conn).await
    }

    async fn columns(store: &PgStore, table: &str) -> Result<Columns, StoreError> {
        let columns: Vec<Column> = sqlx::query_as(
            r#"
            SELECT a.attname::text AS name,
                   format_type(a.atttypid, a.atttypmod) AS shown,
                   t.typname::text AS type_name,
                   -- `character` alone is char(1): bpchar is the unbounded one.
                   CASE WHEN t.typname = 'bpchar' THEN 'bpchar'
                        ELSE format_type(a.atttypid, NULL) END AS base,
                   CASE WHEN t.typname IN ('varchar', 'bpchar') AND a.atttypmod > 4
                        THEN (a.atttypmod - 4)::int8 END AS max_chars,
                   CASE WHEN t.typname = 'numeric' AND a.atttypmod > 4
                        THEN (((a.atttypmod - 4) >> 16) & 65535)::int8 END AS precision,
                   CASE WHEN t.typname = 'numeric' AND a.atttypmod > 4
                        THEN ((a.atttypmod - 4) & 65535)::int8 END AS scale,
                   false AS unsigned
              FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
            "#,
        )
        .bind(shape::quote(Dialect::Postgres, table))
        .fetch_all(&store.pool)
        .await?;
        Ok(catalog::by_name(columns))
    }

    async fn statements(
        store: &PgStore,
        orders: &OrdersColumns,
        items: Option<&(IdColumn, String)>,
    ) -> Result<Sql, StoreError> {
        let items_base = items.map(|(_, base)| base.as_str());
        Ok(Sql::render(&store.timer, orders, items_base))
    }

    fn to_check(timer: &Timer, sql: &Sql) -> Vec<Check> {
        let check = |key, sql: &String, binds| Check {
            key,
            sql: sql.clone(),
            binds,
        };
        let mut checks = vec![check(timer.key(TimerKey::Flip), &sql.cancel, 7)];
        let rows = timer.key(TimerKey::DeadlineGuard);
        checks.push(check(rows, &sql.overdue, 6));
        checks.push(check(timer.key(TimerKey::Id), &sql.set_aside, 3));
        checks.push(check(timer.key(TimerKey::Status), &sql.prune, 2));
        checks.extend(sql.items.iter().map(|items| check("[items]", items, 1)));
        let watch = timer.key(TimerKey::DeadlineGuard);
        checks.extend(sql.due.iter().map(|due| check(watch, due, 5)));
        checks
    }

    async fn parameters(store: &PgStore, statement: &str) -> Result<usize, sqlx::Error> {
        Ok(parameter_types(store, statement).await?.len())
    }

    type AlsoParams = Vec<AlsoParam>;

    /// The types PostgreSQL infers for the statement's parameters, each
    /// the order id is then bound as ([`AlsoParam`]).
    async fn also_parameters(
        store: &PgStore,
        statement: &str,
    ) -> Result<Vec<AlsoParam>, AlsoCheckError> {
        let types = parameter_types(store, statement).await?;
        let params = types
            .into_iter()
            .enumerate()
            .map(|(n, ty)| AlsoParam::new(n + 1, ty))
            .collect::<Result<_, _>>()?;
        Ok(params)
    }

    async fn unvacuumed(store: &PgStore, tables: &[&str]) -> Result<Vec<String>, sqlx::Error> {
        let quoted: Vec<String> = tables
            .iter()
            .map(|t| shape::quote(Dialect::Postgres, t))
            .collect();
        let off: Vec<i64> = sqlx::query_scalar(
            r#"
            SELECT t.i
              FROM unnest($1::text[]) WITH ORDINALITY AS t(name, i)
              JOIN pg_class c ON c.oid = to_regclass(t.name)
             WHERE NOT current_setting('autovacuum')::bool
                OR EXISTS (SELECT 1 FROM unnest(c.reloptions) AS o(option)
                            WHERE split_part(o.option, '=', 1) = 'autovacuum_enabled'
                              AND NOT split_part(o.option, '=', 2)::bool)
             ORDER BY t.i
            "#,
        )
        .bind(&quoted)
        .fetch_all(&store.pool)
        .await?;
        Ok(off
            .into_iter()
            .filter_map(|i| tables.get(usize::try_from(i - 1).ok()?))
            .map(|t| t.to_string())
            .collect())
    }

    /// Compared as values of the status column's type (`citext`, `char(n)`,
    /// an enum compare as their type does).
    async fn same_code(
        store: &PgStore,
        orders: &OrdersColumns,
        a: &StatusValue,
        b: &StatusValue,
    ) -> Result<bool, StoreError> {
        let ty = &orders.status_type;
        let sql = format!("SELECT CAST($1::text AS {ty}) = CAST($2::text AS {ty})");
        Ok(sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(text(a))
            .bind(text(b))
            .fetch_one(&store.pool)
            .await?)
    }

    async fn count_waiting(store: &PgStore, sql: &Sql) -> Result<(i64, i64), sqlx::Error> {
        sqlx::query_as(AssertSqlSafe(sql.count.clone()))
            .bind(text(&store.timer.from))
            .fetch_one(&store.pool)
            .await
    }

    /// The cancel statement, in a transaction with the `also` statements
    /// when there are any.
    async fn cancel(
        store: &PgStore,
        prepared: &Prepared<Self>,
        ids: &[&str],
        lease: Duration,
    ) -> Result<Vec<StateRow>, StoreError> {
        let o = &store.timer;
        let query = sqlx::query_as::<_, StateRow>(AssertSqlSafe(prepared.sql.cancel.clone()))
            .bind(ids)
            .bind(text(&o.to))
            .bind(text(&o.from))
            .bind(o.paid.as_ref().map(text))
            .bind(lease)
            .bind(o.release == Release::None)
            .bind(o.name.as_str());
        if o.also.is_empty() {
            let mut conn = store.pool.acquire().await?;
            return match query.fetch_all(&mut *conn).await {
                Ok(rows) => Ok(rows),
                Err(e) => {
                    // PostgreSQL reports the error before it has ended the
                    // statement's transaction: wait for the session to be
                    // ready again, so that the rows the statement locked
                    // are free before the caller runs the batch again order
                    // by order (else they are skipped there as locked).
                    let _ = conn.ping().await;
                    Err(e.into())
                }
            };
        }
        let mut tx = store.pool.begin().await?;
        let result = cancel_with_also(&mut tx, store, prepared, query).await;
        commit_or_roll_back(tx, result).await
    }

    async fn items(
        store: &PgStore,
        prepared: &Prepared<Self>,
        ids: &[&str],
    ) -> Result<Vec<ItemRow>, StoreError> {
        let Some(sql) = &prepared.sql.items else {
            return Ok(Vec::new());
        };
        Ok(sqlx::query_as(AssertSqlSafe(sql.clone()))
            .bind(ids)
            .fetch_all(&store.pool)
            .await?)
    }

    async fn overdue(
        store: &PgStore,
        prepared: &Prepared<Self>,
        grace: Duration,
        after: Option<(chrono::DateTime<chrono::Utc>, Option<&str>)>,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        Ok(sqlx::query_as(AssertSqlSafe(prepared.sql.overdue.clone()))
            .bind(text(&store.timer.from))
            .bind(grace)
            .bind(i64::from(limit))
            .bind(after.map(|(deadline, _)| deadline))
            .bind(after.and_then(|(_, id)| id))
            .bind(store.timer.name.as_str())
            .fetch_all(&store.pool)
            .await?)
    }

    async fn set_aside(
        store: &PgStore,
        prepared: &Prepared<Self>,
        id: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(AssertSqlSafe(prepared.sql.set_aside.clone()))
            .bind(&[id][..])
            .bind(store.timer.name.as_str())
            .bind(reason)
            .execute(&store.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn prune_set_aside(
        store: &PgStore,
        prepared: &Prepared<Self>,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(AssertSqlSafe(prepared.sql.prune.clone()))
            .bind(text(&store.timer.from))
            .bind(store.timer.name.as_str())
            .execute(&store.pool)
            .await?
            .rows_affected())
    }

    async fn waiting_page(
        store: &PgStore,
        prepared: &Prepared<Self>,
        from: Option<&str>,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        Ok(
            sqlx::query_as(AssertSqlSafe(prepared.sql.waiting_page.clone()))
                .bind(text(&store.timer.from))
                .bind(from)
                .bind(i64::from(limit))
                .fetch_all(&store.pool)
                .await?,
        )
    }

    async fn due_between(
        store: &PgStore,
        prepared: &Prepared<Self>,
        after: (chrono::DateTime<chrono::Utc>, Option<&str>),
        until: chrono::DateTime<chrono::Utc>,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        let Some(sql) = &prepared.sql.due else {
            return Ok(Vec::new());
        };
        Ok(sqlx::query_as(AssertSqlSafe(sql.clone()))
            .bind(text(&store.timer.from))
            .bind(after.0)
            .bind(after.1)
            .bind(until)
            .bind(i64::from(limit))
            .fetch_all(&store.pool)
            .await?)
    }

    async fn execute(store: &PgStore, statement: Statement<'_>) -> Result<u64, StoreError> {
        let query = sqlx::query_with(AssertSqlSafe(statement.sql), arguments(&statement.values)?);
        Ok(query.execute(&store.pool).await?.rows_affected())
    }

    async fn fetch<T: OwnRow>(
        store: &PgStore,
        statement: Statement<'_>,
    ) -> Result<Vec<T>, StoreError> {
        let query =
            sqlx::query_as_with(AssertSqlSafe(statement.sql), arguments(&statement.values)?);
        Ok(query.fetch_all(&store.pool).await?)
    }
}

/// PostgreSQL's words for the statements of the service's own tables.
impl Vocabulary for Postgres {
    const NOW: &'static str = "now()";
    const ORDER_ID: &'static str = "order_id";
    /// The predicate of the partial index `order_timeout_cancel_outbox_due`
    /// (which the planner uses only when the query repeats it), then its
    /// key.
    const SWEEP_DUE: &'static str = "(stock_released_at IS NULL OR event_published_at IS NULL) \
         AND gave_up_at IS NULL AND coalesce(next_attempt_at, created_at) <= now()";
    const SWEEP_AT: &'static str = "coalesce(next_attempt_at, created_at)";
    const KEEP_EXISTING: &'static str = "ON CONFLICT DO NOTHING";

    fn placeholder(n: usize) -> String {
        format!("${n}")
    }

    fn micros(n: usize) -> String {
        format!("(${n} * interval '1 microsecond')")
    }

    fn in_ids(first: usize, _len: usize) -> String {
        format!("= ANY(${first})")
    }

    fn id_placeholders(_len: usize) -> usize {
        1
    }
}

/// Binds `values` in order; an id list as one `text[]`.
fn arguments(values: &[Value<'_>]) -> Result<sqlx::postgres::PgArguments, StoreError> {
    use sqlx::Arguments;
    let mut out = sqlx::postgres::PgArguments::default();
    for value in values {
        match *value {
            Value::Text(s) => out.add(s),
            Value::Int(n) | Value::Micros(n) => out.add(n),
            Value::Time(t) => out.add(t),
            Value::Ids(ids) => out.add(ids),
        }
        .map_err(|e| StoreError::Sql(sqlx::Error::Encode(e)))?;
    }
    Ok(out)
}

/// The statements, rendered from the mapping.
#[derive(Debug)]
pub(crate) struct Sql {
    /// `$1` ids (text[]), `$2` to (cancelled), `$3` from (unpaid), `$4`
    /// paid (text, nullable), `$5` lease (interval), `$6` nothing to
    /// release (bool), `$7` the timer's name (its outbox rows).
    cancel: String,
    /// `$1` from: rows in it passing the guard, and how many are due.
    count: String,
    /// `$1` ids (text[]) → order id, sku, quantity.
    items: Option<String>,
    /// `$1` from, `$2` grace (interval), `$3` limit, `$4` after deadline
    /// (nullable), `$5` after id at that deadline (text, nullable), `$6`
    /// the timer's name.
    overdue: String,
    /// `$1` the id (text[] of one), `$2` the timer's name, `$3` reason.
    set_aside: String,
    /// `$1` from, `$2` the timer's name.
    prune: String,
    /// `$1` from, `$2` after id (text, nullable), `$3` limit.
    waiting_page: String,
    /// A watch's scan: `$1` from, `$2` after deadline, `$3` after id at
    /// that deadline (text, nullable), `$4` until, `$5` limit. Only for a
    /// timer with a watch.
    due: Option<String>,
}

/// The pieces of the mapping every statement is rendered from.
struct Parts {
    table: String,
    id: String,
    status: String,
    deadline: String,
    guard: String,
    /// The id column's type without length or precision.
    id_base: String,
    status_type: String,
}

impl Parts {
    fn of(timer: &Timer, orders: &OrdersColumns) -> Self {
        let o = timer;
        let q = |s: &str| shape::quote(Dialect::Postgres, s);
        Self {
            table: q(&o.table),
            id: q(&o.id),
            status: q(&o.status),
            deadline: shape::deadline_sql(Dialect::Postgres, o),
            guard: shape::guard_sql(o),
            id_base: orders.id_base.clone(),
            status_type: orders.status_type.clone(),
        }
    }

    /// The status code bound as `$n`, in the status column's type.
    fn code(&self, n: u8) -> String {
        format!("CAST(${n}::text AS {})", self.status_type)
    }

    /// The rows of `o` whose id is one of the ids bound as `$1`: compared
    /// in the id column's type (its index), and read back as exactly one of
    /// them (`00123` is not `123`, `ABC` is not `abc` in a `citext`
    /// column).
    fn matches(&self) -> String {
        let Self { id, id_base, .. } = self;
        format!(
            "o.{id} = ANY(CAST($1::text[] AS {id_base}[])) \
             AND (o.{id}::text COLLATE \"C\") = ANY($1::text[])"
        )
    }
}

impl Sql {
    fn render(timer: &Timer, orders: &OrdersColumns, items_base: Option<&str>) -> Self {
        let p = Parts::of(timer, orders);
        Self {
            cancel: cancel_statement(&p, timer),
            count: count_statement(&p),
            items: items_base.map(|base| items_statement(timer, base)),
            overdue: overdue_statement(&p),
            set_aside: set_aside_statement(&p),
            prune: prune_statement(&p),
            waiting_page: waiting_page_statement(&p),
            due: timer.watch.map(|_| due_statement(&p)),
        }
    }
}

/// The cancel statement: the CTEs that change rows, then the report.
fn cancel_statement(p: &Parts, timer: &Timer) -> String {
    format!(
        "{changes}{report}",
        changes = cancel_changes(p, timer),
        report = cancel_report(p)
    )
}

/// `mine`: the rows asked about that are unpaid, overdue and passing the
/// guard, locked `FOR UPDATE SKIP LOCKED`: a row another transaction holds
/// (the shop's payment callback, say) is skipped and reported
/// [`StateRow::locked`], so one held row delays only itself, not the
/// batch; `cancelled`: the conditional UPDATE of those rows (their ids as
/// an array, not a join: the planner nested-looped over the CTE, +40% per
/// statement), each timed when it was updated; `outbox`: an outbox row
/// leased to this caller per order it flipped; `leased`: expired leases of
/// earlier cancellations with work pending, taken over.
fn cancel_changes(p: &Parts, timer: &Timer) -> String {
    let Parts {
        table,
        id,
        status,
        deadline,
        guard,
        ..
    } = p;
    let set: String = timer
        .set
        .iter()
        .map(|(column, value)| format!(", {} = {value}", shape::quote(Dialect::Postgres, column)))
        .collect();
    let (matches, cancelled, unpaid) = (p.matches(), p.code(2), p.code(3));
    format!(
        r#"
        WITH mine AS (
            SELECT o.{id} AS key, o.{id}::text AS id
              FROM {table} AS o
             WHERE {matches} AND o.{status} = {unpaid}
               AND {deadline} <= now() AND {guard}
               AND NOT EXISTS (SELECT 1 FROM order_timeout_cancel_outbox AS x
                                WHERE x.timer = $7 AND x.order_id = o.{id}::text)
               FOR UPDATE OF o SKIP LOCKED
        ), cancelled AS (
            UPDATE {table} AS o
               SET {status} = {cancelled}{set}
             WHERE {matches} AND o.{id} = ANY(ARRAY(SELECT key FROM mine))
               AND o.{status} = {unpaid}
               AND {deadline} <= now() AND {guard}
            RETURNING o.{id}::text AS id, ({deadline})::timestamptz AS expires_at,
                      clock_timestamp() AS cancelled_at
        ), outbox AS (
            INSERT INTO order_timeout_cancel_outbox
                   (timer, order_id, created_at, claimed_until, stock_released_at)
            SELECT $7, id, cancelled_at, cancelled_at + $5, CASE WHEN $6 THEN cancelled_at END
              FROM cancelled
            ON CONFLICT (timer, order_id) DO NOTHING
        ), leased AS (
            UPDATE order_timeout_cancel_outbox
               SET claimed_until = now() + $5
             WHERE timer = $7 AND order_id = ANY($1)
               AND (stock_released_at IS NULL OR event_published_at IS NULL)
               AND (claimed_until IS NULL OR claimed_until <= now())
            RETURNING order_id
        )"#
    )
}

/// `ord`: the rows asked about as they were before the UPDATE (the last
/// committed versions, also of rows another transaction holds); then one
/// [`StateRow`] per id asked about, `locked` when the row is due and unpaid
/// but not flipped and not in `mine` (looked up only for such rows).
fn cancel_report(p: &Parts) -> String {
    let Parts {
        table,
        id,
        status,
        deadline,
        guard,
        ..
    } = p;
    let (matches, cancelled, unpaid, paid) = (p.matches(), p.code(2), p.code(3), p.code(4));
    format!(
        r#", ord AS (
            SELECT o.{id}::text AS id,
                   o.{status} = {cancelled} AS is_cancelled,
                   coalesce(o.{status} = {paid}, false) AS is_paid,
                   o.{status} = {unpaid} AS is_unpaid,
                   ({deadline})::timestamptz AS expires_at,
                   coalesce({guard}, false) AS guard_ok,
                   coalesce({deadline} <= now(), false) AS due
              FROM {table} AS o
             WHERE {matches}
        )
        SELECT req.id,
               ord.id IS NOT NULL AS found,
               (c.id IS NOT NULL OR coalesce(ord.is_cancelled, false)) AS is_cancelled,
               coalesce(ord.is_paid, false) AS is_paid,
               coalesce(ord.is_unpaid, false) AS is_unpaid,
               coalesce(ord.guard_ok, false) AS guard_ok,
               coalesce(c.expires_at, ord.expires_at) AS expires_at,
               coalesce(ob.created_at, c.cancelled_at) AS cancelled_at,
               c.id IS NOT NULL AS just_cancelled,
               CASE WHEN c.id IS NULL
                         AND coalesce(ord.is_unpaid AND ord.guard_ok AND ord.due, false)
                    THEN NOT (req.id = ANY(ARRAY(SELECT id FROM mine)))
                    ELSE false END AS locked,
               (c.id IS NOT NULL OR l.order_id IS NOT NULL) AS leased,
               ob.claimed_until,
               (c.id IS NOT NULL OR ob.order_id IS NOT NULL) AS has_outbox,
               CASE WHEN c.id IS NOT NULL THEN $6
                    ELSE coalesce(ob.stock_released_at IS NOT NULL, false) END AS stock_released,
               coalesce(ob.event_published_at IS NOT NULL, false) AS event_published,
               now() AS db_now
          FROM unnest($1::text[]) AS req(id)
          LEFT JOIN ord ON ord.id = req.id
          LEFT JOIN cancelled c ON c.id = req.id
          LEFT JOIN order_timeout_cancel_outbox ob ON ob.timer = $7 AND ob.order_id = req.id
          LEFT JOIN leased l ON l.order_id = req.id
        "#
    )
}

fn count_statement(p: &Parts) -> String {
    let Parts {
        table,
        status,
        deadline,
        guard,
        ..
    } = p;
    let unpaid = p.code(1);
    format!(
        "SELECT count(*), count(*) FILTER (WHERE {deadline} <= now()) \
           FROM {table} WHERE {status} = {unpaid} AND {guard}"
    )
}

/// A digest of the whole row `o` (every column, as text): what tells a
/// row set aside from the same row changed since.
const ROW_DIGEST: &str = "md5(o::text)";

/// The sweeper's page: overdue rows in (deadline, id) order after the
/// cursor (`$4`, `$5`), leaving out the rows this timer flipped before
/// (their outbox row) and those set aside unchanged. Both are looked up by
/// their primary keys, only for the overdue rows.
fn overdue_statement(p: &Parts) -> String {
    let Parts {
        table,
        id,
        status,
        deadline,
        guard,
        id_base,
        ..
    } = p;
    let unpaid = p.code(1);
    format!(
        "SELECT o.{id}::text, ({deadline})::timestamptz FROM {table} AS o \
          WHERE o.{status} = {unpaid} AND {deadline} < now() - $2::interval AND {guard} \
            AND ($4::timestamptz IS NULL \
                 OR ({deadline} >= $4::timestamptz \
                     AND ({deadline} > $4::timestamptz \
                          OR ($5::text IS NOT NULL AND o.{id} > CAST($5::text AS {id_base}))))) \
            AND NOT EXISTS (SELECT 1 FROM order_timeout_cancel_outbox AS x \
                             WHERE x.timer = $6 AND x.order_id = o.{id}::text) \
            AND NOT EXISTS (SELECT 1 FROM order_timeout_set_aside AS s \
                             WHERE s.timer = $6 AND s.order_id = o.{id}::text \
                               AND s.row_digest = {ROW_DIGEST}) \
          ORDER BY {deadline}, o.{id} LIMIT $3"
    )
}

/// Records the row as set aside, with its digest (replacing an older
/// mark of the same order).
fn set_aside_statement(p: &Parts) -> String {
    let Parts { table, id, .. } = p;
    let matches = p.matches();
    format!(
        "INSERT INTO order_timeout_set_aside (timer, order_id, row_digest, reason) \
         SELECT $2, o.{id}::text, {ROW_DIGEST}, $3 FROM {table} AS o WHERE {matches} \
         ON CONFLICT (timer, order_id) DO UPDATE \
            SET row_digest = EXCLUDED.row_digest, reason = EXCLUDED.reason, \
                set_aside_at = EXCLUDED.set_aside_at"
    )
}

/// Forgets the marks whose row is gone or out of the `from` status.
fn prune_statement(p: &Parts) -> String {
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
fn due_statement(p: &Parts) -> String {
    let Parts {
        table,
        id,
        status,
        deadline,
        guard,
        id_base,
        ..
    } = p;
    let from = p.code(1);
    format!(
        "SELECT o.{id}::text, ({deadline})::timestamptz FROM {table} AS o \
          WHERE o.{status} = {from} AND {guard} \
            AND {deadline} >= $2::timestamptz AND {deadline} <= $4::timestamptz \
            AND ({deadline} > $2::timestamptz \
                 OR ({deadline} = $2::timestamptz AND $3::text IS NOT NULL \
                     AND o.{id} > CAST($3::text AS {id_base}))) \
          ORDER BY {deadline}, o.{id} LIMIT $5"
    )
}

fn waiting_page_statement(p: &Parts) -> String {
    let Parts {
        table,
        id,
        status,
        deadline,
        guard,
        id_base,
        ..
    } = p;
    let unpaid = p.code(1);
    format!(
        "SELECT {id}::text, ({deadline})::timestamptz FROM {table} \
          WHERE {status} = {unpaid} AND {guard} \
            AND ($2::text IS NULL OR {id} > CAST($2::text AS {id_base})) \
          ORDER BY {id} LIMIT $3"
    )
}

fn items_statement(timer: &Timer, order_id_base: &str) -> String {
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

/// `numeric`, `uuid` (no sqlx feature names them here).
const NUMERIC: Oid = Oid(1700);
const UUID: Oid = Oid(2950);

/// Prepares `statement` on a connection of the pool, returning the types
/// PostgreSQL inferred for its parameters. The statement stays in that
/// connection's statement cache with those types, which is why every
/// value later bound to it must be encoded as them ([`AlsoParam`]).
async fn parameter_types(store: &PgStore, statement: &str) -> Result<Vec<PgTypeInfo>, sqlx::Error> {
    let mut conn = store.pool.acquire().await?;
    let prepared = conn
        .prepare(AssertSqlSafe(statement.to_owned()).into_sql_str())
        .await?;
    Ok(sqlx::Statement::parameters(&prepared)
        .and_then(|p| p.left())
        .map(<[PgTypeInfo]>::to_vec)
        .unwrap_or_default())
}

/// How the order id is bound to one parameter of an `also` statement: as
/// the type PostgreSQL inferred for the parameter when the check prepared
/// the statement (`text` for `$1::text` or a text column, `bigint` where
/// it is compared with a bigint column, the id column's own type, …).
///
/// sqlx keeps a prepared statement in each connection's cache under its
/// text, with the parameter types of its first preparation: on the
/// connection the check prepared it on, the types the server inferred; on
/// the others, the types of the values first bound. An id encoded as
/// another type than the statement's parameter (an `int4` sent to a
/// parameter inferred as `text`) is read as that type's bytes there
/// (`invalid byte sequence for encoding "UTF8": 0x00`), so every
/// connection must be sent the same type: the inferred one.
#[derive(Clone, Debug)]
pub(crate) struct AlsoParam {
    /// `$n`.
    n: usize,
    /// The parameter's type, as PostgreSQL inferred it (a domain's own).
    ty: PgTypeInfo,
    /// The type's base, as a column an id can be a value of.
    base: IdColumn,
}

impl AlsoParam {
    /// Parameter `$n` of type `ty`, if an order id can be bound as it.
    fn new(n: usize, ty: PgTypeInfo) -> Result<Self, AlsoCheckError> {
        let name = base_type_name(&ty);
        match IdColumn::of_parameter(&name) {
            Some(base) => Ok(Self { n, ty, base }),
            None => Err(AlsoCheckError::Unbindable(format!(
                "parameter ${n} is of type {name} in this statement: the order id is bound as \
                 text, an integer, numeric or uuid; cast it (${n}::text, ${n}::bigint)"
            ))),
        }
    }

    /// The order `id` (canonical for the id column) as this parameter's
    /// value, or why it cannot be one (`abc` for a `bigint` parameter).
    fn bind(&self, id: &str) -> Result<BoundId<'_>, String> {
        match self.base.value(id) {
            Ok(value) => Ok(BoundId {
                ty: &self.ty,
                value,
            }),
            Err(rejected) => Err(format!(
                "order id {id:?} cannot be bound to ${} of an `also` statement: {rejected}",
                self.n
            )),
        }
    }
}

/// The name of `ty`'s base type (`pg_type.typname`): a domain's base, a
/// built-in type by its oid, another type by its name (`citext`).
fn base_type_name(ty: &PgTypeInfo) -> String {
    if let PgTypeKind::Domain(base) = ty.kind() {
        return base_type_name(base);
    }
    let builtin = match ty.oid().map(|oid| oid.0) {
        Some(21) => "int2",
        Some(23) => "int4",
        Some(20) => "int8",
        Some(1700) => "numeric",
        Some(2950) => "uuid",
        Some(25) => "text",
        Some(1043) => "varchar",
        Some(1042) => "bpchar",
        Some(19) => "name",
        Some(705) => "unknown",
        _ => return sqlx::TypeInfo::name(ty).to_ascii_lowercase(),
    };
    builtin.to_owned()
}

/// An order id bound as an [`AlsoParam`]'s type: its value encoded in the
/// parameter's base type, declared as the parameter's own type.
#[derive(Debug)]
pub(crate) struct BoundId<'a> {
    ty: &'a PgTypeInfo,
    value: IdValue,
}

impl sqlx::Type<sqlx::Postgres> for BoundId<'_> {
    fn type_info() -> PgTypeInfo {
        <str as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

impl Encode<'_, sqlx::Postgres> for BoundId<'_> {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        self.value.encode_by_ref(buf)
    }

    fn produces(&self) -> Option<PgTypeInfo> {
        Some(self.ty.clone())
    }
}

/// Bound as text unless [`Encode::produces`] says otherwise per value.
impl sqlx::Type<sqlx::Postgres> for IdValue {
    fn type_info() -> PgTypeInfo {
        <str as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

/// An order id in the id column's own type: `int2`/`int4`/`int8`,
/// `numeric` (binary: base-10000 digits), `uuid` (16 bytes) or text.
impl Encode<'_, sqlx::Postgres> for IdValue {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        match self {
            Self::Text(s) => <&str as Encode<sqlx::Postgres>>::encode(s.as_str(), buf),
            Self::I16(n) => <i16 as Encode<sqlx::Postgres>>::encode_by_ref(n, buf),
            Self::I32(n) => <i32 as Encode<sqlx::Postgres>>::encode_by_ref(n, buf),
            Self::I64(n) => <i64 as Encode<sqlx::Postgres>>::encode_by_ref(n, buf),
            Self::U64(n) => {
                buf.extend(numeric(&n.to_string()));
                Ok(IsNull::No)
            }
            Self::Decimal(digits) => {
                buf.extend(numeric(digits));
                Ok(IsNull::No)
            }
            Self::Uuid(bytes) => {
                buf.extend_from_slice(bytes);
                Ok(IsNull::No)
            }
        }
    }

    fn produces(&self) -> Option<PgTypeInfo> {
        Some(match self {
            Self::Text(_) => <str as sqlx::Type<sqlx::Postgres>>::type_info(),
            Self::I16(_) => <i16 as sqlx::Type<sqlx::Postgres>>::type_info(),
            Self::I32(_) => <i32 as sqlx::Type<sqlx::Postgres>>::type_info(),
            Self::I64(_) => <i64 as sqlx::Type<sqlx::Postgres>>::type_info(),
            Self::U64(_) | Self::Decimal(_) => PgTypeInfo::with_oid(NUMERIC),
            Self::Uuid(_) => PgTypeInfo::with_oid(UUID),
        })
    }
}

/// A whole number (an optional `-`, then digits without leading zeros) in
/// `numeric`'s binary form: digit count, weight, sign, display scale, then
/// base-10000 digits, most significant first.
fn numeric(number: &str) -> Vec<u8> {
    let (sign, digits) = match number.strip_prefix('-') {
        Some(digits) => (0x4000u16, digits),
        None => (0x0000u16, number),
    };
    let digits = digits.trim_start_matches('0');
    // Groups of four decimal digits from the right.
    let first = match digits.len() % 4 {
        0 => 4,
        n => n,
    };
    let mut groups: Vec<i16> = Vec::new();
    let mut rest = digits;
    let mut take = first;
    while !rest.is_empty() {
        let (group, tail) = rest.split_at(take);
        groups.push(group.parse().unwrap_or(0));
        rest = tail;
        take = 4;
    }
    let count = groups.len() as i16;
    let mut out = Vec::with_capacity(8 + 2 * groups.len());
    out.extend(count.to_be_bytes());
    out.extend((count - 1).max(0).to_be_bytes());
    out.extend(if groups.is_empty() { 0 } else { sign }.to_be_bytes());
    out.extend(0i16.to_be_bytes());
    for group in groups {
        out.extend(group.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::numeric;

    #[test]
    fn numerics_are_base_10000_digits() {
        let header = |n: i16, weight: i16, sign: u16| {
            let mut h = Vec::new();
            h.extend(n.to_be_bytes());
            h.extend(weight.to_be_bytes());
            h.extend(sign.to_be_bytes());
            h.extend(0i16.to_be_bytes());
            h
        };
        assert_eq!(numeric("0"), header(0, 0, 0));
        let mut seven = header(1, 0, 0);
        seven.extend(7i16.to_be_bytes());
        assert_eq!(numeric("7"), seven);
        let mut big = header(3, 2, 0x4000);
        for g in [12i16, 3456, 7890] {
            big.extend(g.to_be_bytes());
        }
        assert_eq!(numeric("-1234567890"), big);
    }
}
