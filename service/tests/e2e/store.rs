//! The store suite: every state the cancel transaction can report, and the
//! outbox, sweeper and migration operations, written once against the
//! [`OrderStore`] interface and run for every SQL dialect
//! (`store_suite!(dialect, Fixture)` below; one line per dialect).
//!
//! A fixture is a fresh database of its dialect with the service's
//! migrations and the reference shop schema, plus the few statements the
//! cases need to put an order row into a state (as the shop would).

use std::time::Duration;

use chrono::{DateTime, Utc};
use order_timeout::message::OrderId;
use order_timeout::settings::{self, SecretUrl};
use order_timeout::store::{self, Cancellation, OrderState, OrderStore, ShopSchema, Store};

const REASON: &str = "payment timeout";
const LEASE: Duration = Duration::from_secs(15);

/// A fresh database of one dialect, and the shop's side of it.
trait Fixture: Sized {
    /// A fresh database: migrated, with the reference shop schema.
    async fn new() -> Self;
    /// The store under test.
    fn store(&self) -> &Store;
    /// Its URL (for the migration cases).
    fn url(&self) -> &SecretUrl;
    /// Inserts an order row with `status` (`UNPAID`, `PAID`, `CANCELLED`)
    /// whose deadline is `due_in` from now (negative: overdue).
    async fn insert(&self, id: &str, status: &str, due_in: chrono::Duration);
    /// Adds an item to an order.
    async fn add_item(&self, id: &str, sku: &str, quantity: i64);
    /// The order row's `(status, cancelled_at, cancel_reason)`.
    async fn row(&self, id: &str) -> (String, Option<DateTime<Utc>>, Option<String>);
    /// Outbox rows for the order (0 or 1).
    async fn outbox_rows(&self, id: &str) -> i64;
    /// Pays the order in a transaction that holds the row while `during`
    /// runs, then commits: what a concurrent payment looks like to a cancel
    /// statement that runs meanwhile.
    async fn pay_concurrently(&self, id: &str, during: impl Future<Output = ()>);
    /// Ages an outbox row (its `created_at`) by `by`.
    async fn age_outbox(&self, id: &str, by: chrono::Duration);
    /// The column definitions of the shop's tables, to compare before and
    /// after a migration.
    async fn shop_ddl(&self) -> Vec<String>;
    /// The tables of the database that are not the shop's reference ones.
    async fn other_tables(&self) -> Vec<String>;
}

fn id(s: &str) -> OrderId {
    OrderId::parse(s).unwrap()
}

fn secs(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

/// `cancel_due` for one order.
async fn state_of(store: &dyn OrderStore, order: &str, lease: Duration) -> OrderState {
    let states = store.cancel_due(&[id(order)], lease).await.unwrap();
    assert_eq!(states.len(), 1, "{states:?}");
    assert_eq!(states[0].0.as_str(), order);
    states[0].1.clone()
}

fn cancellation(state: OrderState) -> Cancellation {
    match state {
        OrderState::Cancelled(c) => c,
        other => panic!("expected Cancelled, got {other:?}"),
    }
}

mod cases {
    use super::*;

    pub(super) async fn unknown_order_is_reported_unknown(f: &impl Fixture) {
        assert_eq!(
            state_of(f.store().as_ref(), "nobody", LEASE).await,
            OrderState::Unknown
        );
        assert_eq!(f.outbox_rows("nobody").await, 0);
    }

    pub(super) async fn paid_order_is_left_alone(f: &impl Fixture) {
        f.insert("paid", "PAID", secs(-5)).await;
        assert_eq!(
            state_of(f.store().as_ref(), "paid", LEASE).await,
            OrderState::Paid
        );
        assert_eq!(f.row("paid").await, ("PAID".into(), None, None));
        assert_eq!(f.outbox_rows("paid").await, 0);
    }

    pub(super) async fn order_not_yet_due_is_not_cancelled(f: &impl Fixture) {
        f.insert("later", "UNPAID", secs(3600)).await;
        match state_of(f.store().as_ref(), "later", LEASE).await {
            OrderState::NotYetDue { expires_at, db_now } => {
                assert!(expires_at > db_now);
                let left = expires_at - db_now;
                assert!(left > secs(3590) && left <= secs(3600), "{left}");
            }
            other => panic!("expected NotYetDue, got {other:?}"),
        }
        assert_eq!(f.row("later").await.0, "UNPAID");
        assert_eq!(f.outbox_rows("later").await, 0);
    }

    pub(super) async fn overdue_order_is_cancelled_just_now_with_the_lease(f: &impl Fixture) {
        f.insert("due", "UNPAID", secs(-2)).await;
        let c = cancellation(state_of(f.store().as_ref(), "due", LEASE).await);
        assert!(c.just_now && c.leased && c.release_pending && c.event_pending);
        assert!(c.cancelled_at >= c.expires_at, "never early");
        let (status, cancelled_at, reason) = f.row("due").await;
        assert_eq!(status, "CANCELLED");
        // `set`'s `now()`: the same instant (PostgreSQL), or that second
        // (MySQL's `now()` has whole seconds).
        let set_at = cancelled_at.expect("cancelled_at set");
        assert!(
            (set_at - c.cancelled_at).abs() < secs(1),
            "{set_at} vs {}",
            c.cancelled_at
        );
        assert_eq!(reason.as_deref(), Some(REASON));
        assert_eq!(f.outbox_rows("due").await, 1);
    }

    pub(super) async fn a_live_lease_is_reported_as_leased_elsewhere(f: &impl Fixture) {
        f.insert("busy", "UNPAID", secs(-1)).await;
        let store = f.store().as_ref();
        cancellation(state_of(store, "busy", LEASE).await);
        match state_of(store, "busy", LEASE).await {
            OrderState::LeasedElsewhere { until, db_now } => {
                assert!(
                    until > db_now && until - db_now <= secs(15),
                    "{until} {db_now}"
                );
            }
            other => panic!("expected LeasedElsewhere, got {other:?}"),
        }
    }

    pub(super) async fn an_earlier_cancellation_with_work_pending_is_taken_over(f: &impl Fixture) {
        f.insert("crashed", "UNPAID", secs(-1)).await;
        let store = f.store().as_ref();
        // A worker that crashed: its lease ran out at once.
        let first = cancellation(state_of(store, "crashed", Duration::ZERO).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let c = cancellation(state_of(store, "crashed", LEASE).await);
        assert!(!c.just_now && c.leased && c.release_pending && c.event_pending);
        assert_eq!(c.cancelled_at, first.cancelled_at);
        // Given back after a failure: the next delivery takes it at once.
        store.release_leases(&["crashed"]).await.unwrap();
        let c = cancellation(state_of(store, "crashed", LEASE).await);
        assert!(!c.just_now && c.leased);
    }

    pub(super) async fn finished_work_is_reported_done_and_marks_are_idempotent(f: &impl Fixture) {
        f.insert("done", "UNPAID", secs(-1)).await;
        let store = f.store().as_ref();
        cancellation(state_of(store, "done", LEASE).await);
        store.mark_done(&["done"], &[]).await.unwrap();
        store.release_leases(&["done"]).await.unwrap();
        let c = cancellation(state_of(store, "done", LEASE).await);
        assert!(!c.release_pending && c.event_pending, "{c:?}");
        store.mark_done(&["done"], &["done"]).await.unwrap();
        store.mark_done(&[], &["done"]).await.unwrap();
        let c = cancellation(state_of(store, "done", LEASE).await);
        assert!(!c.just_now && !c.leased && !c.release_pending && !c.event_pending);
        store.mark_done(&[], &[]).await.unwrap();
        store.release_leases(&[]).await.unwrap();
    }

    pub(super) async fn an_order_cancelled_by_someone_else_is_not_ours(f: &impl Fixture) {
        f.insert("theirs", "CANCELLED", secs(-5)).await;
        assert_eq!(
            state_of(f.store().as_ref(), "theirs", LEASE).await,
            OrderState::CancelledElsewhere
        );
        assert_eq!(f.outbox_rows("theirs").await, 0);
    }

    pub(super) async fn a_payment_committing_during_the_cancel_wins(f: &impl Fixture) {
        f.insert("race", "UNPAID", secs(-1)).await;
        let store = f.store().clone();
        let mut cancel = None;
        f.pay_concurrently("race", async {
            cancel = Some(tokio::spawn(async move {
                state_of(store.as_ref(), "race", LEASE).await
            }));
            // Let the cancel statement reach the held row.
            tokio::time::sleep(Duration::from_millis(300)).await;
        })
        .await;
        let state = cancel.unwrap().await.unwrap();
        assert!(
            matches!(state, OrderState::Contended | OrderState::Paid),
            "{state:?}"
        );
        assert_eq!(f.row("race").await.0, "PAID");
        assert_eq!(f.outbox_rows("race").await, 0);
        // Asked again (what the batch does with a contended order): paid.
        assert_eq!(
            state_of(f.store().as_ref(), "race", LEASE).await,
            OrderState::Paid
        );
    }

    pub(super) async fn a_batch_reports_every_order_once(f: &impl Fixture) {
        f.insert("b-due", "UNPAID", secs(-1)).await;
        f.insert("b-paid", "PAID", secs(-1)).await;
        f.insert("b-later", "UNPAID", secs(60)).await;
        f.insert("b-theirs", "CANCELLED", secs(-1)).await;
        let ids: Vec<OrderId> = ["b-due", "b-paid", "b-later", "b-theirs", "b-ghost"]
            .into_iter()
            .map(id)
            .collect();
        let mut states = f.store().cancel_due(&ids, LEASE).await.unwrap();
        states.sort_by(|a, b| a.0.cmp(&b.0));
        let got: Vec<(&str, &str)> = states
            .iter()
            .map(|(id, s)| {
                let kind = match s {
                    OrderState::Cancelled(c) if c.just_now => "cancelled",
                    OrderState::Paid => "paid",
                    OrderState::NotYetDue { .. } => "not yet due",
                    OrderState::CancelledElsewhere => "cancelled elsewhere",
                    OrderState::Unknown => "unknown",
                    _ => "other",
                };
                (id.as_str(), kind)
            })
            .collect();
        assert_eq!(
            got,
            [
                ("b-due", "cancelled"),
                ("b-ghost", "unknown"),
                ("b-later", "not yet due"),
                ("b-paid", "paid"),
                ("b-theirs", "cancelled elsewhere"),
            ]
        );
    }

    pub(super) async fn items_are_read_per_order(f: &impl Fixture) {
        f.insert("i-1", "UNPAID", secs(-1)).await;
        f.insert("i-2", "UNPAID", secs(-1)).await;
        f.insert("i-3", "UNPAID", secs(-1)).await;
        f.add_item("i-1", "apple", 2).await;
        f.add_item("i-1", "pear", 1).await;
        f.add_item("i-2", "plum", 5).await;
        f.add_item("i-3", "fig", 7).await;
        let (a, b, none) = (id("i-1"), id("i-2"), id("i-none"));
        let items = f.store().items(&[&a, &b, &none]).await.unwrap();
        assert_eq!(items.len(), 2, "{items:?}");
        let i1: Vec<(&str, i64)> = items["i-1"]
            .iter()
            .map(|i| (i.sku.as_str(), i.quantity))
            .collect();
        assert_eq!(i1, [("apple", 2), ("pear", 1)]);
        assert_eq!(items["i-2"][0].quantity, 5);
    }

    pub(super) async fn the_sweeper_finds_overdue_orders_oldest_first(f: &impl Fixture) {
        f.insert("s-old", "UNPAID", secs(-300)).await;
        f.insert("s-older", "UNPAID", secs(-600)).await;
        f.insert("s-young", "UNPAID", secs(-5)).await;
        f.insert("s-later", "UNPAID", secs(300)).await;
        f.insert("s-paid", "PAID", secs(-900)).await;
        f.insert("s-theirs", "CANCELLED", secs(-900)).await;
        let store = f.store();
        let grace = Duration::from_secs(60);
        let found = store.overdue(grace, 10).await.unwrap();
        let found: Vec<&str> = found.iter().map(OrderId::as_str).collect();
        assert_eq!(found, ["s-older", "s-old"]);
        let first = store.overdue(grace, 1).await.unwrap();
        assert_eq!(first, [id("s-older")]);
    }

    pub(super) async fn the_sweeper_finds_stale_outbox_work_without_a_live_lease(f: &impl Fixture) {
        for order in ["o-stale", "o-leased", "o-done", "o-fresh"] {
            f.insert(order, "UNPAID", secs(-1)).await;
        }
        let store = f.store();
        let ids: Vec<OrderId> = ["o-stale", "o-leased", "o-done", "o-fresh"]
            .into_iter()
            .map(id)
            .collect();
        store.cancel_due(&ids, LEASE).await.unwrap();
        store.mark_done(&["o-done"], &["o-done"]).await.unwrap();
        store
            .release_leases(&["o-stale", "o-done", "o-fresh"])
            .await
            .unwrap();
        for order in ["o-stale", "o-leased", "o-done"] {
            f.age_outbox(order, secs(-600)).await;
        }
        let found = store
            .stale_outbox(Duration::from_secs(60), 10)
            .await
            .unwrap();
        assert_eq!(found, [id("o-stale")]);
    }

    pub(super) async fn ping_answers(f: &impl Fixture) {
        f.store().ping().await.unwrap();
    }

    pub(super) async fn migrate_creates_only_the_services_tables_and_leaves_the_shops_alone(
        f: &impl Fixture,
    ) {
        let before = f.shop_ddl().await;
        assert!(!before.is_empty());
        store::migrate(f.url()).await.unwrap();
        store::migrate(f.url()).await.unwrap();
        assert_eq!(
            f.shop_ddl().await,
            before,
            "the shop's tables are unchanged"
        );
        let mut other = f.other_tables().await;
        other.sort();
        assert_eq!(
            other,
            ["order_timeout_cancel_outbox", "order_timeout_migrations"]
        );
    }
}

/// Instantiates every case of [`cases`] as a test against `$fixture`.
macro_rules! store_suite {
    ($dialect:ident, $fixture:ty) => {
        mod $dialect {
            use super::*;
            store_suite!(@cases $fixture;
                unknown_order_is_reported_unknown,
                paid_order_is_left_alone,
                order_not_yet_due_is_not_cancelled,
                overdue_order_is_cancelled_just_now_with_the_lease,
                a_live_lease_is_reported_as_leased_elsewhere,
                an_earlier_cancellation_with_work_pending_is_taken_over,
                finished_work_is_reported_done_and_marks_are_idempotent,
                an_order_cancelled_by_someone_else_is_not_ours,
                a_payment_committing_during_the_cancel_wins,
                a_batch_reports_every_order_once,
                items_are_read_per_order,
                the_sweeper_finds_overdue_orders_oldest_first,
                the_sweeper_finds_stale_outbox_work_without_a_live_lease,
                ping_answers,
                migrate_creates_only_the_services_tables_and_leaves_the_shops_alone,
            );
        }
    };
    (@cases $fixture:ty; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let fixture = <$fixture as Fixture>::new().await;
                cases::$case(&fixture).await;
            }
        )*
    };
}

store_suite!(postgres, pg::PgFixture);
store_suite!(mysql, my::MyFixture);

mod pg {
    //! PostgreSQL: a fresh database per test, dropped afterwards.

    use order_timeout_tools::scratch;
    use sqlx::PgPool;

    use super::*;

    pub(super) struct PgFixture {
        name: String,
        base: SecretUrl,
        url: SecretUrl,
        pool: PgPool,
        store: Store,
    }

    impl Fixture for PgFixture {
        async fn new() -> Self {
            let base = SecretUrl::new(
                std::env::var("DATABASE_URL")
                    .unwrap_or_else(|_| settings::DEFAULT_DATABASE_URL.into()),
            );
            let name = format!("ot_store_{}", uuid::Uuid::new_v4().simple());
            let url = scratch::with_path(&base, &name).unwrap();
            let pool = order_timeout_tools::shop::prepare_database(&url, 5)
                .await
                .expect("prepare the store test database");
            let store = store::connect_lazy(&url, 5, &ShopSchema::default()).unwrap();
            Self {
                name,
                base,
                url,
                pool,
                store,
            }
        }

        fn store(&self) -> &Store {
            &self.store
        }

        fn url(&self) -> &SecretUrl {
            &self.url
        }

        async fn insert(&self, id: &str, status: &str, due_in: chrono::Duration) {
            sqlx::query("INSERT INTO orders (id, status, expires_at) VALUES ($1, $2, $3)")
                .bind(id)
                .bind(status)
                .bind(Utc::now() + due_in)
                .execute(&self.pool)
                .await
                .unwrap();
        }

        async fn add_item(&self, id: &str, sku: &str, quantity: i64) {
            sqlx::query("INSERT INTO order_items (order_id, sku, quantity) VALUES ($1, $2, $3)")
                .bind(id)
                .bind(sku)
                .bind(quantity)
                .execute(&self.pool)
                .await
                .unwrap();
        }

        async fn row(&self, id: &str) -> (String, Option<DateTime<Utc>>, Option<String>) {
            sqlx::query_as("SELECT status, cancelled_at, cancel_reason FROM orders WHERE id = $1")
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .unwrap()
        }

        async fn outbox_rows(&self, id: &str) -> i64 {
            sqlx::query_scalar(
                "SELECT count(*) FROM order_timeout_cancel_outbox WHERE order_id = $1",
            )
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
        }

        async fn pay_concurrently(&self, id: &str, during: impl Future<Output = ()>) {
            let mut tx = self.pool.begin().await.unwrap();
            sqlx::query("UPDATE orders SET status = 'PAID' WHERE id = $1 AND status = 'UNPAID'")
                .bind(id)
                .execute(&mut *tx)
                .await
                .unwrap();
            during.await;
            tx.commit().await.unwrap();
        }

        async fn age_outbox(&self, id: &str, by: chrono::Duration) {
            sqlx::query(
                "UPDATE order_timeout_cancel_outbox SET created_at = created_at + $2 WHERE order_id = $1",
            )
            .bind(id)
            .bind(by)
            .execute(&self.pool)
            .await
            .unwrap();
        }

        async fn shop_ddl(&self) -> Vec<String> {
            sqlx::query_scalar(
                r#"
                SELECT concat_ws(' ', table_schema, table_name, column_name, data_type,
                                 is_nullable, column_default)
                  FROM information_schema.columns
                 WHERE (table_schema = 'public' AND table_name IN ('orders', 'order_items'))
                    OR table_schema = 'inventory'
                 ORDER BY table_schema, table_name, ordinal_position
                "#,
            )
            .fetch_all(&self.pool)
            .await
            .unwrap()
        }

        async fn other_tables(&self) -> Vec<String> {
            sqlx::query_scalar(
                r#"
                SELECT table_name::text FROM information_schema.tables
                 WHERE table_schema = 'public' AND table_name NOT IN ('orders', 'order_items')
                "#,
            )
            .fetch_all(&self.pool)
            .await
            .unwrap()
        }
    }

    impl Drop for PgFixture {
        fn drop(&mut self) {
            let _ = scratch::drop_database_blocking(&self.base, &self.name);
        }
    }
}

pub(crate) use my::mysql_base;

mod my {
    //! MySQL/MariaDB: a fresh database per test on the server of
    //! `MYSQL_URL` (default: the local MariaDB's root), dropped afterwards.

    use order_timeout_tools::scratch;
    use sqlx::MySqlPool;

    use super::*;

    /// The MySQL/MariaDB server the tests use.
    pub(crate) fn mysql_base() -> SecretUrl {
        SecretUrl::new(
            std::env::var("MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/mysql".into()),
        )
    }

    pub(super) struct MyFixture {
        name: String,
        base: SecretUrl,
        url: SecretUrl,
        pool: MySqlPool,
        store: Store,
    }

    impl Fixture for MyFixture {
        async fn new() -> Self {
            let base = mysql_base();
            let name = format!("ot_store_{}", uuid::Uuid::new_v4().simple());
            let url = scratch::with_path(&base, &name).unwrap();
            let pool = order_timeout_tools::shop::prepare_mysql_database(&url, 5)
                .await
                .expect("prepare the MySQL store test database");
            let store = store::connect_lazy(&url, 5, &ShopSchema::default()).unwrap();
            Self {
                name,
                base,
                url,
                pool,
                store,
            }
        }

        fn store(&self) -> &Store {
            &self.store
        }

        fn url(&self) -> &SecretUrl {
            &self.url
        }

        async fn insert(&self, id: &str, status: &str, due_in: chrono::Duration) {
            sqlx::query("INSERT INTO orders (id, status, expires_at) VALUES (?, ?, ?)")
                .bind(id)
                .bind(status)
                .bind(Utc::now() + due_in)
                .execute(&self.pool)
                .await
                .unwrap();
        }

        async fn add_item(&self, id: &str, sku: &str, quantity: i64) {
            sqlx::query("INSERT INTO order_items (order_id, sku, quantity) VALUES (?, ?, ?)")
                .bind(id)
                .bind(sku)
                .bind(quantity)
                .execute(&self.pool)
                .await
                .unwrap();
        }

        async fn row(&self, id: &str) -> (String, Option<DateTime<Utc>>, Option<String>) {
            sqlx::query_as("SELECT status, cancelled_at, cancel_reason FROM orders WHERE id = ?")
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .unwrap()
        }

        async fn outbox_rows(&self, id: &str) -> i64 {
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM order_timeout_cancel_outbox WHERE order_id = ?",
            )
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
        }

        async fn pay_concurrently(&self, id: &str, during: impl Future<Output = ()>) {
            let mut tx = self.pool.begin().await.unwrap();
            sqlx::query("UPDATE orders SET status = 'PAID' WHERE id = ? AND status = 'UNPAID'")
                .bind(id)
                .execute(&mut *tx)
                .await
                .unwrap();
            during.await;
            tx.commit().await.unwrap();
        }

        async fn age_outbox(&self, id: &str, by: chrono::Duration) {
            sqlx::query(
                "UPDATE order_timeout_cancel_outbox \
                    SET created_at = created_at + INTERVAL ? MICROSECOND WHERE order_id = ?",
            )
            .bind(by.num_microseconds().unwrap())
            .bind(id)
            .execute(&self.pool)
            .await
            .unwrap();
        }

        async fn shop_ddl(&self) -> Vec<String> {
            sqlx::query_scalar(
                "SELECT CAST(CONCAT_WS(' ', TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, \
                                       COALESCE(COLUMN_DEFAULT, '-'), COLUMN_KEY) AS CHAR) \
                   FROM information_schema.COLUMNS \
                  WHERE TABLE_SCHEMA = DATABASE() \
                    AND TABLE_NAME IN ('orders', 'order_items', 'shop_stock') \
                  ORDER BY TABLE_NAME, ORDINAL_POSITION",
            )
            .fetch_all(&self.pool)
            .await
            .unwrap()
        }

        async fn other_tables(&self) -> Vec<String> {
            sqlx::query_scalar(
                "SELECT CAST(TABLE_NAME AS CHAR) FROM information_schema.TABLES \
                  WHERE TABLE_SCHEMA = DATABASE() \
                    AND TABLE_NAME NOT IN ('orders', 'order_items', 'shop_stock')",
            )
            .fetch_all(&self.pool)
            .await
            .unwrap()
        }
    }

    impl Drop for MyFixture {
        fn drop(&mut self) {
            let _ = scratch::drop_database_blocking(&self.base, &self.name);
        }
    }
}
