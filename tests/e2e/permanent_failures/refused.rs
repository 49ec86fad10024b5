//! Publishes the broker refuses (a queue at its length limit,
//! `reject-publish`) back off instead of spinning, and a refused
//! re-schedule takes another route by the time left or holds the order
//! until its hold window is over.

use super::*;
use order_timeout::testing::topology::{Layout, binding_specs};

/// Limits the parked queue and the cascade's level 4 (16 s) to `max`
/// messages, refusing publishes beyond (`reject-publish`).
fn set_limit(env: &TestEnv, max: u32) {
    env.rabbitmqctl(&[
        "-q",
        "set_policy",
        "-p",
        &env.name,
        "--apply-to",
        "queues",
        "limit",
        r"^order-timeout\.delay\.04(\.s[0-9]+)?$",
        &format!(r#"{{"max-length":{max},"overflow":"reject-publish"}}"#),
    ]);
}

/// The paid order `filler`, whose messages fill queues (acked as paid
/// when they reach the consumer).
async fn paid_filler(env: &TestEnv) {
    let paid = env
        .create_order("filler", Duration::from_secs(3600), &[(0, 1)])
        .await;
    assert!(env.pay(&paid.id).await);
}

/// Fills cascade level `level` of every shard with one message of the
/// paid order `filler`, so that a limit of 0 refuses more.
async fn fill_level(env: &TestEnv, level: u32) {
    let delay = 1u64 << level;
    let route = cascade_route(delay, 0);
    for shard in 0..env.settings.cascade_shards.get() {
        let exchange = cascade_route(delay, shard).exchange;
        assert_eq!(exchange, shard_level_name(shard, level));
        publish_with(
            env,
            &exchange,
            &route.routing_key,
            br#"{"order_id":"filler"}"#,
            FieldTable::default(),
        )
        .await;
    }
}

pub(super) async fn publishes_the_broker_refuses_back_off_instead_of_spinning(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    // The first cascade level of a 16 s delay is full and refuses
    // publishes (a quorum queue over `max-length` with `reject-publish`):
    // one message in it, a limit of 0. (The parked queue no longer fills:
    // the service moves what is parked into the parked store at once.)
    paid_filler(&env).await;
    fill_level(&env, 4).await;
    set_limit(&env, 0);

    let service = env.service().await;
    // A timeout 24 s away: the service sends it 16 s down the cascade
    // (its first hop, into a full level). A re-schedule is routed by the
    // time left at each try, so it goes on into the full level only while
    // 16 s or more are left: 8 s of tries, not the 1.5 s a 17.5 s timeout
    // left, which a slow start of the service could spend before its
    // second try (then routed into the 8 s level, which takes it).
    let order = env
        .create_order("refused-1", Duration::from_secs(24), &[(0, 2)])
        .await;
    env.publish_timeout(&order).await;

    // At least 10 s of refusals, and up to 15 s for the second refusal (a
    // loaded 4.x node can take seconds to refuse): well before the order's
    // deadline, which must still be met once the level takes messages.
    let started = std::time::Instant::now();
    let _ = tokio::time::timeout(Duration::from_secs(15), async {
        while service.metrics.publish_failures() < 2 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let window = started.elapsed().max(Duration::from_secs(10));
    tokio::time::sleep(window.saturating_sub(started.elapsed())).await;
    let failures = service.metrics.publish_failures();
    let requeued = service.metrics.requeued_total();
    println!(
        "in {window:?} of refused publishes: {failures} failed publishes, {requeued} requeues"
    );
    assert!(
        failures >= 2,
        "the publish was refused, and tried again: {failures}"
    );
    // Returned to the queue at once, each message came straight back: one
    // round trip of a few milliseconds, thousands of times in the window.
    assert!(
        failures <= 60,
        "publishes tried again with backoff: {failures}"
    );
    assert!(
        requeued <= 6,
        "deliveries returned at most every few seconds: {requeued}"
    );
    assert_eq!(service.metrics.count(Outcome::Parked), 0);

    // The limit is raised; a quorum queue that has told publishers it is
    // full lets them in again once it is below its limit (emptied here).
    // (RabbitMQ 3.10 never lets them in if the limit is removed instead:
    // the publishers' channels stay refused until they are reopened.)
    set_limit(&env, 100_000);
    let purge = env.amqp.create_channel().await.unwrap();
    for shard in 0..env.settings.cascade_shards.get() {
        purge
            .queue_purge(
                shard_level_name(shard, 4).as_str().into(),
                lapin::options::QueuePurgeOptions::default(),
            )
            .await
            .unwrap();
    }
    let (status, expires_at, cancelled_at) =
        env.wait_settled("refused-1", Duration::from_secs(20)).await;
    assert_eq!(status, "CANCELLED");
    let late = cancelled_at.unwrap() - expires_at;
    assert!(
        late >= chrono::Duration::zero() && late < late_ok(),
        "on time once the broker took the re-schedule: {late}"
    );
    assert!(parked(&env).await.is_empty(), "nothing parked");
    service.stop().await.unwrap();
}

/// A re-schedule the broker refuses is routed again at each try by the
/// time left then, so it goes around a full cascade level within a second
/// or two instead of waiting out the publish patience (8 s) and going back
/// to the queue.
pub(super) async fn a_refused_re_schedule_takes_another_route_by_the_time_left(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    // Level 4 (16 s) of every shard holds a message and refuses more.
    paid_filler(&env).await;
    fill_level(&env, 4).await;
    set_limit(&env, 0);

    let service = env.service().await;
    // 17.8 s away: 16 s (one hop, refused) while more than 16.5 s are
    // left, then 15 s (levels 3 to 0), which the broker takes.
    let order = env
        .create_order("rerouted-1", Duration::from_millis(17_800), &[(0, 2)])
        .await;
    env.publish_timeout(&order).await;
    let (status, expires_at, cancelled_at) = env
        .wait_settled("rerouted-1", Duration::from_secs(30))
        .await;
    assert_eq!(status, "CANCELLED");
    let late = cancelled_at.unwrap() - expires_at;
    assert!(
        late >= chrono::Duration::zero() && late < late_ok(),
        "on time: {late}"
    );
    let failures = service.metrics.publish_failures();
    assert!(
        (1..=8).contains(&failures),
        "refused into level 4, then taken by another route: {failures} failed publishes"
    );
    assert_eq!(
        service.metrics.requeued_total(),
        0,
        "the delivery was not returned to the queue after the publish patience"
    );
    service.stop().await.unwrap();
}

/// A re-schedule the broker refuses on every route until its deadline is
/// within the hold window is held in-process then, not returned to the
/// queue seconds later.
pub(super) async fn a_re_schedule_refused_until_the_hold_window_is_held(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    env.stock_skus(1).await;
    let service = env.service().await;
    let addr = service.http_addr;
    env.eventually(Duration::from_secs(10), "ready (topology declared)", || {
        ready(addr)
    })
    .await;
    // Levels 0 (1 s) and 1 (2 s) lose their queues' bindings: a delay of
    // 1 or 2 s is unroutable (the publish is mandatory), so refused.
    let levels: Vec<String> = (0..env.settings.cascade_shards.get())
        .flat_map(|shard| [0, 1].map(|level| shard_level_name(shard, level)))
        .collect();
    let channel = env.amqp.create_channel().await.unwrap();
    let specs = binding_specs(&Layout::of(&env.settings));
    for spec in specs {
        let BindingDestination::Queue(queue) = &spec.destination else {
            continue;
        };
        if !levels.contains(queue) {
            continue;
        }
        channel
            .queue_unbind(
                queue.as_str().into(),
                spec.source.as_str().into(),
                spec.routing_key.as_str().into(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    // 3.4 s away: 2 s, then 1 s, both refused, then held at under 2 s.
    let order = env
        .create_order("held-1", Duration::from_millis(3_400), &[(0, 2)])
        .await;
    env.publish_timeout(&order).await;
    let (status, expires_at, cancelled_at) =
        env.wait_settled("held-1", Duration::from_secs(20)).await;
    assert_eq!(status, "CANCELLED");
    let late = cancelled_at.unwrap() - expires_at;
    assert!(
        late >= chrono::Duration::zero() && late < chrono::Duration::seconds(1),
        "held until its deadline, not returned after the publish patience (8 s): {late}"
    );
    assert!(service.metrics.publish_failures() >= 1);
    assert_eq!(service.metrics.requeued_total(), 0);
    service.stop().await.unwrap();
}
