//! `order-timeout-tools crash-levers`: both levers against a broker crash,
//! measured on issue 12's run. Per run (`--levers`, one after the other):
//! a fresh [`World`], a private single RabbitMQ node
//! ([`crate::private_broker`], never the machine's broker) with the shipped
//! `deploy/rabbitmq/advanced.config` and the dead-letter retry
//! (`dead_letter_worker_publisher_confirm_timeout`) left at RabbitMQ's
//! default of 180 s or set lower, and the service's catch-up sweeps on
//! (shipped) or off. 600 orders due evenly over 3–30 s, the node `kill -9`ed
//! 2 s in and started again 8 s after the kill; once the service consumes
//! again, 40 more orders due 6–10 s later. Every order is waited for (at
//! most 270 s); then the figures, from the orders' rows: lost, early, the
//! outage, how soon the service consumed again, the latest order, and the
//! lateness of the orders due during or just after the outage and of those
//! due 5 s or more after the node was back. About 2 minutes a run.
//!
//! The run is [`super::broker_fault::run`]; `tests/e2e/broker_faults.rs`
//! runs it too (this plan among others) and checks bounds on its figures;
//! docs/benchmarks-log.md "Broker crashes" records the figures.

use std::process::ExitCode;
use std::time::Duration;

use order_timeout::settings::SecretUrl;

use super::World;
use super::broker_fault::{Fault, Figures, Plan, SKUS};
use crate::private_broker::{ClusterConfig, PrivateCluster};

/// One run's levers: `RETRY:CATCH_UP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lever {
    /// The dead-letter retry, ms (`None`: RabbitMQ's default, 180 s, as
    /// shipped).
    pub retry_ms: Option<u64>,
    /// The service's catch-up sweeps (`[sweeper] catch_up_window`: the
    /// default, or 0).
    pub catch_up: bool,
}

impl Lever {
    fn label(&self) -> String {
        format!(
            "dead-letter retry {}, {}",
            self.retry_ms
                .map_or("180 s (default)".into(), |ms| format!("{ms} ms")),
            if self.catch_up {
                "catch-up sweeps"
            } else {
                "no catch-up"
            }
        )
    }
}

/// Parses `RETRY:CATCH_UP` (`none:off`, `2000:on`).
fn parse_lever(s: &str) -> Result<Lever, String> {
    let (retry, catch_up) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected RETRY:on|off (e.g. none:off, 2000:on)"))?;
    let retry_ms = match retry {
        "none" => None,
        ms => Some(
            ms.parse()
                .map_err(|_| format!("{retry:?}: a retry in ms, or none"))?,
        ),
    };
    let catch_up = match catch_up {
        "on" => true,
        "off" => false,
        other => return Err(format!("{other:?}: catch-up sweeps on or off")),
    };
    Ok(Lever { retry_ms, catch_up })
}

/// `crash-levers`' arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct CrashLeversArgs {
    /// The runs, in order: each `RETRY:CATCH_UP`, the dead-letter retry in
    /// ms (`none`: RabbitMQ's default of 180 s, as shipped) and the
    /// service's catch-up sweeps `on` (as shipped) or `off`.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_lever,
        default_value = "none:off,none:on,2000:off,2000:on,10000:on"
    )]
    pub levers: Vec<Lever>,
    /// Also list the orders due 5 s or more after recovery that were
    /// cancelled more than 100 ms late.
    #[arg(long)]
    pub list_late: bool,
}

/// Runs `crash-levers` (the command): each run's figures as it ends, then
/// all of them together.
pub async fn command(args: CrashLeversArgs) -> anyhow::Result<ExitCode> {
    let mut table = Vec::new();
    for lever in &args.levers {
        let figures = one(*lever, args.list_late).await?;
        println!("{figures}");
        table.push(figures.to_string());
    }
    println!("\n{}", table.join("\n"));
    Ok(ExitCode::SUCCESS)
}

/// One run (module docs) with `lever`.
async fn one(lever: Lever, list_late: bool) -> anyhow::Result<Figures> {
    let world = World::build(false).await?;
    world.stock_skus(SKUS).await?;
    let cluster = PrivateCluster::start(ClusterConfig {
        advanced_config: Some(advanced_config(lever.retry_ms)?),
        ..ClusterConfig::nodes(1)
    })
    .await?;
    let mut settings = world.settings.clone();
    settings.amqp_url = SecretUrl::new(cluster.urls_from(1));
    if !lever.catch_up {
        settings.sweeper.catch_up_window = Duration::ZERO;
    }
    // Issue 12's run: 600 orders due evenly over 3-30 s, the only node
    // `kill -9`ed 2 s in, for 8 s.
    let plan = Plan {
        list_late,
        ..Plan::new(lever.label(), "k-", 600, 30, Fault::Kill, 1, 8)
    };
    super::broker_fault::run(world.shop(), &cluster, settings, &plan).await
}

/// `deploy/rabbitmq/advanced.config`, plus the dead-letter retry set to
/// `retry_ms` (`None`: as shipped, RabbitMQ's default of 180 s).
fn advanced_config(retry_ms: Option<u64>) -> anyhow::Result<String> {
    let shipped = include_str!("../../../deploy/rabbitmq/advanced.config");
    let prefetch = "{dead_letter_worker_consumer_prefetch, 512}";
    anyhow::ensure!(
        shipped.contains(prefetch),
        "deploy/rabbitmq/advanced.config no longer sets {prefetch}"
    );
    Ok(match retry_ms {
        Some(ms) => shipped.replace(
            prefetch,
            &format!("{prefetch},\n    {{dead_letter_worker_publisher_confirm_timeout, {ms}}}"),
        ),
        None => shipped.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levers_parse_as_the_test_took_them() {
        assert_eq!(
            parse_lever("none:off"),
            Ok(Lever {
                retry_ms: None,
                catch_up: false
            })
        );
        assert_eq!(
            parse_lever("2000:on"),
            Ok(Lever {
                retry_ms: Some(2000),
                catch_up: true
            })
        );
        assert!(parse_lever("2000").is_err());
        assert!(parse_lever("soon:on").is_err());
        assert!(parse_lever("none:maybe").is_err());
    }

    #[test]
    fn the_retry_goes_beside_the_shipped_window() {
        let shipped = advanced_config(None).unwrap();
        assert!(!shipped.contains("{dead_letter_worker_publisher_confirm_timeout,"));
        let set = advanced_config(Some(2000)).unwrap();
        assert!(set.contains("{dead_letter_worker_publisher_confirm_timeout, 2000}"));
    }
}
