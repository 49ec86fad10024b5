//! PostgreSQL: the cancel transaction as one statement (CTEs with
//! `UPDATE … RETURNING` over `unnest($1::text[])`), so a batch costs one
//! round trip and one commit; with `also` statements, that statement and
//! the statements for each order it cancelled in one transaction.
//!
//! Every statement is rendered once from the mapping ([`Sql::render`]) after
//! the shop's table was read: ids and status codes are bound as text and
//! cast to the columns' own types, so integer, uuid and text columns (and
//! enums) all work with their indexes.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Executor, SqlSafeStr};
use tokio::sync::OnceCell;

use super::shape::{self, IdKind, SchemaReport};
use super::state::StateRow;
use super::{Dialect, OrderItem, OrderState, OrderStore, ShopSchema, StoreError};
use crate::message::OrderId;
use crate::settings::{Release, SecretUrl, StatusValue};

/// The service's own migrations for PostgreSQL (`migrations/postgres/`),
/// recorded in their own table, `order_timeout_migrations`, so they never
/// mix with the shop's own sqlx migrations in a shared database.
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("./migrations/postgres");
    migrator.dangerous_set_table_name("order_timeout_migrations");
    migrator
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

/// The store on PostgreSQL: a connection pool, the mapping, and the
/// statements rendered from it.
#[derive(Debug)]
pub struct PgStore {
    pool: PgPool,
    schema: ShopSchema,
    prepared: OnceCell<Prepared>,
    id_kind: OnceLock<IdKind>,
    /// Taken by cancel transactions that run `also` statements: they
    /// update the shop's hot rows (stock), and concurrent ones deadlocked
    /// (`bench --stock also` on MariaDB: p50 lateness 1 s, p99 16 s with
    /// four at a time, deadlock retries included); one at a time per
    /// instance, they do not wait on each other.
    also_turn: tokio::sync::Mutex<()>,
}

/// The statements and what the check found.
#[derive(Debug)]
struct Prepared {
    sql: Sql,
    report: SchemaReport,
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

impl PgStore {
    /// Connects a pool of at most `max_connections` (lazily: the first query
    /// opens the first connection, so start-up does not fail on a database
    /// that is still booting).
    pub fn connect_lazy(
        url: &SecretUrl,
        max_connections: u32,
        schema: &ShopSchema,
    ) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_lazy_with(connect_options(url, &schema.orders.time_zone)?);
        Ok(Self {
            pool,
            schema: schema.clone(),
            prepared: OnceCell::new(),
            id_kind: OnceLock::new(),
            also_turn: tokio::sync::Mutex::new(()),
        })
    }

    /// Creates the database if it does not exist, then applies the embedded
    /// migrations.
    #[tracing::instrument(skip_all, fields(url = %url))]
    pub async fn migrate(url: &SecretUrl) -> Result<(), StoreError> {
        let options = connect_options(url, "UTC")?;
        let name = options.get_database().unwrap_or("postgres").to_owned();
        let admin = options.clone().database("postgres");
        let mut conn = sqlx::PgConnection::connect_with(&admin).await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await?;
        if !exists {
            let create = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
            match conn.execute(sqlx::AssertSqlSafe(create)).await {
                Ok(_) => tracing::info!(database = %name, "created database"),
                // Another process created it between our check and now.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
                Err(e) => return Err(e.into()),
            }
        }
        drop(conn);
        let mut conn = sqlx::PgConnection::connect_with(&options).await?;
        migrator().run(&mut conn).await?;
        Ok(())
    }

    async fn prepared(&self) -> Result<&Prepared, StoreError> {
        self.prepared
            .get_or_try_init(|| async {
                let prepared = self.check().await?;
                let _ = self.id_kind.set(prepared.report.id_kind);
                Ok(prepared)
            })
            .await
    }

    /// Reads the shop's table, checks the mapping, renders and prepares
    /// every statement.
    #[tracing::instrument(skip_all)]
    async fn check(&self) -> Result<Prepared, StoreError> {
        let o = &self.schema.orders;
        shape::check_orders_identifiers(o)?;
        let columns = self.columns(&o.table).await?;
        let shape::OrdersColumns {
            id_type,
            id_kind,
            status_type,
        } = shape::check_orders_columns(o, &columns)?;
        let items = match self.schema.release {
            Release::Grpc => Some(self.items_columns().await?),
            Release::None => None,
        };
        let sql = Sql::render(&self.schema, &id_type, &status_type, items.as_ref());
        let unpaid = self.check_statements(&sql).await?;
        let columns = shape::OrdersColumns {
            id_type,
            id_kind,
            status_type,
        };
        let report = SchemaReport::new(Dialect::Postgres, &self.schema, columns, unpaid);
        Ok(Prepared { sql, report })
    }

    /// `name -> (formatted type, type name)` of a table's columns.
    async fn columns(&self, table: &str) -> Result<HashMap<String, (String, String)>, StoreError> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            r#"
            SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.typname::text
              FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
            "#,
        )
        .bind(shape::quote(Dialect::Postgres, table))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(n, f, t)| (n, (f, t))).collect())
    }

    /// The items table's order id type, after checking its columns.
    async fn items_columns(&self) -> Result<String, StoreError> {
        let i = &self.schema.items;
        shape::check_identifiers(&[("[items].table", &i.table)], true)?;
        shape::check_identifiers(
            &[
                ("[items].order_id", &i.order_id),
                ("[items].sku", &i.sku),
                ("[items].quantity", &i.quantity),
            ],
            false,
        )?;
        let columns = self.columns(&i.table).await?;
        if columns.is_empty() {
            return Err(StoreError::Schema {
                key: "[items].table",
                problem: format!("no table {:?} (or it has no columns)", i.table),
            });
        }
        for (key, name) in [("[items].sku", &i.sku), ("[items].quantity", &i.quantity)] {
            if !columns.contains_key(name.as_str()) {
                return Err(StoreError::Schema {
                    key,
                    problem: format!("table {:?} has no column {name:?}", i.table),
                });
            }
        }
        columns
            .get(&i.order_id)
            .map(|(formatted, _)| formatted.clone())
            .ok_or_else(|| StoreError::Schema {
                key: "[items].order_id",
                problem: format!("table {:?} has no column {:?}", i.table, i.order_id),
            })
    }

    /// Evaluates the deadline and the guard over the unpaid rows (returning
    /// how many there are and how many are overdue), and prepares the other
    /// statements, so that a mistake in any of them is reported now, with
    /// its key, and not on the first order due.
    async fn check_statements(&self, sql: &Sql) -> Result<(i64, i64), StoreError> {
        let o = &self.schema.orders;
        let counted: Result<(i64, i64), sqlx::Error> =
            sqlx::query_as(AssertSqlSafe(sql.count.clone()))
                .bind(text(&o.unpaid))
                .fetch_one(&self.pool)
                .await;
        let unpaid = counted.map_err(|e| StoreError::Schema {
            key: "[orders].deadline / [orders].guard",
            problem: format!("evaluating them over the unpaid orders failed: {e}"),
        })?;
        let mut conn = self.pool.acquire().await?;
        let mut prepare = async |key: &'static str, statement: &str| {
            conn.prepare(AssertSqlSafe(statement.to_owned()).into_sql_str())
                .await
                .map(drop)
                .map_err(|e| StoreError::Schema {
                    key,
                    problem: format!("{e}: {statement}"),
                })
        };
        prepare(
            "[orders].set / [orders].deadline / [orders].guard",
            &sql.cancel,
        )
        .await?;
        for statement in &o.also {
            prepare("[orders].also", statement).await?;
        }
        if let Some(items) = &sql.items {
            prepare("[items]", items).await?;
        }
        Ok(unpaid)
    }

    /// The cancel statement for canonical `ids`, in a transaction with the
    /// `also` statements when there are any.
    async fn run_cancel(
        &self,
        prepared: &Prepared,
        ids: &[&str],
        lease: Duration,
    ) -> Result<Vec<StateRow>, StoreError> {
        let o = &self.schema.orders;
        let query = sqlx::query_as::<_, StateRow>(AssertSqlSafe(prepared.sql.cancel.clone()))
            .bind(ids)
            .bind(text(&o.cancelled))
            .bind(text(&o.unpaid))
            .bind(o.paid.as_ref().map(text))
            .bind(lease)
            .bind(self.schema.release == Release::None);
        if o.also.is_empty() {
            return Ok(query.fetch_all(&self.pool).await?);
        }
        let _turn = self.also_turn.lock().await;
        let mut tx = self.pool.begin().await?;
        let rows = query.fetch_all(&mut *tx).await?;
        for row in rows.iter().filter(|r| r.just_cancelled) {
            for statement in &o.also {
                let q = sqlx::query(AssertSqlSafe(statement.clone()));
                let q = match prepared.report.id_kind {
                    IdKind::Integer => q.bind(row.id.parse::<i64>().unwrap_or_default()),
                    IdKind::Text | IdKind::Uuid => q.bind(row.id.clone()),
                };
                q.execute(&mut *tx).await?;
            }
        }
        tx.commit().await?;
        Ok(rows)
    }
}

/// A status code as the text bound for it (cast to the column's type).
fn text(value: &StatusValue) -> String {
    match value {
        StatusValue::Int(n) => n.to_string(),
        StatusValue::Text(s) => s.clone(),
    }
}

/// The statements, rendered from the mapping.
#[derive(Debug)]
struct Sql {
    /// `$1` ids (text[]), `$2` cancelled, `$3` unpaid, `$4` paid (text,
    /// nullable), `$5` lease (interval), `$6` nothing to release (bool).
    cancel: String,
    /// `$1` unpaid: unpaid rows passing the guard, and how many are due.
    count: String,
    /// `$1` ids (text[]) → order id, sku, quantity.
    items: Option<String>,
    /// `$1` unpaid, `$2` grace (interval), `$3` limit.
    overdue: String,
    /// `$1` unpaid, `$2` after id (text, nullable), `$3` limit.
    unpaid_page: String,
}

impl Sql {
    fn render(
        schema: &ShopSchema,
        id_type: &str,
        status_type: &str,
        items_id_type: Option<&String>,
    ) -> Self {
        let o = &schema.orders;
        let q = |s: &str| shape::quote(Dialect::Postgres, s);
        let (table, id, status) = (q(&o.table), q(&o.id), q(&o.status));
        let deadline = shape::deadline_sql(Dialect::Postgres, o);
        let guard = shape::guard_sql(o);
        let ids = format!("CAST($1::text[] AS {id_type}[])");
        let code = |n: u8| format!("CAST(${n}::text AS {status_type})");
        let set: String = o
            .set
            .iter()
            .map(|(column, value)| format!(", {} = {value}", q(column)))
            .collect();
        let (cancelled, unpaid, paid) = (code(2), code(3), code(4));
        let cancel = format!(
            r#"
            WITH cancelled AS (
                UPDATE {table} AS o
                   SET {status} = {cancelled}{set}
                 WHERE o.{id} = ANY({ids}) AND o.{status} = {unpaid}
                   AND {deadline} <= now() AND {guard}
                RETURNING o.{id}::text AS id, ({deadline})::timestamptz AS expires_at
            ), outbox AS (
                INSERT INTO order_timeout_cancel_outbox
                       (order_id, created_at, claimed_until, stock_released_at)
                SELECT id, now(), now() + $5, CASE WHEN $6 THEN now() END FROM cancelled
                ON CONFLICT (order_id) DO NOTHING
            ), leased AS (
                UPDATE order_timeout_cancel_outbox
                   SET claimed_until = now() + $5
                 WHERE order_id = ANY($1)
                   AND (stock_released_at IS NULL OR event_published_at IS NULL)
                   AND (claimed_until IS NULL OR claimed_until <= now())
                RETURNING order_id
            ), ord AS (
                SELECT o.{id}::text AS id,
                       o.{status} = {cancelled} AS is_cancelled,
                       coalesce(o.{status} = {paid}, false) AS is_paid,
                       o.{status} = {unpaid} AS is_unpaid,
                       ({deadline})::timestamptz AS expires_at,
                       coalesce({guard}, false) AS guard_ok
                  FROM {table} AS o
                 WHERE o.{id} = ANY({ids})
            )
            SELECT req.id,
                   ord.id IS NOT NULL AS found,
                   (c.id IS NOT NULL OR coalesce(ord.is_cancelled, false)) AS is_cancelled,
                   coalesce(ord.is_paid, false) AS is_paid,
                   coalesce(ord.is_unpaid, false) AS is_unpaid,
                   coalesce(ord.guard_ok, false) AS guard_ok,
                   coalesce(c.expires_at, ord.expires_at) AS expires_at,
                   coalesce(ob.created_at, CASE WHEN c.id IS NOT NULL THEN now() END) AS cancelled_at,
                   c.id IS NOT NULL AS just_cancelled,
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
              LEFT JOIN order_timeout_cancel_outbox ob ON ob.order_id = req.id
              LEFT JOIN leased l ON l.order_id = req.id
            "#
        );
        let unpaid1 = code(1);
        let count = format!(
            "SELECT count(*), count(*) FILTER (WHERE {deadline} <= now()) \
               FROM {table} WHERE {status} = {unpaid1} AND {guard}"
        );
        let overdue = format!(
            "SELECT {id}::text FROM {table} \
              WHERE {status} = {unpaid1} AND {deadline} < now() - $2 AND {guard} \
              ORDER BY {deadline} LIMIT $3"
        );
        let unpaid_page = format!(
            "SELECT {id}::text, ({deadline})::timestamptz FROM {table} \
              WHERE {status} = {unpaid1} AND {guard} \
                AND ($2::text IS NULL OR {id} > CAST($2::text AS {id_type})) \
              ORDER BY {id} LIMIT $3"
        );
        let items = items_id_type.map(|order_id_type| {
            let i = &schema.items;
            format!(
                "SELECT {oid}::text, {sku}::text, {qty}::int8 FROM {table} \
                  WHERE {oid} = ANY(CAST($1::text[] AS {order_id_type}[])) ORDER BY 1, 2",
                oid = q(&i.order_id),
                sku = q(&i.sku),
                qty = q(&i.quantity),
                table = q(&i.table),
            )
        });
        Self {
            cancel,
            count,
            items,
            overdue,
            unpaid_page,
        }
    }
}

#[async_trait::async_trait]
impl OrderStore for PgStore {
    async fn prepare(&self) -> Result<SchemaReport, StoreError> {
        Ok(self.prepared().await?.report.clone())
    }

    fn canonical(&self, id: &OrderId) -> Option<OrderId> {
        self.id_kind
            .get()
            .copied()
            .unwrap_or_default()
            .canonical(id)
    }

    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn cancel_due(
        &self,
        ids: &[OrderId],
        lease: Duration,
    ) -> Result<Vec<(OrderId, OrderState)>, StoreError> {
        let prepared = self.prepared().await?;
        // In id order, so concurrent batches run their `also` statements in
        // the same order (fewer deadlocks).
        let mut ids_text: Vec<&str> = ids.iter().map(OrderId::as_str).collect();
        ids_text.sort_unstable();
        let rows = super::retry_deadlocks(|| self.run_cancel(prepared, &ids_text, lease)).await?;
        let asked: HashMap<&str, &OrderId> = ids.iter().map(|id| (id.as_str(), id)).collect();
        Ok(rows
            .iter()
            .filter_map(|r| Some(((*asked.get(r.id.as_str())?).clone(), r.state())))
            .collect())
    }

    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn items(&self, ids: &[&OrderId]) -> Result<HashMap<String, Vec<OrderItem>>, StoreError> {
        let prepared = self.prepared().await?;
        let Some(sql) = &prepared.sql.items else {
            return Ok(HashMap::new());
        };
        let ids_text: Vec<&str> = ids.iter().map(|id| id.as_str()).collect();
        let rows: Vec<(String, String, i64)> = sqlx::query_as(AssertSqlSafe(sql.clone()))
            .bind(&ids_text)
            .fetch_all(&self.pool)
            .await?;
        let mut map: HashMap<String, Vec<OrderItem>> = HashMap::new();
        for (order_id, sku, quantity) in rows {
            map.entry(order_id)
                .or_default()
                .push(OrderItem { sku, quantity });
        }
        Ok(map)
    }

    /// An index range scan when the shop has an index on `(status,
    /// deadline column)` and the deadline is that column.
    #[tracing::instrument(skip(self))]
    async fn overdue(&self, grace: Duration, limit: u32) -> Result<Vec<OrderId>, StoreError> {
        let prepared = self.prepared().await?;
        let ids: Vec<String> = sqlx::query_scalar(AssertSqlSafe(prepared.sql.overdue.clone()))
            .bind(text(&self.schema.orders.unpaid))
            .bind(grace)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(shape::order_ids(ids))
    }

    #[tracing::instrument(skip(self))]
    async fn unpaid_page(
        &self,
        from: Option<&OrderId>,
        limit: u32,
    ) -> Result<Vec<(OrderId, DateTime<Utc>)>, StoreError> {
        let prepared = self.prepared().await?;
        let rows: Vec<(String, Option<DateTime<Utc>>)> =
            sqlx::query_as(AssertSqlSafe(prepared.sql.unpaid_page.clone()))
                .bind(text(&self.schema.orders.unpaid))
                .bind(from.map(OrderId::as_str))
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
        Ok(shape::page(rows))
    }

    #[tracing::instrument(skip(self))]
    async fn stale_outbox(&self, grace: Duration, limit: u32) -> Result<Vec<OrderId>, StoreError> {
        let ids: Vec<String> = sqlx::query_scalar(
            r#"
            SELECT order_id FROM order_timeout_cancel_outbox
             WHERE (stock_released_at IS NULL OR event_published_at IS NULL)
               AND created_at < now() - $1
               AND (claimed_until IS NULL OR claimed_until <= now())
             ORDER BY created_at
             LIMIT $2
            "#,
        )
        .bind(grace)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(shape::order_ids(ids))
    }

    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn release_leases(&self, ids: &[&str]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "UPDATE order_timeout_cancel_outbox SET claimed_until = NULL WHERE order_id = ANY($1)",
        )
        .bind(ids)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(released = released.len(), published = published.len()))]
    async fn mark_done(&self, released: &[&str], published: &[&str]) -> Result<(), StoreError> {
        if released.is_empty() && published.is_empty() {
            return Ok(());
        }
        sqlx::query(
            r#"
            UPDATE order_timeout_cancel_outbox
               SET stock_released_at  = CASE WHEN order_id = ANY($1)
                                             THEN coalesce(stock_released_at, now())
                                             ELSE stock_released_at END,
                   event_published_at = CASE WHEN order_id = ANY($2)
                                             THEN coalesce(event_published_at, now())
                                             ELSE event_published_at END
             WHERE order_id = ANY($1) OR order_id = ANY($2)
            "#,
        )
        .bind(released)
        .bind(published)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}
