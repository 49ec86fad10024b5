//! A flip that fails for good for one row of a batch (a trigger of the
//! shop's refusing it, a CHECK constraint, a `set` value that does not fit)
//! fails only that order: the batch is run again order by order, the other
//! orders are cancelled with their effects, and the one whose row the
//! trigger refuses is reported failed with the trigger's reason, nothing of
//! it committed. No `also` statement here: this is the batch path (a timer
//! with `also` statements runs each order on its own anyway).

use super::*;

/// Orders in the batch besides the refused one.
const OTHERS: usize = 9;

/// A trigger on the reference orders table that refuses to cancel
/// `fl-refused` (as a shop's own rule might).
pub(super) async fn refuse(f: &Fixture, order: Option<&str>) {
    let (postgres, mysql) = crate::common::refusing_trigger("refuse_cancel", order);
    match f.dialect() {
        Dialect::Postgres => f.exec(&postgres).await,
        Dialect::MySql => f.exec(&mysql).await,
    }
}

pub(super) async fn a_flip_failing_for_one_row_fails_only_that_order(f: &Fixture) {
    refuse(f, Some("fl-refused")).await;
    let mut ids: Vec<OrderId> = (0..OTHERS).map(|n| id(&format!("fl-{n:02}"))).collect();
    ids.push(id("fl-refused"));
    for order in &ids {
        f.insert(order.as_str(), "UNPAID", secs(-1)).await;
    }
    let store = f.store();
    let states = store.cancel_due(&ids, LEASE).await.unwrap();
    assert_eq!(states.len(), ids.len(), "{states:?}");
    for (id, state) in states {
        match id.as_str() {
            "fl-refused" => match state {
                OrderState::Failed(failure) => {
                    let error = failure.0.to_string();
                    assert!(failure.0.is_permanent(), "{error}");
                    assert!(error.contains("may not be cancelled"), "{error}");
                }
                other => panic!("the refused order: {other:?}"),
            },
            _ => assert!(
                matches!(&state, OrderState::Cancelled(c) if c.just_now),
                "{id}: {state:?}"
            ),
        }
    }
    assert_eq!(f.row("fl-refused").await.0, "UNPAID");
    assert_eq!(f.outbox_rows("fl-refused").await, 0);
    for id in ids.iter().filter(|id| id.as_str() != "fl-refused") {
        assert_eq!(f.row(id.as_str()).await.0, "CANCELLED", "{id}");
        assert_eq!(f.outbox_rows(id.as_str()).await, 1, "{id}");
    }
}
