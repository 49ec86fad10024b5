//! `topology check`: OK on the service's layout, then every difference a
//! broken one has; a parked queue from before the delivery limit; the
//! broker's file limit against what the layout needs.

use super::*;
use order_timeout::testing::topology::{
    DUE_QUEUE, Layout, PARKED_QUEUE, READY_EXCHANGE, exchange_specs, queue_specs,
};

/// Level 3 re-created as a classic queue with another TTL, level 5 and
/// shard 1's level 2 deleted, the ready exchange re-created as direct.
/// Returns shard 1's level 2 queue name.
async fn break_the_topology(env: &TestEnv) -> String {
    let channel = env.amqp.create_channel().await.unwrap();
    delete_queue(&channel, &level_name(3)).await;
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(1234));
    declare_durable_queue(&channel, &level_name(3), "classic", args).await;
    delete_queue(&channel, &level_name(5)).await;
    let shard_queue = order_timeout::testing::topology::shard_level_name(1, 2);
    delete_queue(&channel, &shard_queue).await;
    channel
        .exchange_delete(READY_EXCHANGE.into(), Default::default())
        .await
        .unwrap();
    channel
        .exchange_declare(
            READY_EXCHANGE.into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    shard_queue
}

pub(super) async fn topology_check_reports_ok_and_then_every_difference(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    let layout = order_timeout::testing::topology::Layout::of(&env.settings);
    assert!(
        layout.shards.get() > 1,
        "the default layout has cascade shards"
    );
    let expected = exchange_specs(&layout).len() + queue_specs(&layout).len();
    let out = env.cli(&["topology", "check"]).await;
    assert_success(&out);
    assert!(
        out.stdout.contains(&format!("{expected} of {expected}")),
        "{}",
        out.stdout
    );
    assert!(out.stdout.trim_end().ends_with("OK"), "{}", out.stdout);

    let shard_queue = break_the_topology(&env).await;

    let out = env.cli(&["topology", "check"]).await;
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    let line = |prefix: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{}", out.stdout))
            .to_owned()
    };
    let level3 = line(&format!("DIFFERS  queue {}", level_name(3)));
    assert!(
        level3.contains("PRECONDITION_FAILED") && level3.contains("inequivalent arg"),
        "{level3}"
    );
    line(&format!("MISSING  queue {}", level_name(5)));
    line(&format!("MISSING  queue {shard_queue}"));
    let ready = line(&format!("DIFFERS  exchange {}", READY_EXCHANGE));
    assert!(ready.contains("'type'"), "{ready}");
    assert!(
        out.stdout
            .contains(&format!("{} of {expected}", expected - 4)),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("MISMATCH"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );

    // The check created nothing: level 5 is still missing.
    let probe = env.amqp.create_channel().await.unwrap();
    let missing = probe
        .queue_declare(
            level_name(5).as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    assert!(missing.is_err(), "topology check must not create queues");
}

pub(super) async fn a_parked_queue_from_before_the_delivery_limit_is_used_and_the_check_names_the_fix(
    dialect: Dialect,
) {
    let env = TestEnv::on(dialect).await;
    // As a version without the delivery limit declared it.
    let channel = env.amqp.create_channel().await.unwrap();
    delete_queue(&channel, PARKED_QUEUE).await;
    declare_durable_queue(&channel, PARKED_QUEUE, "quorum", FieldTable::default()).await;

    // The service starts on it (a warning, not a refusal) and parks into it.
    let service = env.service().await;
    publish_for_unknown(&env, "no-such-order").await;
    wait_parked(&env, &service, 1).await;
    service.stop().await.unwrap();

    let out = env.cli(&["topology", "check"]).await;
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    let parked = out
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with(&format!("DIFFERS  queue {}", PARKED_QUEUE)))
        .take(2)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        parked.contains("'x-delivery-limit'") && parked.contains("current is none"),
        "{}",
        out.stdout
    );
    assert!(
        parked.contains("rabbitmqctl set_policy -p ")
            && parked.contains(r#""delivery-limit": 1000000"#),
        "the check names the fix: {parked}"
    );
    // Every other queue, the due queue included, has the limit.
    assert!(
        !out.stdout.contains(&format!("queue {}:", DUE_QUEUE)),
        "{}",
        out.stdout
    );
}

/// `topology check` says what the layout needs of the broker's file handles
/// and what the broker allows: its limit read from the broker process on
/// this host (cross-checked with `rabbitmqctl status`, whose limit is the
/// one RabbitMQ enforces), a warning with the numbers and the fix when the
/// limit is too low for the layout or for a layout change (given with
/// `--broker-fd-limit`), and the exit code stays the topology's.
pub(super) async fn topology_check_warns_when_the_brokers_file_limit_is_too_low(dialect: Dialect) {
    use order_timeout::ops::topology_fds::{self, Allowance};
    let env = TestEnv::on(dialect).await;
    let layout = Layout::of(&env.settings);
    let need = topology_fds::need(&layout, 1);
    let queues = queue_specs(&layout).len() as u64;
    assert_eq!(need.for_queues, 3 * queues, "quorum queues, 3 handles each");

    let out = env.cli(&["topology", "check"]).await;
    assert_success(&out);
    assert!(
        out.stdout.contains(&format!(
            "file descriptors: this layout's {queues} queues take ~{} of the broker's file handles",
            3 * queues
        )),
        "{}",
        out.stdout
    );
    // The broker's own figure: `Total: N, limit: L` under File Descriptors.
    let status = env.rabbitmqctl(&["status"]);
    let usable: u64 = status
        .lines()
        .find_map(|l| l.trim().strip_prefix("Total: ")?.split("limit: ").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("a file descriptor limit in:\n{status}"));
    let limit = usable + topology_fds::BROKER_RESERVE;
    assert!(
        out.stdout.contains(&format!(
            "broker open-file limit {limit} ({usable} usable by RabbitMQ; read from /proc/"
        )),
        "the limit as the broker counts it ({usable} in rabbitmqctl status):\n{}",
        out.stdout
    );
    let here = Allowance {
        limit,
        source: String::new(),
    };
    assert_eq!(
        out.stdout.contains("WARNING"),
        topology_fds::warning(&need, &here).is_some(),
        "{}",
        out.stdout
    );

    // Too low for the layout, and for a change of it: each says its numbers.
    let usable_for = |limit: u64| limit - topology_fds::BROKER_RESERVE;
    let too_low = need.total + topology_fds::BROKER_RESERVE - 1;
    let for_a_change = need.during_a_change + topology_fds::BROKER_RESERVE - 1;
    for (limit, says) in [
        (
            too_low,
            format!("needs ~{} file handles on the broker,", need.total),
        ),
        (
            for_a_change,
            format!(
                "needs ~{} file handles on the broker while a layout change keeps its old queues",
                need.during_a_change
            ),
        ),
    ] {
        let out = env
            .cli(&["topology", "check", "--broker-fd-limit", &limit.to_string()])
            .await;
        assert_success(&out);
        let warning = out
            .stdout
            .lines()
            .find(|l| l.starts_with("WARNING"))
            .unwrap_or_else(|| panic!("--broker-fd-limit {limit}: no warning in\n{}", out.stdout));
        assert!(warning.contains(&says), "{warning}");
        assert!(
            warning.contains(&format!(
                "allows {} ({limit} open-file limit",
                usable_for(limit)
            )),
            "{warning}"
        );
        assert!(warning.contains("LimitNOFILE=65536"), "{warning}");
    }
    let enough = need.during_a_change + topology_fds::BROKER_RESERVE;
    let out = env
        .cli(&[
            "topology",
            "check",
            "--broker-fd-limit",
            &enough.to_string(),
        ])
        .await;
    assert!(!out.stdout.contains("WARNING"), "{}", out.stdout);
}
