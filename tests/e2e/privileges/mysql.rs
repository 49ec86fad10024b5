//! On MySQL/MariaDB, a mall shop: `migrate` and `serve` as the documented
//! least-privilege users, the order service with its documented
//! permissions.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_migrate_and_serve_a_mall_shop_as_documented_least_privilege_users() {
    crate::common::sweep_abandoned().await;
    let broker = Broker::new();
    let server = mysql_base();
    let (migrator, app) = (scratch::owned_name("ot_m"), scratch::owned_name("ot_s"));
    let pw = password();
    let _users = DbUsers {
        server: server.clone(),
        names: vec![migrator.clone(), app.clone()],
    };
    // The shop's database as it is before adoption (mall's tables, as root).
    let db = MallDb::unmigrated().await;
    for statement in doc_statements(
        doc_block("mysql"),
        &[
            ("ot_migrate", &migrator),
            ("ot_serve", &app),
            ("shop", &db.name),
            ("change-me", &pw),
        ],
    ) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&db.pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }

    // The worked config for mall, as a shop would deploy it.
    let config = temp_file(&db.name, "toml");
    std::fs::write(
        &config,
        format!(
            "cascade_shards = 1\nlane_shards = 1\n{}\n[sweeper]\ninterval = \"1s\"\ngrace = \"1s\"\n",
            include_str!("../../../config/examples/mall-mysql.toml")
        ),
    )
    .unwrap();
    let mut run = Run {
        amqp_url: broker.url("order-timeout"),
        database_url: as_user(&server, &migrator, &pw, &db.name),
        inventory_url: "http://127.0.0.1:9".into(),
        config: config.clone(),
    };
    let out = run.ok(&["migrate"]).await;
    assert!(out.contains("migrations applied"), "{out}");
    for statement in doc_statements(
        doc_block("mysql-after-migrate"),
        &[("ot_serve", &app), ("shop", &db.name)],
    ) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&db.pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    run.database_url = as_user(&server, &app, &pw, &db.name);
    run.ok(&["schema", "check"]).await;

    let http = free_addr();
    let log = temp_file(&db.name, "log");
    let mut serve = run.serve(http, &log);
    wait_ready(&mut serve, http, &log).await;

    let (_pub_conn, channel) = publisher(&broker.url("order-service")).await;
    let hour = Duration::from_secs(3600);
    // Due in 2-3 s and published (bare ids, as mall does); one never
    // published (swept); a paid one and a soft-deleted one left alone.
    for id in 100..103 {
        db.order(
            id,
            hour - Duration::from_secs(2 + (id as u64 % 2)),
            0,
            false,
            1,
        )
        .await;
        publish(&channel, "schedule", id.to_string().as_bytes()).await;
    }
    db.order(110, hour - Duration::from_millis(500), 0, false, 2)
        .await;
    db.order(200, hour * 2, 1, false, 3).await;
    db.order(300, hour * 2, 0, true, 3).await;
    publish(&channel, "schedule", b"300").await;
    publish(&channel, "schedule", b"not json").await;

    eventually(
        Duration::from_secs(40),
        "mall's unpaid orders closed",
        &log,
        || async {
            for id in [100, 101, 102, 110] {
                if db.status(id).await != 4 {
                    return false;
                }
            }
            true
        },
    )
    .await;
    assert_eq!(db.status(200).await, 1, "paid: untouched");
    assert_eq!(db.status(300).await, 0, "soft-deleted: untouched");
    let locked = db.lock_stock().await;
    assert_eq!(
        locked.values().sum::<i32>(),
        4,
        "lock_stock given back for the four closed orders (two left locked): {locked:?}"
    );
    let (_, metrics) = http_get(http, "/metrics").await;
    assert!(
        metric(
            &metrics,
            r#"order_timeout_sweeper_orders_total{timer="cancel_unpaid"}"#
        ) >= 1.0,
        "the sweeper closed the order nobody published:\n{metrics}"
    );
    let listed = run.ok(&["parked", "list"]).await;
    assert!(listed.contains("not_json"), "{listed}");

    stop(serve, &log).await;
    let _ = std::fs::remove_file(&config);
}
