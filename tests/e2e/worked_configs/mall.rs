//! `config/examples/mall-timers-mysql.toml` on MariaDB: macrozheng/mall's
//! `oms_order` and friends (`document/sql/mall.sql`) plus the two columns
//! and the "settle the past" statement the file documents; every timer
//! flips exactly its rows, once, never early, with its effects.

use super::*;

/// A fresh MariaDB database for the mall shop, migrated, its sessions in
/// the shop's zone (`+08:00`); dropped with the [`Shop`].
async fn mall_db() -> Shop {
    let scratch = ScratchDatabase::new(&mysql_base(), "ot_mall_timers");
    let url = scratch.url().unwrap();
    order_timeout::testing::store::migrate(&url).await.unwrap();
    let pool = mysql_pool(&url, "+08:00", 2).await;
    Shop {
        url,
        shop: ShopDb::MySql(pool),
        _scratch: Some(scratch),
    }
}

/// mall's tables as `document/sql/mall.sql` creates them, trimmed to the
/// columns the worked config reads and writes, with its settings row: the
/// shop before the migration the config's header documents.
const MALL_SCHEMA: &str = include_str!("../../fixtures/mall_timers_mysql.sql");

/// The shop before the migration the config documents: two orders
/// received long ago (30 days: both windows closed long since) and lately
/// (3 days: both still open).
const MALL_PAST: &str = r#"
INSERT INTO oms_order (id, member_id, member_username, status, confirm_status,
                       create_time, delivery_time, receive_time)
VALUES (401, 1, 'windy', 3, 1, NOW() - INTERVAL 40 DAY, NOW() - INTERVAL 35 DAY,
        NOW() - INTERVAL 30 DAY),
       (402, 1, 'windy', 3, 1, NOW() - INTERVAL 10 DAY, NOW() - INTERVAL 5 DAY,
        NOW() - INTERVAL 3 DAY);
INSERT INTO oms_order_item (order_id, product_id, product_name, product_quantity, product_sku_id)
VALUES (401, 26, 'HUAWEI P20', 1, 1), (402, 26, 'HUAWEI P20', 1, 1);
"#;

/// Members, stock, coupons and orders, written after the migration. Every
/// deadline is relative to now: due 8 to 14 s from now, or much later.
const MALL_ROWS: &str = r#"
INSERT INTO ums_member (id, nickname, icon, integration)
VALUES (1, 'windy', 'https://example.com/icon/windy.png', 500),
       (2, NULL, NULL, 50),
       (3, 'lily', NULL, 30);
INSERT INTO pms_sku_stock (id, sku_code, stock, lock_stock)
VALUES (1, '201806070026001', 100, 15), (2, '201806070026002', 100, 17), (3, '201806070026003', 100, 14);
INSERT INTO sms_coupon_history (id, coupon_id, member_id, use_status, use_time)
VALUES (1, 7, 1, 0, NULL),
       (2, 7, 1, 1, NOW() - INTERVAL 1 HOUR),
       (3, 7, 1, 1, NOW() - INTERVAL 1 HOUR),
       (4, 7, 2, 1, NOW() - INTERVAL 1 HOUR),
       (5, 8, 1, 1, NOW() - INTERVAL 1 HOUR);

-- cancel_unpaid: created normal_order_overtime (120) minutes before the deadline.
-- 101: a coupon and 100 points used, two lines of SKU 1 and one of SKU 2;
-- 102: no coupon, no points; 103: paid already; 104: deleted by the member;
-- 105: due in two hours; 106: paid by the member while the test runs.
INSERT INTO oms_order (id, member_id, coupon_id, member_username, status, confirm_status,
                       delete_status, use_integration, create_time)
VALUES (101, 1, 7,    'windy', 0, 0, 0, 100, NOW() - INTERVAL 120 MINUTE + INTERVAL 8 SECOND),
       (102, 2, NULL, 'test',  0, 0, 0, 0,   NOW() - INTERVAL 120 MINUTE + INTERVAL 9 SECOND),
       (103, 3, NULL, 'lily',  1, 0, 0, 30,  NOW() - INTERVAL 120 MINUTE + INTERVAL 8 SECOND),
       (104, 1, 8,    'windy', 0, 0, 1, 20,  NOW() - INTERVAL 120 MINUTE + INTERVAL 8 SECOND),
       (105, 2, NULL, 'test',  0, 0, 0, 0,   NOW()),
       (106, 3, NULL, 'lily',  0, 0, 0, 30,  NOW() - INTERVAL 120 MINUTE + INTERVAL 14 SECOND);

-- auto_receive: shipped, auto_confirm_day days before the deadline (NULL: the
-- setting's 15). 204: deleted; 205: due in 10 days; 206: received by hand
-- while the test runs.
INSERT INTO oms_order (id, member_id, member_username, status, confirm_status, delete_status,
                       auto_confirm_day, create_time, delivery_time)
VALUES (201, 1, 'windy', 2, 0, 0, 15,   NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 15 DAY + INTERVAL 10 SECOND),
       (202, 2, 'test',  2, 0, 0, NULL, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 15 DAY + INTERVAL 11 SECOND),
       (203, 3, 'lily',  2, 0, 0, 3,    NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 3 DAY + INTERVAL 12 SECOND),
       (204, 1, 'windy', 2, 0, 1, 15,   NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 15 DAY + INTERVAL 10 SECOND),
       (205, 1, 'windy', 2, 0, 0, 15,   NOW() - INTERVAL 20 DAY, NOW() - INTERVAL 5 DAY),
       (206, 1, 'windy', 2, 0, 0, 15,   NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 15 DAY + INTERVAL 14 SECOND);

-- auto_complete and default_review: received 7 days before the deadline.
-- 301: both open; 302: reviewed by the member already; 303: after-sale
-- window closed already; 304: closed order (status 4); 305: due tomorrow;
-- 308: reviewed by the member while the test runs.
INSERT INTO oms_order (id, member_id, member_username, status, confirm_status,
                       finish_status, comment_status, create_time, receive_time)
VALUES (301, 1, 'windy', 3, 1, 0, 0, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 7 DAY + INTERVAL 10 SECOND),
       (302, 1, 'windy', 3, 1, 0, 1, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 7 DAY + INTERVAL 11 SECOND),
       (303, 2, 'test',  3, 1, 1, 0, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 7 DAY + INTERVAL 12 SECOND),
       (304, 1, 'windy', 4, 1, 0, 0, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 7 DAY + INTERVAL 10 SECOND),
       (305, 1, 'windy', 3, 1, 0, 0, NOW() - INTERVAL 20 DAY, NOW() - INTERVAL 6 DAY),
       (308, 3, 'lily',  3, 1, 0, 0, NOW() - INTERVAL 20 DAY,
        NOW() - INTERVAL 7 DAY + INTERVAL 14 SECOND);

INSERT INTO oms_order_item (order_id, product_id, product_name, product_quantity,
                            product_sku_id, product_attr)
VALUES (101, 26, 'HUAWEI P20', 2, 1, '[{"key":"颜色","value":"金色"}]'),
       (101, 26, 'HUAWEI P20', 3, 1, '[{"key":"颜色","value":"金色"}]'),
       (101, 27, '小米8', 1, 2, '[{"key":"容量","value":"64G"}]'),
       (102, 27, '小米8', 4, 2, '[{"key":"容量","value":"64G"}]'),
       (103, 28, '苹果 iPhone 8', 2, 3, NULL),
       (104, 28, '苹果 iPhone 8', 1, 3, NULL),
       (105, 28, '苹果 iPhone 8', 1, 3, NULL),
       (106, 27, '小米8', 2, 2, '[{"key":"容量","value":"64G"}]'),
       (301, 26, 'HUAWEI P20', 1, 1, '[{"key":"颜色","value":"金色"}]'),
       (301, 27, '小米8', 1, 2, '[{"key":"容量","value":"64G"}]'),
       (302, 26, 'HUAWEI P20', 1, 1, NULL),
       (303, 28, '苹果 iPhone 8', 1, 3, '[{"key":"颜色","value":"银色"}]'),
       (308, 27, '小米8', 1, 2, NULL);
"#;

/// `config/examples/mall-timers-mysql.toml` on MariaDB, as written: the
/// shop publishes bare order ids for `cancel_unpaid`; `auto_receive`,
/// `auto_complete` and `default_review` are found by their watches. Each
/// timer flips exactly the rows due and still in its `from` status and
/// passing its guard, at or after the deadline (the `set` columns say
/// when), gives back lock_stock (summed per SKU), the coupon and the points
/// once, writes one default review per line, and publishes one event per
/// flip on its routing key; the columns the file documents adding, and its
/// "settle the past" statement, keep old orders out of the new windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mall_timers_on_mariadb() {
    let env = TestEnv::new().await;
    let shop = mall_db().await;
    shop.run(MALL_SCHEMA).await;
    shop.run(MALL_PAST).await;
    // The migration the file documents: the two columns, the indexes, and
    // the past settled.
    shop.run(&documented_sql(MALL, "ALTER TABLE oms_order"))
        .await;
    shop.run(MALL_ROWS).await;

    let run = WorkedConfig {
        config: MALL,
        // The order service publishes each order id when it creates the order.
        published: (101..=106).map(|id: i64| id.to_string()).collect(),
        watched: &[
            ("auto_receive", 4),
            ("auto_complete", 3),
            ("default_review", 3),
        ],
        // While the test runs, before their deadlines: a member pays 106,
        // another confirms receipt of 206, a third reviews 308.
        moves: &[
            (
                "106 paid",
                "UPDATE oms_order SET status = 1 WHERE id = 106 AND status = 0 \
                   AND create_time + INTERVAL 120 MINUTE > NOW()",
            ),
            (
                "206 received",
                "UPDATE oms_order SET status = 3, confirm_status = 1, receive_time = NOW() \
                  WHERE id = 206 AND status = 2 AND delivery_time + INTERVAL 15 DAY > NOW()",
            ),
            (
                "308 reviewed",
                "UPDATE oms_order SET comment_status = 1, comment_time = NOW() \
                  WHERE id = 308 AND comment_status = 0 AND receive_time + INTERVAL 7 DAY > NOW()",
            ),
        ],
        // Paid (103, 106), deleted (104), and already in the timer's `to`
        // status by the member's hand (206, 308).
        answered: &[
            ("cancel_unpaid", Outcome::AlreadyPaid, 2),
            ("cancel_unpaid", Outcome::LeftAlone, 1),
            ("auto_receive", Outcome::AlreadyCancelled, 1),
            ("default_review", Outcome::AlreadyCancelled, 1),
        ],
        flipped: &[
            ("oms_order", &[101, 102], "status = 4"),
            ("oms_order", &[201, 202, 203], "status = 3"),
            ("oms_order", &[301, 302, 308], "finish_status = 1"),
            ("oms_order", &[301, 303], "comment_status = 1"),
        ],
        events: &[
            ("order.cancelled", "cancel_unpaid", "101"),
            ("order.cancelled", "cancel_unpaid", "102"),
            ("order.received", "auto_receive", "201"),
            ("order.received", "auto_receive", "202"),
            ("order.received", "auto_receive", "203"),
            ("order.completed", "auto_complete", "301"),
            ("order.completed", "auto_complete", "302"),
            ("order.completed", "auto_complete", "308"),
            ("order.reviewed", "default_review", "301"),
            ("order.reviewed", "default_review", "303"),
        ],
        set_times: &[
            ("cancel_unpaid", &["modify_time"], &[101, 102]),
            ("auto_receive", &["receive_time"], &[201, 202, 203]),
            ("auto_complete", &["modify_time"], &[301, 302, 308]),
            ("default_review", &["comment_time"], &[301, 303]),
        ],
    };
    let ran = run_worked_config(&env, &shop, run).await;
    let ShopDb::MySql(pool) = &shop.shop else {
        unreachable!("mall's shop is on MariaDB")
    };

    // Every order: (id, status, confirm_status, finish_status,
    // comment_status, modify_time set, comment_time set).
    type Order = (i64, Option<i32>, Option<i32>, i32, i32, i64, i64);
    let orders: Vec<Order> = sqlx::query_as(
        "SELECT id, status, confirm_status, finish_status, comment_status, \
                CAST(modify_time IS NOT NULL AS SIGNED), CAST(comment_time IS NOT NULL AS SIGNED) \
           FROM oms_order ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let s = Some;
    assert_eq!(
        orders,
        [
            (101, s(4), s(0), 0, 0, 1, 0),
            (102, s(4), s(0), 0, 0, 1, 0),
            (103, s(1), s(0), 0, 0, 0, 0),
            (104, s(0), s(0), 0, 0, 0, 0),
            (105, s(0), s(0), 0, 0, 0, 0),
            (106, s(1), s(0), 0, 0, 0, 0),
            (201, s(3), s(1), 0, 0, 0, 0),
            (202, s(3), s(1), 0, 0, 0, 0),
            (203, s(3), s(1), 0, 0, 0, 0),
            (204, s(2), s(0), 0, 0, 0, 0),
            (205, s(2), s(0), 0, 0, 0, 0),
            (206, s(3), s(1), 0, 0, 0, 0),
            (301, s(3), s(1), 1, 1, 1, 1),
            (302, s(3), s(1), 1, 1, 1, 0),
            (303, s(3), s(1), 1, 1, 0, 1),
            (304, s(4), s(1), 0, 0, 0, 0),
            (305, s(3), s(1), 0, 0, 0, 0),
            (308, s(3), s(1), 1, 1, 1, 1),
            // Settled by the migration; its windows stay closed.
            (401, s(3), s(1), 1, 1, 0, 0),
            (402, s(3), s(1), 0, 0, 0, 0),
        ]
    );

    // cancel_unpaid's `also`: lock_stock back for 101 (SKU 1: 2 + 3, SKU 2:
    // 1) and 102 (SKU 2: 4), once; the paid, deleted and later orders' stays.
    let locked: Vec<(i64, Option<i32>)> =
        sqlx::query_as("SELECT id, lock_stock FROM pms_sku_stock ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(locked, [(1, s(10)), (2, s(12)), (3, s(14))]);
    // The coupon back: member 1's first used history row of coupon 7 only.
    let coupons: Vec<(i64, Option<i32>)> =
        sqlx::query_as("SELECT id, use_status FROM sms_coupon_history ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        coupons,
        [(1, s(0)), (2, s(0)), (3, s(1)), (4, s(1)), (5, s(1))]
    );
    // The points back: 100 to member 1; nobody else's change.
    let points: Vec<(i64, Option<i32>)> =
        sqlx::query_as("SELECT id, integration FROM ums_member ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(points, [(1, s(600)), (2, s(50)), (3, s(30))]);

    // default_review's `also`: one 5-star review per line of 301 and 303,
    // named after the member (or the order's username when the member has
    // no nickname), none for 302 and 308 (reviewed by their members) or the
    // settled 401.
    type Review = (
        Option<i64>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<i32>,
        Option<i32>,
        Option<String>,
        Option<String>,
    );
    let reviews: Vec<Review> = sqlx::query_as(
        "SELECT product_id, member_nick_name, member_icon, product_name, star, show_status, \
                product_attribute, content \
           FROM pms_comment ORDER BY product_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let text = |s: &str| Some(s.to_owned());
    let icon = text("https://example.com/icon/windy.png");
    assert_eq!(
        reviews,
        [
            (
                Some(26),
                text("windy"),
                icon.clone(),
                text("HUAWEI P20"),
                s(5),
                s(1),
                text(r#"[{"key":"颜色","value":"金色"}]"#),
                text("系统默认好评"),
            ),
            (
                Some(27),
                text("windy"),
                icon,
                text("小米8"),
                s(5),
                s(1),
                text(r#"[{"key":"容量","value":"64G"}]"#),
                text("系统默认好评"),
            ),
            (
                Some(28),
                text("test"),
                None,
                text("苹果 iPhone 8"),
                s(5),
                s(1),
                text(r#"[{"key":"颜色","value":"银色"}]"#),
                text("系统默认好评"),
            ),
        ]
    );
    let late_reviews = sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM pms_comment c WHERE c.create_time < (SELECT MIN(o.receive_time) \
           + INTERVAL 7 DAY FROM oms_order o WHERE o.id IN (301, 303))",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(late_reviews, 0, "no review before the deadline");

    ran.finish(&env, &shop).await;
}
