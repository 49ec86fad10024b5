//! The store suite's world: a [`Fixture`] is a fresh database of one
//! dialect with the service's migrations and the reference shop schema,
//! plus the few statements the cases need to put an order row into a
//! state (as the shop would), each written once, with the SQL of both
//! dialects side by side where they differ; a [`Repeater`] is another
//! session running one statement in a loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use order_timeout::testing::store::connect_lazy;

/// A concurrent session running one statement in a loop.
pub(super) struct Repeater {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl Repeater {
    pub(super) fn spawn<F, Fut>(mut run: F) -> Self
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut runs = 0;
            while !stopped.load(Ordering::Relaxed) {
                run().await;
                runs += 1;
                tokio::task::yield_now().await;
            }
            runs
        });
        Self { stop, task }
    }

    /// Stops it; how many times the statement ran.
    pub(super) async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// The MySQL/MariaDB server the tests use: `MYSQL_URL` (default: the local
/// MariaDB's root).
pub(crate) fn mysql_base() -> SecretUrl {
    SecretUrl::new(
        std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/mysql".into()),
    )
}

/// A pool on the MySQL/MariaDB database `url` whose sessions read and
/// write zone-less times in `zone` (as the shop's programs do), with
/// statement logging off.
pub(crate) async fn mysql_pool(url: &SecretUrl, zone: &str, max_connections: u32) -> MySqlPool {
    let options: sqlx::mysql::MySqlConnectOptions = url.expose().parse().unwrap();
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(sqlx::ConnectOptions::disable_statement_logging(
            options.timezone(Some(zone.into())),
        ))
        .await
        .unwrap()
}

/// A fresh database of one dialect (PostgreSQL on `DATABASE_URL`'s server,
/// MySQL/MariaDB on `MYSQL_URL`'s), migrated, with the reference shop
/// schema, dropped afterwards; and the shop's side of it.
pub(super) struct Fixture {
    pub(super) dialect: Dialect,
    name: String,
    base: SecretUrl,
    pub(super) url: SecretUrl,
    /// The shop's pool (`on_shop!` runs one statement on it).
    pub(super) shop: ShopDb,
    pub(super) store: Store,
    /// Ends the run, naming the test, if it hangs.
    _watchdog: crate::bounds::Watchdog,
}

impl Fixture {
    /// A fresh database of `dialect`: migrated, with the reference shop
    /// schema.
    pub(super) async fn new(dialect: Dialect) -> Self {
        let watchdog = crate::bounds::Watchdog::start();
        let base = match dialect {
            Dialect::Postgres => scratch::test_pg_server(),
            Dialect::MySql => mysql_base(),
        };
        crate::common::sweep_abandoned().await;
        let name = scratch::owned_name("ot_store");
        let url = scratch::with_path(&base, &name).unwrap();
        let shop = ShopDb::prepare(&url, 5)
            .await
            .expect("prepare the store test database");
        let store = connect_lazy(&url, 5, &ShopSchema::default()).unwrap();
        Self {
            dialect,
            name,
            base,
            url,
            shop,
            store,
            _watchdog: watchdog,
        }
    }

    /// The store under test.
    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    /// Its URL (for the migration cases).
    pub(super) fn url(&self) -> &SecretUrl {
        &self.url
    }

    /// The dialect.
    pub(super) fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Inserts an order row with `status` (`UNPAID`, `PAID`, `CANCELLED`)
    /// whose deadline is `due_in` from now (negative: overdue).
    pub(super) async fn insert(&self, id: &str, status: &str, due_in: chrono::Duration) {
        on_shop!(
            self,
            execute,
            query(
                "INSERT INTO orders (id, status, expires_at) VALUES ($1, $2, $3)",
                "INSERT INTO orders (id, status, expires_at) VALUES (?, ?, ?)"
            ),
            id,
            status,
            Utc::now() + due_in
        )
        .unwrap();
    }

    /// Adds an item to an order.
    pub(super) async fn add_item(&self, id: &str, sku: &str, quantity: i64) {
        on_shop!(
            self,
            execute,
            query(
                "INSERT INTO order_items (order_id, sku, quantity) VALUES ($1, $2, $3)",
                "INSERT INTO order_items (order_id, sku, quantity) VALUES (?, ?, ?)"
            ),
            id,
            sku,
            quantity
        )
        .unwrap();
    }

    /// The order row's `(status, cancelled_at, cancel_reason)`.
    pub(super) async fn row(&self, id: &str) -> (String, Option<DateTime<Utc>>, Option<String>) {
        on_shop!(
            self,
            fetch_one,
            query_as(
                "SELECT status, cancelled_at, cancel_reason FROM orders WHERE id = $1",
                "SELECT status, cancelled_at, cancel_reason FROM orders WHERE id = ?"
            ),
            id
        )
        .unwrap()
    }

    /// Outbox rows for the order (0 or 1).
    pub(super) async fn outbox_rows(&self, id: &str) -> i64 {
        on_shop!(
            self,
            fetch_one,
            query_scalar(
                "SELECT count(*) FROM order_timeout_cancel_outbox WHERE order_id = $1",
                "SELECT COUNT(*) FROM order_timeout_cancel_outbox WHERE order_id = ?"
            ),
            id
        )
        .unwrap()
    }

    /// Waits (at most 30 s) until a session of this database waits for a
    /// lock another holds (on MariaDB: runs a statement for over 200 ms):
    /// the event a test of a race between two sessions waits for before
    /// letting the holder go.
    pub(super) async fn a_session_waits_for_a_lock(&self) {
        let end = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let waiting: i64 = on_shop!(
                self,
                fetch_one,
                query_scalar(
                    "SELECT count(*) FROM pg_stat_activity \
                      WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    // A locking read blocked by another's row lock is not
                    // always in `innodb_trx` as waiting yet (MariaDB 10.11
                    // shows it in the processlist, in state `Statistics`):
                    // a statement of another session still running after
                    // 200 ms, where nothing else runs, is the one waiting.
                    "SELECT COUNT(*) FROM information_schema.processlist \
                      WHERE DB = DATABASE() AND ID <> CONNECTION_ID() \
                        AND COMMAND IN ('Query', 'Execute') AND TIME_MS > 200"
                )
            )
            .unwrap();
            if waiting > 0 {
                return;
            }
            if tokio::time::Instant::now() >= end {
                let sessions = self
                    .texts(match self.dialect {
                        Dialect::Postgres => {
                            "SELECT concat_ws(' | ', pid, state, wait_event_type, wait_event, query) \
                               FROM pg_stat_activity WHERE datname = current_database()"
                        }
                        Dialect::MySql => {
                            "SELECT CONCAT_WS(' | ', p.ID, p.DB, p.STATE, t.trx_state, p.INFO) \
                               FROM information_schema.processlist p \
                               LEFT JOIN information_schema.innodb_trx t \
                                 ON p.ID = t.trx_mysql_thread_id"
                        }
                    })
                    .await;
                panic!(
                    "no session of the test's database waited for a lock within 30 s; \
                     the sessions:\n{}",
                    sessions.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Pays the order in a transaction that holds the row while `during`
    /// runs, then commits: what a concurrent payment looks like to a cancel
    /// statement that runs meanwhile.
    pub(super) async fn pay_concurrently(&self, id: &str, during: impl Future<Output = ()>) {
        let mut tx = ShopTx::begin(&self.shop).await;
        tx.execute(
            "UPDATE orders SET status = 'PAID' WHERE id = $1 AND status = 'UNPAID'",
            "UPDATE orders SET status = 'PAID' WHERE id = ? AND status = 'UNPAID'",
            id,
        )
        .await;
        during.await;
        tx.commit().await;
    }

    /// Holds the order row's lock (`SELECT … FOR UPDATE`, as a slow
    /// payment callback would) while `during` runs, then commits; returns
    /// the database's clock read just before the commit.
    pub(super) async fn lock_row_during(
        &self,
        id: &str,
        during: impl Future<Output = ()>,
    ) -> DateTime<Utc> {
        let mut tx = ShopTx::begin(&self.shop).await;
        tx.execute(
            "SELECT 1 FROM orders WHERE id = $1 FOR UPDATE",
            "SELECT 1 FROM orders WHERE id = ? FOR UPDATE",
            id,
        )
        .await;
        during.await;
        let now = tx
            .now("SELECT clock_timestamp()", "SELECT UTC_TIMESTAMP(6)")
            .await;
        tx.commit().await;
        now
    }

    /// Runs `sql` in a transaction of another session, holds that
    /// transaction open (with its locks) while `during` runs, then rolls it
    /// back.
    pub(super) async fn in_open_transaction(&self, sql: &str, during: impl Future<Output = ()>) {
        let mut tx = ShopTx::begin(&self.shop).await;
        tx.raw(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        during.await;
        tx.rollback().await;
    }

    /// Ages an outbox row (its `created_at`) by `by`.
    pub(super) async fn age_outbox(&self, id: &str, by: chrono::Duration) {
        let micros = by.num_microseconds().unwrap();
        on_shop!(
            self,
            execute,
            query(
                "UPDATE order_timeout_cancel_outbox \
                SET created_at = created_at + make_interval(secs => $1::float8 / 1e6) \
              WHERE order_id = $2",
                "UPDATE order_timeout_cancel_outbox \
                SET created_at = created_at + INTERVAL ? MICROSECOND WHERE order_id = ?"
            ),
            micros,
            id
        )
        .unwrap();
    }

    /// The column definitions of the shop's tables, to compare before and
    /// after a migration.
    pub(super) async fn shop_ddl(&self) -> Vec<String> {
        on_shop!(
            self,
            fetch_all,
            query_scalar(
                "SELECT concat_ws(' ', table_schema, table_name, column_name, data_type, \
                              is_nullable, column_default) \
               FROM information_schema.columns \
              WHERE (table_schema = 'public' AND table_name IN ('orders', 'order_items')) \
                 OR table_schema = 'inventory' \
              ORDER BY table_schema, table_name, ordinal_position",
                "SELECT CAST(CONCAT_WS(' ', TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, \
                                   COALESCE(COLUMN_DEFAULT, '-'), COLUMN_KEY) AS CHAR) \
               FROM information_schema.COLUMNS \
              WHERE TABLE_SCHEMA = DATABASE() \
                AND TABLE_NAME IN ('orders', 'order_items', 'shop_stock') \
              ORDER BY TABLE_NAME, ORDINAL_POSITION"
            )
        )
        .unwrap()
    }

    /// The tables of the database that are not the shop's reference ones.
    pub(super) async fn other_tables(&self) -> Vec<String> {
        on_shop!(
            self,
            fetch_all,
            query_scalar(
                "SELECT table_name::text FROM information_schema.tables \
              WHERE table_schema = 'public' AND table_name NOT IN ('orders', 'order_items')",
                "SELECT CAST(TABLE_NAME AS CHAR) FROM information_schema.TABLES \
              WHERE TABLE_SCHEMA = DATABASE() \
                AND TABLE_NAME NOT IN ('orders', 'order_items', 'shop_stock')"
            )
        )
        .unwrap()
    }

    /// Runs `sql` (one or more statements) as the shop would.
    pub(super) async fn exec(&self, sql: &str) {
        let text = sqlx::AssertSqlSafe(sql.to_owned());
        match &self.shop {
            ShopDb::Postgres(pool) => sqlx::raw_sql(text).execute(pool).await.map(drop),
            ShopDb::MySql(pool) => sqlx::raw_sql(text).execute(pool).await.map(drop),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The first column of `sql`'s rows, as text.
    pub(super) async fn texts(&self, sql: &str) -> Vec<String> {
        let text = || sqlx::AssertSqlSafe(sql.to_owned());
        on_shop!(self, fetch_all, query_scalar(text(), text()))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Another store on this database, with `schema`'s mapping.
    pub(super) fn store_with(&self, schema: &ShopSchema) -> Store {
        connect_lazy(&self.url, 5, schema).unwrap()
    }

    /// Runs `sql` again and again on a session of its own, as another
    /// client would, until the repeater is stopped.
    pub(super) fn repeat(&self, sql: String) -> Repeater {
        let shop = self.shop.clone();
        Repeater::spawn(move || {
            let (shop, sql) = (shop.clone(), sql.clone());
            async move {
                let text = || sqlx::AssertSqlSafe(sql.clone());
                match &shop {
                    ShopDb::Postgres(pool) => sqlx::query(text()).execute(pool).await.map(drop),
                    ShopDb::MySql(pool) => sqlx::query(text()).execute(pool).await.map(drop),
                }
                .unwrap();
            }
        })
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = scratch::drop_database_blocking(&self.base, &self.name);
    }
}
