//! `config/examples/yudao-timers-postgres.toml` on PostgreSQL:
//! YunaiV/ruoyi-vue-pro's trade, product, promotion, member and pay tables
//! as its PostgreSQL scripts type them (ids from `<table>_seq` sequences),
//! in `+08:00`; every timer flips exactly its rows, once, never early,
//! with its effects.

use super::*;

/// yudao's tables as its PostgreSQL scripts type them (converted from the
/// MySQL DDL by `sql/tools/convertor.py`: `bigint` -> int8, `int` -> int4,
/// `tinyint` -> int2, `bit(1)` -> bool except `deleted` -> int2,
/// `datetime` -> timestamp; ids without defaults, from `<table>_seq`
/// sequences), with the columns the worked config and this test use.
const YUDAO_SCHEMA: &str = include_str!("../../fixtures/yudao_timers_postgres.sql");

/// The shop's rows, written in its zone (`+08:00`, as yudao writes them).
/// Every deadline is relative to now: due 8 to 14 s from now, or later.
const YUDAO_ROWS: &str = r#"
INSERT INTO member_user (id, nickname, avatar, point, tenant_id)
VALUES (1, '芋艿', 'https://example.com/avatar/1.png', 200, 1),
       (2, '小王', '', 100, 2),
       (3, '小李', '', 0, 1);
INSERT INTO product_spu (id, name, stock, sales_count, tenant_id)
VALUES (21, 'iPhone 15', 150, 15, 1), (22, 'AirPods', 20, 3, 1);
INSERT INTO product_sku (id, spu_id, properties, pic_url, stock, sales_count, tenant_id)
VALUES (11, 21, '[{"propertyId":1,"propertyName":"颜色","valueId":2,"valueName":"黑色"}]',
        'https://example.com/sku/11.png', 100, 10, 1),
       (12, 21, '[{"propertyId":1,"propertyName":"颜色","valueId":3,"valueName":"白色"}]',
        'https://example.com/sku/12.png', 50, 5, 1),
       (13, 22, NULL, 'https://example.com/sku/13.png', 20, 3, 1);
INSERT INTO pay_order (id, status) VALUES (9001, 0), (9002, 0), (9004, 10);
INSERT INTO promotion_coupon (id, name, status, user_id, valid_start_time, valid_end_time,
                              deleted, tenant_id)
VALUES
    -- Used by the unpaid orders: 501 valid for a month, 502 expired yesterday.
    (501, '满100减10', 2, 1, localtimestamp - interval '1 day', localtimestamp + interval '30 days', 0, 1),
    (502, '满100减10', 2, 2, localtimestamp - interval '9 days', localtimestamp - interval '1 day', 0, 2),
    (503, '满100减10', 2, 1, localtimestamp - interval '1 day', localtimestamp + interval '30 days', 0, 1),
    -- coupon_expiry: 601 due; 602 deleted; 603 used; 604 due tomorrow;
    -- 605 used by its member while the test runs.
    (601, '新人券', 1, 1, localtimestamp - interval '7 days', localtimestamp + interval '9 seconds', 0, 1),
    (602, '新人券', 1, 1, localtimestamp - interval '7 days', localtimestamp + interval '9 seconds', 1, 1),
    (603, '新人券', 2, 1, localtimestamp - interval '7 days', localtimestamp + interval '9 seconds', 0, 1),
    (604, '新人券', 1, 1, localtimestamp - interval '7 days', localtimestamp + interval '1 day', 0, 1),
    (605, '新人券', 1, 3, localtimestamp - interval '7 days', localtimestamp + interval '14 seconds', 0, 1);

-- cancel_unpaid: created 2 hours before the deadline. 1001: a coupon, 50
-- points over two lines of SKU 11, and a line of SKU 12 in after-sale;
-- 1002: another tenant's, its coupon expired meanwhile, no points; 1003: a
-- seckill order (type 1, the job's); 1004: its pay order succeeded (a late
-- callback); 1005: paid; 1006: deleted; 1007: paid by the member while the
-- test runs; 1008: due in two hours.
INSERT INTO trade_order (id, type, user_id, status, pay_order_id, coupon_id, deleted,
                         tenant_id, create_time)
VALUES (1001, 0, 1, 0,  9001, 501,  0, 1, localtimestamp - interval '2 hours' + interval '8 seconds'),
       (1002, 3, 2, 0,  9002, 502,  0, 2, localtimestamp - interval '2 hours' + interval '9 seconds'),
       (1003, 1, 1, 0,  NULL, 503,  0, 1, localtimestamp - interval '2 hours' + interval '8 seconds'),
       (1004, 0, 1, 0,  9004, NULL, 0, 1, localtimestamp - interval '2 hours' + interval '8 seconds'),
       (1005, 0, 1, 10, NULL, NULL, 0, 1, localtimestamp - interval '2 hours' + interval '8 seconds'),
       (1006, 0, 1, 0,  NULL, NULL, 1, 1, localtimestamp - interval '2 hours' + interval '8 seconds'),
       (1007, 0, 3, 0,  NULL, NULL, 0, 1, localtimestamp - interval '2 hours' + interval '14 seconds'),
       (1008, 0, 3, 0,  NULL, NULL, 0, 1, localtimestamp);

-- auto_receive: delivered 14 days before the deadline. 2003: deleted;
-- 2004: received by hand while the test runs; 2005: due in two days.
INSERT INTO trade_order (id, user_id, status, deleted, tenant_id, create_time, delivery_time)
VALUES (2001, 1, 20, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '14 days' + interval '10 seconds'),
       (2002, 2, 20, 0, 2, localtimestamp - interval '20 days', localtimestamp - interval '14 days' + interval '11 seconds'),
       (2003, 1, 20, 1, 1, localtimestamp - interval '20 days', localtimestamp - interval '14 days' + interval '10 seconds'),
       (2004, 1, 20, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '14 days' + interval '14 seconds'),
       (2005, 1, 20, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '12 days');

-- auto_comment: received 7 days before the deadline. 3001: two lines (and
-- a deleted one); 3002: another tenant's, one line reviewed already;
-- 3003: reviewed already; 3004: cancelled after receipt (status 40);
-- 3005: reviewed by its member while the test runs; 3006: due tomorrow.
INSERT INTO trade_order (id, user_id, status, comment_status, deleted, tenant_id, create_time,
                         receive_time)
VALUES (3001, 1, 30, false, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '7 days' + interval '10 seconds'),
       (3002, 2, 30, false, 0, 2, localtimestamp - interval '20 days', localtimestamp - interval '7 days' + interval '12 seconds'),
       (3003, 1, 30, true,  0, 1, localtimestamp - interval '20 days', localtimestamp - interval '7 days' + interval '10 seconds'),
       (3004, 1, 40, false, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '7 days' + interval '10 seconds'),
       (3005, 3, 30, false, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '7 days' + interval '14 seconds'),
       (3006, 1, 30, false, 0, 1, localtimestamp - interval '20 days', localtimestamp - interval '6 days');

INSERT INTO trade_order_item (id, user_id, order_id, spu_id, spu_name, sku_id, count, use_point,
                              after_sale_status, comment_status, deleted, tenant_id)
VALUES (1,  1, 1001, 21, 'iPhone 15', 11, 2, 30, 0,  false, 0, 1),
       (2,  1, 1001, 21, 'iPhone 15', 11, 1, 20, 0,  false, 0, 1),
       (3,  1, 1001, 21, 'iPhone 15', 12, 5, 40, 10, false, 0, 1),
       (4,  2, 1002, 22, 'AirPods',   13, 1, 0,  0,  false, 0, 2),
       (5,  1, 1003, 22, 'AirPods',   13, 4, 0,  0,  false, 0, 1),
       (6,  1, 1004, 21, 'iPhone 15', 11, 1, 10, 0,  false, 0, 1),
       (7,  3, 1007, 21, 'iPhone 15', 12, 1, 5,  0,  false, 0, 1),
       (31, 1, 3001, 21, 'iPhone 15', 11, 1, 0,  0,  false, 0, 1),
       (32, 1, 3001, 22, 'AirPods',   13, 2, 0,  0,  false, 0, 1),
       (37, 1, 3001, 21, 'iPhone 15', 12, 1, 0,  0,  false, 1, 1),
       (33, 2, 3002, 21, 'iPhone 15', 12, 1, 0,  0,  true,  0, 2),
       (34, 2, 3002, 21, 'iPhone 15', 11, 1, 0,  0,  false, 0, 2),
       (35, 1, 3004, 21, 'iPhone 15', 11, 1, 0,  0,  false, 0, 1),
       (36, 3, 3005, 22, 'AirPods',   13, 1, 0,  0,  false, 0, 1);
"#;

/// A pool on the test's database whose sessions are in yudao's zone (set
/// after connecting: sqlx's start-up `TimeZone=UTC` outranks one given in
/// `options`).
async fn yudao_pool(env: &TestEnv) -> PgPool {
    let options: PgConnectOptions = env.settings.database_url.expose().parse().unwrap();
    PgPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(&mut *conn, "SET TimeZone = 'Asia/Shanghai'").await?;
                Ok(())
            })
        })
        .connect_with(options.disable_statement_logging())
        .await
        .unwrap()
}

/// `config/examples/yudao-timers-postgres.toml` on PostgreSQL, as written:
/// the shop publishes `{"order_id": …}` for `cancel_unpaid`;
/// `auto_receive`, `auto_comment` and `coupon_expiry` are found by their
/// watches. Each timer flips exactly the rows due, still in its `from`
/// status and passing its guard (seckill orders, orders whose payment
/// succeeded, deleted rows are left alone), at or after the deadline, once:
/// SKU and SPU stock back for the lines not in after-sale, the coupon back
/// (or expired), the points back with their record, one product review
/// per unreviewed line, one trade_order_log row per flip, each row the
/// service inserts with an id from yudao's sequence and the order's
/// tenant; one event per flip on the timer's routing key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yudao_timers_on_postgres() {
    let env = TestEnv::new().await;
    let shop = Shop {
        url: env.settings.database_url.clone(),
        shop: ShopDb::Postgres(yudao_pool(&env).await),
        _scratch: None,
    };
    shop.run(YUDAO_SCHEMA).await;
    // The indexes the file documents.
    shop.run(&documented_sql(YUDAO, "CREATE INDEX")).await;
    shop.run(YUDAO_ROWS).await;

    let run = WorkedConfig {
        config: YUDAO,
        // The order service publishes each order when it creates it.
        published: (1001..=1008)
            .map(|id: i64| format!(r#"{{"order_id": {id}}}"#))
            .collect(),
        watched: &[
            ("auto_receive", 3),
            ("auto_comment", 3),
            ("coupon_expiry", 2),
        ],
        // While the test runs, before their deadlines: a member pays 1007,
        // another confirms receipt of 2004, reviews 3005, uses coupon 605.
        moves: &[
            (
                "1007 paid",
                "UPDATE trade_order SET status = 10 WHERE id = 1007 AND status = 0 \
                   AND create_time + interval '2 hours' > localtimestamp",
            ),
            (
                "2004 received",
                "UPDATE trade_order SET status = 30, receive_time = localtimestamp \
                  WHERE id = 2004 AND status = 20 \
                    AND delivery_time + interval '14 days' > localtimestamp",
            ),
            (
                "3005 reviewed",
                "UPDATE trade_order SET comment_status = true WHERE id = 3005 \
                   AND NOT comment_status AND receive_time + interval '7 days' > localtimestamp",
            ),
            (
                "605 used",
                "UPDATE promotion_coupon SET status = 2, use_time = localtimestamp \
                  WHERE id = 605 AND status = 1 AND valid_end_time > localtimestamp",
            ),
        ],
        // Paid (1005, 1007), failing the guard (1003, 1004, 1006), already
        // in the timer's `to` status by the member's hand (2004, 3005),
        // used (605).
        answered: &[
            ("cancel_unpaid", Outcome::AlreadyPaid, 2),
            ("cancel_unpaid", Outcome::LeftAlone, 3),
            ("auto_receive", Outcome::AlreadyCancelled, 1),
            ("auto_comment", Outcome::AlreadyCancelled, 1),
            ("coupon_expiry", Outcome::LeftAlone, 1),
        ],
        flipped: &[
            ("trade_order", &[1001, 1002], "status = 40"),
            ("trade_order", &[2001, 2002], "status = 30"),
            ("trade_order", &[3001, 3002], "comment_status"),
            ("promotion_coupon", &[601], "status = 3"),
        ],
        events: &[
            ("order.cancelled", "cancel_unpaid", "1001"),
            ("order.cancelled", "cancel_unpaid", "1002"),
            ("order.received", "auto_receive", "2001"),
            ("order.received", "auto_receive", "2002"),
            ("order.reviewed", "auto_comment", "3001"),
            ("order.reviewed", "auto_comment", "3002"),
            ("coupon.expired", "coupon_expiry", "601"),
        ],
        set_times: &[
            (
                "cancel_unpaid",
                &["cancel_time", "update_time"],
                &[1001, 1002],
            ),
            (
                "auto_receive",
                &["receive_time", "update_time"],
                &[2001, 2002],
            ),
            (
                "auto_comment",
                &["finish_time", "update_time"],
                &[3001, 3002],
            ),
            ("coupon_expiry", &["update_time"], &[601]),
        ],
    };
    let ran = run_worked_config(&env, &shop, run).await;
    let ShopDb::Postgres(shop_pool) = &shop.shop else {
        unreachable!("yudao's shop is on PostgreSQL")
    };

    // Every order: (id, status, cancel_type, comment_status, cancel_time
    // set, receive_time set, finish_time set).
    type Order = (i64, i32, Option<i32>, bool, bool, bool, bool);
    let orders: Vec<Order> = sqlx::query_as(
        "SELECT id, status, cancel_type, comment_status, cancel_time IS NOT NULL, \
                receive_time IS NOT NULL, finish_time IS NOT NULL \
           FROM trade_order ORDER BY id",
    )
    .fetch_all(shop_pool)
    .await
    .unwrap();
    let (t, f) = (true, false);
    assert_eq!(
        orders,
        [
            (1001, 40, Some(10), f, t, f, f),
            (1002, 40, Some(10), f, t, f, f),
            (1003, 0, None, f, f, f, f),
            (1004, 0, None, f, f, f, f),
            (1005, 10, None, f, f, f, f),
            (1006, 0, None, f, f, f, f),
            (1007, 10, None, f, f, f, f),
            (1008, 0, None, f, f, f, f),
            (2001, 30, None, f, f, t, f),
            (2002, 30, None, f, f, t, f),
            (2003, 20, None, f, f, f, f),
            (2004, 30, None, f, f, t, f),
            (2005, 20, None, f, f, f, f),
            (3001, 30, None, t, f, t, t),
            (3002, 30, None, t, f, t, t),
            (3003, 30, None, t, f, t, f),
            (3004, 40, None, f, f, t, f),
            (3005, 30, None, t, f, t, f),
            (3006, 30, None, f, f, t, f),
        ]
    );

    // Stock back for 1001's lines not in after-sale (SKU 11: 2 + 1) and
    // 1002's (SKU 13: 1), on the SKUs and their SPUs, once.
    let skus: Vec<(i64, Option<i32>, Option<i32>)> =
        sqlx::query_as("SELECT id, stock, sales_count FROM product_sku ORDER BY id")
            .fetch_all(shop_pool)
            .await
            .unwrap();
    assert_eq!(
        skus,
        [
            (11, Some(103), Some(7)),
            (12, Some(50), Some(5)),
            (13, Some(21), Some(2))
        ]
    );
    let spus: Vec<(i64, i32, Option<i32>)> =
        sqlx::query_as("SELECT id, stock, sales_count FROM product_spu ORDER BY id")
            .fetch_all(shop_pool)
            .await
            .unwrap();
    assert_eq!(spus, [(21, 153, Some(12)), (22, 21, Some(2))]);
    // Coupons: 501 back to unused, 502 expired (its validity ended), 601
    // expired by coupon_expiry; the others as they were or as their member
    // left them.
    let coupons: Vec<(i64, i32)> =
        sqlx::query_as("SELECT id, status::int4 FROM promotion_coupon ORDER BY id")
            .fetch_all(shop_pool)
            .await
            .unwrap();
    assert_eq!(
        coupons,
        [
            (501, 1),
            (502, 3),
            (503, 2),
            (601, 3),
            (602, 1),
            (603, 2),
            (604, 1),
            (605, 2)
        ]
    );
    // Points: 50 back to member 1 (the after-sale line's 40 not), with
    // their record; nobody else's change.
    let points: Vec<(i64, i32)> = sqlx::query_as("SELECT id, point FROM member_user ORDER BY id")
        .fetch_all(shop_pool)
        .await
        .unwrap();
    assert_eq!(points, [(1, 250), (2, 100), (3, 0)]);
    type Record = (bool, i64, String, i32, String, i32, i32, i64);
    let records: Vec<Record> = sqlx::query_as(
        "SELECT id >= 100, user_id, biz_id, biz_type::int4, description, point, total_point, \
                tenant_id \
           FROM member_point_record ORDER BY id",
    )
    .fetch_all(shop_pool)
    .await
    .unwrap();
    // (id from member_point_record_seq, user, biz id, biz type, description,
    // points, balance after, tenant)
    assert_eq!(
        records,
        [(
            true,
            1,
            "1001".to_owned(),
            12,
            "订单取消，退还 50 积分".to_owned(),
            50,
            250,
            1
        )]
    );

    // One review per unreviewed, undeleted line of 3001 and 3002, with the
    // member's name and avatar, the SPU's name, the SKU's picture and
    // properties, and the order's tenant.
    type Review = (
        i64,
        i64,
        i64,
        Option<String>,
        Option<String>,
        String,
        String,
        Option<String>,
        Option<i32>,
        i64,
    );
    let reviews: Vec<Review> = sqlx::query_as(
        "SELECT order_id, order_item_id, sku_id, user_nickname, user_avatar, spu_name, \
                sku_pic_url, sku_properties, scores::int4, tenant_id \
           FROM product_comment ORDER BY order_item_id",
    )
    .fetch_all(shop_pool)
    .await
    .unwrap();
    let text = |s: &str| Some(s.to_owned());
    assert_eq!(
        reviews,
        [
            (
                3001,
                31,
                11,
                text("芋艿"),
                text("https://example.com/avatar/1.png"),
                "iPhone 15".to_owned(),
                "https://example.com/sku/11.png".to_owned(),
                text(r#"[{"propertyId":1,"propertyName":"颜色","valueId":2,"valueName":"黑色"}]"#),
                Some(5),
                1
            ),
            (
                3001,
                32,
                13,
                text("芋艿"),
                text("https://example.com/avatar/1.png"),
                "AirPods".to_owned(),
                "https://example.com/sku/13.png".to_owned(),
                None,
                Some(5),
                1
            ),
            (
                3002,
                34,
                11,
                text("小王"),
                text(""),
                "iPhone 15".to_owned(),
                "https://example.com/sku/11.png".to_owned(),
                text(r#"[{"propertyId":1,"propertyName":"颜色","valueId":2,"valueName":"黑色"}]"#),
                Some(5),
                2
            ),
        ]
    );
    let comment_ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM product_comment ORDER BY id")
        .fetch_all(shop_pool)
        .await
        .unwrap();
    assert!(
        comment_ids.iter().all(|id| *id >= 100),
        "ids from product_comment_seq: {comment_ids:?}"
    );
    // The lines reviewed: 3001's and 3002's, not the deleted one (37).
    let reviewed: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM trade_order_item WHERE comment_status ORDER BY id")
            .fetch_all(shop_pool)
            .await
            .unwrap();
    assert_eq!(reviewed, [31, 32, 33, 34]);

    // One log row per flip, ids from trade_order_log_seq, the order's tenant.
    let logs: Vec<(i64, i32, i32, i32, i64)> = sqlx::query_as(
        "SELECT order_id, before_status::int4, after_status::int4, operate_type, tenant_id \
           FROM trade_order_log ORDER BY order_id",
    )
    .fetch_all(shop_pool)
    .await
    .unwrap();
    assert_eq!(
        logs,
        [
            (1001, 0, 40, 41, 1),
            (1002, 0, 40, 41, 2),
            (2001, 20, 30, 31, 1),
            (2002, 20, 30, 31, 2),
            (3001, 30, 30, 34, 1),
            (3002, 30, 30, 34, 2),
        ]
    );
    let log_ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM trade_order_log ORDER BY id")
        .fetch_all(shop_pool)
        .await
        .unwrap();
    assert!(
        log_ids.len() == 6 && log_ids.iter().all(|id| *id >= 100),
        "ids from trade_order_log_seq: {log_ids:?}"
    );

    ran.finish(&env, &shop).await;
}
