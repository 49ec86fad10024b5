//! The RabbitMQ 4.x test node is what the `rabbitmq4::` tests of the other
//! suites claim it is: RabbitMQ 4 (the machine's broker 3.x, so the two
//! sets really run on different versions), every deprecated feature it
//! lists denied (by configuration, and in effect: a transient non-exclusive
//! queue is refused), and Khepri on. A root with a newer 4.x that
//! deprecates one more feature fails here until `scripts/rabbitmq4.sh`
//! denies it too.

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use crate::common::{Broker, TestEnv};

/// The broker's own version (`rabbit_misc:version()`, e.g. `4.0.5`).
fn version(broker: Broker) -> String {
    let out = broker
        .rabbitmqctl(&["eval", "rabbit_misc:version()."])
        .unwrap_or_else(|e| panic!("{broker:?}: {e}"));
    out.trim().trim_matches('"').to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_4x_node_denies_every_deprecated_feature_and_runs_khepri() {
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
    for (feature, phase) in &features {
        if *phase == "removed" {
            continue;
        }
        let permitted = broker
            .rabbitmqctl(&[
                "eval",
                &format!("rabbit_deprecated_features:is_permitted({feature})."),
            ])
            .unwrap();
        // The last line: evaluating it logs the deprecation first.
        assert_eq!(
            permitted.lines().last().map(str::trim),
            Some("false"),
            "deprecated feature {feature} ({phase}) is permitted: scripts/rabbitmq4.sh must deny it"
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
