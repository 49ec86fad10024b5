//! The two RabbitMQ versions the suite runs on, and where they differ.
//!
//! The RabbitMQ 4.x test node is what the `rabbitmq4::` tests of the other
//! suites claim it is: RabbitMQ 4 (the machine's broker 3.x, so the two
//! sets really run on different versions), every deprecated feature it
//! lists denied (by configuration, and in effect: a transient non-exclusive
//! queue is refused), and Khepri on. A root with a newer 4.x that
//! deprecates one more feature fails here until `scripts/rabbitmq4.sh`
//! denies it too.
//!
//! The delivery limit, on both versions: RabbitMQ 4.x drops a message
//! returned to a quorum queue more often than the queue's delivery limit,
//! 20 unless the queue says otherwise; 3.x has no default limit. The
//! service declares its due queue (the one it consumes) with a limit of
//! 1,000,000, which holds on both.

use std::time::Duration;

use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
use order_timeout::testing::broker::header_int;
use order_timeout::testing::topology::DUE_QUEUE;

use crate::common::{Broker, TestEnv, declare_durable_queue, depth_on, on_both_brokers};

/// The broker's own version (`rabbit_misc:version()`, e.g. `4.0.5`).
fn version(broker: Broker) -> String {
    let out = broker
        .rabbitmqctl(&["eval", "rabbit_misc:version()."])
        .unwrap_or_else(|e| panic!("{broker:?}: {e}"));
    out.trim().trim_matches('"').to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rabbitmq4_node_denies_every_deprecated_feature_and_runs_khepri() {
    let broker = Broker::Rabbitmq4;
    if !broker.available() {
        return;
    }
    let (four, three) = (version(broker), version(Broker::Rabbitmq3));
    assert!(four.starts_with("4."), "the 4.x test node runs {four}");
    assert!(three.starts_with("3."), "the machine's broker runs {three}");
    eprintln!("RabbitMQ {four} (4.x test node) beside {three} (the machine's)");

    let listed = broker
        .rabbitmqctl(&[
            "list_deprecated_features",
            "--no-table-headers",
            "name",
            "deprecation_phase",
        ])
        .unwrap();
    let features: Vec<(&str, &str)> = listed.lines().filter_map(|l| l.split_once('\t')).collect();
    assert!(
        features
            .iter()
            .any(|(f, _)| *f == "transient_nonexcl_queues"),
        "{listed}"
    );
    // Whether each is permitted, as the broker decides it (the function
    // `is_permitted` asks, without the warning it logs).
    let decided = broker
        .rabbitmqctl(&[
            "eval",
            r#"maps:foreach(fun(F, P) -> io:format("permitted: ~s ~s~n", [F, rabbit_deprecated_features:should_be_permitted(F, P)]) end, rabbit_deprecated_features:list(all)), ok."#,
        ])
        .unwrap();
    let permitted: std::collections::BTreeMap<&str, &str> = decided
        .lines()
        .filter_map(|l| l.strip_prefix("permitted: ")?.split_once(' '))
        .collect();
    for (feature, phase) in &features {
        assert_eq!(
            permitted.get(feature).copied(),
            Some("false"),
            "deprecated feature {feature} ({phase}) is permitted: scripts/rabbitmq4.sh must deny it ({decided})"
        );
    }

    let flags = broker
        .rabbitmqctl(&["list_feature_flags", "--no-table-headers", "name", "state"])
        .unwrap();
    assert!(
        flags.lines().any(|l| l == "khepri_db\tenabled"),
        "Khepri on: {flags}"
    );

    // In effect, not only configured: a transient non-exclusive queue is
    // refused on the 4.x node (and still declared on the machine's).
    let transient = QueueDeclareOptions {
        durable: false,
        exclusive: false,
        auto_delete: false,
        ..Default::default()
    };
    let env = broker.scope(TestEnv::new()).await;
    assert_eq!(env.broker, Broker::Rabbitmq4);
    let channel = env.amqp.create_channel().await.unwrap();
    let refused = channel
        .queue_declare("ot-transient".into(), transient, FieldTable::default())
        .await;
    assert!(
        refused.is_err(),
        "a transient non-exclusive queue was declared on the 4.x node"
    );
    let machine = TestEnv::new().await;
    assert_eq!(machine.broker, Broker::Rabbitmq3);
    let channel = machine.amqp.create_channel().await.unwrap();
    channel
        .queue_declare("ot-transient".into(), transient, FieldTable::default())
        .await
        .expect("the machine's 3.x broker still allows a transient non-exclusive queue");
}

/// Returns the one message of `queue` up to `returns` times (`basic.get`,
/// then `basic.nack` with requeue) and acks it at the end: the
/// `x-delivery-count` of each delivery (`None` when absent), as many as
/// there were. A return is applied by a quorum queue a few milliseconds
/// after the channel answers, so an empty get waits up to 3 s for the
/// message to be counted again before calling it gone.
async fn return_repeatedly(channel: &Channel, queue: &str, returns: usize) -> Vec<Option<i64>> {
    let mut counts = Vec::new();
    loop {
        let got = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap();
        let Some(msg) = got else {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
            while depth_on(channel, queue).await == 0 {
                if tokio::time::Instant::now() >= deadline {
                    return counts;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            continue;
        };
        counts.push(
            msg.delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("x-delivery-count"))
                .and_then(header_int),
        );
        if counts.len() > returns {
            msg.ack(BasicAckOptions::default()).await.unwrap();
            return counts;
        }
        msg.nack(BasicNackOptions {
            requeue: true,
            multiple: false,
        })
        .await
        .unwrap();
    }
}

/// Publishes one persistent message straight to `queue`, confirmed.
async fn put(env: &TestEnv, queue: &str) {
    let confirm = env
        .channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            b"returned again and again",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack(), "{queue}");
}

/// 25 returns of one message: in a quorum queue declared without a
/// delivery limit, RabbitMQ 4.x drops it after the 20th (its default
/// limit) and 3.x keeps it; in the service's due queue (limit 1,000,000;
/// no service consumes it here) both keep it. `x-delivery-count` counts
/// the returns on both.
async fn a_message_returned_25_times_is_kept_where_the_service_declared_the_limit(broker: Broker) {
    const RETURNS: usize = 25;
    let env = TestEnv::new().await;
    assert_eq!(env.broker, broker);
    let channel = env.amqp.create_channel().await.unwrap();
    let plain = "ot-no-delivery-limit";
    declare_durable_queue(&channel, plain, "quorum", FieldTable::default()).await;
    put(&env, plain).await;
    put(&env, DUE_QUEUE).await;

    let in_plain = return_repeatedly(&channel, plain, RETURNS).await;
    let in_due = return_repeatedly(&channel, DUE_QUEUE, RETURNS).await;
    eprintln!(
        "{broker:?}: a quorum queue without a delivery limit handed the message out {} times \
         (x-delivery-count {:?}); the due queue {} times (x-delivery-count {:?})",
        in_plain.len(),
        in_plain,
        in_due.len(),
        in_due
    );
    // The n-th return is counted on the next delivery (absent or 0 on the
    // first).
    let counted = |counts: &[Option<i64>]| {
        counts
            .iter()
            .enumerate()
            .all(|(n, c)| c.unwrap_or(0) == n as i64)
    };
    assert_eq!(in_due.len(), RETURNS + 1, "kept in the due queue");
    assert!(counted(&in_due), "{in_due:?}");
    assert!(counted(&in_plain), "{in_plain:?}");
    match broker {
        Broker::Rabbitmq3 => assert_eq!(in_plain.len(), RETURNS + 1, "3.x has no default limit"),
        Broker::Rabbitmq4 => assert_eq!(
            in_plain.len(),
            21,
            "4.x drops a message returned more often than its default limit of 20"
        ),
    }
}

on_both_brokers!(a_message_returned_25_times_is_kept_where_the_service_declared_the_limit);
