//! `order-timeout topology check`: argument parsing and printing around
//! [`crate::ops::topology_check`].

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::connect;
use crate::broker::topology::{BindingDestination, DELIVERY_LIMIT_FIX, Layout};
use crate::ops::topology_check::{self, Status};
use crate::settings::{QueueType, Settings};

/// `order-timeout topology …`.
#[derive(Debug, Subcommand)]
pub enum TopologyCommand {
    /// Compare the broker's exchanges and queues with what the service
    /// declares; exit 0 when everything matches, 1 otherwise. Creates nothing.
    Check(CheckArgs),
}

/// Arguments of `topology check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Also list the objects that match, and each binding with a missing end.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}
/// Runs `topology …`.
pub(super) async fn run(settings: Settings, command: TopologyCommand) -> anyhow::Result<ExitCode> {
    let TopologyCommand::Check(args) = command;
    let conn = connect(&settings, "order-timeout-topology-check").await?;
    let report = topology_check::check(&conn, &Layout::of(&settings)).await;
    let _ = conn.close(200, "done".into()).await;
    let report = report?;
    let vhost = url::Url::parse(settings.amqp_url.expose())
        .ok()
        .map(|u| {
            let path = u.path().trim_start_matches('/').to_owned();
            if path.is_empty() {
                "/".to_owned()
            } else {
                percent_decode(&path)
            }
        })
        .unwrap_or_else(|| "?".into());
    println!(
        "topology check: vhost {vhost:?}, queue type {}, {} cascade shard(s)",
        match report.queue_type {
            QueueType::Quorum => "quorum",
            QueueType::Classic => "classic",
        },
        report.shards
    );
    for object in &report.objects {
        let line = match &object.status {
            Status::Ok if args.verbose => format!("ok       {} {}", object.kind, object.name),
            Status::Ok => continue,
            Status::Missing => format!("MISSING  {} {}", object.kind, object.name),
            Status::Differs(why) if why.contains("'x-delivery-limit'") => format!(
                "DIFFERS  {} {}: {why}\n         {}",
                object.kind,
                object.name,
                DELIVERY_LIMIT_FIX.replace("VHOST", &shell_word(&vhost))
            ),
            Status::Differs(why) => format!("DIFFERS  {} {}: {why}", object.kind, object.name),
            Status::Unchecked(why) => {
                format!("UNCHECKED {} {}: {why}", object.kind, object.name)
            }
        };
        println!("{line}");
    }
    for binding in report.broken_bindings().filter(|_| args.verbose) {
        let destination = match &binding.spec.destination {
            BindingDestination::Queue(q) => format!("queue {q}"),
            BindingDestination::Exchange(e) => format!("exchange {e}"),
        };
        println!(
            "BROKEN   binding {} -> {destination} ({:?}): an end is missing",
            binding.spec.source, binding.spec.routing_key
        );
    }
    let problems = report.problems().count();
    let broken = report.broken_bindings().count();
    println!(
        "{} of {} exchanges and queues as expected; {} bindings expected, {} with a missing end (bindings themselves cannot be listed over AMQP: see `rabbitmqctl list_bindings -p {vhost}`)",
        report.objects.len() - problems,
        report.objects.len(),
        report.bindings.len(),
        broken,
    );
    if report.is_ok() {
        println!("OK");
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "MISMATCH: `order-timeout serve` declares what is missing; differing objects must be deleted (after draining) and re-declared"
        );
        Ok(ExitCode::from(1))
    }
}

/// `word` as one shell word (quoted unless it is plainly safe).
fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Decodes `%2f`-style escapes in a vhost name (invalid escapes are kept).
fn percent_decode(s: &str) -> String {
    let hex = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| Some(hex(*bytes.get(i + 1)?)? << 4 | hex(*bytes.get(i + 2)?)?))
            .flatten();
        match escaped {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
