//! `order-timeout topology check`: argument parsing and printing around
//! [`crate::ops::topology_check`].

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::connect;
use crate::broker::topology::{BindingDestination, DELIVERY_LIMIT_FIX, Layout};
use crate::ops::leftovers;
use crate::ops::topology_check::{self, Status};
use crate::ops::topology_fds;
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
    /// The broker's open-file limit (`ulimit -n` of its process), when the
    /// check cannot read it itself: it reads it from /proc only for a
    /// broker on this host, as root or the broker's user.
    #[arg(long, value_name = "N")]
    pub broker_fd_limit: Option<u64>,
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
    if args.verbose {
        print_broken_bindings(&report);
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
    // Informational: leftovers are delivered where they are, and the
    // file descriptors are a warning, so neither makes the check fail.
    let mut lines = fd_lines(&settings, &layout, args.broker_fd_limit);
    // Nor does failing to look for leftovers (the connection lost half
    // way): the verdict on the topology still follows, with the reason.
    if let Some(found) = &leftovers {
        lines.extend(leftovers::lines_or_reason(found, &layout));
    }
    for line in lines {
        println!("{line}");
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

/// Each binding with a missing end (`--verbose`).
fn print_broken_bindings(report: &topology_check::TopologyReport) {
    for binding in report.broken_bindings() {
        let destination = match &binding.spec.destination {
            BindingDestination::Queue(q) => format!("queue {q}"),
            BindingDestination::Exchange(e) => format!("exchange {e}"),
        };
        println!(
            "BROKEN   binding {} -> {destination} ({:?}): an end is missing",
            binding.spec.source, binding.spec.routing_key
        );
    }
}

/// What the layout needs of the broker's file descriptors, what the broker
/// allows (`--broker-fd-limit`, else read from /proc for a broker on this
/// host) and a warning when it allows too few. Informational: the exit
/// code stays the objects'.
fn fd_lines(settings: &Settings, layout: &Layout, given: Option<u64>) -> Vec<String> {
    let need = topology_fds::need(layout, 1);
    let allowance = match given {
        Some(limit) => Some(topology_fds::Allowance {
            limit,
            source: "given with --broker-fd-limit".into(),
        }),
        None => local_port(settings).and_then(topology_fds::local_broker),
    };
    topology_fds::lines(&need, allowance.as_ref())
}

/// The AMQP port of the first node, when it is on this host (a loopback
/// name or address).
fn local_port(settings: &Settings) -> Option<u16> {
    let first_node = settings.amqp_url.expose().split(',').next()?.trim();
    let url = url::Url::parse(first_node).ok()?;
    let local = match url.host()? {
        // `amqp` is no special scheme to the URL parser: its IP literals
        // come as names.
        url::Host::Domain(name) => {
            name == "localhost"
                || name
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    };
    let default = if url.scheme() == "amqps" { 5671 } else { 5672 };
    local.then(|| url.port().unwrap_or(default))
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
