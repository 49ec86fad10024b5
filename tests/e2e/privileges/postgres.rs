//! On PostgreSQL: `migrate` as the documented migrating user, then
//! `serve` and the operator commands as the serving one, the order service
//! and an events consumer with their own documented permissions.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrate_serve_and_operate_as_documented_least_privilege_users() {
    crate::common::sweep_abandoned().await;
    let broker = Broker::new();
    let server = scratch::test_pg_server();
    let (migrator, app) = (scratch::owned_name("ot_m"), scratch::owned_name("ot_s"));
    let pw = password();
    let _users = DbUsers {
        server: server.clone(),
        names: vec![migrator.clone(), app.clone()],
    };
    let db = scratch::ScratchDatabase::on_test_server("ot_priv");
    let db_url = db.url().unwrap();

    // The shop's side, as its owner: the database, the reference schema,
    // stock, the inventory service.
    {
        let admin = scratch::with_path(&server, "/postgres").unwrap();
        let mut conn = sqlx::PgConnection::connect_with(
            &order_timeout::testing::store::pg_options(&admin).unwrap(),
        )
        .await
        .unwrap();
        conn.execute(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE \"{}\"",
            db.name()
        )))
        .await
        .unwrap();
    }
    let shop_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(order_timeout::testing::store::pg_options(&db_url).unwrap())
        .await
        .unwrap();
    shop::create_reference_schema(&shop_pool).await.unwrap();
    shop::set_stock(&shop_pool, &[("sku-0".to_owned(), 1_000)])
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let inventory_url = format!("http://{}", listener.local_addr().unwrap());
    let stop_inventory = Shutdown::new();
    {
        let stop = stop_inventory.clone();
        tokio::spawn(
            ReferenceInventory::new(shop_pool.clone())
                .serve(listener, async move { stop.wait().await }),
        );
    }
    let inventory = ShopInventory::connect_lazy(&inventory_url, Duration::from_secs(5)).unwrap();

    // The documented grants, as the database's owner.
    for statement in doc_statements(
        doc_block("postgres"),
        &[
            ("ot_migrate", &migrator),
            ("ot_serve", &app),
            ("change-me", &pw),
        ],
    ) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&shop_pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }

    let config = temp_file(db.name(), "toml");
    std::fs::write(
        &config,
        r#"
cascade_shards = 1
lanes = ["5s"]
lane_shards = 1
[sweeper]
interval = "1s"
grace = "1s"
# A second timer with a watch: its lease and scans need their table's rows.
[[timers]]
name = "expire_paid"
from = "PAID"
to = "CANCELLED"
deadline = "expires_at + interval '30 days'"
watch = "1m"
"#,
    )
    .unwrap();
    let mut run = Run {
        amqp_url: broker.url("order-timeout"),
        database_url: as_user(&server, &migrator, &pw, db.name()),
        inventory_url: inventory_url.clone(),
        config: config.clone(),
    };
    let out = run.ok(&["migrate"]).await;
    assert!(out.contains("migrations applied"), "{out}");
    run.database_url = as_user(&server, &app, &pw, db.name());
    run.ok(&["schema", "check"]).await;

    let http = free_addr();
    let log = temp_file(db.name(), "log");
    let mut serve = run.serve(http, &log);
    wait_ready(&mut serve, http, &log).await;
    assert_eq!(
        broker.connections_of("order-timeout"),
        2,
        "serve's connections (consume, publish)"
    );

    let (_events_conn, mut events) = notifications(&broker.url("notifications")).await;
    let (_pub_conn, channel) = publisher(&broker.url("order-service")).await;
    let order = |id: &str, in_ms: i64| NewOrder {
        id: id.to_owned(),
        expires_at: Utc::now() + chrono::Duration::milliseconds(in_ms),
        items: vec![OrderItem {
            sku: "sku-0".into(),
            quantity: 2,
        }],
    };
    let mut cancelled = BTreeSet::new();
    // Published with `schedule`, with a lane entry, and one the order
    // service never published (the sweeper's); a paid one; a bad message.
    for (id, in_ms, key) in [
        ("lp-1", 2_000, Some("schedule")),
        ("lp-2", 2_500, Some("schedule")),
        ("lp-3", 3_000, Some("schedule")),
        ("lp-lane", 5_000, Some("schedule.5s")),
        ("lp-swept", 500, None),
    ] {
        let o = order(id, in_ms);
        inventory.reserve(&o.id, &o.items).await.unwrap();
        shop::insert_order(&shop_pool, &o).await.unwrap();
        if let Some(key) = key {
            let body = serde_json::json!({
                "order_id": o.id,
                "cancel_at": order_timeout::message::format_instant(o.expires_at),
            });
            publish(&channel, key, body.to_string().as_bytes()).await;
        }
        cancelled.insert(id.to_owned());
    }
    let paid = order("lp-paid", 1_000);
    shop::insert_order(&shop_pool, &paid).await.unwrap();
    shop::pay(&shop_pool, &paid.id).await.unwrap();
    publish(&channel, "schedule", br#""lp-paid""#).await;
    publish(&channel, "schedule", b"not json").await;

    let status = |id: String| {
        let pool = shop_pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT status FROM orders WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    eventually(
        Duration::from_secs(40),
        "every unpaid order cancelled",
        &log,
        || {
            let ids = cancelled.clone();
            let status = &status;
            async move {
                for id in ids {
                    if status(id).await != "CANCELLED" {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
    assert_eq!(status("lp-paid".into()).await, "PAID");

    // Every cancellation's event reached the consumer, and its stock came
    // back once.
    let mut seen = BTreeSet::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        while seen.len() < cancelled.len() {
            let Some(Ok(delivery)) = events.next().await else {
                break;
            };
            let event: serde_json::Value = serde_json::from_slice(&delivery.data).unwrap();
            seen.insert(event["order_id"].as_str().unwrap().to_owned());
        }
    })
    .await;
    assert_eq!(seen, cancelled, "events\n{}", serve_log(&log));
    for id in &cancelled {
        let calls: Option<i64> =
            sqlx::query_scalar("SELECT calls FROM inventory.releases WHERE order_id = $1")
                .bind(id)
                .fetch_optional(&shop_pool)
                .await
                .unwrap();
        assert_eq!(calls, Some(1), "release of {id}\n{}", serve_log(&log));
    }
    let (status_code, metrics) = http_get(http, "/metrics").await;
    assert_eq!(status_code, 200);
    assert!(
        metric(
            &metrics,
            r#"order_timeout_sweeper_orders_total{timer="cancel_unpaid"}"#
        ) >= 1.0,
        "the sweeper cancelled the order nobody published:\n{metrics}"
    );
    let watched: i64 = sqlx::query_scalar("SELECT count(*) FROM order_timeout_watch")
        .fetch_one(&shop_pool)
        .await
        .unwrap();
    assert_eq!(watched, 1, "the watch's lease row");

    // The operator commands, with the service's users.
    let listed = run.ok(&["parked", "list"]).await;
    assert!(listed.contains("not_json"), "{listed}");
    run.ok(&["pending"]).await;
    run.ok(&["topology", "check"]).await;
    let purged = run.ok(&["parked", "purge", "--yes"]).await;
    assert!(purged.contains("deleted 1 parked message"), "{purged}");

    stop(serve, &log).await;
    stop_inventory.trigger();
    shop_pool.close().await;
    let _ = std::fs::remove_file(&config);
}
