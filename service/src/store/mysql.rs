//! MySQL 5.7/8 and MariaDB 10.x: no `UPDATE … RETURNING` in a CTE, so the
//! cancel is a transaction: the order rows and their outbox rows read with
//! `SELECT … FOR UPDATE`, a conditional `UPDATE … WHERE id IN (…)` of the
//! eligible ones, the `also` statements for each, the outbox rows inserted
//! and expired leases taken, then one commit. The facts read are turned into
//! order states by the same mapping as PostgreSQL's (`state.rs`).
//!
//! Time: the session `time_zone` is the configured one, so the shop's
//! zone-less `DATETIME` deadlines compare with `NOW(6)` as the shop wrote
//! them; deadlines are read as UTC microseconds (`CONVERT_TZ`), and the
//! service's own outbox keeps UTC (`UTC_TIMESTAMP(6)`).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::mysql::{MySql, MySqlArguments, MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Either, Executor, SqlSafeStr, Statement};
use tokio::sync::OnceCell;

use super::shape::{self, IdKind, SchemaReport};
use super::state::StateRow;
use super::{Dialect, OrderItem, OrderState, OrderStore, ShopSchema, StoreError};
use crate::message::OrderId;
use crate::settings::{Release, SecretUrl, StatusValue};

/// The service's own migrations for MySQL (`migrations/mysql/`), recorded in
/// `order_timeout_migrations`.
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("./migrations/mysql");
    migrator.dangerous_set_table_name("order_timeout_migrations");
    migrator
}

/// `time_zone` as a MySQL session `time_zone`: `UTC` as `+00:00` (named
/// zones need the server's time zone tables, which MariaDB often lacks).
fn mysql_time_zone(time_zone: &str) -> String {
    if time_zone.eq_ignore_ascii_case("utc") {
        "+00:00".into()
    } else {
        time_zone.to_owned()
    }
}

fn connect_options(url: &SecretUrl, time_zone: &str) -> Result<MySqlConnectOptions, StoreError> {
    super::mysql_options(url).map(|o| {
        o.log_statements(tracing::log::LevelFilter::Trace)
            .timezone(Some(mysql_time_zone(time_zone)))
    })
}

/// `?, ?, …` for `n` values.
fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Microseconds since the epoch as a UTC instant.
fn from_micros(us: Option<i64>) -> Option<DateTime<Utc>> {
    us.and_then(DateTime::from_timestamp_micros)
}

/// The store on MySQL or MariaDB.
#[derive(Debug)]
pub struct MySqlStore {
    pool: MySqlPool,
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

/// The statement pieces and what the check found.
#[derive(Debug)]
struct Prepared {
    sql: Sql,
    /// Parameters of each `also` statement (each is bound the order id).
    also_params: Vec<usize>,
    report: SchemaReport,
}

/// Statement parts rendered from the mapping; the `{ids}` place is filled
/// with one `?` per id.
#[derive(Debug)]
struct Sql {
    lock_orders: String,
    update: String,
    count: String,
    items: Option<String>,
    overdue: String,
    unpaid_page: String,
}

impl Sql {
    fn render(schema: &ShopSchema, with_items: bool) -> Self {
        let o = &schema.orders;
        let q = |s: &str| shape::quote(Dialect::MySql, s);
        let (table, id, status) = (q(&o.table), q(&o.id), q(&o.status));
        let deadline = shape::deadline_sql(Dialect::MySql, o);
        let guard = shape::guard_sql(o);
        let deadline_us = format!(
            "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', \
             CONVERT_TZ({deadline}, @@session.time_zone, '+00:00'))"
        );
        let set: String = o
            .set
            .iter()
            .map(|(column, value)| format!(", {} = {value}", q(column)))
            .collect();
        let items = with_items.then(|| {
            let i = &schema.items;
            format!(
                "SELECT CAST({oid} AS CHAR), CAST({sku} AS CHAR), CAST({qty} AS SIGNED) \
                 FROM {table} WHERE {oid} IN ({{ids}}) ORDER BY 1, 2",
                oid = q(&i.order_id),
                sku = q(&i.sku),
                qty = q(&i.quantity),
                table = q(&i.table),
            )
        });
        Self {
            lock_orders: format!(
                "SELECT CAST({id} AS CHAR), {status} = ?, {status} = ?, {status} = ?, \
                        {deadline_us}, COALESCE({guard}, FALSE), {deadline} <= NOW(6) \
                   FROM {table} WHERE {id} IN ({{ids}}) FOR UPDATE"
            ),
            update: format!(
                "UPDATE {table} SET {status} = ?{set} \
                  WHERE {id} IN ({{ids}}) AND {status} = ? AND {deadline} <= NOW(6) AND {guard}"
            ),
            count: format!(
                "SELECT COUNT(*), CAST(COALESCE(SUM({deadline} <= NOW(6)), 0) AS SIGNED) \
                   FROM {table} WHERE {status} = ? AND {guard}"
            ),
            overdue: format!(
                "SELECT CAST({id} AS CHAR) FROM {table} \
                  WHERE {status} = ? AND {deadline} < NOW(6) - INTERVAL ? MICROSECOND AND {guard} \
                  ORDER BY {deadline} LIMIT ?"
            ),
            unpaid_page: format!(
                "SELECT CAST({id} AS CHAR), {deadline_us} FROM {table} \
                  WHERE {status} = ? AND {guard} AND (? IS NULL OR {id} > ?) \
                  ORDER BY {id} LIMIT ?"
            ),
            items,
        }
    }
}

/// One order row as the cancel transaction locked it.
type LockedOrder = (
    String,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

/// One outbox row as the cancel transaction locked it.
type LockedOutbox = (
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    bool,
    bool,
    bool,
);

impl MySqlStore {
    /// Connects a pool of at most `max_connections`, lazily.
    pub fn connect_lazy(
        url: &SecretUrl,
        max_connections: u32,
        schema: &ShopSchema,
    ) -> Result<Self, StoreError> {
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            // READ COMMITTED: the cancel transaction's locking read of outbox
            // rows that do not exist yet takes no gap locks, so two batches
            // inserting outbox rows do not deadlock each other (measured with
            // the demo on MariaDB 10.11 under REPEATABLE READ: deadlocks,
            // each a retry and a second of lateness). Order rows are still
            // locked one by one, which is all the cancel needs.
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await
                        .map(drop)
                })
            })
            .connect_lazy_with(connect_options(url, &schema.orders.time_zone)?);
        Ok(Self {
            pool,
            schema: schema.clone(),
            prepared: OnceCell::new(),
            id_kind: OnceLock::new(),
            also_turn: tokio::sync::Mutex::new(()),
        })
    }

    /// Creates the database if it does not exist, then applies the
    /// service's own migrations.
    #[tracing::instrument(skip_all, fields(url = %url))]
    pub async fn migrate(url: &SecretUrl) -> Result<(), StoreError> {
        let options = connect_options(url, "UTC")?;
        if let Some(name) = options.get_database().map(str::to_owned) {
            let admin = options.clone().database("information_schema");
            let mut conn = sqlx::MySqlConnection::connect_with(&admin).await?;
            let create = format!(
                "CREATE DATABASE IF NOT EXISTS `{}` CHARACTER SET utf8mb4",
                name.replace('`', "``")
            );
            conn.execute(AssertSqlSafe(create)).await?;
        }
        let mut conn = sqlx::MySqlConnection::connect_with(&options).await?;
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
        let columns = self.columns("[orders].table", &o.table).await?;
        let orders_columns = shape::check_orders_columns(o, &columns)?;
        let with_items = self.schema.release == Release::Grpc;
        if with_items {
            self.check_items().await?;
        }
        let sql = Sql::render(&self.schema, with_items);
        let (unpaid, also_params) = self.check_statements(&sql).await?;
        let report = SchemaReport::new(Dialect::MySql, &self.schema, orders_columns, unpaid);
        Ok(Prepared {
            sql,
            also_params,
            report,
        })
    }

    /// `name -> (column type, data type)` of a table's columns; an error
    /// naming `key` when the table does not exist.
    async fn columns(
        &self,
        key: &'static str,
        table: &str,
    ) -> Result<HashMap<String, (String, String)>, StoreError> {
        let (schema, name) = shape::split_table(table);
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT CAST(COLUMN_NAME AS CHAR), CAST(COLUMN_TYPE AS CHAR), CAST(DATA_TYPE AS CHAR) \
               FROM information_schema.COLUMNS \
              WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
        )
        .bind(schema)
        .bind(name)
        .fetch_all(&self.pool)
        .await?;
        if rows.is_empty() {
            return Err(StoreError::Schema {
                key,
                problem: format!("no table {table:?} (or it has no columns)"),
            });
        }
        Ok(rows.into_iter().map(|(n, c, d)| (n, (c, d))).collect())
    }

    async fn check_items(&self) -> Result<(), StoreError> {
        let i = &self.schema.items;
        shape::check_identifiers(&[("[items].table", &i.table)], true)?;
        let columns = self.columns("[items].table", &i.table).await?;
        for (key, name) in [
            ("[items].order_id", &i.order_id),
            ("[items].sku", &i.sku),
            ("[items].quantity", &i.quantity),
        ] {
            shape::check_identifiers(&[(key, name)], false)?;
            if !columns.contains_key(name.as_str()) {
                return Err(StoreError::Schema {
                    key,
                    problem: format!("table {:?} has no column {name:?}", i.table),
                });
            }
        }
        Ok(())
    }

    /// Evaluates the deadline and the guard over the unpaid rows, and
    /// prepares the other statements (returning each `also` statement's
    /// parameter count), so that a mistake is reported now, with its key.
    async fn check_statements(&self, sql: &Sql) -> Result<((i64, i64), Vec<usize>), StoreError> {
        let o = &self.schema.orders;
        let unpaid: (i64, i64) =
            bind_status(sqlx::query_as(AssertSqlSafe(sql.count.clone())), &o.unpaid)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| StoreError::Schema {
                    key: "[orders].deadline / [orders].guard",
                    problem: format!("evaluating them over the unpaid orders failed: {e}"),
                })?;
        let mut conn = self.pool.acquire().await?;
        let mut prepare = async |key: &'static str, statement: String| {
            let prepared = conn
                .prepare(AssertSqlSafe(statement.clone()).into_sql_str())
                .await
                .map_err(|e| StoreError::Schema {
                    key,
                    problem: format!("{e}: {statement}"),
                })?;
            Ok::<usize, StoreError>(match prepared.parameters() {
                Some(Either::Right(n)) => n,
                Some(Either::Left(types)) => types.len(),
                None => 0,
            })
        };
        prepare(
            "[orders].set / [orders].deadline / [orders].guard",
            sql.update.replace("{ids}", "?"),
        )
        .await?;
        let mut also_params = Vec::new();
        for statement in &o.also {
            also_params.push(prepare("[orders].also", statement.clone()).await?);
        }
        if let Some(items) = &sql.items {
            prepare("[items]", items.replace("{ids}", "?")).await?;
        }
        Ok((unpaid, also_params))
    }

    /// Binds an order id: as an integer for an integer id column.
    fn bind_id<'q, O>(
        &self,
        q: QueryAs<'q, MySql, O, MySqlArguments>,
        id: &str,
    ) -> QueryAs<'q, MySql, O, MySqlArguments> {
        match self.id_kind.get().copied().unwrap_or_default() {
            IdKind::Integer => q.bind(id.parse::<i64>().unwrap_or_default()),
            IdKind::Text | IdKind::Uuid => q.bind(id.to_owned()),
        }
    }

    /// The cancel transaction (see the module docs).
    async fn run_cancel(
        &self,
        prepared: &Prepared,
        ids: &[&str],
        lease: Duration,
    ) -> Result<Vec<StateRow>, StoreError> {
        let o = &self.schema.orders;
        let sql = &prepared.sql;
        let lease_us = i64::try_from(lease.as_micros()).unwrap_or(i64::MAX);
        let _turn = if o.also.is_empty() {
            None
        } else {
            Some(self.also_turn.lock().await)
        };
        let mut tx = self.pool.begin().await?;
        let db_now: DateTime<Utc> = sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
            .fetch_one(&mut *tx)
            .await?;
        let lock = sql.lock_orders.replace("{ids}", &marks(ids.len()));
        let mut q = sqlx::query_as::<_, LockedOrder>(AssertSqlSafe(lock));
        q = bind_status(q, &o.cancelled);
        q = match &o.paid {
            Some(paid) => bind_status(q, paid),
            None => q.bind(None::<String>),
        };
        q = bind_status(q, &o.unpaid);
        for id in ids {
            q = self.bind_id(q, id);
        }
        let orders: HashMap<String, LockedOrder> = q
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(|row| (row.0.clone(), row))
            .collect();
        let outbox_sql = format!(
            "SELECT order_id, created_at, claimed_until, stock_released_at IS NOT NULL, \
                    event_published_at IS NOT NULL, \
                    claimed_until IS NULL OR claimed_until <= UTC_TIMESTAMP(6) \
               FROM order_timeout_cancel_outbox WHERE order_id IN ({}) FOR UPDATE",
            marks(ids.len())
        );
        let mut q = sqlx::query_as::<_, LockedOutbox>(AssertSqlSafe(outbox_sql));
        for id in ids {
            q = q.bind(*id);
        }
        let outbox: HashMap<String, LockedOutbox> = q
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(|row| (row.0.clone(), row))
            .collect();
        let truthy = |v: Option<i64>| v.unwrap_or(0) != 0;
        let eligible: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| {
                orders.get(*id).is_some_and(|r| {
                    truthy(r.3) && truthy(r.5) && truthy(r.6) && !outbox.contains_key(*id)
                })
            })
            .collect();
        if !eligible.is_empty() {
            self.cancel_rows(&mut tx, prepared, &eligible, lease_us, db_now)
                .await?;
        }
        let takeover: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| {
                outbox
                    .get(*id)
                    .is_some_and(|(_, _, _, released, published, free)| {
                        *free && !(*released && *published)
                    })
            })
            .collect();
        if !takeover.is_empty() {
            let take = format!(
                "UPDATE order_timeout_cancel_outbox \
                    SET claimed_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                  WHERE order_id IN ({})",
                marks(takeover.len())
            );
            let mut q = sqlx::query(AssertSqlSafe(take)).bind(lease_us);
            for id in &takeover {
                q = q.bind(*id);
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        let none = self.schema.release == Release::None;
        Ok(ids
            .iter()
            .map(|id| {
                let order = orders.get(*id);
                let ob = outbox.get(*id);
                let just = eligible.contains(id);
                StateRow {
                    id: (*id).to_owned(),
                    found: order.is_some(),
                    is_cancelled: just || order.is_some_and(|r| truthy(r.1)),
                    is_paid: !just && order.is_some_and(|r| truthy(r.2)),
                    is_unpaid: order.is_some_and(|r| truthy(r.3)),
                    guard_ok: order.is_some_and(|r| truthy(r.5)),
                    expires_at: order.and_then(|r| from_micros(r.4)),
                    cancelled_at: if just { Some(db_now) } else { ob.map(|r| r.1) },
                    just_cancelled: just,
                    leased: just || takeover.contains(id),
                    claimed_until: ob.and_then(|r| r.2),
                    has_outbox: just || ob.is_some(),
                    stock_released: if just { none } else { ob.is_some_and(|r| r.3) },
                    event_published: ob.is_some_and(|r| r.4),
                    db_now,
                }
            })
            .collect())
    }

    /// Flips the eligible (locked) orders, runs the `also` statements for
    /// each, and records their outbox rows leased to this worker.
    async fn cancel_rows(
        &self,
        tx: &mut sqlx::Transaction<'static, MySql>,
        prepared: &Prepared,
        eligible: &[&str],
        lease_us: i64,
        db_now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let o = &self.schema.orders;
        let update = prepared.sql.update.replace("{ids}", &marks(eligible.len()));
        let mut q = status_query(sqlx::query(AssertSqlSafe(update)), &o.cancelled);
        for id in eligible {
            q = match self.id_kind.get().copied().unwrap_or_default() {
                IdKind::Integer => q.bind(id.parse::<i64>().unwrap_or_default()),
                IdKind::Text | IdKind::Uuid => q.bind(*id),
            };
        }
        q = status_query(q, &o.unpaid);
        q.execute(&mut **tx).await?;
        for id in eligible {
            for (statement, params) in o.also.iter().zip(&prepared.also_params) {
                let mut q = sqlx::query(AssertSqlSafe(statement.clone()));
                for _ in 0..*params {
                    q = match self.id_kind.get().copied().unwrap_or_default() {
                        IdKind::Integer => q.bind(id.parse::<i64>().unwrap_or_default()),
                        IdKind::Text | IdKind::Uuid => q.bind(*id),
                    };
                }
                q.execute(&mut **tx).await?;
            }
        }
        let insert = format!(
            "INSERT INTO order_timeout_cancel_outbox \
                    (order_id, created_at, claimed_until, stock_released_at) VALUES {} \
             ON DUPLICATE KEY UPDATE order_id = order_id",
            vec!["(?, ?, ? + INTERVAL ? MICROSECOND, IF(?, ?, NULL))"; eligible.len()].join(", ")
        );
        let none = self.schema.release == Release::None;
        let mut q = sqlx::query(AssertSqlSafe(insert));
        for id in eligible {
            // The transaction's clock, so the cancellation time reported
            // now and read back later is one instant.
            q = q
                .bind(*id)
                .bind(db_now)
                .bind(db_now)
                .bind(lease_us)
                .bind(none)
                .bind(db_now);
        }
        q.execute(&mut **tx).await?;
        Ok(())
    }

    /// Runs `UPDATE order_timeout_cancel_outbox SET {set} WHERE order_id IN
    /// (ids)` when `ids` is not empty.
    async fn update_outbox(&self, set: &str, ids: &[&str]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let sql = format!(
            "UPDATE order_timeout_cancel_outbox SET {set} WHERE order_id IN ({})",
            marks(ids.len())
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for id in ids {
            q = q.bind(*id);
        }
        q.execute(&self.pool).await?;
        Ok(())
    }
}

/// Binds a status code in its own type.
fn bind_status<'q, O>(
    q: QueryAs<'q, MySql, O, MySqlArguments>,
    value: &StatusValue,
) -> QueryAs<'q, MySql, O, MySqlArguments> {
    match value {
        StatusValue::Int(n) => q.bind(*n),
        StatusValue::Text(s) => q.bind(s.clone()),
    }
}

/// [`bind_status`] for a plain query.
fn status_query<'q>(
    q: Query<'q, MySql, MySqlArguments>,
    value: &StatusValue,
) -> Query<'q, MySql, MySqlArguments> {
    match value {
        StatusValue::Int(n) => q.bind(*n),
        StatusValue::Text(s) => q.bind(s.clone()),
    }
}

/// [`bind_status`] for a scalar query.
fn status_scalar<'q, O>(
    q: QueryScalar<'q, MySql, O, MySqlArguments>,
    value: &StatusValue,
) -> QueryScalar<'q, MySql, O, MySqlArguments> {
    match value {
        StatusValue::Int(n) => q.bind(*n),
        StatusValue::Text(s) => q.bind(s.clone()),
    }
}

#[async_trait::async_trait]
impl OrderStore for MySqlStore {
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
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // In id order: the same order as the rows are locked in, so the
        // `also` statements of concurrent batches meet fewer deadlocks.
        let mut ids: Vec<&OrderId> = ids.iter().collect();
        ids.sort();
        let ids_text: Vec<&str> = ids.iter().map(|id| id.as_str()).collect();
        let rows = super::retry_deadlocks(|| self.run_cancel(prepared, &ids_text, lease)).await?;
        Ok(ids
            .into_iter()
            .zip(rows)
            .map(|(id, row)| (id.clone(), row.state()))
            .collect())
    }

    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn items(&self, ids: &[&OrderId]) -> Result<HashMap<String, Vec<OrderItem>>, StoreError> {
        let prepared = self.prepared().await?;
        let (Some(sql), false) = (&prepared.sql.items, ids.is_empty()) else {
            return Ok(HashMap::new());
        };
        let mut q = sqlx::query_as::<_, (String, String, i64)>(AssertSqlSafe(
            sql.replace("{ids}", &marks(ids.len())),
        ));
        for id in ids {
            q = self.bind_id(q, id.as_str());
        }
        let mut map: HashMap<String, Vec<OrderItem>> = HashMap::new();
        for (order_id, sku, quantity) in q.fetch_all(&self.pool).await? {
            map.entry(order_id)
                .or_default()
                .push(OrderItem { sku, quantity });
        }
        Ok(map)
    }

    #[tracing::instrument(skip(self))]
    async fn overdue(&self, grace: Duration, limit: u32) -> Result<Vec<OrderId>, StoreError> {
        let prepared = self.prepared().await?;
        let q = sqlx::query_scalar::<_, String>(AssertSqlSafe(prepared.sql.overdue.clone()));
        let ids = status_scalar(q, &self.schema.orders.unpaid)
            .bind(i64::try_from(grace.as_micros()).unwrap_or(i64::MAX))
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
        let q = sqlx::query_as::<_, (String, Option<i64>)>(AssertSqlSafe(
            prepared.sql.unpaid_page.clone(),
        ));
        let mut q = bind_status(q, &self.schema.orders.unpaid);
        let from = from.map(OrderId::as_str);
        q = match (self.id_kind.get().copied().unwrap_or_default(), from) {
            (IdKind::Integer, from) => {
                let n = from.map(|f| f.parse::<i64>().unwrap_or_default());
                q.bind(n).bind(n)
            }
            (_, from) => q
                .bind(from.map(str::to_owned))
                .bind(from.map(str::to_owned)),
        };
        let rows = q.bind(i64::from(limit)).fetch_all(&self.pool).await?;
        Ok(shape::page(
            rows.into_iter()
                .map(|(id, us)| (id, from_micros(us)))
                .collect(),
        ))
    }

    #[tracing::instrument(skip(self))]
    async fn stale_outbox(&self, grace: Duration, limit: u32) -> Result<Vec<OrderId>, StoreError> {
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT order_id FROM order_timeout_cancel_outbox \
              WHERE (stock_released_at IS NULL OR event_published_at IS NULL) \
                AND created_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                AND (claimed_until IS NULL OR claimed_until <= UTC_TIMESTAMP(6)) \
              ORDER BY created_at LIMIT ?",
        )
        .bind(i64::try_from(grace.as_micros()).unwrap_or(i64::MAX))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(shape::order_ids(ids))
    }

    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    async fn release_leases(&self, ids: &[&str]) -> Result<(), StoreError> {
        self.update_outbox("claimed_until = NULL", ids).await
    }

    #[tracing::instrument(skip_all, fields(released = released.len(), published = published.len()))]
    async fn mark_done(&self, released: &[&str], published: &[&str]) -> Result<(), StoreError> {
        self.update_outbox(
            "stock_released_at = COALESCE(stock_released_at, UTC_TIMESTAMP(6))",
            released,
        )
        .await?;
        self.update_outbox(
            "event_published_at = COALESCE(event_published_at, UTC_TIMESTAMP(6))",
            published,
        )
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}
