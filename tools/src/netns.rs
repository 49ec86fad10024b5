//! Network namespaces whose links a test cuts: real silence, not a killed
//! process. A peer (a private RabbitMQ node, a private PostgreSQL, the
//! reference inventory) runs in a [`Namespace`] of its own, reached over
//! [`Link`]s — each a veth pair whose host end is the one port of a bridge
//! that holds the host's address. [`Link::cut`] takes that port down: from
//! then on every packet either way is dropped, with no reset and no ICMP
//! (the neighbours are static, so not even ARP fails), which is what a
//! switch port, a security group or a partition does. [`Link::heal`]
//! brings it back; connections that survived the cut carry on.
//!
//! Needs root and `ip` (iproute2); there is no iptables or `tc netem` on
//! these machines, and none is needed. [`Namespace::new`] fails with a
//! clear message when a precondition is missing (callers must not skip
//! silently). Everything is named after this process (`otns<pid>x<n>`,
//! `otb<pid>x<n>`, `otv<pid>x<n>`) and removed by that name on drop —
//! also on a panic — after the namespace's processes are killed by their
//! own pids; namespaces a killed run left behind (their pid gone) are
//! removed by the next [`Namespace::new`]. Every `ip` call is bounded in
//! time.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A precondition is missing or an `ip` command failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Not root, or no `ip netns`: partition tests cannot run here.
    #[error(
        "network namespaces are not available: {0} (the partition tests need root and iproute2's `ip netns`; they fail rather than skip)"
    )]
    Unavailable(String),
    /// A command failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it printed.
        stderr: String,
    },
}

/// The longest any one `ip` (or helper) command may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(15);

/// Namespaces made by this process so far (for unique names).
static MADE: AtomicU32 = AtomicU32::new(0);

/// Held while a link picks its subnet and takes it: two links made at once
/// (tests run in parallel threads) must not pick the same one.
static LINKING: Mutex<()> = Mutex::new(());

/// The same across processes (two test runs at once): an exclusive
/// `flock` on this file, released when the returned file is dropped.
const LINKING_FILE: &str = "/tmp/order-timeout-netns.lock";

fn lock_across_processes() -> Result<std::fs::File, NetnsError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LINKING_FILE)
        .map_err(|e| NetnsError::Command {
            command: format!("open {LINKING_FILE}"),
            stderr: e.to_string(),
        })?;
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open file descriptor; flock blocks until it is ours.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(NetnsError::Command {
            command: format!("flock {LINKING_FILE}"),
            stderr: std::io::Error::last_os_error().to_string(),
        });
    }
    Ok(file)
}

/// Runs `program args` within [`COMMAND_LIMIT`], returning its stdout.
fn run(program: &str, args: &[&str]) -> Result<String, NetnsError> {
    let shown = format!("{program} {}", args.join(" "));
    let output = Command::new("timeout")
        .arg("--kill-after=2")
        .arg(COMMAND_LIMIT.as_secs().to_string())
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetnsError::Command {
            command: shown.clone(),
            stderr: e.to_string(),
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(NetnsError::Command {
            command: shown,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

fn ip(args: &[&str]) -> Result<String, NetnsError> {
    run("ip", args)
}

/// Root, and `ip netns` works.
fn check_preconditions() -> Result<(), NetnsError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(NetnsError::Unavailable(format!(
            "running as uid {euid}, not root"
        )));
    }
    ip(&["netns", "list"]).map_err(|e| NetnsError::Unavailable(e.to_string()))?;
    Ok(())
}

/// One cuttable link between the host and a namespace.
#[derive(Debug)]
pub struct Link {
    /// The host's address on it (the bridge's).
    pub host_ip: Ipv4Addr,
    /// The namespace's address on it: where its peer listens.
    pub ns_ip: Ipv4Addr,
    port: String,
}

impl Link {
    /// Cuts the link silently: the bridge's only port goes down, and every
    /// packet either way is dropped from now on.
    pub fn cut(&self) -> Result<(), NetnsError> {
        ip(&["link", "set", &self.port, "down"]).map(drop)
    }

    /// Restores the link.
    pub fn heal(&self) -> Result<(), NetnsError> {
        ip(&["link", "set", &self.port, "up"]).map(drop)
    }
}

/// A network namespace of this process, with its links and the processes
/// started in it; all removed on drop.
#[derive(Debug)]
pub struct Namespace {
    /// Its name (`ip netns`).
    pub name: String,
    tag: String,
    links: Mutex<Vec<(String, String)>>,
    children: Mutex<Vec<std::process::Child>>,
}

impl Namespace {
    /// A new namespace with its loopback up (and no link yet).
    #[tracing::instrument]
    pub fn new() -> Result<Self, NetnsError> {
        check_preconditions()?;
        sweep_abandoned();
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}x{n}", std::process::id());
        let name = format!("otns{tag}");
        ip(&["netns", "add", &name])?;
        let ns = Self {
            name,
            tag,
            links: Mutex::new(Vec::new()),
            children: Mutex::new(Vec::new()),
        };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Adds a link: a bridge on the host with a fresh /24 (its `.1`), a
    /// veth pair from the bridge into the namespace (its `.2`), static
    /// neighbours both ways. The first link is the namespace's default
    /// route.
    #[tracing::instrument(skip(self), fields(ns = %self.name))]
    pub fn link(&self) -> Result<Link, NetnsError> {
        let _one_at_a_time = LINKING.lock().unwrap_or_else(|e| e.into_inner());
        let _one_process_at_a_time = lock_across_processes()?;
        let k = self.links.lock().unwrap().len();
        let bridge = format!("otb{}l{k}", self.tag);
        let port = format!("otv{}l{k}", self.tag);
        let inner = format!("otn{}l{k}", self.tag);
        let subnet = free_subnet()?;
        let host_ip = Ipv4Addr::new(10, 231, subnet, 1);
        let ns_ip = Ipv4Addr::new(10, 231, subnet, 2);
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        self.links
            .lock()
            .unwrap()
            .push((bridge.clone(), port.clone()));
        ip(&["addr", "add", &format!("{host_ip}/24"), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        ip(&["link", "add", &port, "type", "veth", "peer", "name", &inner])?;
        ip(&["link", "set", &port, "master", &bridge])?;
        ip(&["link", "set", &port, "up"])?;
        ip(&["link", "set", &inner, "netns", &self.name])?;
        let n = ["-n", self.name.as_str()];
        ip(&[
            &n[..],
            &["addr", "add", &format!("{ns_ip}/24"), "dev", &inner],
        ]
        .concat())?;
        ip(&[&n[..], &["link", "set", &inner, "up"]].concat())?;
        if k == 0 {
            ip(&[
                &n[..],
                &["route", "add", "default", "via", &host_ip.to_string()],
            ]
            .concat())?;
        }
        self.static_neighbours(&bridge, &inner, host_ip, ns_ip)?;
        Ok(Link {
            host_ip,
            ns_ip,
            port,
        })
    }

    /// Fixes the neighbours of the link both ways (`nud permanent`): with
    /// the link cut, packets then vanish, instead of ARP failing and the
    /// kernel answering "host unreachable".
    fn static_neighbours(
        &self,
        bridge: &str,
        inner: &str,
        host_ip: Ipv4Addr,
        ns_ip: Ipv4Addr,
    ) -> Result<(), NetnsError> {
        let bridge_mac = run("cat", &[&format!("/sys/class/net/{bridge}/address")])?;
        let inner_mac = run(
            "ip",
            &[
                "netns",
                "exec",
                &self.name,
                "cat",
                &format!("/sys/class/net/{inner}/address"),
            ],
        )?;
        let (ns_ip, host_ip) = (ns_ip.to_string(), host_ip.to_string());
        ip(&[
            "neigh",
            "replace",
            &ns_ip,
            "lladdr",
            inner_mac.trim(),
            "dev",
            bridge,
            "nud",
            "permanent",
        ])?;
        ip(&[
            "-n",
            &self.name,
            "neigh",
            "replace",
            &host_ip,
            "lladdr",
            bridge_mac.trim(),
            "dev",
            inner,
            "nud",
            "permanent",
        ])
        .map(drop)
    }

    /// `ip netns exec` this namespace `program`: a command to complete and
    /// spawn with [`Namespace::spawn`] or run to its end.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }

    /// Spawns `command` (from [`Namespace::command`]); it is killed by its
    /// pid (and every other process left in the namespace) on drop.
    pub fn spawn(&self, mut command: Command) -> Result<u32, NetnsError> {
        let child = command.spawn().map_err(|e| NetnsError::Command {
            command: format!("{command:?}"),
            stderr: e.to_string(),
        })?;
        let pid = child.id();
        self.children.lock().unwrap().push(child);
        Ok(pid)
    }

    /// A TCP listener bound to `addr` inside this namespace, for a server
    /// this process runs itself (the reference inventory): bound by a
    /// thread that enters the namespace, so the listener and every
    /// connection it accepts live there, whichever thread serves them.
    pub fn listener(
        &self,
        addr: std::net::SocketAddr,
    ) -> Result<std::net::TcpListener, NetnsError> {
        let path = format!("/var/run/netns/{}", self.name);
        let failed = |what: &str, e: std::io::Error| NetnsError::Command {
            command: format!("{what} in {path}"),
            stderr: e.to_string(),
        };
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let file = std::fs::File::open(&path).map_err(|e| failed("open", e))?;
                    use std::os::fd::AsRawFd;
                    // SAFETY: a valid namespace fd; only this thread moves.
                    let entered = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                    if entered != 0 {
                        return Err(failed("setns", std::io::Error::last_os_error()));
                    }
                    let listener =
                        std::net::TcpListener::bind(addr).map_err(|e| failed("bind", e))?;
                    listener
                        .set_nonblocking(true)
                        .map_err(|e| failed("set_nonblocking", e))?;
                    Ok(listener)
                })
                .join()
                .unwrap_or_else(|_| {
                    Err(NetnsError::Unavailable("the setns thread panicked".into()))
                })
        })
    }

    /// Kills every process still in the namespace, by pid: the children
    /// spawned here and what they started (an Erlang VM's epmd).
    pub(crate) fn kill_all(&self) {
        for mut child in self.children.lock().unwrap().drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        kill_pids_in(&self.name);
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        self.kill_all();
        let _ = ip(&["netns", "del", &self.name]);
        for (bridge, port) in self.links.lock().unwrap().drain(..) {
            let _ = ip(&["link", "del", &port]);
            let _ = ip(&["link", "del", &bridge]);
        }
    }
}

/// A bridge on the host that several namespaces share, one [`Link`] each:
/// what a switch is to a few machines. The host holds its `.1`; member `k`
/// (from 0) gets `.k+2`, and every pair of members, and each member and the
/// host, know each other's address statically (so a cut member's packets
/// vanish instead of ARP failing). [`Link::cut`] of a member takes its
/// bridge port down: from then on it reaches nothing and nothing reaches
/// it, neither the host nor the other members — a partition of that one
/// namespace. Removed (its ports, then itself) on drop; the members'
/// namespaces are dropped by their owners.
#[derive(Debug)]
pub struct Bridge {
    name: String,
    tag: String,
    subnet: u8,
    /// The host's address on the bridge.
    pub host_ip: Ipv4Addr,
    /// Each member: its namespace, inner device, address and MAC.
    members: Mutex<Vec<Member>>,
}

#[derive(Debug, Clone)]
struct Member {
    ns: String,
    inner: String,
    port: String,
    ip: Ipv4Addr,
    mac: String,
}

impl Bridge {
    /// A new bridge with a fresh 10.231.X.0/24 of its own, up, with no
    /// member yet.
    #[tracing::instrument]
    pub fn new() -> Result<Self, NetnsError> {
        check_preconditions()?;
        sweep_abandoned();
        let _one_at_a_time = LINKING.lock().unwrap_or_else(|e| e.into_inner());
        let _one_process_at_a_time = lock_across_processes()?;
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}x{n}", std::process::id());
        let subnet = free_subnet()?;
        let bridge = Self {
            name: format!("otb{tag}"),
            tag,
            subnet,
            host_ip: Ipv4Addr::new(10, 231, subnet, 1),
            members: Mutex::new(Vec::new()),
        };
        ip(&["link", "add", &bridge.name, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", bridge.host_ip),
            "dev",
            &bridge.name,
        ])?;
        ip(&["link", "set", &bridge.name, "up"])?;
        Ok(bridge)
    }

    /// Connects `ns` to the bridge (a veth pair, the namespace's end with
    /// the next address, its default route via the host when it has none
    /// yet) and fixes the neighbours: the host's, and every member's both
    /// ways. The link cuts that member off from all of them.
    #[tracing::instrument(skip(self, ns), fields(bridge = %self.name, ns = %ns.name))]
    pub fn attach(&self, ns: &Namespace) -> Result<Link, NetnsError> {
        let mut members = self.members.lock().unwrap();
        let k = members.len();
        if k > 200 {
            return Err(NetnsError::Unavailable("a bridge holds 200 members".into()));
        }
        let port = format!("otv{}p{k}", self.tag);
        let inner = format!("otn{}p{k}", self.tag);
        let ns_ip = Ipv4Addr::new(10, 231, self.subnet, k as u8 + 2);
        ip(&["link", "add", &port, "type", "veth", "peer", "name", &inner])?;
        ip(&["link", "set", &port, "master", &self.name])?;
        ip(&["link", "set", &port, "up"])?;
        ip(&["link", "set", &inner, "netns", &ns.name])?;
        let n = ["-n", ns.name.as_str()];
        ip(&[
            &n[..],
            &["addr", "add", &format!("{ns_ip}/24"), "dev", &inner],
        ]
        .concat())?;
        ip(&[&n[..], &["link", "set", &inner, "up"]].concat())?;
        let routes = ip(&[&n[..], &["route", "show", "default"]].concat())?;
        if routes.trim().is_empty() {
            let via = self.host_ip.to_string();
            ip(&[&n[..], &["route", "add", "default", "via", &via]].concat())?;
        }
        let mac = ns_mac(&ns.name, &inner)?;
        let bridge_mac = run("cat", &[&format!("/sys/class/net/{}/address", self.name)])?;
        let me = Member {
            ns: ns.name.clone(),
            inner,
            port: port.clone(),
            ip: ns_ip,
            mac,
        };
        neighbour(None, &self.name, me.ip, &me.mac)?;
        neighbour(Some(&me.ns), &me.inner, self.host_ip, bridge_mac.trim())?;
        for other in members.iter() {
            neighbour(Some(&me.ns), &me.inner, other.ip, &other.mac)?;
            neighbour(Some(&other.ns), &other.inner, me.ip, &me.mac)?;
        }
        members.push(me);
        Ok(Link {
            host_ip: self.host_ip,
            ns_ip,
            port,
        })
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        for member in self.members.lock().unwrap().drain(..) {
            let _ = ip(&["link", "del", &member.port]);
        }
        let _ = ip(&["link", "del", &self.name]);
    }
}

/// The MAC address of `device` in namespace `ns`.
fn ns_mac(ns: &str, device: &str) -> Result<String, NetnsError> {
    let path = format!("/sys/class/net/{device}/address");
    Ok(run("ip", &["netns", "exec", ns, "cat", &path])?
        .trim()
        .to_owned())
}

/// A permanent neighbour entry: `ip` is at `mac` on `device` (of namespace
/// `ns`, or the host's).
fn neighbour(
    ns: Option<&str>,
    device: &str,
    ip_addr: Ipv4Addr,
    mac: &str,
) -> Result<(), NetnsError> {
    let addr = ip_addr.to_string();
    let entry = [
        "neigh",
        "replace",
        &addr,
        "lladdr",
        mac,
        "dev",
        device,
        "nud",
        "permanent",
    ];
    match ns {
        Some(ns) => ip(&[&["-n", ns][..], &entry[..]].concat()),
        None => ip(&entry),
    }
    .map(drop)
}

/// Kills (SIGKILL, by pid) every process in the namespace `name`.
fn kill_pids_in(name: &str) {
    for _ in 0..3 {
        let pids = ip(&["netns", "pids", name]).unwrap_or_default();
        let pids: Vec<i32> = pids
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            // SAFETY: a pid read from this namespace just now.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A third octet for 10.231.X.0/24 that no interface of the host uses.
fn free_subnet() -> Result<u8, NetnsError> {
    let used = ip(&["-4", "-o", "addr", "show"])?;
    let seed = std::process::id() as usize + MADE.load(Ordering::Relaxed) as usize * 31;
    for k in 0..250usize {
        let x = ((seed + k * 7) % 250 + 1) as u8;
        if !used.contains(&format!("10.231.{x}.")) {
            return Ok(x);
        }
    }
    Err(NetnsError::Unavailable(
        "no free 10.231.X.0/24 subnet left".into(),
    ))
}

/// Removes the namespaces (with their processes and links) of runs whose
/// process is gone: a test killed before its drop ran.
fn sweep_abandoned() {
    let list = ip(&["netns", "list"]).unwrap_or_default();
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix("otns")
            .and_then(|rest| rest.split('x').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        kill_pids_in(name);
        let _ = ip(&["netns", "del", name]);
        let links = ip(&["-o", "link", "show"]).unwrap_or_default();
        let tag = format!("{pid}x");
        for device in links
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(|d| d.trim().split('@').next().unwrap_or("").to_owned())
            .filter(|d| (d.starts_with("otb") || d.starts_with("otv")) && d[3..].starts_with(&tag))
        {
            let _ = ip(&["link", "del", &device]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two namespaces on one bridge reach each other and the host; a cut
    /// of one's link makes it silent to both.
    #[test]
    fn a_cut_member_of_a_bridge_is_silent_to_the_host_and_the_other_members() {
        let bridge = Bridge::new().expect("a bridge (run as root)");
        let (a, b) = (Namespace::new().unwrap(), Namespace::new().unwrap());
        let link_a = bridge.attach(&a).unwrap();
        let link_b = bridge.attach(&b).unwrap();
        let listener = a.listener((link_a.ns_ip, 0).into()).unwrap();
        let port = listener.local_addr().unwrap().port().to_string();
        let probe = |from: &Namespace| {
            let script = format!("exec 3<>/dev/tcp/{}/{port}", link_a.ns_ip);
            from.command("timeout")
                .args(["2", "bash", "-c", &script])
                .status()
                .unwrap()
                .code()
        };
        let host = || {
            let addr = (link_a.ns_ip, port.parse().unwrap()).into();
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        };
        assert_eq!(probe(&b), Some(0), "b reaches a over the bridge");
        assert!(host().is_ok(), "the host reaches a");
        link_a.cut().unwrap();
        assert_eq!(
            probe(&b),
            Some(124),
            "a cut member is silent to b (a timeout)"
        );
        let err = host().expect_err("a cut member is silent to the host");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        link_a.heal().unwrap();
        assert_eq!(probe(&b), Some(0), "b reaches a again");
        let _ = link_b;
        drop((a, b));
        drop(bridge);
    }

    /// The link carries TCP, a cut makes it silent (a connect neither
    /// succeeds nor is refused), and a heal restores it.
    #[test]
    fn a_cut_link_is_silent_and_a_healed_one_carries_again() {
        let ns = Namespace::new().expect("network namespaces (run as root)");
        let link = ns.link().expect("a link");
        let listener = ns
            .listener((link.ns_ip, 0).into())
            .expect("a listener in the namespace");
        let addr = listener.local_addr().unwrap();
        let connect = || std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2));
        assert!(connect().is_ok(), "the link carries");
        link.cut().unwrap();
        let err = connect().expect_err("a cut link carries nothing");
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::TimedOut,
            "silence, not a refusal: {err}"
        );
        link.heal().unwrap();
        assert!(connect().is_ok(), "a healed link carries again");
        let name = ns.name.clone();
        drop(ns);
        let left = ip(&["netns", "list"]).unwrap();
        assert!(!left.contains(&name), "the namespace is removed: {left}");
    }
}
