//! Playing the order service in a test's world and reading what happened:
//! orders created, paid, held, deadlines moved; timeouts published; the
//! rows, the stock, the ledger, the events and the parked messages read
//! back, on either dialect.

use super::*;
use order_timeout::testing::topology::{
    CANCELLED_ROUTING_KEY, ENTRY_EXCHANGE, EVENTS_EXCHANGE, SCHEDULE_ROUTING_KEY,
};

impl TestEnv {
    /// The SKU name `n` of this test.
    pub fn sku(&self, n: usize) -> String {
        format!("sku-{n}")
    }

    /// Stocks SKUs 0..n with [`STOCK`] each.
    pub async fn stock_skus(&self, n: usize) {
        let stock: Vec<(String, i64)> = (0..n).map(|i| (self.sku(i), STOCK)).collect();
        shop::set_stock(&self.pool, &stock).await.unwrap();
    }

    /// Creates an order as the order service would: reserves its stock,
    /// then inserts the row with `expires_at = now + timeout`. Does not
    /// publish.
    pub async fn create_order(
        &self,
        id: &str,
        timeout: Duration,
        items: &[(usize, i64)],
    ) -> NewOrder {
        let order = NewOrder {
            id: id.to_owned(),
            expires_at: Utc::now() + chrono::Duration::from_std(timeout).unwrap(),
            items: items
                .iter()
                .map(|(sku, quantity)| OrderItem {
                    sku: self.sku(*sku),
                    quantity: *quantity,
                })
                .collect(),
        };
        self.inventory
            .reserve(&order.id, &order.items)
            .await
            .expect("reserve");
        self.shop.insert_order(&order).await.expect("insert order");
        order
    }

    /// Pays the order as the order service would (`false`: it was not
    /// unpaid any more).
    pub async fn pay(&self, id: &str) -> bool {
        self.shop.pay(id).await.unwrap()
    }

    /// Moves the order's deadline to `at`, as the order service does when
    /// it extends the payment window.
    pub async fn set_deadline(&self, id: &str, at: DateTime<Utc>) {
        on_shop!(
            self,
            execute,
            query(
                "UPDATE orders SET expires_at = $1 WHERE id = $2",
                "UPDATE orders SET expires_at = ? WHERE id = ?"
            ),
            at,
            id
        )
        .unwrap();
    }

    /// Sets the order's deadline to `after` from now on the database's own
    /// clock (not this host's), for a test that compares only the
    /// database's times.
    pub async fn set_deadline_on_db_clock(&self, id: &str, after: Duration) {
        let micros = i64::try_from(after.as_micros()).unwrap();
        on_shop!(self, execute, query(
            "UPDATE orders SET expires_at = now() + make_interval(secs => $1::float8 / 1e6) WHERE id = $2",
            "UPDATE orders SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE id = ?"
        ), micros, id)
        .unwrap();
    }

    /// Leaves the order as a crash right after the cancel transaction's
    /// commit leaves it: the row CANCELLED (now, on the database's clock),
    /// its outbox row pending, no stock released and no event published.
    pub async fn cancel_without_effects(&self, id: &str) {
        on_shop!(self, execute, query(
            "UPDATE orders SET status = 'CANCELLED', cancelled_at = now() WHERE id = $1",
            "UPDATE orders SET status = 'CANCELLED', cancelled_at = UTC_TIMESTAMP(6) WHERE id = ?"
        ), id)
        .unwrap();
        on_shop!(self, execute, query(
            "INSERT INTO order_timeout_cancel_outbox (order_id) VALUES ($1)",
            "INSERT INTO order_timeout_cancel_outbox (order_id, created_at) VALUES (?, UTC_TIMESTAMP(6))"
        ), id)
        .unwrap();
    }

    /// Opens a transaction of the shop's that holds the order row's lock
    /// (`SELECT … FOR UPDATE`, as a slow payment callback would) until it
    /// commits ([`ShopTx::commit`]).
    pub async fn hold_row(&self, id: &str) -> ShopTx {
        let mut tx = ShopTx::begin(&self.shop).await;
        tx.execute(
            "SELECT 1 FROM orders WHERE id = $1 FOR UPDATE",
            "SELECT 1 FROM orders WHERE id = ? FOR UPDATE",
            id,
        )
        .await;
        tx
    }

    /// `pg` on PostgreSQL, `my` on MariaDB: a test's own statement (a table
    /// of its own, an `also` statement) in the dialect of its world.
    pub fn sql<'a>(&self, pg: &'a str, my: &'a str) -> &'a str {
        match self.dialect {
            Dialect::Postgres => pg,
            Dialect::MySql => my,
        }
    }

    /// Runs `sql` (one or more statements, in the dialect: see
    /// [`TestEnv::sql`]) on the shop's orders database.
    pub async fn shop_exec(&self, sql: &str) {
        let text = || sqlx::AssertSqlSafe(sql.to_owned());
        on_shop!(self, execute, raw_sql(text(), text())).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The rows of `sql` (in the dialect: see [`TestEnv::sql`]) on the
    /// shop's orders database, each decoded as `T` (a tuple).
    pub async fn shop_rows<T>(&self, sql: &str) -> Vec<T>
    where
        T: for<'r> sqlx::FromRow<'r, PgRow> + for<'r> sqlx::FromRow<'r, MySqlRow> + Send + Unpin,
    {
        let text = || sqlx::AssertSqlSafe(sql.to_owned());
        on_shop!(self, fetch_all, query_as(text(), text())).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Orders cancelled before their deadline, by the database's own
    /// timestamps (every test expects 0).
    pub async fn cancelled_early(&self) -> i64 {
        let sql = "SELECT count(*) FROM orders WHERE cancelled_at < expires_at";
        on_shop!(self, fetch_one, query_scalar(sql, sql)).unwrap()
    }

    /// Cancelled orders whose stock release is not marked done in the
    /// outbox: the only ones whose `ReleaseStock` another process may call
    /// again.
    pub async fn outbox_unreleased(&self) -> i64 {
        let sql =
            "SELECT count(*) FROM order_timeout_cancel_outbox WHERE stock_released_at IS NULL";
        on_shop!(self, fetch_one, query_scalar(sql, sql)).unwrap()
    }

    /// Kills every connection to this test's databases but the killer's
    /// own (the service's, the inventory server's, the harness's), on
    /// PostgreSQL and, in a MariaDB world, on MariaDB too; returns how many
    /// of them were to the shop's orders database (on MariaDB: not counting
    /// the inventory's), so that a test can tell the service's own were
    /// among them. For the tests of a database that drops its sessions.
    pub async fn kill_database_connections(&self) -> i64 {
        let admin = scratch::with_path(&self.base_db_url, "postgres").unwrap();
        let admin = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_with(order_timeout::testing::store::pg_options(&admin).unwrap())
            .await
            .unwrap();
        let mut killed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()) t",
        )
        .bind(&self.name)
        .fetch_one(&admin)
        .await
        .unwrap();
        admin.close().await;
        if let Some(base) = &self.mysql_base {
            // The inventory's, killed above: not the shop's.
            killed = 0;
            let admin = scratch::with_path(base, "information_schema").unwrap();
            let admin: MySqlPool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(1)
                .connect_with(order_timeout::testing::store::mysql_options(&admin).unwrap())
                .await
                .unwrap();
            let ids: Vec<i64> = sqlx::query_scalar(
                "SELECT ID FROM information_schema.PROCESSLIST \
                  WHERE DB = ? AND ID <> CONNECTION_ID()",
            )
            .bind(&self.name)
            .fetch_all(&admin)
            .await
            .unwrap();
            for id in ids {
                // Gone meanwhile (1094, unknown thread): nothing to kill.
                let sql = sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}"));
                if sqlx::query(sql).execute(&admin).await.is_ok() {
                    killed += 1;
                }
            }
            admin.close().await;
        }
        killed
    }

    /// Publishes raw bytes to the entry exchange with a plain AMQP client,
    /// as any order service would, and waits for the confirm.
    pub async fn publish_raw(&self, body: &[u8]) {
        self.publish_raw_as(SCHEDULE_ROUTING_KEY, body).await;
    }

    /// [`TestEnv::publish_raw`] with routing key `key` (a lane entry).
    pub async fn publish_raw_as(&self, key: &str, body: &[u8]) {
        let confirm = self
            .channel
            .basic_publish(
                ENTRY_EXCHANGE.into(),
                key.into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_content_type("application/json".into()),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }

    /// Publishes `{"order_id", "cancel_at"}` for `order`.
    pub async fn publish_timeout(&self, order: &NewOrder) {
        self.publish_timeout_as(SCHEDULE_ROUTING_KEY, order).await;
    }

    /// [`TestEnv::publish_timeout`] with routing key `key` (a lane entry).
    pub async fn publish_timeout_as(&self, key: &str, order: &NewOrder) {
        let body = serde_json::json!({
            "order_id": order.id,
            "cancel_at": order_timeout::message::format_instant(order.expires_at),
        });
        self.publish_raw_as(key, body.to_string().as_bytes()).await;
    }

    /// An exclusive queue bound to the `order.cancelled` events.
    pub async fn subscribe_events(&self) -> lapin::Consumer {
        self.subscribe_events_on(CANCELLED_ROUTING_KEY).await
    }

    /// An exclusive queue bound to the events whose routing key matches
    /// `binding` (`#`: every timer's).
    pub async fn subscribe_events_on(&self, binding: &str) -> lapin::Consumer {
        let channel = self.amqp.create_channel().await.unwrap();
        let queue = exclusive_queue(&channel).await;
        channel
            .queue_bind(
                queue.name().clone(),
                EVENTS_EXCHANGE.into(),
                binding.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .basic_consume(
                queue.name().clone(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
    }

    /// The parked store (`order_timeout_parked`) of the database of the
    /// service started last, else of this test's database.
    pub fn parked_store(&self) -> order_timeout::testing::store::Store {
        let url = self
            .service_database
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(|| self.settings.database_url.clone());
        order_timeout::testing::store::connect_lazy(
            &url,
            2,
            &order_timeout::testing::store::ShopSchema::default(),
        )
        .unwrap()
    }

    /// Every parked message, oldest first, with whole bodies, after moving
    /// those waiting in the parked queue into the parked store (reading
    /// changes nothing).
    pub async fn parked_listing(&self) -> order_timeout::ops::parked::Listing {
        use order_timeout::ops::parked;
        let store = self.parked_store();
        parked::take_in(&self.amqp, &store).await.unwrap();
        let page = parked::Page {
            selection: parked::Selection::All,
            after: 0,
            limit: u32::MAX,
            excerpt: None,
        };
        parked::list(&store, &page).await.unwrap()
    }

    /// Takes every parked message: moves those waiting in the parked queue
    /// into the parked store, then reads and deletes every one kept there,
    /// in the order they were parked.
    pub async fn drain_parked(&self) -> Vec<order_timeout::ops::parked::ParkedMessage> {
        let messages = self.parked_listing().await.messages;
        let store = self.parked_store();
        let ids: Vec<i64> = messages.iter().filter_map(|m| m.id).collect();
        store.delete_parked(&ids).await.unwrap();
        messages
    }

    /// `(status, expires_at, cancelled_at)` of an order.
    pub async fn order_state(&self, id: &str) -> (String, DateTime<Utc>, Option<DateTime<Utc>>) {
        on_shop!(
            self,
            fetch_one,
            query_as(
                "SELECT status, expires_at, cancelled_at FROM orders WHERE id = $1",
                "SELECT status, expires_at, cancelled_at FROM orders WHERE id = ?"
            ),
            id
        )
        .unwrap()
    }

    /// Available stock of SKU `n`.
    pub async fn stock(&self, n: usize) -> i64 {
        let sku = self.sku(n);
        *self
            .inventory
            .stock(std::slice::from_ref(&sku))
            .await
            .unwrap()
            .get(&sku)
            .unwrap()
    }

    /// How many `ReleaseStock` calls the inventory saw for an order (None:
    /// never released).
    pub async fn release_calls(&self, id: &str) -> Option<i64> {
        sqlx::query_scalar("SELECT calls FROM inventory.releases WHERE order_id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .unwrap()
    }

    /// Counts orders by status among ids starting with `prefix`.
    pub async fn count(&self, prefix: &str, status: &str) -> i64 {
        on_shop!(
            self,
            fetch_one,
            query_scalar(
                "SELECT count(*) FROM orders WHERE left(id, char_length($1)) = $2 AND status = $3",
                "SELECT count(*) FROM orders WHERE LEFT(id, CHAR_LENGTH(?)) = ? AND status = ?"
            ),
            prefix,
            prefix,
            status
        )
        .unwrap()
    }

    /// Polls `check` every 50 ms until it holds or `timeout` passes.
    pub async fn eventually<F, Fut>(&self, timeout: Duration, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        crate::bounds::step(what);
        let end = tokio::time::Instant::now() + timeout;
        loop {
            if check().await {
                return;
            }
            assert!(
                tokio::time::Instant::now() < end,
                "timed out after {timeout:?} waiting for: {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `service` has acked exactly `n` messages as
    /// `outcome`. A row flips before its message is acked (the release,
    /// the event and the outbox marks come first), so after the rows are
    /// seen cancelled the counter may still trail by a batch.
    pub async fn acked_exactly(&self, service: &RunningService, outcome: Outcome, n: u64) {
        self.eventually(
            Duration::from_secs(10),
            &format!("{n} messages acked as {outcome:?}"),
            || async { service.metrics.count(outcome) >= n },
        )
        .await;
        assert_eq!(service.metrics.count(outcome), n, "{outcome:?}");
    }

    /// Waits (at most 60 s) until `service` has run `n` more sweeps of the
    /// default timer through (settling what they found, or leaving some
    /// for the next) than it had: what tests that something stays as it is
    /// across sweeps wait for, instead of a guessed time.
    pub async fn more_sweeps(&self, service: &RunningService, n: u64) {
        self.more_sweeps_of(service, order_timeout::settings::DEFAULT_TIMER, n)
            .await;
    }

    /// [`TestEnv::more_sweeps`] of `timer`.
    pub async fn more_sweeps_of(&self, service: &RunningService, timer: &str, n: u64) {
        use order_timeout::testing::metrics::SweepResult;
        let ran = || {
            service.metrics.sweeps_of(timer, SweepResult::Ok)
                + service.metrics.sweeps_of(timer, SweepResult::LeftBehind)
        };
        let after = ran();
        self.eventually(
            Duration::from_secs(60),
            &format!("{n} more sweeps of {timer}"),
            || async { ran() >= after + n },
        )
        .await;
    }

    /// Waits (at most `wait` each) until every one of `orders` is settled,
    /// and checks each was cancelled at or after its deadline, less than
    /// `late_ok` after it.
    pub async fn cancelled_on_time<'a>(
        &self,
        orders: impl Iterator<Item = &'a NewOrder>,
        wait: Duration,
        late_ok: chrono::Duration,
    ) {
        for order in orders {
            let (status, expires_at, cancelled_at) = self.wait_settled(&order.id, wait).await;
            assert_eq!(status, "CANCELLED", "{}", order.id);
            let cancelled_at = cancelled_at.expect("cancelled_at set");
            assert!(
                cancelled_at >= expires_at,
                "{} cancelled early: {cancelled_at} < {expires_at}",
                order.id
            );
            assert!(
                cancelled_at - expires_at < late_ok,
                "{} too late: {}",
                order.id,
                cancelled_at - expires_at
            );
        }
    }

    /// Waits until the order with `id` is no longer UNPAID.
    pub async fn wait_settled(
        &self,
        id: &str,
        timeout: Duration,
    ) -> (String, DateTime<Utc>, Option<DateTime<Utc>>) {
        self.eventually(timeout, &format!("order {id} settled"), || async {
            self.order_state(id).await.0 != "UNPAID"
        })
        .await;
        self.order_state(id).await
    }

    /// Waits until no cancelled order has outbox work (stock release,
    /// event) pending: the order row flips to CANCELLED before the release.
    pub async fn wait_outbox_done(&self, timeout: Duration) {
        self.eventually(timeout, "no outbox work pending", || async {
            let sql = "SELECT count(*) FROM order_timeout_cancel_outbox \
                        WHERE stock_released_at IS NULL OR event_published_at IS NULL";
            let pending: i64 = on_shop!(self, fetch_one, query_scalar(sql, sql)).unwrap();
            pending == 0
        })
        .await;
    }

    /// Asserts that the inventory holds exactly `STOCK - reserved by
    /// orders not cancelled` for SKUs 0..n, and that every cancelled order's
    /// stock was released exactly once (after waiting for pending releases).
    pub async fn assert_stock_exact(&self, skus: usize) {
        self.wait_outbox_done(Duration::from_secs(10)).await;
        let rows: Vec<(String, i64)> = on_shop!(
            self,
            fetch_all,
            query_as(
                "SELECT i.sku, sum(i.quantity)::bigint \
               FROM order_items i JOIN orders o ON o.id = i.order_id \
              WHERE o.status <> 'CANCELLED' GROUP BY i.sku",
                "SELECT i.sku, CAST(SUM(i.quantity) AS SIGNED) \
               FROM order_items i JOIN orders o ON o.id = i.order_id \
              WHERE o.status <> 'CANCELLED' GROUP BY i.sku"
            )
        )
        .unwrap();
        for n in 0..skus {
            let held: i64 = rows
                .iter()
                .find(|(s, _)| *s == self.sku(n))
                .map(|(_, q)| *q)
                .unwrap_or(0);
            assert_eq!(
                self.stock(n).await,
                STOCK - held,
                "stock of {}",
                self.sku(n)
            );
        }
        let sql = "SELECT count(*) FROM orders WHERE status = 'CANCELLED'";
        let cancelled: i64 = on_shop!(self, fetch_one, query_scalar(sql, sql)).unwrap();
        // The inventory's own database, PostgreSQL in either world.
        let released: i64 = sqlx::query_scalar("SELECT count(*) FROM inventory.releases")
            .fetch_one(&self.pool)
            .await
            .unwrap();
        assert_eq!(released, cancelled, "one release per cancelled order");
    }

    /// Reads up to `n` events within `timeout`.
    pub async fn read_events(
        consumer: &mut lapin::Consumer,
        n: usize,
        timeout: Duration,
    ) -> Vec<order_timeout::testing::broker::TimerEvent> {
        let mut events = Vec::new();
        let _ = tokio::time::timeout(timeout, async {
            while events.len() < n {
                let Some(Ok(delivery)) = consumer.next().await else {
                    break;
                };
                events.push(serde_json::from_slice(&delivery.data).expect("event is JSON"));
            }
        })
        .await;
        events
    }
}

/// A trigger on the reference orders table (named `name`) refusing the
/// cancellation of `order`, or of every order (`None`), as a shop's own
/// rule might: a CHECK violation raised by PostgreSQL, a `SIGNAL` on
/// MariaDB. Its text in each dialect: `(postgres, mysql)`.
pub fn refusing_trigger(name: &str, order: Option<&str>) -> (String, String) {
    let when = order.map_or(String::new(), |id| format!("NEW.id = '{id}' AND "));
    let postgres = format!(
        r#"
        CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF {when}NEW.status = 'CANCELLED' THEN
                RAISE EXCEPTION 'order % may not be cancelled', NEW.id
                    USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER {name} BEFORE UPDATE ON orders
            FOR EACH ROW EXECUTE FUNCTION {name}();
        "#
    );
    let mysql = format!(
        "CREATE TRIGGER {name} BEFORE UPDATE ON orders FOR EACH ROW \
         BEGIN \
           IF {when}NEW.status = 'CANCELLED' THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'this order may not be cancelled'; \
           END IF; \
         END"
    );
    (postgres, mysql)
}
