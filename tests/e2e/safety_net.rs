//! The safety net never stops, on PostgreSQL and on MariaDB: the real
//! service sweeping a real shop table for orders whose timeout message was
//! never published.
//!
//! - One row that can never flip (its `also` statement hits a unique
//!   constraint for that order alone) is parked once, with the reason,
//!   whether the consumer or the sweeper met it first, and skipped by later
//!   sweeps until the row changes; every other overdue order is cancelled
//!   meanwhile. Fixed and replayed, it is cancelled, and its mark is
//!   forgotten.
//! - Rows the flip leaves alone (re-opened after an earlier flip) and rows
//!   that are no orders (an id no message could name), more of them than a
//!   sweep's page, never hide the orders behind them.
//!
//! Sweeps run every second here (grace 1 s, no catch-up window); the
//! defaults, and how late an unpublished order is cancelled behind such
//! rows with them, are in docs/guarantees.md.

use std::time::Duration;

use order_timeout::observe::metrics::SweepResult;
use order_timeout::ops::parked::{self, Selection};
use order_timeout::settings::{DEFAULT_TIMER, Release, SecretUrl, Settings};
use order_timeout::store::Dialect;
use order_timeout_tools::scratch::ScratchDatabase;
use order_timeout_tools::shop::ShopDb;

use crate::common::{TestEnv, on_rabbitmq4};
use crate::store::mysql_base;

/// The shop's database for one dialect: the test's PostgreSQL database, or
/// a fresh MariaDB one with the same reference schema.
struct Shop {
    dialect: Dialect,
    url: SecretUrl,
    db: ShopDb,
    _scratch: Option<ScratchDatabase>,
}

impl Shop {
    async fn new(env: &TestEnv, dialect: Dialect) -> Self {
        let (url, scratch) = match dialect {
            Dialect::Postgres => (env.settings.database_url.clone(), None),
            Dialect::MySql => {
                let scratch = ScratchDatabase::new(&mysql_base(), "ot_net");
                (scratch.url().unwrap(), Some(scratch))
            }
        };
        let db = ShopDb::prepare(&url, 4).await.unwrap();
        Self {
            dialect,
            url,
            db,
            _scratch: scratch,
        }
    }

    async fn exec(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match &self.db {
            ShopDb::Postgres(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
            ShopDb::MySql(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
        }
        .unwrap_or_else(|e| panic!("{e}"));
    }

    async fn count(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match &self.db {
            ShopDb::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            ShopDb::MySql(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The `also` statement's placeholder.
    fn mark(&self) -> &'static str {
        match self.dialect {
            Dialect::Postgres => "$1",
            Dialect::MySql => "?",
        }
    }

    /// An instant `secs` seconds ago, in the dialect.
    fn ago(&self, secs: i64) -> String {
        match self.dialect {
            Dialect::Postgres => format!("now() - interval '{secs} seconds'"),
            Dialect::MySql => format!("UTC_TIMESTAMP(6) - INTERVAL {secs} SECOND"),
        }
    }

    /// Unpaid orders `ids`, overdue by `secs` seconds (negative: due in
    /// `-secs`).
    async fn unpaid(&self, ids: &[String], secs: i64) {
        for id in ids {
            let at = self.ago(secs);
            self.exec(&format!(
                "INSERT INTO orders (id, status, expires_at) VALUES ('{id}', 'UNPAID', {at})"
            ))
            .await;
        }
    }

    /// Orders `ids` the default timer flipped earlier and the shop
    /// re-opened: unpaid, overdue by `secs` seconds, each with a finished
    /// outbox row.
    async fn reopened(&self, ids: &[String], secs: i64) {
        self.unpaid(ids, secs).await;
        let at = self.ago(secs - 60);
        let outbox: Vec<String> = ids
            .iter()
            .map(|id| format!("('{DEFAULT_TIMER}', '{id}', {at}, {at}, {at})"))
            .collect();
        self.exec(&format!(
            "INSERT INTO order_timeout_cancel_outbox \
                    (timer, order_id, created_at, stock_released_at, event_published_at) VALUES {}",
            outbox.join(", ")
        ))
        .await;
    }

    /// How many of `prefix`'s orders are in `status`.
    async fn with_status(&self, prefix: &str, status: &str) -> i64 {
        self.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE id LIKE '{prefix}%' AND status = '{status}'"
        ))
        .await
    }

    /// The service's settings for this shop: stock given back by an `also`
    /// statement logging each flip in `released` (a primary key: a second
    /// release of one order fails), sweeps every second of orders overdue
    /// by 3 s.
    fn settings(&self, env: &TestEnv) -> Settings {
        let mut settings = env.settings.clone();
        settings.database_url = self.url.clone();
        settings.orders.also = vec![format!(
            "INSERT INTO released (order_id) VALUES ({})",
            self.mark()
        )];
        settings.inventory.release = Release::None;
        settings.sweeper.interval = Duration::from_secs(1);
        settings.sweeper.grace = Duration::from_secs(3);
        settings.sweeper.catch_up_window = Duration::ZERO;
        settings
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
}

async fn a_row_that_can_never_flip_is_parked_once_and_the_sweeper_goes_on(dialect: Dialect) {
    let env = TestEnv::new().await;
    let shop = Shop::new(&env, dialect).await;
    shop.exec("CREATE TABLE released (order_id VARCHAR(128) NOT NULL PRIMARY KEY)")
        .await;
    // Two orders whose release row already exists: their `also` statement
    // fails for them alone, every time. The first has a message and falls
    // due in 2 s (the consumer meets it, before the sweeper's grace), the
    // second has none and is due before every other order (the sweeper
    // meets it at the head of its first page).
    shop.exec("INSERT INTO released (order_id) VALUES ('net-poison-a'), ('net-poison-b')")
        .await;
    shop.unpaid(&["net-poison-a".to_owned()], -2).await;
    shop.unpaid(&["net-poison-b".to_owned()], 120).await;
    let lost = ids("net-lost", 50);
    shop.unpaid(&lost, 60).await;
    let service = env.service_with(shop.settings(&env)).await;
    env.publish_raw(br#""net-poison-a""#).await;

    env.eventually(
        Duration::from_secs(30),
        "every never-published order cancelled behind the poison rows",
        || async { shop.with_status("net-lost", "CANCELLED").await == 50 },
    )
    .await;
    // Parked once each, however many sweeps pass.
    let parked_once = || async {
        let listing = env.parked_listing().await;
        let mut kinds: Vec<(String, String)> = listing
            .messages
            .iter()
            .map(|m| {
                (
                    m.order_id.clone().unwrap_or_default(),
                    m.error_kind.clone().unwrap_or_default(),
                )
            })
            .collect();
        kinds.sort();
        for m in &listing.messages {
            let error = m.error.clone().unwrap_or_default().to_lowercase();
            assert!(
                error.contains("duplicate") || error.contains("unique"),
                "{error}"
            );
        }
        kinds
    };
    let once = vec![
        ("net-poison-a".to_owned(), "permanent_failure".to_owned()),
        ("net-poison-b".to_owned(), "permanent_failure".to_owned()),
    ];
    env.eventually(
        Duration::from_secs(10),
        "both poison rows parked",
        || async { parked_once().await.len() == 2 },
    )
    .await;
    env.more_sweeps(&service, 3).await;
    assert_eq!(parked_once().await, once, "parked once each");
    assert_eq!(
        service
            .metrics
            .sweeps_of(DEFAULT_TIMER, SweepResult::Failed),
        0,
        "no sweep failed"
    );
    assert_eq!(shop.with_status("net-poison", "UNPAID").await, 2);
    assert_eq!(shop.count("SELECT COUNT(*) FROM released").await, 52);

    // The row changes: the sweeper tries it again (and parks it again: it
    // still fails), once.
    shop.exec("UPDATE orders SET cancel_reason = 'looked at' WHERE id = 'net-poison-b'")
        .await;
    env.eventually(
        Duration::from_secs(15),
        "the changed row parked again",
        || async { parked_once().await.len() == 3 },
    )
    .await;
    env.more_sweeps(&service, 3).await;
    assert_eq!(
        parked_once().await.len(),
        3,
        "the changed row parked once more"
    );

    // Fixed, and replayed: cancelled, effects once, the marks forgotten.
    shop.exec("DELETE FROM released WHERE order_id LIKE 'net-poison%'")
        .await;
    let replayed = parked::replay(&env.amqp, &env.parked_store(), &Selection::All)
        .await
        .unwrap();
    assert_eq!(replayed.replayed, 3);
    env.eventually(
        Duration::from_secs(15),
        "the poison rows cancelled",
        || async { shop.with_status("net-poison", "CANCELLED").await == 2 },
    )
    .await;
    assert_eq!(shop.count("SELECT COUNT(*) FROM released").await, 52);
    env.eventually(Duration::from_secs(10), "the marks forgotten", || async {
        shop.count("SELECT COUNT(*) FROM order_timeout_set_aside")
            .await
            == 0
    })
    .await;
    assert_eq!(env.parked_count().await, 0);
    service.stop().await.unwrap();
}

async fn rows_the_flip_leaves_alone_never_hide_the_rows_behind_them(dialect: Dialect) {
    let env = TestEnv::new().await;
    let shop = Shop::new(&env, dialect).await;
    shop.exec("CREATE TABLE released (order_id VARCHAR(128) NOT NULL PRIMARY KEY)")
        .await;
    // 600 orders the timer flipped before and the shop re-opened (an outbox
    // row, unpaid again), and 60 rows that are no orders (a tab in the id),
    // all due before the orders nobody published a message for.
    shop.reopened(&ids("net-reopened", 600), 600).await;
    let tab = match dialect {
        Dialect::Postgres => "E'net-bad\\t",
        Dialect::MySql => "'net-bad\\t",
    };
    for n in 0..60 {
        shop.exec(&format!(
            "INSERT INTO orders (id, status, expires_at) VALUES ({tab}{n:02}', 'UNPAID', {})",
            shop.ago(550)
        ))
        .await;
    }
    let lost = ids("net-lost", 30);
    shop.unpaid(&lost, 30).await;
    let mut settings = shop.settings(&env);
    settings.sweeper.batch = 50;
    let service = env.service_with(settings).await;
    env.eventually(
        Duration::from_secs(30),
        "every never-published order cancelled behind 660 rows left alone",
        || async { shop.with_status("net-lost", "CANCELLED").await == 30 },
    )
    .await;
    // The rows left alone stay as they were: not flipped twice, no effects.
    assert_eq!(shop.with_status("net-reopened", "UNPAID").await, 600);
    assert_eq!(shop.with_status("net-bad", "UNPAID").await, 60);
    assert_eq!(shop.count("SELECT COUNT(*) FROM released").await, 30);
    assert_eq!(
        service
            .metrics
            .sweeps_of(DEFAULT_TIMER, SweepResult::Failed),
        0
    );
    assert_eq!(env.parked_count().await, 0, "nothing parked");
    service.stop().await.unwrap();
}

mod postgres {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_that_can_never_flip_is_parked_once_and_the_sweeper_goes_on() {
        super::a_row_that_can_never_flip_is_parked_once_and_the_sweeper_goes_on(Dialect::Postgres)
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_the_flip_leaves_alone_never_hide_the_rows_behind_them() {
        super::rows_the_flip_leaves_alone_never_hide_the_rows_behind_them(Dialect::Postgres).await;
    }
}

mod mysql {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_that_can_never_flip_is_parked_once_and_the_sweeper_goes_on() {
        super::a_row_that_can_never_flip_is_parked_once_and_the_sweeper_goes_on(Dialect::MySql)
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_the_flip_leaves_alone_never_hide_the_rows_behind_them() {
        super::rows_the_flip_leaves_alone_never_hide_the_rows_behind_them(Dialect::MySql).await;
    }
}

// On RabbitMQ 4.x: a poison row parked once while the sweeper goes on.
on_rabbitmq4!(a_row_that_can_never_flip_is_parked_once_and_the_sweeper_goes_on);
