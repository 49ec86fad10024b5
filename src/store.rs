//! The database side of a cancellation: **the cancel transaction** and the
//! transactional outbox.
//!
//! [`Store::cancel_due`] is one SQL statement (so one transaction) for a whole
//! batch of orders: it flips `UNPAID -> CANCELLED` only where the row's
//! `expires_at <= now()`, inserts an outbox row for each order it flipped, and
//! reports the state of every order asked about. The stock release and the
//! event are then done from the outbox and marked there, so a crash at any
//! point leaves either nothing done or a pending outbox row that the next
//! delivery (or the sweeper) finishes.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor};

use crate::message::OrderId;

/// The embedded migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Errors talking to the database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL does not parse.
    #[error("invalid DATABASE_URL {url}: {error}")]
    Url { url: String, error: sqlx::Error },
    /// A query or connection failed; transient as far as we can tell.
    #[error("database: {0}")]
    Sql(sqlx::Error),
    /// Applying migrations failed.
    #[error("migrations: {0}")]
    Migrate(sqlx::migrate::MigrateError),
}

// Hand-written (not `#[from]`) so the inner error is shown once, in the
// message, and not again as a `source` in `{:#}` chains.
impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Self::Migrate(e)
    }
}

/// Where an order stands after [`Store::cancel_due`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrderState {
    /// No row with that id.
    Unknown,
    /// Paid: leave it alone.
    Paid,
    /// Still unpaid and its deadline has not passed (it may have been
    /// extended): wait until `expires_at`.
    NotYetDue {
        expires_at: DateTime<Utc>,
        db_now: DateTime<Utc>,
    },
    /// Unpaid and overdue, yet this statement did not cancel it: another
    /// transaction holds or just changed the row. Ask again shortly.
    Contended,
    /// Cancelled, by this statement or an earlier one.
    Cancelled(Cancellation),
    /// Cancelled by someone other than this service (no outbox row): nothing
    /// for us to release.
    CancelledElsewhere,
    /// Cancelled, with outbox work pending that another worker has leased
    /// until `until`: check again then (if that worker crashed, the lease
    /// will have run out and this delivery takes over).
    LeasedElsewhere {
        until: DateTime<Utc>,
        db_now: DateTime<Utc>,
    },
}

/// A cancellation this service made, and what is still to do for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cancellation {
    /// True when the statement just now cancelled it.
    pub just_now: bool,
    /// True when this caller holds the outbox lease (and so must finish the
    /// pending work, or give the lease back with [`Store::release_leases`]).
    pub leased: bool,
    /// The deadline it was cancelled for.
    pub expires_at: DateTime<Utc>,
    /// When it was cancelled.
    pub cancelled_at: DateTime<Utc>,
    /// The stock release is still to be done.
    pub release_pending: bool,
    /// The `order.cancelled` event is still to be published.
    pub event_pending: bool,
}

/// One line of an order.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct OrderItem {
    /// Stock keeping unit.
    pub sku: String,
    /// Units reserved.
    pub quantity: i64,
}

/// A connection pool plus the queries the service needs.
#[derive(Clone, Debug)]
pub struct Store {
    pool: PgPool,
}

fn connect_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    url.parse::<PgConnectOptions>()
        .map(|o| {
            o.log_statements(tracing::log::LevelFilter::Trace)
                // Plan every execution with its real parameters. With cached
                // generic plans, a connection that prepared the cancel
                // statement while `orders`/`cancel_outbox` were nearly empty
                // kept seq-scanning them as they grew (measured with `bench`
                // on a fresh database: one seq scan of each table per batch,
                // cancellations capped near 700/s). Planning costs well under
                // a millisecond per statement.
                .options([("plan_cache_mode", "force_custom_plan")])
        })
        .map_err(|error| StoreError::Url {
            url: crate::config::redact_url(url),
            error,
        })
}

#[derive(sqlx::FromRow)]
struct StateRow {
    id: String,
    status: Option<String>,
    expires_at: Option<DateTime<Utc>>,
    cancelled_at: Option<DateTime<Utc>>,
    just_cancelled: bool,
    leased: bool,
    claimed_until: Option<DateTime<Utc>>,
    has_outbox: bool,
    stock_released: bool,
    event_published: bool,
    db_now: DateTime<Utc>,
}

impl Store {
    /// Connects a pool of at most `max_connections` (lazily: the first query
    /// opens the first connection, so start-up does not fail on a database
    /// that is still booting).
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_lazy_with(connect_options(url)?);
        Ok(Self { pool })
    }

    /// Wraps an existing pool.
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool, for callers with their own queries (demo, tests).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Creates the database if it does not exist, then applies the embedded
    /// migrations.
    #[tracing::instrument(skip_all, fields(url = %crate::config::redact_url(url)))]
    pub async fn migrate(url: &str) -> Result<(), StoreError> {
        let options = connect_options(url)?;
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
        MIGRATOR.run(&mut conn).await?;
        Ok(())
    }

    /// **The cancel transaction**, for a batch of distinct order ids: cancel
    /// every order that is UNPAID and overdue, record its outbox row leased
    /// to the caller for `lease`, take the lease of earlier cancellations
    /// whose work is pending and whose lease ran out, and report every
    /// order's state. One statement, so it commits atomically.
    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    pub async fn cancel_due(
        &self,
        ids: &[OrderId],
        reason: &str,
        lease: std::time::Duration,
    ) -> Result<Vec<(OrderId, OrderState)>, StoreError> {
        let ids_text: Vec<&str> = ids.iter().map(OrderId::as_str).collect();
        let rows: Vec<StateRow> = sqlx::query_as(
            r#"
            WITH cancelled AS (
                UPDATE orders
                   SET status = 'CANCELLED', cancelled_at = now(), cancel_reason = $2
                 WHERE id = ANY($1) AND status = 'UNPAID' AND expires_at <= now()
                RETURNING id, expires_at, cancelled_at
            ), outbox AS (
                INSERT INTO cancel_outbox (order_id, created_at, claimed_until)
                SELECT id, cancelled_at, now() + $3 FROM cancelled
                ON CONFLICT (order_id) DO NOTHING
            ), leased AS (
                UPDATE cancel_outbox
                   SET claimed_until = now() + $3
                 WHERE order_id = ANY($1)
                   AND (stock_released_at IS NULL OR event_published_at IS NULL)
                   AND (claimed_until IS NULL OR claimed_until <= now())
                RETURNING order_id
            )
            SELECT req.id,
                   CASE WHEN c.id IS NOT NULL THEN 'CANCELLED' ELSE o.status END AS status,
                   coalesce(c.expires_at, o.expires_at) AS expires_at,
                   coalesce(c.cancelled_at, o.cancelled_at) AS cancelled_at,
                   c.id IS NOT NULL AS just_cancelled,
                   (c.id IS NOT NULL OR l.order_id IS NOT NULL) AS leased,
                   ob.claimed_until,
                   (c.id IS NOT NULL OR ob.order_id IS NOT NULL) AS has_outbox,
                   coalesce(ob.stock_released_at IS NOT NULL, false) AS stock_released,
                   coalesce(ob.event_published_at IS NOT NULL, false) AS event_published,
                   now() AS db_now
              FROM unnest($1::text[]) AS req(id)
              LEFT JOIN orders o ON o.id = req.id
              LEFT JOIN cancelled c ON c.id = req.id
              LEFT JOIN cancel_outbox ob ON ob.order_id = req.id
              LEFT JOIN leased l ON l.order_id = req.id
            "#,
        )
        .bind(&ids_text)
        .bind(reason)
        .bind(lease)
        .fetch_all(&self.pool)
        .await?;

        Ok(rows
            .into_iter()
            .map(|r| {
                let state = match (r.status.as_deref(), r.expires_at) {
                    (None, _) | (_, None) => OrderState::Unknown,
                    (Some("PAID"), _) => OrderState::Paid,
                    (Some("CANCELLED"), Some(_))
                        if r.has_outbox
                            && !r.leased
                            && !(r.stock_released && r.event_published) =>
                    {
                        OrderState::LeasedElsewhere {
                            until: r.claimed_until.unwrap_or(r.db_now),
                            db_now: r.db_now,
                        }
                    }
                    (Some("CANCELLED"), Some(expires_at)) if r.has_outbox => {
                        OrderState::Cancelled(Cancellation {
                            just_now: r.just_cancelled,
                            leased: r.leased,
                            expires_at,
                            cancelled_at: r.cancelled_at.unwrap_or(r.db_now),
                            release_pending: !r.stock_released,
                            event_pending: !r.event_published,
                        })
                    }
                    (Some("CANCELLED"), _) => OrderState::CancelledElsewhere,
                    (Some(_), Some(expires_at)) if expires_at > r.db_now => OrderState::NotYetDue {
                        expires_at,
                        db_now: r.db_now,
                    },
                    // UNPAID, overdue, not flipped by us: a concurrent
                    // transaction got there first (our snapshot predates it).
                    (Some(_), Some(_)) => OrderState::Contended,
                };
                let id = OrderId::parse(&r.id).expect("ids came from OrderId values");
                (id, state)
            })
            .collect())
    }

    /// The items of each order, for the stock release.
    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    pub async fn items(
        &self,
        ids: &[&OrderId],
    ) -> Result<HashMap<String, Vec<OrderItem>>, StoreError> {
        let ids_text: Vec<&str> = ids.iter().map(|id| id.as_str()).collect();
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT order_id, sku, quantity FROM order_items WHERE order_id = ANY($1) ORDER BY order_id, sku",
        )
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

    /// UNPAID orders overdue by more than `grace`, oldest first: what the
    /// sweeper cancels. An index range scan on `(status, expires_at)`.
    #[tracing::instrument(skip(self))]
    pub async fn overdue(
        &self,
        grace: std::time::Duration,
        limit: u32,
    ) -> Result<Vec<OrderId>, StoreError> {
        let ids: Vec<String> = sqlx::query_scalar(
            r#"
            SELECT id FROM orders
             WHERE status = 'UNPAID' AND expires_at < now() - $1
             ORDER BY expires_at
             LIMIT $2
            "#,
        )
        .bind(grace)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(ids
            .iter()
            .filter_map(|id| OrderId::parse(id).ok())
            .collect())
    }

    /// Cancelled orders whose release or event is still pending after
    /// `grace`, with no live lease: work a crashed or parked delivery left.
    #[tracing::instrument(skip(self))]
    pub async fn stale_outbox(
        &self,
        grace: std::time::Duration,
        limit: u32,
    ) -> Result<Vec<OrderId>, StoreError> {
        let ids: Vec<String> = sqlx::query_scalar(
            r#"
            SELECT order_id FROM cancel_outbox
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
        Ok(ids
            .iter()
            .filter_map(|id| OrderId::parse(id).ok())
            .collect())
    }

    /// Gives leases back early (after a failure), so the retry does not
    /// wait for them to run out.
    #[tracing::instrument(skip_all, fields(orders = ids.len()))]
    pub async fn release_leases(&self, ids: &[&str]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query("UPDATE cancel_outbox SET claimed_until = NULL WHERE order_id = ANY($1)")
            .bind(ids)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Marks outbox work done: stock released for `released`, event
    /// published for `published`.
    #[tracing::instrument(skip_all, fields(released = released.len(), published = published.len()))]
    pub async fn mark_done(&self, released: &[&str], published: &[&str]) -> Result<(), StoreError> {
        if released.is_empty() && published.is_empty() {
            return Ok(());
        }
        sqlx::query(
            r#"
            UPDATE cancel_outbox
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
}
