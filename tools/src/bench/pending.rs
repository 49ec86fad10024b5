//! `bench --pending N`: fill N orders with long timeouts as fast as
//! confirms allow, wait until the service has moved them all into the
//! cascade, and measure the broker's memory and disk and the service's
//! memory while they wait.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use lapin::Connection;

use super::env::{self, BenchEnv};
use super::report::PendingReport;
use super::sys::{self, Sampling};
use super::{BenchArgs, BenchError, load, loadavg};
use order_timeout::testing::topology::{DUE_QUEUE, Layout, queue_specs};

/// Fills `n` orders and measures them pending; CPU and memory come from
/// `sampling` (reset here).
pub(super) async fn measure(
    env: &BenchEnv,
    args: &BenchArgs,
    n: u64,
    declare_seconds: f64,
    sampling: &Sampling,
) -> Result<PendingReport, BenchError> {
    sampling.reset();
    let mut p = PendingReport {
        orders: n,
        timeouts: args.chosen.timeouts.to_string(),
        declare_seconds,
        loadavg: (loadavg(), String::new()),
        ..Default::default()
    };
    let (mem0, data_dir) = broker_status();
    let disk0 = data_dir.as_deref().and_then(sys::disk_usage);
    let conn = order_timeout::testing::broker::connect_amqp(
        &env.settings.amqp_url,
        "order-timeout-bench-fill",
    )
    .await?;
    let started = Instant::now();
    let errors = fill(env, args, n, &conn, &mut p).await?;
    let depth_channel = conn.create_channel().await?;
    let layout = Layout::of(&env.settings);
    wait_in_cascade(&depth_channel, &layout, n, errors, &mut p).await?;
    p.fill_seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "== filled in {:.1} s; watching memory for 15 s",
        p.fill_seconds
    );
    tokio::time::sleep(Duration::from_secs(15)).await;
    p.queue_messages = queue_counts(&depth_channel, &layout)
        .await?
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .collect();
    p.queue_memory_mib = list_queues(&env.name).map(|(_, mem)| mem);
    let (mem1, _) = broker_status();
    p.broker_memory_mib = (mem0, mem1);
    let disk1 = data_dir.as_deref().and_then(sys::disk_usage);
    let mib = |b: Option<u64>| b.map(|b| b as f64 / 1048576.0);
    p.broker_disk_mib = (mib(disk0), mib(disk1));
    p.loadavg.1 = loadavg();
    let _ = conn.close(200, "done".into()).await;
    sampling.with(|s| {
        s.sample();
        p.resources = s.usage();
        p.service_memory = s.series("service");
        p.broker_memory = s.series("broker");
    });
    Ok(p)
}

fn bar(n: u64, template: &str) -> Result<ProgressBar, BenchError> {
    Ok(ProgressBar::new(n).with_style(
        ProgressStyle::with_template(template).map_err(|e| BenchError::Setup(e.to_string()))?,
    ))
}

/// Inserts and publishes the `n` orders; returns how many failed.
async fn fill(
    env: &BenchEnv,
    args: &BenchArgs,
    n: u64,
    conn: &Connection,
    p: &mut PendingReport,
) -> Result<u64, BenchError> {
    let channels = super::amqp::confirm_channels(conn, args.publish_channels).await?;
    eprintln!("== filling {n} orders, timeouts {}", args.chosen.timeouts);
    let bar = bar(
        n,
        "{spinner} filling [{elapsed_precise}] {bar:30} {pos}/{len} published ({per_sec}) {msg}",
    )?;
    let started = Instant::now();
    let errors = load::fill(&env.db, &channels, &args.chosen.timeouts, n, &bar).await?;
    p.publish_seconds = started.elapsed().as_secs_f64();
    bar.finish();
    if errors > 0 {
        p.failures
            .push(format!("{errors} orders failed to be created/published"));
    }
    Ok(errors)
}

/// Waits until the service has moved every message from the due queue
/// into the cascade (or gives up, saying so in `p.failures`).
async fn wait_in_cascade(
    channel: &lapin::Channel,
    layout: &Layout,
    n: u64,
    errors: u64,
    p: &mut PendingReport,
) -> Result<(), BenchError> {
    let wait_bar = bar(
        n,
        "{spinner} into the cascade [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
    )?;
    let give_up = Instant::now() + Duration::from_secs(600.max(n / 300));
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let q = queue_counts(channel, layout).await?;
        let due = q.get(DUE_QUEUE).copied().unwrap_or(0);
        let in_cascade: u64 = q
            .iter()
            .filter(|(k, _)| k.starts_with("order-timeout.delay."))
            .map(|(_, v)| v)
            .sum();
        wait_bar.set_position(in_cascade);
        wait_bar.set_message(format!("due queue {due}"));
        if due == 0 && in_cascade >= n - errors {
            break;
        }
        if Instant::now() > give_up {
            p.failures.push(format!(
                "gave up waiting: {in_cascade} of {n} in the cascade, {due} in the due queue"
            ));
            break;
        }
    }
    wait_bar.finish();
    Ok(())
}

/// The broker's memory (MiB) and data directory (`rabbitmqctl status`),
/// if it says.
fn broker_status() -> (Option<f64>, Option<String>) {
    let Some(text) = env::rabbitmqctl_opt(&["status", "--formatter", "json"]) else {
        return (None, None);
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return (None, None);
    };
    let mem = v["memory"]["total"]["rss"]
        .as_f64()
        .or_else(|| v["memory"]["total"]["erlang"].as_f64())
        .map(|b| b / 1048576.0);
    let dir = v["data_directory"].as_str().map(str::to_owned);
    (mem, dir)
}

/// Ready messages in the service's queues (passive declares: cheap,
/// unlike a `rabbitmqctl` call, which costs the broker's host a second of
/// CPU).
async fn queue_counts(
    channel: &lapin::Channel,
    layout: &Layout,
) -> Result<BTreeMap<String, u64>, BenchError> {
    let mut out = BTreeMap::new();
    for spec in queue_specs(layout) {
        let q = channel
            .queue_declare(
                spec.name.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await?;
        out.insert(spec.name, u64::from(q.message_count()));
    }
    Ok(out)
}

/// Messages per queue and the queues' total memory (MiB) in `vhost`.
fn list_queues(vhost: &str) -> Option<(BTreeMap<String, u64>, f64)> {
    let text = env::rabbitmqctl_opt(&[
        "list_queues",
        "-p",
        vhost,
        "name",
        "messages",
        "memory",
        "--formatter",
        "json",
    ])?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let mut out = BTreeMap::new();
    let mut mem = 0.0;
    for q in v.as_array()? {
        let name = q["name"].as_str()?.to_owned();
        out.insert(name, q["messages"].as_u64().unwrap_or(0));
        mem += q["memory"].as_f64().unwrap_or(0.0);
    }
    Some((out, mem / 1048576.0))
}
