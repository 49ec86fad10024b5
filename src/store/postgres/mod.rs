//! PostgreSQL: ids and status codes are bound as text and cast to the
//! columns' own types ([`Vocabulary::cast`]), so integer, uuid and text
//! columns (and enums) all work with their indexes; ids are cast to the id
//! column's type without its length or precision (`character varying`,
//! not `character varying(8)`, which would truncate), only after the
//! shared flow checked that the column can hold them. The `also`
//! statements are bound the id as the types PostgreSQL inferred for their
//! parameters (`also.rs`, `binding.rs`).

use std::time::Duration;

use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPool, PgStatement};
use sqlx::{Arguments, AssertSqlSafe, ConnectOptions, Connection, Executor, SqlSafeStr};

use crate::settings::{SecretUrl, StatusValue};
use crate::store::catalog::{self, Column, Columns};
use crate::store::ids::IdValue;
use crate::store::outbox::{NewOutboxRow, OwnRow, Statement, Value, Vocabulary};
use crate::store::releases::{self, Expansion};
use crate::store::shape::{self, OrdersColumns};
use crate::store::sql::{Prepared, SqlDialect, SqlStore, pool_options};
use crate::store::{Dialect, PoolSettings, StoreError};

mod also;
mod binding;

use binding::AlsoParam;

/// PostgreSQL, as a [`SqlDialect`].
#[derive(Debug)]
pub(crate) struct Postgres;

/// The store on PostgreSQL.
pub(crate) type PgStore = SqlStore<Postgres>;

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

/// A timeout as PostgreSQL's milliseconds, at least 1 (0 would mean no
/// timeout at all) and at most the largest it takes (`INT_MAX`, 24.8 days:
/// a larger one refuses the connection).
fn millis(d: Duration) -> String {
    d.as_millis().clamp(1, i32::MAX as u128).to_string()
}

impl SqlDialect for Postgres {
    type Db = sqlx::Postgres;
    /// Nothing beyond the shared statements.
    type Statements = ();
    const FRESH: &'static str = "SELECT to_regclass('order_timeout_cancel_outbox') IS NULL";
    const EXPANSIONS: &'static [Expansion] = &[releases::OUTBOX_ORDER_ID_UNIQUE];

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

    /// The timeouts are session settings given at connection start-up, so
    /// every statement of the pool has them (and `migrate`'s own
    /// connections do not). A transaction idle for the client's own bound
    /// (`[liveness].database_timeout`) was abandoned by the client, its
    /// answer lost to a silent network (`bounded.rs`): the server ends it
    /// then, releasing its row locks, rather than when the client's close
    /// finally reaches it (tens of seconds after the network heals). The
    /// service never leaves a transaction idle between its statements.
    fn pool(url: &SecretUrl, pool: PoolSettings, time_zone: &str) -> Result<PgPool, StoreError> {
        let options = Self::connect_options(url, time_zone)?.options([
            ("lock_timeout", millis(pool.lock_timeout)),
            ("statement_timeout", millis(pool.statement_timeout)),
            (
                "idle_in_transaction_session_timeout",
                millis(pool.client_timeout),
            ),
        ]);
        Ok(pool_options::<Self>(pool).connect_lazy_with(options))
    }

    async fn create_database(url: &SecretUrl) -> Result<(), StoreError> {
        let options = Self::connect_options(url, "UTC")?;
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

    async fn run_migrations(conn: &mut sqlx::PgConnection) -> Result<(), StoreError> {
        let mut migrator = sqlx::migrate!("./migrations/postgres");
        migrator.dangerous_set_table_name("order_timeout_migrations");
        Ok(migrator.run(conn).await?)
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

    async fn statements(_: &PgStore, _: &OrdersColumns) -> Result<(), StoreError> {
        Ok(())
    }

    async fn prepare(store: &PgStore, statement: String) -> sqlx::Result<PgStatement> {
        let mut conn = store.pool.acquire().await?;
        conn.prepare(AssertSqlSafe(statement).into_sql_str()).await
    }

    type AlsoParams = Vec<AlsoParam>;

    /// The types PostgreSQL inferred for the statement's parameters, each
    /// the order id is then bound as ([`AlsoParam`]). The statement stays
    /// in that connection's statement cache with those types, which is why
    /// every id later bound to it must be encoded as them.
    fn also_parameters(statement: &PgStatement) -> Result<Vec<AlsoParam>, String> {
        let types = sqlx::Statement::parameters(statement).and_then(|p| p.left());
        (types.unwrap_or_default().iter().enumerate())
            .map(|(n, ty)| AlsoParam::new(n + 1, ty.clone()))
            .collect()
    }

    async fn unvacuumed(store: &PgStore, tables: &[&str]) -> Result<Vec<String>, sqlx::Error> {
        let mut off = Vec::new();
        for table in tables {
            let unvacuumed: bool = sqlx::query_scalar(
                "SELECT to_regclass($1) IS NOT NULL AND (NOT current_setting('autovacuum')::bool \
                     OR EXISTS (SELECT 1 FROM pg_class c, unnest(c.reloptions) AS o(option) \
                                 WHERE c.oid = to_regclass($1) \
                                   AND split_part(o.option, '=', 1) = 'autovacuum_enabled' \
                                   AND NOT split_part(o.option, '=', 2)::bool))",
            )
            .bind(shape::quote(Dialect::Postgres, table))
            .fetch_one(&store.pool)
            .await?;
            if unvacuumed {
                off.push(table.to_string());
            }
        }
        Ok(off)
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
            .bind(a.as_text())
            .bind(b.as_text())
            .fetch_one(&store.pool)
            .await?)
    }

    /// Each statement bound the id as the types PostgreSQL inferred for
    /// its parameters ([`AlsoParam`]), after `SET LOCAL lock_timeout`.
    async fn also(
        conn: &mut sqlx::PgConnection,
        store: &PgStore,
        prepared: &Prepared<Self>,
        id: &str,
    ) -> Result<(), StoreError> {
        also::also(conn, store, prepared, id).await
    }

    async fn execute(
        conn: &mut sqlx::PgConnection,
        statement: Statement<'_>,
    ) -> Result<u64, StoreError> {
        let query = sqlx::query_with(AssertSqlSafe(statement.sql), arguments(&statement.values)?);
        Ok(query.execute(conn).await?.rows_affected())
    }

    async fn fetch<T: OwnRow>(
        conn: &mut sqlx::PgConnection,
        statement: Statement<'_>,
    ) -> Result<Vec<T>, StoreError> {
        let query =
            sqlx::query_as_with(AssertSqlSafe(statement.sql), arguments(&statement.values)?);
        Ok(query.fetch_all(conn).await?)
    }
}

/// PostgreSQL's words for the statements of the service's own tables.
impl Vocabulary for Postgres {
    const DIALECT: Dialect = Dialect::Postgres;
    const NOW: &'static str = "now()";
    const CLOCK: &'static str = "clock_timestamp()";
    const ORDER_ID: &'static str = "order_id";
    /// The predicate of the partial index `order_timeout_cancel_outbox_due`
    /// (which the planner uses only when the query repeats it), then its
    /// key.
    const SWEEP_DUE: &'static str = "(stock_released_at IS NULL OR event_published_at IS NULL) \
         AND gave_up_at IS NULL AND coalesce(next_attempt_at, created_at) <= now()";
    const SWEEP_AT: &'static str = "coalesce(next_attempt_at, created_at)";
    /// Byte order, as the history index `order_timeout_cancel_outbox_history`
    /// keeps it (whatever the database's collation).
    const ORDER_KEY: &'static str = "order_id COLLATE \"C\"";
    fn keep_existing(_column: &str) -> String {
        "ON CONFLICT DO NOTHING".into()
    }

    fn placeholder(n: usize) -> String {
        format!("${n}")
    }

    /// Typed: the schema check prepares statements without binding them,
    /// and sqlx keeps each connection's first preparation of a text with
    /// the parameter types the server inferred then: an untyped `$n *
    /// interval` is inferred `float8`, and a bound `int8` would be read as
    /// a float's bits (a grace of 60 s as 0).
    fn micros(n: usize) -> String {
        format!("(${n}::int8 * interval '1 microsecond')")
    }

    fn in_ids(first: usize, _len: usize) -> String {
        format!("= ANY(${first})")
    }

    fn id_placeholders(_len: usize) -> usize {
        1
    }

    fn cast(n: usize, ty: &str) -> String {
        format!("CAST(${n}::text AS {ty})")
    }

    fn in_cast_ids(first: usize, _len: usize, ty: &str) -> String {
        format!("= ANY(CAST(${first}::text[] AS {ty}[]))")
    }

    fn shop_time(n: usize) -> String {
        format!("${n}::timestamptz")
    }

    const SHOP_NOW: &'static str = "now()";

    fn text(expr: &str) -> String {
        format!("({expr})::text")
    }

    fn int8(expr: &str) -> String {
        format!("({expr})::int8")
    }

    fn count_if(condition: &str) -> String {
        format!("count(*) FILTER (WHERE {condition})")
    }

    fn epoch_micros(deadline: &str, usable: &str) -> String {
        format!(
            "CASE WHEN {usable} THEN \
             (extract(epoch FROM ({deadline})::timestamptz) * 1000000)::int8 END"
        )
    }

    /// Every column, as the row's text.
    fn row_digest(_columns: &[String]) -> String {
        "md5(o::text)".into()
    }

    /// Four arrays, however many rows.
    fn outbox_rows(timer: &str, n: usize, _len: usize) -> (String, usize) {
        let (a, b, c) = (n + 1, n + 2, n + 3);
        let rows = format!(
            "SELECT '{timer}', * FROM unnest(${n}::text[], ${a}::timestamptz[], \
             ${b}::timestamptz[], ${c}::timestamptz[])"
        );
        (rows, 4)
    }

    /// The ids are bound as one array, and the outbox rows as four.
    const MAX_BATCH_IDS: usize = usize::MAX;
}

/// Binds `values` in order; an id list as one `text[]`.
fn arguments(values: &[Value<'_>]) -> Result<PgArguments, StoreError> {
    let mut out = PgArguments::default();
    for value in values {
        match *value {
            Value::Text(s) => out.add(s),
            Value::Int(n) | Value::Micros(n) => out.add(n),
            Value::Time(t) => out.add(t),
            Value::Ids(ids) => out.add(ids),
            Value::MaybeText(s) => out.add(s),
            Value::Bytes(b) => out.add(b),
            Value::Nums(nums) => out.add(nums),
            Value::Status(code) => out.add(code.as_text()),
            Value::MaybeStatus(code) => out.add(code.map(StatusValue::as_text)),
            Value::RowId(id) => out.add(id.map(IdValue::text)),
            Value::RowIds(ids) | Value::ItemIds(ids) => {
                out.add(ids.iter().map(IdValue::text).collect::<Vec<_>>())
            }
            Value::ShopTime(t) => out.add(t),
            Value::NewOutboxRows(_, rows) => add_outbox_rows(&mut out, rows),
        }
        .map_err(|e| StoreError::Sql(sqlx::Error::Encode(e)))?;
    }
    Ok(out)
}

/// New outbox rows as four arrays, one a column.
fn add_outbox_rows(out: &mut PgArguments, rows: &[NewOutboxRow<'_>]) -> Result<(), BoxDynError> {
    out.add(rows.iter().map(|r| r.order_id).collect::<Vec<_>>())?;
    out.add(rows.iter().map(|r| r.created_at).collect::<Vec<_>>())?;
    out.add(rows.iter().map(|r| r.claimed_until).collect::<Vec<_>>())?;
    out.add(rows.iter().map(|r| r.stock_released_at).collect::<Vec<_>>())
}
