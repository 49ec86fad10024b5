//! Which rows a timer flips: only the due rows in its `from` status (never
//! early), nothing for a row it was not asked about (ids compared exactly
//! in its table), and a row back in its `from` status not again.

use super::*;

pub(in crate::store) async fn a_timer_flips_only_due_rows_in_its_from_status(f: &Fixture) {
    shipping_schema(f).await;
    let minute = secs(60);
    insert_rows(
        f,
        &[
            order_row(f, "m-unpaid", "UNPAID", None),
            order_row(f, "m-paid", "PAID", None),
            order_row(f, "m-cancelled", "CANCELLED", None),
            order_row(f, "m-due-1", "SHIPPED", Some(-minute * 2)),
            order_row(f, "m-due-2", "SHIPPED", Some(-minute)),
            order_row(f, "m-later", "SHIPPED", Some(secs(3600))),
            order_row(f, "m-soon", "SHIPPED", Some(secs(3))),
            // Shipped, no ship date: no deadline, never flipped.
            order_row(f, "m-undated", "SHIPPED", None),
            // Received by the customer's own click: not this service's flip.
            order_row(f, "m-confirmed", "RECEIVED", Some(-minute)),
        ],
    )
    .await;
    // The UNPAID and PAID rows shipped long ago, as far as the deadline
    // expression goes: only the status keeps them out.
    f.exec(&format!(
        "UPDATE orders SET shipped_at = {} WHERE id IN ('m-unpaid', 'm-paid')",
        match f.dialect() {
            Dialect::MySql => "UTC_TIMESTAMP(6) - INTERVAL 20 DAY",
            Dialect::Postgres => "now() - interval '20 days'",
        }
    ))
    .await;
    let store = store_of(f, &auto_receive(f, "none", "")).await;
    let all = ids(&[
        "m-unpaid",
        "m-paid",
        "m-cancelled",
        "m-due-1",
        "m-due-2",
        "m-later",
        "m-soon",
        "m-undated",
        "m-confirmed",
        "m-ghost",
    ]);

    // What the sweeper would take for this timer: the due shipped rows,
    // oldest first.
    let overdue = store.overdue(Duration::ZERO, None, 100).await.unwrap();
    let overdue: Vec<OrderId> = overdue.rows.into_iter().map(|(id, _)| id).collect();
    assert_eq!(overdue, ids(&["m-due-1", "m-due-2"]));

    let states = batch(&store, &all).await;
    for order in ["m-due-1", "m-due-2"] {
        let c = flipped_just_now(order, &states[order]);
        // release = "none": nothing to release; the event is to publish.
        assert!(!c.release_pending && c.event_pending, "{order}: {c:?}");
    }
    for order in ["m-unpaid", "m-paid", "m-cancelled", "m-undated"] {
        assert_eq!(states[order], OrderState::LeftAlone, "{order}");
    }
    assert_eq!(states["m-confirmed"], OrderState::CancelledElsewhere);
    assert_eq!(states["m-ghost"], OrderState::Unknown);
    match &states["m-later"] {
        OrderState::NotYetDue { expires_at, db_now } => {
            let left = *expires_at - *db_now;
            assert!(left > secs(3500) && left <= secs(3600), "{left}");
        }
        other => panic!("m-later: expected NotYetDue, got {other:?}"),
    }
    // Never early: due in three seconds, it waits, then flips once due.
    let wait = match &states["m-soon"] {
        OrderState::NotYetDue { expires_at, db_now } => *expires_at - *db_now,
        other => panic!("m-soon: expected NotYetDue, got {other:?}"),
    };
    assert!(wait > secs(1) && wait <= secs(3), "{wait}");
    assert_eq!(effects(f, "m-soon").await, ("SHIPPED".into(), 0, 0, 0));
    tokio::time::sleep(
        (wait + chrono::Duration::milliseconds(500))
            .to_std()
            .unwrap(),
    )
    .await;
    let soon = state_of(store.as_ref(), "m-soon", LEASE).await;
    flipped_just_now("m-soon", &soon);

    // The default timer on the same table: cancels its unpaid row, and
    // leaves every shipped or received row alone.
    let mut default = batch(f.store(), &all).await;
    flipped_just_now("m-unpaid", &default.remove("m-unpaid").unwrap());
    assert_eq!(default.remove("m-paid"), Some(OrderState::Paid));
    assert_eq!(
        default.remove("m-cancelled"),
        Some(OrderState::CancelledElsewhere)
    );
    assert_eq!(default.remove("m-ghost"), Some(OrderState::Unknown));
    for (order, state) in default {
        assert_eq!(state, OrderState::LeftAlone, "{order}");
    }

    // Asked again: not flipped again, and the row the default timer
    // cancelled meanwhile is not this timer's.
    let again = batch(&store, &all).await;
    for order in ["m-due-1", "m-due-2", "m-soon"] {
        assert_not_again(order, &again[order]);
    }
    assert_eq!(again["m-unpaid"], OrderState::LeftAlone);

    // Effects: [status, also log rows, this timer's outbox rows, the
    // default timer's outbox rows].
    for order in ["m-due-1", "m-due-2", "m-soon"] {
        assert_eq!(
            effects(f, order).await,
            ("RECEIVED".into(), 1, 1, 0),
            "{order}"
        );
        // Its own `set`, not the default timer's.
        assert_eq!(set_columns(f, order).await, (true, false, false), "{order}");
        assert!(release_done(f, order).await, "{order}: release = none");
    }
    let untouched = [
        ("m-paid", "PAID"),
        ("m-cancelled", "CANCELLED"),
        ("m-later", "SHIPPED"),
        ("m-undated", "SHIPPED"),
        ("m-confirmed", "RECEIVED"),
    ];
    for (order, status) in untouched {
        assert_eq!(effects(f, order).await, (status.into(), 0, 0, 0), "{order}");
        assert!(!set_columns(f, order).await.0, "{order}: received_at");
    }
    assert_eq!(effects(f, "m-unpaid").await, ("CANCELLED".into(), 0, 0, 1));
    assert_eq!(set_columns(f, "m-unpaid").await, (false, true, true));
    // `set`'s clock: at or after the deadline it flipped for.
    let early = f
        .texts(&format!(
            "SELECT id FROM orders WHERE status = 'RECEIVED' AND id <> 'm-confirmed' \
                AND NOT (received_at >= {})",
            match f.dialect() {
                Dialect::MySql => "shipped_at + INTERVAL 15 DAY",
                Dialect::Postgres => "shipped_at + interval '15 days'",
            }
        ))
        .await;
    assert!(early.is_empty(), "received before the deadline: {early:?}");
}

/// Ids are compared exactly in a timer's table: the id-column cases of
/// [`super::id_columns`], each through a `[[timers]]` table of its own.
pub(in crate::store) async fn a_timers_batch_never_flips_a_row_it_was_not_asked_about(f: &Fixture) {
    super::id_columns::every_id_column_type(f, super::id_columns::Flip::Timer).await;
}

/// A row that comes back into a timer's `from` status after the timer
/// flipped it (the shop reopens it) is not flipped again while the timer's
/// outbox row is kept: its effects never run twice, on either dialect, and
/// it is reported left alone (not contended, which would retry the message
/// until it is parked). The same holds for the default timer and an order
/// the shop sets back to unpaid after it was cancelled.
pub(in crate::store) async fn a_row_back_in_its_from_status_is_not_flipped_again(f: &Fixture) {
    shipping_schema(f).await;
    insert_rows(f, &[order_row(f, "b-shipped", "SHIPPED", Some(secs(-60)))]).await;
    f.insert("b-unpaid", "UNPAID", secs(-60)).await;
    let store = store_of(f, &auto_receive(f, "none", "")).await;
    let flipped = batch(&store, &ids(&["b-shipped"])).await;
    flipped_just_now("b-shipped", &flipped["b-shipped"]);
    let cancelled = batch(f.store(), &ids(&["b-unpaid"])).await;
    flipped_just_now("b-unpaid", &cancelled["b-unpaid"]);

    // The shop reopens both, in a session of its own, while nothing else
    // runs; then both timers are asked again, twice.
    commit_during(
        f,
        "UPDATE orders SET status = 'SHIPPED', received_at = NULL WHERE id = 'b-shipped'",
        async {},
    )
    .await;
    commit_during(
        f,
        "UPDATE orders SET status = 'UNPAID' WHERE id = 'b-unpaid'",
        async {},
    )
    .await;
    for _ in 0..2 {
        let again = batch(&store, &ids(&["b-shipped"])).await;
        assert_eq!(again["b-shipped"], OrderState::LeftAlone);
        let again = batch(f.store(), &ids(&["b-unpaid"])).await;
        assert_eq!(again["b-unpaid"], OrderState::LeftAlone);
    }
    assert_eq!(
        effects(f, "b-shipped").await,
        ("SHIPPED".into(), 1, 1, 0),
        "one flip's effects, the row as the shop left it"
    );
    assert!(
        !set_columns(f, "b-shipped").await.0,
        "received_at cleared by the shop"
    );
    assert_eq!(f.row("b-unpaid").await.0, "UNPAID");
    assert_eq!(f.outbox_rows("b-unpaid").await, 1);
}
