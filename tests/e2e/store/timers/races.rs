//! Effects follow the flip while another session moves rows out of the
//! timer's `from` status and back, or flips its guard column: two stores
//! flip 1,200 rows in concurrent batches, each row's effects exist if and
//! only if it flipped, each exactly once.

use super::*;

pub(in crate::store) async fn effects_follow_a_timers_flip_while_another_session_moves_rows_out_of_its_from_status(
    f: &Fixture,
) {
    // The first half of the rows go back and forth between SHIPPED and
    // HELD (a support agent's hold, say); the second half are left alone.
    race(
        f,
        "",
        "UPDATE orders SET status = CASE WHEN status = 'SHIPPED' THEN 'HELD' ELSE 'SHIPPED' END \
          WHERE id >= 'tr-00000' AND id < 'tr-00600' AND status IN ('SHIPPED', 'HELD')",
        "UPDATE orders SET status = 'SHIPPED' WHERE status = 'HELD'",
    )
    .await;
}

pub(in crate::store) async fn effects_follow_a_timers_flip_while_another_session_flips_the_guard_column(
    f: &Fixture,
) {
    race(
        f,
        "frozen = 0",
        "UPDATE orders SET frozen = 1 - frozen WHERE id >= 'tr-00000' AND id < 'tr-00600'",
        "UPDATE orders SET frozen = 0",
    )
    .await;
}

/// 1,200 due shipped rows; `toggle` repeated by another session while two
/// stores of the timer (with `guard`) flip them in concurrent batches,
/// twice over; the invariant, row by row; then `settle` (the other session
/// done), one more run, and every row flipped exactly once.
async fn race(f: &Fixture, guard: &str, toggle: &str, settle: &str) {
    shipping_schema(f).await;
    let names: Vec<String> = (0..ROWS).map(|n| format!("tr-{n:05}")).collect();
    let rows: Vec<String> = names
        .iter()
        .map(|name| order_row(f, name, "SHIPPED", Some(secs(-60))))
        .collect();
    insert_rows(f, &rows).await;
    let ids: Vec<OrderId> = names.iter().map(|n| id(n)).collect();
    let timer = auto_receive(f, "none", guard);
    let stores = [store_of(f, &timer).await, store_of(f, &timer).await];
    let mut reported: BTreeMap<String, usize> = BTreeMap::new();

    let toggler = f.repeat(toggle.to_owned());
    for _ in 0..2 {
        run_batches(&stores, &ids, &mut reported).await;
    }
    let toggles = toggler.stop().await;
    assert!(toggles > 10, "the other session ran {toggles} times");
    let flipped = check(f, &ids, &reported).await;
    eprintln!("{flipped} of {ROWS} rows flipped while the other session ran {toggles} times");
    // The rows the other session never touched have all flipped.
    let untouched_flipped = check_untouched(f).await;
    assert_eq!(untouched_flipped, ROWS / 2, "the rows left alone all flip");
    // The race happened: of the rows the other session touched, some
    // flipped and some were held back (else the invariant above was never
    // put to the test).
    assert!(
        flipped > untouched_flipped,
        "none of the touched rows flipped during the race"
    );
    assert!(flipped < ROWS, "every touched row flipped: no race");

    f.exec(settle).await;
    run_batches(&stores, &ids, &mut reported).await;
    let flipped = check(f, &ids, &reported).await;
    assert_eq!(flipped, ROWS, "every row flips once nothing holds it back");
}

/// One run of concurrent batches over `ids`, alternating between the
/// stores; counts each row reported flipped just now.
async fn run_batches(stores: &[Store; 2], ids: &[OrderId], reported: &mut BTreeMap<String, usize>) {
    let mut tasks = tokio::task::JoinSet::new();
    for (n, chunk) in ids.chunks(BATCH).enumerate() {
        let store = stores[n % 2].clone();
        let chunk = chunk.to_vec();
        tasks.spawn(async move { store.cancel_due(&chunk, LEASE).await.unwrap() });
    }
    while let Some(states) = tasks.join_next().await {
        for (id, state) in states.unwrap() {
            if matches!(state, OrderState::Cancelled(c) if c.just_now) {
                *reported.entry(id.as_str().to_owned()).or_default() += 1;
            }
        }
    }
}

/// For every row: in `RECEIVED` ⇔ one `also` log row ⇔ one outbox row of
/// this timer ⇔ `received_at` set ⇔ reported flipped just now once; and no
/// outbox row of the default timer. Returns how many rows are received.
async fn check(f: &Fixture, ids: &[OrderId], reported: &BTreeMap<String, usize>) -> usize {
    let count = |rows: Vec<String>| {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for row in rows {
            *counts.entry(row).or_default() += 1;
        }
        counts
    };
    let received = count(
        f.texts("SELECT id FROM orders WHERE status = 'RECEIVED'")
            .await,
    );
    let set = count(
        f.texts("SELECT id FROM orders WHERE received_at IS NOT NULL")
            .await,
    );
    let log = count(f.texts("SELECT order_id FROM receive_log").await);
    let outbox = count(
        f.texts(&format!(
            "SELECT {} FROM order_timeout_cancel_outbox WHERE timer = '{TIMER}'",
            outbox_id(f)
        ))
        .await,
    );
    let other = f
        .texts(&format!(
            "SELECT {} FROM order_timeout_cancel_outbox WHERE timer <> '{TIMER}'",
            outbox_id(f)
        ))
        .await;
    assert!(other.is_empty(), "outbox rows of another timer: {other:?}");
    let asked: BTreeSet<&str> = ids.iter().map(OrderId::as_str).collect();
    for table in [&received, &set, &log, &outbox] {
        let strays: Vec<&String> = table
            .keys()
            .filter(|k| !asked.contains(k.as_str()))
            .collect();
        assert!(strays.is_empty(), "rows never asked about: {strays:?}");
    }
    let mut wrong = BTreeMap::new();
    for id in &asked {
        let at = |t: &BTreeMap<String, usize>| t.get(*id).copied().unwrap_or(0);
        let facts = [at(&received), at(&set), at(&log), at(&outbox), at(reported)];
        if facts.iter().any(|n| *n != facts[0] || *n > 1) {
            wrong.insert(*id, facts);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} rows with [received, received_at, also, outbox, reported] out of step \
         ({} received): {wrong:?}",
        wrong.len(),
        ids.len(),
        received.len()
    );
    assert!(!received.is_empty(), "some rows were flipped");
    received.len()
}

/// How many of the rows the other session never touched (`tr-00600` on)
/// are received.
async fn check_untouched(f: &Fixture) -> usize {
    f.texts("SELECT id FROM orders WHERE status = 'RECEIVED' AND id >= 'tr-00600'")
        .await
        .len()
}
