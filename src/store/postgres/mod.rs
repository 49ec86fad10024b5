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
use crate::store::zones::ZoneFacts;
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

/// Sets the session's `TimeZone` to `zone` (the timer's `time_zone`, in
/// PostgreSQL's form), or, with none, to the zone a session of this role
/// starts in on this database when it names none itself
/// ([`default_zones`]): the zone the shop's own sessions (and their
/// `localtimestamp`) run in. Run on every new connection of a pool.
async fn set_session_zone(conn: &mut sqlx::PgConnection, zone: Option<&str>) -> sqlx::Result<()> {
    let zone = match zone {
        Some(zone) => zone.to_owned(),
        None => default_zones(conn).await?.service.0,
    };
    sqlx::query("SELECT set_config('TimeZone', $1, false)")
        .bind(zone)
        .execute(conn)
        .await?;
    Ok(())
}

/// The zones sessions start in on this database when the client names none
/// (sqlx always names UTC, so the service has to work it out): for the
/// service's own role, and for every other role whose sessions start
/// elsewhere.
struct DefaultZones {
    /// The service's role's: the zone and where it comes from.
    service: (String, String),
    /// Other roles' (each role with a `timezone` of its own, and "other
    /// roles"): whose, and the zone.
    others: Vec<(String, String)>,
}

/// PostgreSQL's order, most specific first: `ALTER ROLE r IN DATABASE d
/// SET timezone`, `ALTER ROLE r SET`, `ALTER DATABASE d SET`, `ALTER ROLE
/// ALL SET`, then the server's configuration (`postgresql.conf`, `ALTER
/// SYSTEM`), read from `pg_file_settings` where the role may; else its
/// `log_timezone` (initdb writes both from the machine's zone).
async fn default_zones(conn: &mut sqlx::PgConnection) -> sqlx::Result<DefaultZones> {
    // (role, or none for every role; this database only; zone)
    let settings: Vec<(Option<String>, bool, String)> = sqlx::query_as(
        "SELECT r.rolname::text, s.setdatabase <> 0, substr(c, 10) \
           FROM pg_db_role_setting s \
           LEFT JOIN pg_roles r ON r.oid = s.setrole AND s.setrole <> 0 \
          CROSS JOIN LATERAL unnest(s.setconfig) AS c \
          WHERE lower(c) LIKE 'timezone=%' \
            AND s.setdatabase IN (0, (SELECT oid FROM pg_database \
                                       WHERE datname = current_database()))",
    )
    .fetch_all(&mut *conn)
    .await?;
    let me: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut *conn)
        .await?;
    let server = server_zone(conn).await?;
    let service = effective_zone(&settings, Some(&me), &server);
    let mut others = Vec::new();
    let mut roles: Vec<&str> = (settings.iter())
        .filter_map(|(role, _, _)| role.as_deref())
        .filter(|role| *role != me)
        .collect();
    roles.sort_unstable();
    roles.dedup();
    for role in roles {
        let (zone, _) = effective_zone(&settings, Some(role), &server);
        others.push((format!("role {role}"), zone));
    }
    let (zone, _) = effective_zone(&settings, None, &server);
    others.push(("other roles".to_owned(), zone));
    Ok(DefaultZones { service, others })
}

/// The zone of the server's configuration (`postgresql.conf`, `ALTER
/// SYSTEM`) and where it was read: `pg_file_settings` where the role may
/// read it (its built-in default, GMT, when no file sets one), else the
/// server's `log_timezone`.
async fn server_zone(conn: &mut sqlx::PgConnection) -> sqlx::Result<(String, String)> {
    let readable: bool = sqlx::query_scalar(
        "SELECT has_function_privilege('pg_show_all_file_settings()', 'EXECUTE')",
    )
    .fetch_one(&mut *conn)
    .await?;
    let file: Option<String> = if readable {
        sqlx::query_scalar(
            "SELECT setting FROM pg_file_settings \
              WHERE lower(name) = 'timezone' AND error IS NULL \
              ORDER BY seqno DESC LIMIT 1",
        )
        .fetch_optional(&mut *conn)
        .await?
    } else {
        None
    };
    Ok(match (readable, file) {
        (_, Some(zone)) => (zone, "the server's configuration".to_owned()),
        (true, None) => {
            let boot: String =
                sqlx::query_scalar("SELECT boot_val FROM pg_settings WHERE name = 'TimeZone'")
                    .fetch_one(&mut *conn)
                    .await?;
            (boot, "the server's built-in default".to_owned())
        }
        (false, None) => {
            let log: String = sqlx::query_scalar("SELECT current_setting('log_timezone')")
                .fetch_one(&mut *conn)
                .await?;
            (
                log,
                "the server's log_timezone: this role may not read its timezone setting".to_owned(),
            )
        }
    })
}

/// The zone a session of `role` (none: a role without settings of its
/// own) starts in, and where it comes from, by PostgreSQL's precedence.
fn effective_zone(
    settings: &[(Option<String>, bool, String)],
    role: Option<&str>,
    server: &(String, String),
) -> (String, String) {
    let find = |of_role: bool, this_db: bool| {
        settings.iter().find(|(r, db, _)| {
            *db == this_db
                && match (of_role, r.as_deref(), role) {
                    (true, Some(r), Some(role)) => r == role,
                    (true, _, _) => false,
                    (false, r, _) => r.is_none(),
                }
        })
    };
    let steps = [
        (true, true, "the role's setting in this database"),
        (true, false, "the role's setting"),
        (false, true, "the database's setting"),
        (false, false, "the setting of every role"),
    ];
    for (of_role, this_db, whose) in steps {
        if let Some((_, _, zone)) = find(of_role, this_db) {
            let whose = match role {
                Some(role) if of_role => format!("{whose} (role {role})"),
                _ => whose.to_owned(),
            };
            return (zone.clone(), whose);
        }
    }
    server.clone()
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

    fn connect_options(
        url: &SecretUrl,
        time_zone: Option<&str>,
    ) -> Result<PgConnectOptions, StoreError> {
        super::pg_options(url).map(|o| {
            let o = o
                .log_statements(tracing::log::LevelFilter::Trace)
                // Plan every execution with its real parameters. With cached
                // generic plans, a connection that prepared the cancel
                // statement while `orders`/the outbox were nearly empty
                // kept seq-scanning them as they grew (measured with `bench`
                // on a fresh database: one seq scan of each table per batch,
                // cancellations capped near 700/s). Planning costs well under
                // a millisecond per statement.
                .options([("plan_cache_mode", "force_custom_plan")]);
            // The zone is set after connecting ([`set_session_zone`]): sqlx
            // sends `TimeZone=UTC` in the start-up packet, which outranks
            // any zone given in `options` and the role's and database's own.
            let _ = time_zone;
            o
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
    fn pool(
        url: &SecretUrl,
        pool: PoolSettings,
        time_zone: Option<&str>,
    ) -> Result<PgPool, StoreError> {
        let options = Self::connect_options(url, time_zone)?.options([
            ("lock_timeout", millis(pool.lock_timeout)),
            ("statement_timeout", millis(pool.statement_timeout)),
            (
                "idle_in_transaction_session_timeout",
                millis(pool.client_timeout),
            ),
        ]);
        let zone = time_zone.map(pg_time_zone);
        Ok(pool_options::<Self>(pool)
            .after_connect(move |conn, _| {
                let zone = zone.clone();
                Box::pin(async move { set_session_zone(conn, zone.as_deref()).await })
            })
            .connect_lazy_with(options))
    }

    async fn create_database(url: &SecretUrl) -> Result<(), StoreError> {
        let options = Self::connect_options(url, Some("UTC"))?;
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

    /// The pool's `TimeZone` and its offsets; then the zone a session of
    /// the service's role starts in on this database, and the zones other
    /// roles' sessions start in where they differ ([`default_zones`]).
    async fn zone_facts(store: &PgStore) -> Result<ZoneFacts, StoreError> {
        let (session, january, july): (String, i32, i32) = sqlx::query_as(
            "SELECT current_setting('TimeZone'), \
                    extract(timezone FROM make_timestamptz( \
                        extract(year FROM now())::int, 1, 15, 12, 0, 0))::int4, \
                    extract(timezone FROM make_timestamptz( \
                        extract(year FROM now())::int, 7, 15, 12, 0, 0))::int4",
        )
        .fetch_one(&store.pool)
        .await?;
        let mut conn = store.pool.acquire().await?;
        let zones = default_zones(&mut conn).await?;
        drop(conn);
        let others = zones
            .others
            .into_iter()
            .filter(|(_, zone)| !zone.eq_ignore_ascii_case(&zones.service.0))
            .collect();
        Ok(ZoneFacts {
            session,
            offsets: (january, july),
            server: format!("{} ({})", zones.service.0, zones.service.1),
            others,
        })
    }

    async fn check_zone(store: &PgStore) -> Result<(), StoreError> {
        let Some(zone) = store.timer.time_zone.as_deref() else {
            return Ok(());
        };
        let mut plain = Self::connect_options(&store.url, None)?.connect().await?;
        let set = sqlx::query("SELECT set_config('TimeZone', $1, false)")
            .bind(pg_time_zone(zone))
            .execute(&mut plain)
            .await;
        let _ = plain.close().await;
        set.map(drop).map_err(StoreError::from)
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

    /// PostgreSQL compares a zone-less `timestamp` with `now()` as the
    /// instant it stands for in the session's zone, an ambiguous or skipped
    /// wall-clock time as the later one: nothing to add where the zone
    /// shifts.
    fn shop_now(_shifts: bool) -> String {
        "now()".to_owned()
    }

    fn text(expr: &str) -> String {
        format!("({expr})::text")
    }

    fn int8(expr: &str) -> String {
        format!("({expr})::int8")
    }

    fn count_if(condition: &str) -> String {
        format!("count(*) FILTER (WHERE {condition})")
    }

    fn epoch_micros(deadline: &str, usable: &str, _shifts: bool) -> String {
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
