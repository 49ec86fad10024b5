//! Plays the shop's part, for the demo, the tests and benchmarks: the
//! reference shop schema (`orders`, `order_items`, and the reference
//! inventory's `inventory.*`), and the order service's work on it: stock
//! the warehouse, create an order (row + items), pay it. In production the
//! shop has its own schema and its order service does all of this itself;
//! the service's `migrate` never creates these tables.

use std::time::Duration;

use chrono::{DateTime, Utc};
use order_timeout::settings::SecretUrl;
use order_timeout::testing::store::OrderItem;
use sqlx::MySqlPool;
use sqlx::PgPool;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;

/// The reference shop schema on PostgreSQL: orders and their items, with
/// the `(status, expires_at)` index the sweeper's query needs.
const REFERENCE_ORDERS: &str = include_str!("../sql/postgres/reference_orders.sql");
/// The reference inventory server's schema.
const REFERENCE_INVENTORY: &str = include_str!("../sql/postgres/reference_inventory.sql");
/// The reference shop schema on MySQL/MariaDB.
const REFERENCE_ORDERS_MYSQL: &str = include_str!("../sql/mysql/reference_orders.sql");

/// Makes `url`'s database ready for the demo, the bench or a test: the
/// service's own migrations (creating the database if needed), then the
/// reference shop schema. Returns a pool of at most `max_connections` on it.
pub async fn prepare_database(url: &SecretUrl, max_connections: u32) -> anyhow::Result<PgPool> {
    order_timeout::testing::store::migrate(url).await?;
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(order_timeout::testing::store::pg_options(url)?)
        .await?;
    create_reference_schema(&pool).await?;
    Ok(pool)
}

/// [`prepare_database`] on MySQL/MariaDB: the service's migrations, then
/// the reference orders and items tables (the reference inventory server
/// keeps its stock in PostgreSQL).
pub async fn prepare_mysql_database(
    url: &SecretUrl,
    max_connections: u32,
) -> anyhow::Result<MySqlPool> {
    order_timeout::testing::store::migrate(url).await?;
    let pool = MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(order_timeout::testing::store::mysql_options(url)?)
        .await?;
    create_reference_schema_mysql(&pool).await?;
    Ok(pool)
}

/// The reference orders and items tables on MySQL/MariaDB, without the
/// service's migrations (for a database an earlier release migrated).
pub async fn create_reference_schema_mysql(pool: &MySqlPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(REFERENCE_ORDERS_MYSQL).execute(pool).await?;
    Ok(())
}

/// Creates the reference shop schema if it is missing (idempotent).
#[tracing::instrument(skip_all)]
pub async fn create_reference_schema(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(REFERENCE_ORDERS).execute(pool).await?;
    sqlx::raw_sql(REFERENCE_INVENTORY).execute(pool).await?;
    Ok(())
}

/// The reference inventory server's schema alone (`inventory.*`), for a
/// database that holds nothing else: the inventory's own, beside a shop
/// whose orders live in another database (MariaDB, in the tests).
pub async fn create_inventory_schema(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(REFERENCE_INVENTORY).execute(pool).await?;
    Ok(())
}

/// An order as the order service creates it.
#[derive(Clone, Debug)]
pub struct NewOrder {
    /// Order id.
    pub id: String,
    /// Payment deadline.
    pub expires_at: DateTime<Utc>,
    /// What it reserves.
    pub items: Vec<OrderItem>,
}

/// Inserts the order row (UNPAID) and its items in one transaction.
#[tracing::instrument(skip_all, fields(order_id = %order.id))]
pub async fn insert_order(pool: &PgPool, order: &NewOrder) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id, status, expires_at) VALUES ($1, 'UNPAID', $2)")
        .bind(&order.id)
        .bind(order.expires_at)
        .execute(&mut *tx)
        .await?;
    let skus: Vec<&str> = order.items.iter().map(|i| i.sku.as_str()).collect();
    let quantities: Vec<i64> = order.items.iter().map(|i| i.quantity).collect();
    sqlx::query(
        "INSERT INTO order_items (order_id, sku, quantity) SELECT $1, * FROM unnest($2::text[], $3::bigint[])",
    )
    .bind(&order.id)
    .bind(&skus)
    .bind(&quantities)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// Marks an order paid if it is still unpaid. `Ok(false)` if it was not
/// UNPAID any more (already cancelled or paid).
#[tracing::instrument(skip(pool))]
pub async fn pay(pool: &PgPool, order_id: &str) -> Result<bool, sqlx::Error> {
    let done = sqlx::query("UPDATE orders SET status = 'PAID' WHERE id = $1 AND status = 'UNPAID'")
        .bind(order_id)
        .execute(pool)
        .await?
        .rows_affected();
    Ok(done == 1)
}

/// Sets the available stock of SKUs in the reference inventory.
#[tracing::instrument(skip_all, fields(skus = stock.len()))]
pub async fn set_stock(pool: &PgPool, stock: &[(String, i64)]) -> Result<(), sqlx::Error> {
    let skus: Vec<&str> = stock.iter().map(|(s, _)| s.as_str()).collect();
    let quantities: Vec<i64> = stock.iter().map(|(_, q)| *q).collect();
    sqlx::query(
        r#"
        INSERT INTO inventory.stock (sku, available)
        SELECT * FROM unnest($1::text[], $2::bigint[])
        ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available
        "#,
    )
    .bind(&skus)
    .bind(&quantities)
    .execute(pool)
    .await?;
    Ok(())
}

/// Lateness of cancelled orders among those whose id starts with `prefix`,
/// from the database timestamps (`cancelled_at - expires_at`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lateness {
    /// Cancelled orders measured.
    pub count: i64,
    /// Cancelled before their deadline (must be 0).
    pub early: i64,
    /// Median lateness, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Worst, ms.
    pub max_ms: f64,
}

/// Measures [`Lateness`] for orders whose id starts with `prefix`.
pub async fn lateness(pool: &PgPool, prefix: &str) -> Result<Lateness, sqlx::Error> {
    let row: (i64, i64, Option<f64>, Option<f64>, Option<f64>) = sqlx::query_as(
        r#"
        WITH l AS (
            SELECT extract(epoch FROM cancelled_at - expires_at)::float8 * 1000 AS ms
              FROM orders
             WHERE status = 'CANCELLED' AND starts_with(id, $1)
        )
        SELECT count(*),
               count(*) FILTER (WHERE ms < 0),
               percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
               percentile_cont(0.99) WITHIN GROUP (ORDER BY ms),
               max(ms)
          FROM l
        "#,
    )
    .bind(prefix)
    .fetch_one(pool)
    .await?;
    Ok(Lateness {
        count: row.0,
        early: row.1,
        p50_ms: row.2.unwrap_or(0.0),
        p99_ms: row.3.unwrap_or(0.0),
        max_ms: row.4.unwrap_or(0.0),
    })
}

/// Where the demo's and the bench's orders live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OrdersDatabase {
    /// PostgreSQL (`DATABASE_URL`).
    Postgres,
    /// MySQL or MariaDB (`MYSQL_URL`'s server).
    Mysql,
}

/// `MYSQL_URL` (default: the local MariaDB's root) with its database part
/// replaced by `name`.
pub fn mysql_url(name: &str) -> anyhow::Result<SecretUrl> {
    let server =
        std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/mysql".into());
    Ok(crate::scratch::with_path(
        &SecretUrl::new(server),
        &format!("/{name}"),
    )?)
}

/// The shop's orders database on either dialect, for the demo: the order
/// service's writes and the demo's checks, on the reference schema.
#[derive(Clone, Debug)]
pub enum ShopDb {
    /// PostgreSQL (`postgres://`).
    Postgres(PgPool),
    /// MySQL/MariaDB (`mysql://`).
    MySql(MySqlPool),
}

/// How far a demo run has come (orders whose id starts with a prefix).
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    /// Cancelled orders.
    pub cancelled: i64,
    /// Paid orders.
    pub paid: i64,
    /// Unpaid orders.
    pub unpaid: i64,
    /// Paid orders whose deadline has passed.
    pub paid_past: i64,
    /// Cancelled orders whose release or event is still pending.
    pub pending_outbox: i64,
}

impl ShopDb {
    /// Prepares `url`'s database ([`prepare_database`] or
    /// [`prepare_mysql_database`], by its scheme).
    pub async fn prepare(url: &SecretUrl, max_connections: u32) -> anyhow::Result<Self> {
        if url.expose().starts_with("mysql://") {
            Ok(Self::MySql(
                prepare_mysql_database(url, max_connections).await?,
            ))
        } else {
            Ok(Self::Postgres(
                prepare_database(url, max_connections).await?,
            ))
        }
    }

    /// Inserts the order row (UNPAID) and its items in one transaction.
    pub async fn insert_order(&self, order: &NewOrder) -> Result<(), sqlx::Error> {
        let pool = match self {
            Self::Postgres(pool) => return insert_order(pool, order).await,
            Self::MySql(pool) => pool,
        };
        let mut tx = pool.begin().await?;
        sqlx::query("INSERT INTO orders (id, status, expires_at) VALUES (?, 'UNPAID', ?)")
            .bind(&order.id)
            .bind(order.expires_at)
            .execute(&mut *tx)
            .await?;
        for item in &order.items {
            sqlx::query("INSERT INTO order_items (order_id, sku, quantity) VALUES (?, ?, ?)")
                .bind(&order.id)
                .bind(&item.sku)
                .bind(item.quantity)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }

    /// Marks an order paid if it is still unpaid (`false`: it was not).
    pub async fn pay(&self, order_id: &str) -> Result<bool, sqlx::Error> {
        match self {
            Self::Postgres(pool) => pay(pool, order_id).await,
            Self::MySql(pool) => Ok(sqlx::query(
                "UPDATE orders SET status = 'PAID' WHERE id = ? AND status = 'UNPAID'",
            )
            .bind(order_id)
            .execute(pool)
            .await?
            .rows_affected()
                == 1),
        }
    }

    /// Counts for the orders whose id starts with `prefix`.
    pub async fn progress(&self, prefix: &str) -> Result<Progress, sqlx::Error> {
        let (counts, pending): ((i64, i64, i64, i64), i64) = match self {
            Self::Postgres(pool) => (
                sqlx::query_as(
                    "SELECT count(*) FILTER (WHERE status = 'CANCELLED'), \
                            count(*) FILTER (WHERE status = 'PAID'), \
                            count(*) FILTER (WHERE status = 'UNPAID'), \
                            count(*) FILTER (WHERE status = 'PAID' AND expires_at < now()) \
                       FROM orders WHERE starts_with(id, $1)",
                )
                .bind(prefix)
                .fetch_one(pool)
                .await?,
                sqlx::query_scalar(
                    "SELECT count(*) FROM order_timeout_cancel_outbox WHERE starts_with(order_id, $1) \
                        AND (stock_released_at IS NULL OR event_published_at IS NULL)",
                )
                .bind(prefix)
                .fetch_one(pool)
                .await?,
            ),
            Self::MySql(pool) => (
                sqlx::query_as(
                    "SELECT CAST(COALESCE(SUM(status = 'CANCELLED'), 0) AS SIGNED), \
                            CAST(COALESCE(SUM(status = 'PAID'), 0) AS SIGNED), \
                            CAST(COALESCE(SUM(status = 'UNPAID'), 0) AS SIGNED), \
                            CAST(COALESCE(SUM(status = 'PAID' AND expires_at < UTC_TIMESTAMP(6)), 0) AS SIGNED) \
                       FROM orders WHERE id LIKE CONCAT(?, '%')",
                )
                .bind(prefix)
                .fetch_one(pool)
                .await?,
                sqlx::query_scalar(
                    "SELECT COUNT(*) FROM order_timeout_cancel_outbox WHERE order_id LIKE CONCAT(?, '%') \
                        AND (stock_released_at IS NULL OR event_published_at IS NULL)",
                )
                .bind(prefix)
                .fetch_one(pool)
                .await?,
            ),
        };
        Ok(Progress {
            cancelled: counts.0,
            paid: counts.1,
            unpaid: counts.2,
            paid_past: counts.3,
            pending_outbox: pending,
        })
    }

    /// What is still open of the orders whose id starts with `prefix`:
    /// unpaid orders, and cancelled ones whose release or event is still to
    /// do and not given up. Cheap enough to ask twice a second while a
    /// bench runs: both are index scans of the open rows only
    /// (`(status, expires_at)`; the outbox's pending index), where
    /// [`Self::progress`] reads every order and outbox row the database
    /// holds, earlier runs' too, so polling it made PostgreSQL's share of
    /// a bench grow with the database.
    pub async fn unsettled(&self, prefix: &str) -> Result<(i64, i64), sqlx::Error> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_as(
                    "SELECT (SELECT count(*) FROM orders \
                              WHERE status = 'UNPAID' AND starts_with(id, $1)), \
                            (SELECT count(*) FROM order_timeout_cancel_outbox \
                              WHERE (stock_released_at IS NULL OR event_published_at IS NULL) \
                                AND gave_up_at IS NULL AND starts_with(order_id, $1))",
                )
                .bind(prefix)
                .fetch_one(pool)
                .await
            }
            Self::MySql(pool) => {
                sqlx::query_as(
                    "SELECT (SELECT COUNT(*) FROM orders \
                              WHERE status = 'UNPAID' AND id LIKE CONCAT(?, '%')), \
                            (SELECT COUNT(*) FROM order_timeout_cancel_outbox \
                              WHERE pending = 1 AND gave_up_at IS NULL \
                                AND order_id LIKE CONCAT(?, '%'))",
                )
                .bind(prefix)
                .bind(prefix)
                .fetch_one(pool)
                .await
            }
        }
    }

    /// Status by order id, for the orders whose id starts with `prefix`.
    pub async fn statuses(&self, prefix: &str) -> Result<Vec<(String, String)>, sqlx::Error> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_as("SELECT id, status FROM orders WHERE starts_with(id, $1)")
                    .bind(prefix)
                    .fetch_all(pool)
                    .await
            }
            Self::MySql(pool) => {
                sqlx::query_as("SELECT id, status FROM orders WHERE id LIKE CONCAT(?, '%')")
                    .bind(prefix)
                    .fetch_all(pool)
                    .await
            }
        }
    }

    /// [`Lateness`] of the cancelled orders whose id starts with `prefix`
    /// (`cancelled_at - expires_at`, from the database's timestamps).
    pub async fn lateness(&self, prefix: &str) -> Result<Lateness, sqlx::Error> {
        let pool = match self {
            Self::Postgres(pool) => return lateness(pool, prefix).await,
            Self::MySql(pool) => pool,
        };
        let mut ms: Vec<f64> = sqlx::query_scalar::<_, i64>(
            "SELECT TIMESTAMPDIFF(MICROSECOND, expires_at, cancelled_at) FROM orders \
              WHERE status = 'CANCELLED' AND id LIKE CONCAT(?, '%')",
        )
        .bind(prefix)
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|us| us as f64 / 1000.0)
        .collect();
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| {
            ms.get(((ms.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        Ok(Lateness {
            count: ms.len() as i64,
            early: ms.iter().filter(|m| **m < 0.0).count() as i64,
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: ms.last().copied().unwrap_or(0.0),
        })
    }
}
