//! The rolling upgrade from the previous release to this one, with orders
//! waiting in every store the previous release has (the delay cascade, the
//! due queue, the parked queue, pending stock releases, retries), then the
//! way back and the contraction: every order in flight is cancelled once.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_from_the_previous_release_keeps_every_order_in_flight() {
    step("building (or finding) the previous release");
    let previous = release_binary(None);
    let (old, _) = previous_version();
    let current = PathBuf::from(env!("CARGO_BIN_EXE_order-timeout"));
    let _turn = restart_turn().await;
    let env = TestEnv::migrated_by(&previous).await;
    env.stock_skus(5).await;
    // Releases of held-* fail until the roll is over: their outbox rows
    // stay pending through the upgrade.
    let open = Arc::new(AtomicBool::new(false));
    let opened = open.clone();
    let (_inventory, _stop_inventory) = env
        .inventory_refusing(move |id, _| {
            (id.starts_with("held-") && !opened.load(Ordering::SeqCst))
                .then(|| Status::unavailable("the stock shard is down"))
        })
        .await;

    step("two replicas of the previous release");
    let old_a = Replica::start(&previous, &env, "old-a");
    let old_b = Replica::start(&previous, &env, "old-b");
    wait_consumers(&env, 2, &[&old_a, &old_b]).await;
    let mut events = env.subscribe_events().await;
    let mut seen = HashMap::new();

    // What waits in the previous release's stores when the upgrade starts
    // (t = 0 now; the migration runs at 8 s, the replicas are replaced at
    // 14 s and 22 s):
    // - held-*: due at 2 s; cancelled by the old replicas, their releases
    //   failing until the end of the upgrade (outbox rows pending, their
    //   messages waiting as retries in the cascade);
    // - stream-*: one due every 150 ms from 4 s to 34 s, through the
    //   migration and both replacements (the due queue, held messages);
    // - cascade-*: due at 40–55 s, in the delay cascade all along;
    // - paid-*: due at 10–30 s, paid before: left alone;
    // - late-row: a timeout whose row does not exist yet, parked.
    let start = Utc::now();
    let at = |ms: u64| {
        let due = start + chrono::Duration::milliseconds(ms as i64);
        (due - Utc::now()).to_std().unwrap_or(Duration::ZERO)
    };
    // (id, due in ms from `start`, its one item): created and published sixteen
    // at a time, so that a loaded machine still publishes within the 4 s
    // the timeline allows (one at a time took 5.7 s in CI).
    let mut plan: Vec<(String, u64, (usize, i64))> = Vec::new();
    for i in 0..20u64 {
        plan.push((format!("held-{i:02}"), 2_000, (i as usize % 5, 1)));
    }
    for i in 0..200u64 {
        let item = (i as usize % 5, 1 + i as i64 % 3);
        plan.push((format!("stream-{i:03}"), 4_000 + i * 150, item));
    }
    for i in 0..60u64 {
        plan.push((
            format!("cascade-{i:02}"),
            40_000 + i * 250,
            (i as usize % 5, 2),
        ));
    }
    let n_orders = plan.len() as i64;
    for i in 0..20u64 {
        plan.push((
            format!("paid-{i:02}"),
            10_000 + i * 1_000,
            (i as usize % 5, 1),
        ));
    }
    futures_util::stream::iter(plan)
        .for_each_concurrent(16, |(id, due, item)| {
            let env = &env;
            async move {
                let o = env.create_order(&id, at(due), &[item]).await;
                env.publish_timeout(&o).await;
            }
        })
        .await;
    sqlx::query("UPDATE orders SET status = 'PAID' WHERE starts_with(id, 'paid-')")
        .execute(&env.pool)
        .await
        .unwrap();
    let late_row = serde_json::json!({
        "order_id": "late-row",
        "cancel_at": order_timeout::message::format_instant(Utc::now()),
    });
    env.publish_raw(late_row.to_string().as_bytes()).await;
    let publishing = Utc::now() - start;
    assert!(
        publishing < chrono::Duration::seconds(4),
        "publishing took {publishing}: the timeline below needs it under 4 s"
    );

    env.eventually(
        Duration::from_secs(20),
        "held-* cancelled, releases pending",
        || async {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM order_timeout_cancel_outbox \
              WHERE starts_with(order_id, 'held-') AND stock_released_at IS NULL",
            )
            .fetch_one(&env.pool)
            .await
            .unwrap();
            pending == 20
        },
    )
    .await;
    env.eventually(Duration::from_secs(10), "late-row parked", || async {
        env.parked_count().await == 1
    })
    .await;

    step("migrate with the new release while the old replicas run");
    tokio::time::sleep(at(8_000)).await;
    let (ok, out) = cli(&current, &env, &["migrate"]);
    assert!(ok, "migrate: {out}");
    // Since 0.2.0 every migration is additive: nothing is kept for the
    // previous release (0.1.0 needed an index kept until the contraction;
    // on_mariadb_the_previous_release_runs_against_the_migrated_outbox
    // still upgrades from it).
    assert!(!out.contains("kept for"), "nothing kept for {old}: {out}");
    let migrated_at = Utc::now();

    step("replace the first replica");
    tokio::time::sleep(at(14_000)).await;
    let old_a_logs = old_a.stop().await;
    let stopped_a = Utc::now();
    let new_a = Replica::start(&current, &env, "new-a");
    wait_consumers(&env, 2, &[&new_a, &old_b]).await;
    // Only old replicas ran between the migration and the first stop: the
    // orders cancelled then were cancelled by the previous release, against
    // the migrated outbox.
    let by_old_after_migration: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE status = 'CANCELLED' \
            AND cancelled_at > $1 AND cancelled_at < $2",
    )
    .bind(migrated_at)
    .bind(stopped_a)
    .fetch_one(&env.pool)
    .await
    .unwrap();

    step("replace the second replica");
    tokio::time::sleep(at(22_000)).await;
    let old_b_logs = old_b.stop().await;
    let new_b = Replica::start(&current, &env, "new-b");
    wait_consumers(&env, 2, &[&new_a, &new_b]).await;
    for (name, logs) in [("old-a", &old_a_logs), ("old-b", &old_b_logs)] {
        assert!(
            !logs.contains("no unique or exclusion constraint"),
            "{name} failed against the migrated outbox:\n{logs}"
        );
    }
    assert!(
        by_old_after_migration >= 10,
        "the old replicas cancelled orders after the migration ({by_old_after_migration})"
    );

    step("every order cancelled once, the pending releases finished");
    tokio::time::sleep(at(26_000)).await;
    open.store(true, Ordering::SeqCst);
    env.eventually(Duration::from_secs(60), "every order cancelled", || async {
        env.count("held-", "CANCELLED").await
            + env.count("stream-", "CANCELLED").await
            + env.count("cascade-", "CANCELLED").await
            == n_orders
    })
    .await;
    env.wait_outbox_done(Duration::from_secs(60)).await;
    env.assert_stock_exact(5).await;
    assert_eq!(
        env.count("paid-", "PAID").await,
        20,
        "paid orders left alone"
    );
    let held = lateness(&env, "held-", 20).await;
    let stream = lateness(&env, "stream-", 200).await;
    let cascade = lateness(&env, "cascade-", 60).await;
    eprintln!(
        "upgrade: {n_orders} orders; lateness max: held {held}, stream {stream}, cascade {cascade}; \
         {by_old_after_migration} cancelled by {old} after the migration"
    );
    assert!(
        stream < chrono::Duration::seconds(3),
        "orders due through the migration and the replacements are on time (max {stream})"
    );
    assert!(
        cascade < chrono::Duration::seconds(3),
        "orders waiting in the cascade are on time (max {cascade})"
    );
    let releases: i64 = sqlx::query_scalar("SELECT count(*) FROM inventory.releases")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(releases, n_orders, "one release per cancelled order");
    for i in 0..20 {
        let id = format!("held-{i:02}");
        assert_eq!(env.release_calls(&id).await, Some(1), "{id} released once");
    }
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    while (seen.len() as i64) < n_orders && tokio::time::Instant::now() < end {
        drain_events(&mut events, &mut seen).await;
    }
    drain_events(&mut events, &mut seen).await;
    assert_eq!(seen.len() as i64, n_orders, "an event per order");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "events published twice: {twice:?}");

    step("the parked message of the previous release, replayed by this one");
    let (ok, out) = cli(&current, &env, &["parked", "list"]);
    assert!(
        ok && out.contains("late-row") && out.contains("unknown_order"),
        "parked list: {out}"
    );
    let o = env
        .create_order("late-row", Duration::ZERO, &[(0, 1)])
        .await;
    let _ = o;
    let (ok, out) = cli(&current, &env, &["parked", "replay", "--all"]);
    assert!(ok, "parked replay: {out}");
    env.eventually(Duration::from_secs(20), "late-row cancelled", || async {
        env.order_state("late-row").await.0 == "CANCELLED"
    })
    .await;
    let (_, parked) = cli(&current, &env, &["parked", "list"]);
    assert_eq!(env.parked_count().await, 0, "{parked}");
    new_a.stop().await;
    new_b.stop().await;

    step("the way back before the contraction: the previous release works");
    let back = Replica::start(&previous, &env, "back");
    wait_consumers(&env, 1, &[&back]).await;
    for i in 0..10 {
        let o = env
            .create_order(&format!("back-{i}"), Duration::from_secs(2), &[(1, 1)])
            .await;
        env.publish_timeout(&o).await;
    }
    env.eventually(
        Duration::from_secs(20),
        "back-* cancelled by the previous release",
        || async { env.count("back-", "CANCELLED").await == 10 },
    )
    .await;
    env.wait_outbox_done(Duration::from_secs(20)).await;
    let back_logs = back.stop().await;
    assert!(!back_logs.contains("ERROR"), "{back_logs}");

    step("contract: nothing was kept, and the previous release still works");
    let (ok, out) = cli(&current, &env, &["migrate", "--contract"]);
    assert!(
        ok && out.contains("nothing was kept"),
        "migrate --contract: {out}"
    );
    let again = Replica::start(&previous, &env, "again");
    wait_consumers(&env, 1, &[&again]).await;
    let o = env
        .create_order("after-contract", Duration::from_millis(500), &[(2, 1)])
        .await;
    env.publish_timeout(&o).await;
    env.eventually(
        Duration::from_secs(30),
        "after-contract cancelled",
        || async { env.order_state("after-contract").await.0 == "CANCELLED" },
    )
    .await;
    env.wait_outbox_done(Duration::from_secs(20)).await;
    again.stop().await;
    env.assert_stock_exact(5).await;
}
