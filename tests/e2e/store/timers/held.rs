//! A row another session holds delays only itself: the others flip at
//! once with their effects exactly once, the held one flips once after the
//! release; if the holder moved it out of the timer's `from` status, it is
//! never flipped.

use super::*;

/// `n` due shipped orders `{prefix}-NN` and a held one `{prefix}-held`.
async fn held_setup(f: &Fixture, prefix: &str, n: usize) -> Vec<OrderId> {
    shipping_schema(f).await;
    let names: Vec<String> = (0..n)
        .map(|i| format!("{prefix}-{i:02}"))
        .chain([format!("{prefix}-held")])
        .collect();
    let rows: Vec<String> = names
        .iter()
        .map(|name| order_row(f, name, "SHIPPED", Some(secs(-60))))
        .collect();
    insert_rows(f, &rows).await;
    names.iter().map(|name| id(name)).collect()
}

/// Runs the timer's batch for `ids` while `held` is held: checks that it
/// answers promptly, flips every other row just now (stock release pending:
/// `release = "grpc"`), and reports the held one locked.
async fn flip_around(store: &Store, ids: &[OrderId], held: &str) {
    let started = Instant::now();
    let states = batch(store, ids).await;
    let took = started.elapsed();
    assert!(
        took < PROMPT,
        "the batch took {took:?} while one row was held"
    );
    for (order, state) in states {
        if order == held {
            assert!(
                matches!(state, OrderState::Locked { .. }),
                "held row: {state:?}"
            );
        } else {
            let c = flipped_just_now(&order, &state);
            assert!(c.release_pending && c.event_pending, "{order}: {c:?}");
        }
    }
}

pub(in crate::store) async fn a_held_row_delays_only_itself_for_a_timer(f: &Fixture) {
    let ids = held_setup(f, "th", 20).await;
    let store = store_of(f, &auto_receive(f, "grpc", "")).await;
    let released = f
        .lock_row_during("th-held", async {
            flip_around(&store, &ids, "th-held").await;
            // Still held, asked again a moment later: still locked, still no
            // effects; the others are not flipped twice.
            tokio::time::sleep(Duration::from_millis(500)).await;
            for (order, state) in batch(&store, &ids).await {
                match order.as_str() {
                    "th-held" => assert!(matches!(state, OrderState::Locked { .. }), "{state:?}"),
                    _ => assert_not_again(&order, &state),
                }
            }
            assert_eq!(effects(f, "th-held").await, ("SHIPPED".into(), 0, 0, 0));
        })
        .await;
    // Let go: flipped now, timed after the release, its effects once.
    for (order, state) in batch(&store, &ids).await {
        match order.as_str() {
            "th-held" => {
                let c = flipped_just_now(&order, &state);
                assert!(
                    c.cancelled_at >= released,
                    "flipped at {} before the shop let go of the row at {released}",
                    c.cancelled_at
                );
                assert!(c.release_pending, "release = grpc: {c:?}");
            }
            _ => assert_not_again(&order, &state),
        }
    }
    let again = state_of(store.as_ref(), "th-held", LEASE).await;
    assert_not_again("th-held", &again);
    for id in &ids {
        assert_eq!(
            effects(f, id.as_str()).await,
            ("RECEIVED".into(), 1, 1, 0),
            "{id}: [status, also runs, outbox rows, default timer's outbox rows]"
        );
        assert!(!release_done(f, id.as_str()).await, "{id}: release = grpc");
    }
}

pub(in crate::store) async fn a_held_row_the_holder_moves_on_is_never_flipped_by_the_timer(
    f: &Fixture,
) {
    let mut ids = held_setup(f, "tm", 20).await;
    // A second held row: one the customer confirms (to the timer's own
    // `to`, by the shop), one returned (out of its `from`).
    insert_rows(
        f,
        &[order_row(f, "tm-returned", "SHIPPED", Some(secs(-60)))],
    )
    .await;
    ids.push(id("tm-returned"));
    let store = store_of(f, &auto_receive(f, "grpc", "")).await;
    let confirm = match f.dialect() {
        Dialect::MySql => "UTC_TIMESTAMP(6)",
        Dialect::Postgres => "now()",
    };
    commit_during(
        f,
        &format!(
            "UPDATE orders SET status = 'RECEIVED', received_at = {confirm} \
              WHERE id = 'tm-held' AND status = 'SHIPPED'"
        ),
        commit_during(
            f,
            "UPDATE orders SET status = 'RETURNED' WHERE id = 'tm-returned' AND status = 'SHIPPED'",
            async {
                let started = Instant::now();
                let states = batch(&store, &ids).await;
                let took = started.elapsed();
                assert!(
                    took < PROMPT,
                    "the batch took {took:?} while two rows were held"
                );
                for (order, state) in states {
                    match order.as_str() {
                        "tm-held" | "tm-returned" => assert!(
                            matches!(state, OrderState::Locked { .. }),
                            "{order}: {state:?}"
                        ),
                        _ => {
                            let c = flipped_just_now(&order, &state);
                            assert!(c.release_pending, "{order}: {c:?}");
                        }
                    }
                }
            },
        ),
    )
    .await;
    // Committed: the confirmed one is the shop's flip, the returned one no
    // longer the timer's; asked again and again, neither is flipped.
    for _ in 0..2 {
        let states = batch(&store, &ids).await;
        assert_eq!(states["tm-held"], OrderState::CancelledElsewhere);
        assert_eq!(states["tm-returned"], OrderState::LeftAlone);
    }
    assert_eq!(effects(f, "tm-held").await, ("RECEIVED".into(), 0, 0, 0));
    assert_eq!(
        effects(f, "tm-returned").await,
        ("RETURNED".into(), 0, 0, 0)
    );
    for id in ids
        .iter()
        .filter(|id| !["tm-held", "tm-returned"].contains(&id.as_str()))
    {
        assert_eq!(
            effects(f, id.as_str()).await,
            ("RECEIVED".into(), 1, 1, 0),
            "{id}: [status, also runs, outbox rows, default timer's outbox rows]"
        );
    }
}
