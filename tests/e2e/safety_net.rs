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

use order_timeout::ops::parked::{self, Selection};
use order_timeout::settings::{DEFAULT_TIMER, Settings};
use order_timeout::testing::metrics::SweepResult;
use order_timeout::testing::store::Dialect;
use order_timeout_tools::measure::sweep_lateness::{Shop, ids};

use crate::common::{TestEnv, on_rabbitmq4};

/// The shop's database for one dialect: the test's PostgreSQL database, or
/// a fresh MariaDB one with the same reference schema.
async fn shop(env: &TestEnv, dialect: Dialect) -> Shop {
    Shop::new(dialect, &env.settings.database_url, "ot_net")
        .await
        .unwrap()
}

/// The service's settings for `shop`: stock given back by an `also`
/// statement logging each flip in `released` (a primary key: a second
/// release of one order fails), sweeps every second of orders overdue by
/// 3 s.
fn settings(shop: &Shop, env: &TestEnv) -> Settings {
    let mut settings = shop.settings(&env.settings);
    settings.sweeper.interval = Duration::from_secs(1);
    settings.sweeper.grace = Duration::from_secs(3);
    settings.sweeper.catch_up_window = Duration::ZERO;
    settings
}

async fn a_row_that_can_never_flip_is_parked_once_and_the_sweeper_goes_on(dialect: Dialect) {
    let env = TestEnv::new().await;
    let shop = shop(&env, dialect).await;
    shop.exec("CREATE TABLE released (order_id VARCHAR(128) NOT NULL PRIMARY KEY)")
        .await
        .unwrap();
    // Two orders whose release row already exists: their `also` statement
    // fails for them alone, every time. The first has a message and falls
    // due in 2 s (the consumer meets it, before the sweeper's grace), the
    // second has none and is due before every other order (the sweeper
    // meets it at the head of its first page).
    shop.exec("INSERT INTO released (order_id) VALUES ('net-poison-a'), ('net-poison-b')")
        .await
        .unwrap();
    shop.unpaid(&["net-poison-a".to_owned()], -2).await.unwrap();
    shop.unpaid(&["net-poison-b".to_owned()], 120)
        .await
        .unwrap();
    let lost = ids("net-lost", 50);
    shop.unpaid(&lost, 60).await.unwrap();
    let service = env.service_with(settings(&shop, &env)).await;
    env.publish_raw(br#""net-poison-a""#).await;

    env.eventually(
        Duration::from_secs(30),
        "every never-published order cancelled behind the poison rows",
        || async { shop.with_status("net-lost", "CANCELLED").await.unwrap() == 50 },
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
    assert_eq!(shop.with_status("net-poison", "UNPAID").await.unwrap(), 2);
    assert_eq!(
        shop.count("SELECT COUNT(*) FROM released").await.unwrap(),
        52
    );

    // The row changes: the sweeper tries it again (and parks it again: it
    // still fails), once.
    shop.exec("UPDATE orders SET cancel_reason = 'looked at' WHERE id = 'net-poison-b'")
        .await
        .unwrap();
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
        .await
        .unwrap();
    let replayed = parked::replay(&env.amqp, &env.parked_store(), &Selection::All)
        .await
        .unwrap();
    assert_eq!(replayed.replayed, 3);
    env.eventually(
        Duration::from_secs(15),
        "the poison rows cancelled",
        || async { shop.with_status("net-poison", "CANCELLED").await.unwrap() == 2 },
    )
    .await;
    assert_eq!(
        shop.count("SELECT COUNT(*) FROM released").await.unwrap(),
        52
    );
    env.eventually(Duration::from_secs(10), "the marks forgotten", || async {
        shop.count("SELECT COUNT(*) FROM order_timeout_set_aside")
            .await
            .unwrap()
            == 0
    })
    .await;
    assert_eq!(env.parked_count().await, 0);
    service.stop().await.unwrap();
}

async fn rows_the_flip_leaves_alone_never_hide_the_rows_behind_them(dialect: Dialect) {
    let env = TestEnv::new().await;
    let shop = shop(&env, dialect).await;
    shop.exec("CREATE TABLE released (order_id VARCHAR(128) NOT NULL PRIMARY KEY)")
        .await
        .unwrap();
    // 600 orders the timer flipped before and the shop re-opened (an outbox
    // row, unpaid again), and 60 rows that are no orders (a tab in the id),
    // all due before the orders nobody published a message for.
    shop.reopened(&ids("net-reopened", 600), 600).await.unwrap();
    let tab = match dialect {
        Dialect::Postgres => "E'net-bad\\t",
        Dialect::MySql => "'net-bad\\t",
    };
    for n in 0..60 {
        shop.exec(&format!(
            "INSERT INTO orders (id, status, expires_at) VALUES ({tab}{n:02}', 'UNPAID', {})",
            shop.ago(550)
        ))
        .await
        .unwrap();
    }
    let lost = ids("net-lost", 30);
    shop.unpaid(&lost, 30).await.unwrap();
    let mut settings = settings(&shop, &env);
    settings.sweeper.batch = 50;
    let service = env.service_with(settings).await;
    env.eventually(
        Duration::from_secs(30),
        "every never-published order cancelled behind 660 rows left alone",
        || async { shop.with_status("net-lost", "CANCELLED").await.unwrap() == 30 },
    )
    .await;
    // The rows left alone stay as they were: not flipped twice, no effects.
    assert_eq!(
        shop.with_status("net-reopened", "UNPAID").await.unwrap(),
        600
    );
    assert_eq!(shop.with_status("net-bad", "UNPAID").await.unwrap(), 60);
    assert_eq!(
        shop.count("SELECT COUNT(*) FROM released").await.unwrap(),
        30
    );
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
