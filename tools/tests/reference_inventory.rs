//! The reference inventory server releases each order's stock exactly once
//! however its `ReleaseStock` calls arrive: many orders at once on the same
//! few stock rows, each order called several times concurrently (the
//! service's at-least-once retries), so that calls share the server's
//! release batches, duplicates of one order inside one batch included. And
//! an order the database refuses fails only its own call, not the others
//! written with it. Through the service's own gRPC client, against the
//! local PostgreSQL (`DATABASE_URL`), in a database of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;
use order_timeout::settings::SecretUrl;
use order_timeout::testing::InventoryClient;
use order_timeout::testing::store::OrderItem;
use order_timeout_tools::inventory::ReferenceInventory;
use order_timeout_tools::{scratch, shop};

const ORDERS: usize = 300;
const CALLS_PER_ORDER: usize = 3;
const SKUS: &[&str] = &["sku-a", "sku-b", "sku-c", "sku-d", "sku-e"];
const INITIAL: i64 = 1_000;

/// Order `n`'s items: two or three of the five SKUs, quantities 1–4.
fn items(n: usize) -> Vec<OrderItem> {
    (0..2 + n % 2)
        .map(|k| OrderItem {
            sku: SKUS[(n + 2 * k) % SKUS.len()].to_owned(),
            quantity: ((n + k) % 4 + 1) as i64,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_and_repeated_releases_release_each_order_once() {
    let db = scratch::ScratchDatabase::on_test_server("ot_tools_inventory");
    let pool = shop::prepare_database(&db.url().unwrap(), 10)
        .await
        .expect("prepare the database");
    let stock: Vec<(String, i64)> = SKUS.iter().map(|s| (s.to_string(), INITIAL)).collect();
    shop::set_stock(&pool, &stock).await.unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        ReferenceInventory::new(pool.clone()).serve(listener, async {
            let _ = stopped.await;
        }),
    );
    let client = InventoryClient::connect_lazy(
        &SecretUrl::new(format!("http://{addr}")),
        Duration::from_secs(30),
    )
    .unwrap();

    // Every call at once: each order's calls side by side, and one order
    // whose id PostgreSQL cannot store (a NUL byte) among them.
    let bad = "bad\0order".to_owned();
    let mut calls = Vec::new();
    for round in 0..CALLS_PER_ORDER {
        for n in 0..ORDERS {
            let client = client.clone();
            calls.push(tokio::spawn(async move {
                (n, client.release(&format!("order-{n}"), &items(n)).await)
            }));
        }
        if round == 0 {
            let (client, bad) = (client.clone(), bad.clone());
            calls.push(tokio::spawn(async move {
                (usize::MAX, client.release(&bad, &items(0)).await)
            }));
        }
    }
    let mut released = vec![0; ORDERS];
    for joined in join_all(calls).await {
        match joined.unwrap() {
            (usize::MAX, result) => assert!(result.is_err(), "the NUL order id was accepted"),
            (n, result) => {
                if result.unwrap_or_else(|e| panic!("order-{n}: {e}")) {
                    released[n] += 1;
                }
            }
        }
    }
    assert!(
        released.iter().all(|&r| r == 1),
        "orders not released exactly once: {:?}",
        released
            .iter()
            .enumerate()
            .filter(|(_, r)| **r != 1)
            .collect::<Vec<_>>()
    );

    // The stock went back once per order, and every call was counted.
    let mut expected: BTreeMap<String, i64> =
        SKUS.iter().map(|s| (s.to_string(), INITIAL)).collect();
    for n in 0..ORDERS {
        for item in items(n) {
            *expected.get_mut(&item.sku).unwrap() += item.quantity;
        }
    }
    let actual: BTreeMap<String, i64> =
        sqlx::query_as("SELECT sku, available FROM inventory.stock")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(actual, expected);
    let (rows, calls): (i64, i64) =
        sqlx::query_as("SELECT count(*), sum(calls)::bigint FROM inventory.releases")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (rows, calls),
        (ORDERS as i64, (ORDERS * CALLS_PER_ORDER) as i64)
    );

    // The calls shared statements: the rows of one batch carry its
    // transaction's timestamp.
    let statements: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT released_at) FROM inventory.releases")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        statements < ORDERS as i64,
        "{statements} statements for {ORDERS} orders: the calls were not batched"
    );

    let _ = stop.send(());
    server.await.unwrap().unwrap();
    pool.close().await;
}
