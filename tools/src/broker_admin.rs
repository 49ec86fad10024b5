//! Vhosts on a local RabbitMQ node made, listed and deleted through one
//! short Erlang call each, for the scratch environments of the tests and
//! the bench ([`crate::scratch`]).
//!
//! Why not `rabbitmqctl`: every call of it boots an Erlang VM with the
//! Elixir CLI, about 0.6–0.9 s of CPU. A test made and removed its vhost in
//! three such calls, and the suite's 320 tests spent more CPU in
//! `rabbitmqctl` than in the service and the tests themselves (measured
//! with process accounting: 236 of 300 CPU seconds in one run of the store
//! and service suites). A bare `erl` joining the node as a hidden node with
//! its cookie and calling the broker's own functions does the same work in
//! about 0.25 s of CPU, and makes the vhost and its permissions in one
//! call.
//!
//! The functions called are those `rabbitmqctl add_vhost`, `set_permissions`,
//! `delete_vhost` and `list_vhosts` call: `rabbit_vhost:add/2`,
//! `rabbit_auth_backend_internal:set_permissions/6`, `rabbit_vhost:delete/2`
//! and `rabbit_vhost:list_names/0`, the same on RabbitMQ 3.10 and 4.0 (both
//! are run by the suite). Where `erl` is missing, the cookie cannot be read
//! or the node does not answer, the callers fall back to `rabbitmqctl`
//! ([`AdminError::Unreachable`]).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// A local RabbitMQ node and what joining it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The node's name (`rabbit@localhost`).
    pub name: String,
    /// The directory whose `.erlang.cookie` is the node's cookie (the
    /// `HOME` its CLI runs with).
    pub cookie_home: PathBuf,
    /// The port of the epmd the node registered with, when not the default
    /// 4369 (`ERL_EPMD_PORT`).
    pub epmd_port: Option<u16>,
}

/// Why a call on a [`Node`] failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The node could not be reached this way (no `erl`, no readable
    /// cookie, the node down or not answering): use `rabbitmqctl` instead.
    #[error("the node cannot be reached with erl: {0}")]
    Unreachable(String),
    /// The node answered with an error.
    #[error("{0}")]
    Refused(String),
}

/// What the scratch vhosts' changes are made in the name of (the broker's
/// "acting user", in its log).
const ACTING_USER: &str = "order-timeout-tests";

/// How long one call may take: as long as `rabbitmqctl`'s
/// ([`crate::scratch::RABBITMQCTL_TIMEOUT_SECS`]).
const CALL_LIMIT: Duration = Duration::from_secs(crate::scratch::RABBITMQCTL_TIMEOUT_SECS as u64);

/// The exit status of a call whose `rpc:call` found the node down
/// (`{badrpc, nodedown}`), or which could not start at all.
const UNREACHABLE: i32 = 3;
/// The exit status of a call the node answered with an error.
const REFUSED: i32 = 4;

impl Node {
    /// The machine's broker, as Debian's `rabbitmqctl` finds it: the node
    /// named by `RABBITMQ_NODENAME`, else `NODENAME` in
    /// `/etc/rabbitmq/rabbitmq-env.conf`, else `rabbit@` and the short host
    /// name; the cookie of the `rabbitmq` user's home,
    /// `/var/lib/rabbitmq`.
    pub fn machine() -> Self {
        let from_conf = || {
            std::fs::read_to_string("/etc/rabbitmq/rabbitmq-env.conf")
                .ok()?
                .lines()
                .find_map(|l| {
                    let value = l.trim().strip_prefix("NODENAME=")?;
                    Some(value.trim_matches(['"', '\'']).to_owned())
                })
        };
        let name = std::env::var("RABBITMQ_NODENAME")
            .ok()
            .filter(|n| !n.is_empty())
            .or_else(from_conf)
            .unwrap_or_else(|| format!("rabbit@{}", short_host_name()));
        Self {
            name,
            cookie_home: PathBuf::from("/var/lib/rabbitmq"),
            epmd_port: None,
        }
    }

    /// Creates vhost `vhost` and gives `user` full permissions on it, in
    /// one call (`rabbitmqctl add_vhost` and `set_permissions`). A vhost
    /// that exists already is kept.
    pub fn create_vhost(&self, vhost: &str, user: &str) -> Result<(), AdminError> {
        let (v, u, a) = (binary(vhost)?, binary(user)?, binary(ACTING_USER)?);
        self.call(&format!(
            "Ok(C(rabbit_vhost, add, [{v}, {a}])), \
             Ok(C(rabbit_auth_backend_internal, set_permissions, \
                  [{u}, {v}, <<\".*\">>, <<\".*\">>, <<\".*\">>, {a}]))"
        ))
        .map(drop)
    }

    /// Deletes vhost `vhost` with everything in it (`rabbitmqctl
    /// delete_vhost`).
    pub fn delete_vhost(&self, vhost: &str) -> Result<(), AdminError> {
        let (v, a) = (binary(vhost)?, binary(ACTING_USER)?);
        self.call(&format!("Ok(C(rabbit_vhost, delete, [{v}, {a}]))"))
            .map(drop)
    }

    /// The names of the node's vhosts (`rabbitmqctl list_vhosts name`).
    pub fn list_vhosts(&self) -> Result<Vec<String>, AdminError> {
        let out =
            self.call("[io:format(\"~s~n\", [V]) || V <- C(rabbit_vhost, list_names, [])]")?;
        Ok(out.lines().map(str::to_owned).collect())
    }

    /// Whether the node answers (`rabbitmqctl status`'s exit status).
    pub fn ping(&self) -> Result<(), AdminError> {
        self.call("C(erlang, node, [])").map(drop)
    }

    /// Runs `body` in an `erl` joined to the node as a hidden node, with
    /// `C(M, F, A)` calling `M:F(A…)` on the node and `Ok(R)` requiring
    /// `R` to be `ok`; returns what it printed.
    fn call(&self, body: &str) -> Result<String, AdminError> {
        let node = atom(&self.name)?;
        let program = format!(
            "C = fun(M, F, A) -> case rpc:call({node}, M, F, A, {limit}) of \
                 {{badrpc, R}} -> io:format(standard_error, \"~p~n\", [{{badrpc, R}}]), \
                                  halt({UNREACHABLE}); \
                 V -> V end end, \
             Ok = fun(ok) -> ok; \
                     (E) -> io:format(standard_error, \"~p~n\", [E]), halt({REFUSED}) end, \
             {body}, \
             halt(0).",
            limit = CALL_LIMIT.as_millis(),
        );
        let client = format!(
            "ot_admin_{}_{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        let mut command = Command::new("timeout");
        command
            .args(["--kill-after=10", &(CALL_LIMIT.as_secs() + 30).to_string()])
            .args(["erl", "-noshell", "-hidden", "-sname", &client])
            .args(["-eval", &program])
            .env("HOME", &self.cookie_home)
            // A failed boot writes no erl_crash.dump into the caller's directory.
            .env("ERL_CRASH_DUMP_SECONDS", "0")
            .env_remove("ERL_FLAGS")
            .env_remove("ERL_AFLAGS")
            .env_remove("ERL_ZFLAGS");
        match self.epmd_port {
            Some(port) => command.env("ERL_EPMD_PORT", port.to_string()),
            None => command.env_remove("ERL_EPMD_PORT"),
        };
        let out = command
            .output()
            .map_err(|e| AdminError::Unreachable(format!("cannot run erl: {e}")))?;
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        match out.status.code() {
            Some(0) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            Some(REFUSED) => Err(AdminError::Refused(format!("{}: {stderr}", self.name))),
            Some(124 | 137) => Err(AdminError::Refused(format!(
                "{}: the call did not finish within {} s",
                self.name,
                CALL_LIMIT.as_secs() + 30
            ))),
            _ => Err(AdminError::Unreachable(format!(
                "{} ({}): {stderr}",
                self.name, out.status
            ))),
        }
    }
}

/// This machine's short host name (what Erlang's `-sname` uses).
fn short_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().split('.').next().unwrap_or_default().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// `s` as an Erlang binary literal; only names of letters, digits and
/// `_.-@:` (every scratch name and broker user of the suite), so nothing
/// needs escaping.
fn binary(s: &str) -> Result<String, AdminError> {
    plain(s).map(|s| format!("<<\"{s}\">>"))
}

/// `s` as a quoted Erlang atom.
fn atom(s: &str) -> Result<String, AdminError> {
    plain(s).map(|s| format!("'{s}'"))
}

fn plain(s: &str) -> Result<&str, AdminError> {
    let ok = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-@:".contains(&b));
    ok.then_some(s).ok_or_else(|| {
        AdminError::Unreachable(format!(
            "{s:?} has characters this client does not quote; rabbitmqctl does"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_or_refused() {
        assert_eq!(binary("ot_test_p1_ab").unwrap(), "<<\"ot_test_p1_ab\">>");
        assert_eq!(atom("rabbit@localhost").unwrap(), "'rabbit@localhost'");
        assert!(binary("a\"b").is_err());
        assert!(binary("").is_err());
        assert!(atom("x'), halt(1), ('").is_err());
    }
}
