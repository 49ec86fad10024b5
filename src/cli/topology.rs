//! `order-timeout topology check`: argument parsing and printing around
//! [`crate::ops::topology_check`].

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::connect;
use crate::broker::topology::{BindingDestination, DELIVERY_LIMIT_FIX, Layout};
use crate::ops::leftovers;
use crate::ops::topology_check::{self, Status};
use crate::settings::{QueueType, Settings};

/// `order-timeout topology …`.
#[derive(Debug, Subcommand)]
pub enum TopologyCommand {
    /// Compare the broker's exchanges and queues with what the service
    /// declares, and list the queues earlier layouts left (with what they
    /// hold); exit 0 when everything declared matches, 1 otherwise. Creates
    /// nothing.
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
    let layout = Layout::of(&settings);
    let report = topology_check::check(&conn, &layout).await;
    let leftovers = match &report {
        Ok(_) => Some(leftovers::find(&conn, &layout).await),
        Err(_) => None,
    };
    crate::broker::close_quietly(&conn).await;
    let report = report?;
    let vhost = vhost_of(&settings);
    println!(
        "topology check: vhost {vhost:?}, queue type {}, {} cascade shard(s)",
        match report.queue_type {
            QueueType::Quorum => "quorum",
            QueueType::Classic => "classic",
        },
        report.shards
    );
    for object in &report.objects {
        if let Some(line) = object_line(object, &vhost, args.verbose) {
            println!("{line}");
        }
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
    // Informational: leftovers are delivered where they are, so they do
    // not make the check fail.
    if let Some(leftovers) = leftovers {
        for line in leftovers::lines(&leftovers?, &layout) {
            println!("{line}");
        }
    }
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

/// The vhost an `AMQP_URL` names (its path, percent-decoded), for display.
fn vhost_of(settings: &Settings) -> String {
    // The first node's vhost (every node of a list serves the same one).
    let first_node = settings.amqp_url.expose().split(',').next().unwrap_or("");
    url::Url::parse(first_node.trim())
        .ok()
        .map(|u| {
            let path = u.path().trim_start_matches('/').to_owned();
            if path.is_empty() {
                "/".to_owned()
            } else {
                percent_encoding::percent_decode_str(&path)
                    .decode_utf8_lossy()
                    .into_owned()
            }
        })
        .unwrap_or_else(|| "?".into())
}

/// The line printed for one checked object (`None`: a match, shown only
/// with `--verbose`).
fn object_line(
    object: &topology_check::ObjectReport,
    vhost: &str,
    verbose: bool,
) -> Option<String> {
    Some(match &object.status {
        Status::Ok if verbose => format!("ok       {} {}", object.kind, object.name),
        Status::Ok => return None,
        Status::Missing => format!("MISSING  {} {}", object.kind, object.name),
        Status::Differs(why) if why.contains("'x-delivery-limit'") => format!(
            "DIFFERS  {} {}: {why}\n         {}",
            object.kind,
            object.name,
            DELIVERY_LIMIT_FIX.replace("VHOST", &shell_word(vhost))
        ),
        Status::Differs(why) => format!("DIFFERS  {} {}: {why}", object.kind, object.name),
        Status::Unchecked(why) => format!("UNCHECKED {} {}: {why}", object.kind, object.name),
    })
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
