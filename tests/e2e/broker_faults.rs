//! Broker faults on private RabbitMQ nodes (never the machine's broker):
//! `kill -9` of a single node, graceful restarts (`stop_app`/`start_app`,
//! stop/start), and in a 3-node cluster the loss of the node the service is
//! connected to and of a node leading cascade queues. Each run schedules
//! hundreds of orders due before, during and after the outage and checks:
//! none lost, none early, stock exact, the latest order at most the outage
//! plus a few seconds late, and orders due after recovery on time.
//!
//! Each runs on both RabbitMQ versions ([`on_both_brokers!`]):
//! `rabbitmq3::…` on private nodes of the machine's RabbitMQ 3.10,
//! `rabbitmq4::…` on private nodes of RabbitMQ 4.x from the root of
//! `scripts/rabbitmq4.sh` (deprecated features denied, Khepri on).
//!
//! The figures are printed (`--nocapture`); docs/benchmarks-log.md "Broker
//! crashes" records them, with `order-timeout-tools crash-levers` (~10 min)
//! comparing the broker setting and the service's catch-up sweeps on the
//! issue's run.
//!
//! The run (workload, fault, figures) is the tools crate's
//! `measure::broker_fault::run`, which that command runs too: these tests
//! only check bounds on its figures.

use std::time::Duration;

use order_timeout::settings::{SecretUrl, Settings};
use order_timeout_tools::measure::broker_fault::{self, Fault, Figures, Plan, SKUS};
use order_timeout_tools::private_broker::{ClusterConfig, PrivateCluster};

use crate::common::{Broker, TestEnv, on_both_brokers};

/// Runs `plan` against `cluster` with a service built from `settings`
/// (whose AMQP_URL points at the cluster) on `env`'s shop, and measures;
/// `CRASH_DEBUG` set: the late orders listed too.
async fn run(env: &TestEnv, cluster: &PrivateCluster, settings: Settings, plan: Plan) -> Figures {
    crate::bounds::step(&format!("{}: every order cancelled", plan.label));
    let plan = Plan {
        list_late: std::env::var_os("CRASH_DEBUG").is_some(),
        ..plan
    };
    let shop = broker_fault::Shop {
        pool: &env.pool,
        inventory: &env.inventory,
    };
    broker_fault::run(shop, cluster, settings, &plan)
        .await
        .unwrap_or_else(|e| panic!("{}: {e:#}", plan.label))
}

/// The bounds, with a margin so a loaded CI machine does not flake:
/// nothing early, the latest order at most outage + 5 s late (+5 s margin),
/// orders due 5 s or more after recovery on time (p99 under 3 s in this
/// debug build on a shared 2-core machine: the catch-up sweeps' bound plus a
/// margin; the release figures are in docs/BENCHMARKS.md).
fn assert_bounds(f: &Figures) {
    eprintln!("{f}");
    assert_eq!(f.cancelled, f.orders as i64, "{f}");
    assert_eq!(f.early, 0, "never early: {f}");
    let bound = f.outage.as_secs_f64() * 1000.0 + 10_000.0;
    assert!(
        f.max_late_ms <= bound,
        "latest order within outage + 5 s: {f}"
    );
    assert!(f.after.0 > 0, "some orders were due after recovery: {f}");
    // When a level's dead-letter worker is still stuck (a race at restart,
    // likelier on a loaded machine), the catch-up sweeps cancel its orders:
    // at most catch_up_grace + catch_up_interval (2 s) late, plus the
    // sweep's own time.
    assert!(
        f.after.1 <= 3_000.0,
        "orders due after recovery on time: {f}"
    );
    assert!(
        f.reconnect <= Duration::from_secs(5),
        "consuming again promptly: {f}"
    );
}

fn on(cluster: &PrivateCluster, env: &TestEnv, first: usize) -> Settings {
    let mut settings = env.settings.clone();
    settings.amqp_url = SecretUrl::new(cluster.urls_from(first));
    settings
}

async fn a_single_broker_killed_and_restarted_gracefully_loses_nothing_and_catches_up(
    broker: Broker,
) {
    let env = TestEnv::new().await;
    env.stock_skus(SKUS).await;
    let cluster = PrivateCluster::start(broker.cluster(1)).await.unwrap();
    let settings = on(&cluster, &env, 1);
    // The run: 600 orders due over 3-30 s, kill -9, 8 s down.
    let kill = Plan::new("kill -9, 8 s down", "k-", 600, 30, Fault::Kill, 1, 8);
    assert_bounds(&run(&env, &cluster, settings.clone(), kill).await);
    let stop_app = Plan::new(
        "stop_app, 5 s, start_app",
        "a-",
        300,
        20,
        Fault::StopApp,
        1,
        5,
    );
    assert_bounds(&run(&env, &cluster, settings.clone(), stop_app).await);
    let stop = Plan::new("stop, 5 s, start", "s-", 300, 20, Fault::Stop, 1, 5);
    assert_bounds(&run(&env, &cluster, settings, stop).await);
    env.assert_stock_exact(SKUS).await;
}

/// A 3-node cluster with quorum queue leaders spread over the nodes (what
/// `deploy/rabbitmq/cluster.conf` sets): the service lists all three.
async fn in_a_cluster_losing_the_connected_node_or_a_leader_node_loses_nothing(broker: Broker) {
    let env = TestEnv::new().await;
    env.stock_skus(SKUS).await;
    let cluster = PrivateCluster::start(ClusterConfig {
        extra_conf: Some(include_str!("../../deploy/rabbitmq/cluster.conf").into()),
        ..broker.cluster(3)
    })
    .await
    .unwrap();
    let settings = on(&cluster, &env, 1);
    // The service connects to node 1, the first listed.
    let connected = Plan::new(
        "cluster: kill -9 of the connected node, 8 s down",
        "n1-",
        400,
        25,
        Fault::Kill,
        1,
        8,
    );
    assert_bounds(&run(&env, &cluster, settings.clone(), connected).await);
    // Node 3 leads a third of the queues; the service stays on node 1.
    let leader = Plan::new(
        "cluster: kill -9 of another node leading queues, 8 s down",
        "n3-",
        400,
        25,
        Fault::Kill,
        3,
        8,
    );
    assert_bounds(&run(&env, &cluster, settings, leader).await);
    env.assert_stock_exact(SKUS).await;
}

on_both_brokers!(
    a_single_broker_killed_and_restarted_gracefully_loses_nothing_and_catches_up,
    in_a_cluster_losing_the_connected_node_or_a_leader_node_loses_nothing,
);
