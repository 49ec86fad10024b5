//! **The broker's file descriptors** in `order-timeout topology check`:
//! what the configured layout needs of them, what the broker allows, and a
//! warning with the fix when it allows too few.
//!
//! What a queue and a connection cost was measured on RabbitMQ 3.10.8
//! (docs/limits.md#file-descriptors: the broker's `/proc/<pid>/fd` counted
//! before and after a layout was declared in a fresh vhost, and with the
//! service connected): [`need`] turns a layout into descriptors with those
//! figures.
//!
//! What the broker allows cannot be asked over AMQP 0-9-1, and the service
//! needs no management plugin (whose `/api/nodes` has `fd_total` and
//! `fd_used`), so the check reads it where it can ([`Allowance`]): given
//! on the command line (`--broker-fd-limit N`, the broker's `ulimit -n`), or
//! read from the broker's process when it runs on the same host and the
//! check may read `/proc/<pid>/limits` (the process listening on the AMQP
//! port: root, or the broker's own user). Otherwise the check prints what
//! the layout needs and how to read the limit, and warns about nothing.

use std::path::Path;

use crate::broker::topology::{Layout, queue_specs};
use crate::settings::QueueType;

/// File handles RabbitMQ counts for one quorum queue, idle or not: it
/// reserves them when the queue starts (measured on RabbitMQ 3.10.8: 115
/// queues, 345 more in `rabbitmqctl status`'s File Descriptors Total; the
/// OS's `/proc/<pid>/fd` of the broker moved by none).
pub const PER_QUORUM_QUEUE: u64 = 3;
/// File handles RabbitMQ counts for one idle classic queue (measured: 116
/// classic queues, 1 more in all; a classic queue opens files only when it
/// pages messages to disk).
pub const PER_CLASSIC_QUEUE: u64 = 0;
/// File handles one AMQP connection takes (its socket; measured).
pub const PER_CONNECTION: u64 = 1;
/// Connections one `serve` replica opens (measured: consuming and
/// publishing).
pub const CONNECTIONS_PER_REPLICA: u64 = 2;
/// What RabbitMQ keeps for itself below the open-file limit: 3.10.8 under
/// a limit of 1,024 counts up to 927 handles (`rabbitmqctl status`).
pub const BROKER_RESERVE: u64 = 97;

/// What a layout needs of the handles RabbitMQ counts against its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    /// The layout's queues.
    pub queues: u64,
    /// Handles they take.
    pub for_queues: u64,
    /// Handles the connections of the replicas take.
    pub for_connections: u64,
    /// The layout's total.
    pub total: u64,
    /// The total while a layout change keeps the old layout's queues beside
    /// the new ones (served where they are until empty): twice the queues.
    pub during_a_change: u64,
}

/// What `layout` needs with `replicas` replicas of the service connected.
pub fn need(layout: &Layout, replicas: u64) -> Need {
    let queues = u64::try_from(queue_specs(layout).len()).unwrap_or(u64::MAX);
    let per_queue = match layout.queue_type {
        QueueType::Quorum => PER_QUORUM_QUEUE,
        QueueType::Classic => PER_CLASSIC_QUEUE,
    };
    let for_queues = queues * per_queue;
    let for_connections = replicas * CONNECTIONS_PER_REPLICA * PER_CONNECTION;
    Need {
        queues,
        for_queues,
        for_connections,
        total: for_queues + for_connections,
        during_a_change: 2 * for_queues + for_connections,
    }
}

/// What the broker allows, and where the figure comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowance {
    /// The broker process's open-file limit (`ulimit -n`, soft).
    pub limit: u64,
    /// Where the figure comes from, for the report.
    pub source: String,
}

impl Allowance {
    /// What RabbitMQ lets queues and connections take of the limit.
    pub fn usable(&self) -> u64 {
        self.limit.saturating_sub(BROKER_RESERVE)
    }
}

/// The warning for `need` under `allowance`, if the broker allows too few
/// for the layout, or for the layout through a change (its old queues kept
/// beside the new ones). Other vhosts on the broker count against the same
/// limit: the warning says how to see what they take.
pub fn warning(need: &Need, allowance: &Allowance) -> Option<String> {
    let usable = allowance.usable();
    let short = if need.total > usable {
        format!(
            "this layout needs ~{} file handles on the broker",
            need.total
        )
    } else if need.during_a_change > usable {
        format!(
            "this layout needs ~{} file handles on the broker while a layout change keeps its old queues",
            need.during_a_change
        )
    } else {
        return None;
    };
    Some(format!(
        "WARNING  {short}, which allows {usable} ({} open-file limit, less {BROKER_RESERVE} RabbitMQ keeps; other vhosts take their share: `rabbitmqctl status`, File Descriptors). When they run out, declaring queues and opening connections hang. Raise the broker's limit to 65536: systemd `systemctl edit rabbitmq-server` with `[Service]` `LimitNOFILE=65536`, then restart it; a container `--ulimit nofile=65536:65536` (compose: `ulimits: nofile: 65536`); docs/limits.md#file-descriptors",
        allowance.limit
    ))
}

/// The report's lines: what the layout needs, what the broker allows (or
/// how to find out), and the warning when it allows too few.
pub fn lines(need: &Need, allowance: Option<&Allowance>) -> Vec<String> {
    let mut lines = vec![format!(
        "file descriptors: this layout's {} queues take ~{} of the broker's file handles, each replica {} more; ~{} while a layout change keeps the old queues",
        need.queues,
        need.for_queues,
        PER_CONNECTION * CONNECTIONS_PER_REPLICA,
        need.during_a_change
    )];
    match allowance {
        Some(a) => {
            lines.push(format!(
                "broker open-file limit {} ({} usable by RabbitMQ; {})",
                a.limit,
                a.usable(),
                a.source
            ));
            lines.extend(warning(need, a));
        }
        None => lines.push(
            "broker open-file limit: not known here (the broker runs on another host, or its process cannot be read): \
             `rabbitmq-diagnostics status` on the broker shows it (File Descriptors), or pass --broker-fd-limit N"
                .into(),
        ),
    }
    lines
}

/// The open-file limit of the process listening on TCP `port` on this
/// host, read from `/proc` (`None`: no such process visible, or not
/// readable by this user).
pub fn local_broker(port: u16) -> Option<Allowance> {
    let inodes = listening_inodes(Path::new("/proc/net"), port);
    if inodes.is_empty() {
        return None;
    }
    let pid = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| holds_socket(*pid, &inodes))?;
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let limit = open_files_limit(&limits)?;
    Some(Allowance {
        limit,
        source: format!("read from /proc/{pid}, the process listening on port {port}"),
    })
}

/// The socket inodes listening on TCP `port` (IPv4 and IPv6), from
/// `/proc/net/tcp{,6}` under `net`.
fn listening_inodes(net: &Path, port: u16) -> Vec<String> {
    let mut inodes = Vec::new();
    for file in ["tcp", "tcp6"] {
        let Ok(table) = std::fs::read_to_string(net.join(file)) else {
            continue;
        };
        inodes.extend(listeners_on(&table, port));
    }
    inodes
}

/// The inodes of the sockets in LISTEN state (`0A`) on `port` in one
/// `/proc/net/tcp` table.
fn listeners_on(table: &str, port: u16) -> Vec<String> {
    let port = format!("{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = fields.get(1)?;
            let listening = *fields.get(3)? == "0A";
            let on_port = local.rsplit(':').next()? == port;
            (listening && on_port).then(|| fields.get(9).map(|s| (*s).to_owned()))?
        })
        .collect()
}

/// Whether process `pid` holds one of the sockets `inodes`.
fn holds_socket(pid: u32, inodes: &[String]) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok).any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            let target = target.to_string_lossy();
            inodes
                .iter()
                .any(|inode| target == format!("socket:[{inode}]"))
        })
    })
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text.
fn open_files_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Shards;

    fn layout(shards: u32) -> Layout {
        Layout::cascade(QueueType::Quorum, Shards::try_from(shards).unwrap())
    }

    #[test]
    fn a_layout_needs_its_queues_and_connections() {
        let need = need(&layout(4), 2);
        assert_eq!(need.queues, 115, "due, parked, layouts and 28 levels x 4");
        assert_eq!(need.for_queues, 345, "3 handles per quorum queue");
        assert_eq!(need.total, 345 + 4, "2 connections per replica");
        assert_eq!(need.during_a_change, 2 * 345 + 4);
        let classic = Layout::cascade(QueueType::Classic, Shards::try_from(4).unwrap());
        assert_eq!(super::need(&classic, 1).total, 2);
    }

    #[test]
    fn a_small_limit_warns_with_the_numbers_and_the_fix() {
        let need = need(&layout(4), 1);
        let allow = |limit| Allowance {
            limit,
            source: "given".into(),
        };
        // Debian's systemd unit: 1,024, 927 usable: enough for the layout
        // and for a change of it (692).
        assert_eq!(warning(&need, &allow(1024)), None);
        let short = warning(&need, &allow(300)).expect("203 usable, 347 needed");
        assert!(short.contains("needs ~347 file handles"), "{short}");
        assert!(short.contains("allows 203 (300 open-file limit"), "{short}");
        assert!(short.contains("LimitNOFILE=65536"), "{short}");
        assert!(short.contains("--ulimit nofile=65536:65536"), "{short}");
        let change = warning(&need, &allow(600)).expect("503 usable, 692 through a change");
        assert!(
            change.contains("~692 file handles on the broker while a layout change"),
            "{change}"
        );
        assert_eq!(warning(&need, &allow(65536)), None);
        // Eight shards: 227 quorum queues, 681 handles, ~1,360 through a
        // change: too many for Debian's default.
        let eight = super::need(&layout(8), 1);
        assert!(warning(&eight, &allow(1024)).is_some());
    }

    #[test]
    fn the_listener_and_the_limit_are_read_from_procs_text() {
        let tcp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000000000000000000000000000:1628 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   107        0 23456 1 0000000000000000 100 0 0 10 0\n   1: 0000000000000000FFFF00000100007F:1628 0000000000000000FFFF00000100007F:D2C4 01 00000000:00000000 00:00000000 00000000   107        0 99999 1 0000000000000000 20 4 30 10 -1\n";
        assert_eq!(listeners_on(tcp6, 5672), vec!["23456".to_owned()]);
        assert!(listeners_on(tcp6, 5673).is_empty());
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax processes             7823                 7823                 processes \nMax open files            1024                 20000                files     \n";
        assert_eq!(open_files_limit(limits), Some(1024));
    }
}
