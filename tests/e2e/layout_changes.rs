//! Changing the layout with timeouts in flight, on the real broker: the
//! service runs with 4 cascade shards and two lanes in 3 shards, timeouts
//! wait in cascade shard 3 and in the lanes, the service stops and comes
//! back with 2 shards, one lane removed and the other in 1 shard. Every
//! order is cancelled exactly once, never early, and on time (nothing
//! waits in a queue nobody serves: the sweeper is off, so a stranded
//! message leaves its order unpaid), and `topology check` / `pending` name
//! the leftover queues while they hold messages and say they are empty
//! afterwards.

use std::time::Duration;

use crate::common::{TestEnv, ready, restart_turn};
use order_timeout::settings::{Lane, Shards};
use order_timeout::testing::metrics::Outcome;
use order_timeout::testing::topology::{lane_name, shard_for, shard_level_name};
use order_timeout_tools::shop::NewOrder;

/// Generous bound on lateness (the benchmark measures the real figure).
const LATE_OK: chrono::Duration = chrono::Duration::milliseconds(1500);

fn shards(n: u32) -> Shards {
    Shards::try_from(n).unwrap()
}

/// `n` ids `prefix-i` whose shard among `of` satisfies `pick`.
fn ids(prefix: &str, n: usize, of: u32, pick: impl Fn(u32) -> bool) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|id| pick(shard_for(id, shards(of))))
        .take(n)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_change_strands_no_timeout_and_topology_check_lists_what_is_left() {
    // The first service stops with timeouts in flight and a second starts.
    let _turn = restart_turn().await;
    let mut env = TestEnv::new().await;
    env.stock_skus(1).await;
    let removed = Lane::try_from("12s".to_string()).unwrap();
    let kept = Lane::try_from("15s".to_string()).unwrap();
    env.settings.sweeper.enabled = false;
    let mut before = env.settings.clone();
    before.cascade_shards = shards(4);
    before.lanes = vec![removed, kept];
    before.lane_shards = shards(3);
    let first = env.service_with(before.clone()).await;
    env.eventually(Duration::from_secs(10), "the first service ready", || {
        ready(first.http_addr)
    })
    .await;

    // 20 s through the cascade: 18 s = levels 4 and 1, so a message of
    // shard 3 falls from level 4 through the exchanges of levels 3 and 2,
    // which the new layout does not declare, into level 1.
    let in_shard3 = ids("cascade", 6, 4, |s| s == 3);
    let elsewhere = ids("other", 4, 4, |s| s != 3);
    let in_removed_lane = ids("removed-lane", 6, 3, |_| true);
    let kept_beyond = ids("kept-lane", 4, 3, |s| s != 0);
    let kept_first = ids("kept-first", 2, 3, |s| s == 0);
    let mut orders: Vec<NewOrder> = Vec::new();
    for (group, secs) in [
        (&in_shard3, 20),
        (&elsewhere, 20),
        (&in_removed_lane, 12),
        (&kept_beyond, 15),
        (&kept_first, 15),
    ] {
        for id in group {
            let order = env
                .create_order(id, Duration::from_secs(secs), &[(0, 1)])
                .await;
            env.publish_timeout(&order).await;
            orders.push(order);
        }
    }
    let s3_top = shard_level_name(3, 4);
    let depth = |queue: String| {
        let env = &env;
        async move { env.queue_depth(&queue).await }
    };
    env.eventually(
        Duration::from_secs(5),
        "the timeouts in shard 3 and the lanes",
        || async {
            let mut removed_lane = 0;
            let mut kept_lane = 0;
            for shard in 0..3 {
                removed_lane += depth(lane_name(removed, shard)).await;
                if shard > 0 {
                    kept_lane += depth(lane_name(kept, shard)).await;
                }
            }
            depth(s3_top.clone()).await == 6 && removed_lane == 6 && kept_lane == 4
        },
    )
    .await;
    let first_metrics = first.metrics.clone();
    first.stop().await.unwrap();
    assert_eq!(
        first_metrics.count(Outcome::Cancelled),
        0,
        "all still waiting"
    );

    // The new layout: 2 shards, the 12 s lane removed, the 15 s lane in 1 shard.
    env.settings.cascade_shards = shards(2);
    env.settings.lanes = vec![kept];
    env.settings.lane_shards = shards(1);
    let check = env.cli(&["topology", "check"]).await;
    let out = &check.stdout;
    assert_eq!(check.code, Some(0), "{out}{}", check.stderr);
    assert!(
        out.contains(&format!("LEFTOVER queue {s3_top} holds 6 messages")),
        "{out}"
    );
    assert!(out.contains("they will still be delivered; delete it once empty"));
    for shard in 0..3 {
        let queue = lane_name(removed, shard);
        assert!(
            out.contains(&format!("LEFTOVER queue {queue} holds ")),
            "{out}"
        );
    }
    for shard in 1..3 {
        let queue = lane_name(kept, shard);
        assert!(
            out.contains(&format!("LEFTOVER queue {queue} holds ")),
            "{out}"
        );
    }
    assert!(
        !out.contains(&format!("queue {} ", lane_name(kept, 0))),
        "shard 0 of the kept lane is not left over: {out}"
    );
    let pending = env.cli(&["pending", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&pending.stdout).unwrap();
    assert!(json["leftover_messages"].as_u64().unwrap() > 0, "{json}");
    let leftover_names: Vec<&str> = json["leftover_queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["queue"].as_str().unwrap())
        .collect();
    assert!(leftover_names.contains(&s3_top.as_str()), "{json}");

    // The second service: every order cancelled once, on time.
    let second = env.service().await;
    env.cancelled_on_time(orders.iter(), Duration::from_secs(40), LATE_OK)
        .await;
    // Every message reached the consumer (none was replaced by a sweep).
    env.acked_exactly(&second, Outcome::Cancelled, orders.len() as u64)
        .await;
    env.assert_stock_exact(1).await;

    // What is left is empty, and said to be.
    env.eventually(
        Duration::from_secs(10),
        "topology check: the leftovers empty",
        || async {
            let out = env.cli(&["topology", "check"]).await.stdout;
            !out.contains("LEFTOVER") && out.contains("holding 0 timeouts")
        },
    )
    .await;
    let out = env.cli(&["topology", "check"]).await.stdout;
    for shard in [2, 3] {
        let line =
            format!("EMPTY    left over from an earlier layout: cascade shard {shard} (28 queues");
        assert!(out.contains(&line), "{out}");
    }
    assert!(
        out.contains(&format!(
            "queue {}: empty, can be deleted once no order service publishes with the lane entry key \"schedule.12s\"",
            lane_name(removed, 0)
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "queue {}: empty, can be deleted\n",
            lane_name(kept, 2)
        )),
        "{out}"
    );
    second.stop().await.unwrap();
}
