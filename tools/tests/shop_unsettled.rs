//! `ShopDb::unsettled`, what the bench asks twice a second while a phase
//! settles, counts exactly the open rows of one run's prefix: its unpaid
//! orders and its outbox rows with work pending that were not given up,
//! never another prefix's, on both dialects. (It replaced full counts that
//! read every row of the tables; a wrong count would end a phase early or
//! never.) Runs against the local PostgreSQL and MariaDB (`DATABASE_URL`,
//! `MYSQL_URL`), each in a database of its own, dropped afterwards.

use order_timeout::settings::SecretUrl;
use order_timeout_tools::scratch;
use order_timeout_tools::shop::ShopDb;

/// `(id, status, outbox: None or (released, published, given up))`.
type Row = (&'static str, &'static str, Option<(bool, bool, bool)>);

const ROWS: &[Row] = &[
    ("run1-1", "UNPAID", None),
    ("run1-2", "PAID", None),
    ("run1-3", "CANCELLED", Some((false, false, false))),
    ("run1-4", "CANCELLED", Some((true, false, false))),
    ("run1-5", "CANCELLED", Some((true, true, false))),
    ("run1-6", "CANCELLED", Some((false, true, true))),
    ("run1-7", "UNPAID", None),
    // Another run's rows, open ones included.
    ("run2-1", "UNPAID", None),
    ("run2-2", "CANCELLED", Some((false, false, false))),
];

async fn fill(shop: &ShopDb) {
    for &(id, status, outbox) in ROWS {
        let (order, entry) = match shop {
            ShopDb::Postgres(_) => (
                "INSERT INTO orders (id, status, expires_at) VALUES ($1, $2, now())",
                "INSERT INTO order_timeout_cancel_outbox (timer, order_id, stock_released_at, \
                 event_published_at, gave_up_at) VALUES ('cancel_unpaid', $1, \
                 CASE WHEN $2 THEN now() END, CASE WHEN $3 THEN now() END, CASE WHEN $4 THEN now() END)",
            ),
            ShopDb::MySql(_) => (
                "INSERT INTO orders (id, status, expires_at) VALUES (?, ?, UTC_TIMESTAMP(6))",
                "INSERT INTO order_timeout_cancel_outbox (timer, order_id, created_at, stock_released_at, \
                 event_published_at, gave_up_at) VALUES ('cancel_unpaid', ?, UTC_TIMESTAMP(6), \
                 IF(?, UTC_TIMESTAMP(6), NULL), IF(?, UTC_TIMESTAMP(6), NULL), IF(?, UTC_TIMESTAMP(6), NULL))",
            ),
        };
        // The same binds on either pool type.
        macro_rules! insert {
            ($pool:expr) => {{
                sqlx::query(order)
                    .bind(id)
                    .bind(status)
                    .execute($pool)
                    .await
                    .unwrap();
                if let Some((released, published, given_up)) = outbox {
                    sqlx::query(entry)
                        .bind(id)
                        .bind(released)
                        .bind(published)
                        .bind(given_up)
                        .execute($pool)
                        .await
                        .unwrap();
                }
            }};
        }
        match shop {
            ShopDb::Postgres(pool) => insert!(pool),
            ShopDb::MySql(pool) => insert!(pool),
        }
    }
}

async fn counts_the_open_rows_of_one_prefix(base: SecretUrl) {
    let scratch = scratch::ScratchDatabase::new(&base, "ot_tools_unsettled");
    let url = scratch.url().unwrap();
    let shop = ShopDb::prepare(&url, 2).await.expect("prepare the shop");
    fill(&shop).await;
    // Unpaid run1-1 and run1-7; pending run1-3 and run1-4 (run1-6 was given
    // up: waiting will not finish it).
    assert_eq!(shop.unsettled("run1-").await.unwrap(), (2, 2));
    assert_eq!(shop.unsettled("run2-").await.unwrap(), (1, 1));
    assert_eq!(shop.unsettled("run3-").await.unwrap(), (0, 0));
    // The full counts agree, given-up rows included there.
    let full = shop.progress("run1-").await.unwrap();
    assert_eq!((full.unpaid, full.pending_outbox), (2, 3));
    match shop {
        ShopDb::Postgres(pool) => pool.close().await,
        ShopDb::MySql(pool) => pool.close().await,
    }
}

#[tokio::test]
async fn postgres_counts_the_open_rows_of_one_prefix() {
    counts_the_open_rows_of_one_prefix(scratch::test_pg_server()).await;
}

#[tokio::test]
async fn mysql_counts_the_open_rows_of_one_prefix() {
    let base = SecretUrl::new(
        std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/mysql".into()),
    );
    counts_the_open_rows_of_one_prefix(base).await;
}
