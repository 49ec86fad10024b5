//! `[http]`: what the HTTP side (`HTTP_ADDR`: `/metrics`, `/healthz`,
//! `/readyz`, the console) accepts from whom, and how long it waits. The
//! defaults suit a listener reached from the host itself or through a
//! port-forward; an operator who publishes the console names its host names
//! and the proxies it trusts here.

use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;

/// The HTTP side's exposure and limits (`[http]`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// Host names the console answers to, besides the loopback names
    /// (`localhost`, `127.0.0.1`, `[::1]`) and IP literals, which it always
    /// answers to (`HTTP_HOSTS`, comma-separated). A name with a port
    /// (`console.internal:9464`) matches that port only; without one, any.
    /// A request naming another host is refused (421), so a DNS-rebinding
    /// page, whose requests name the attacker's host, reads nothing.
    pub hosts: Vec<String>,
    /// Addresses of the reverse proxies whose `X-Forwarded-Proto` and
    /// `X-Forwarded-For` are believed (`HTTP_TRUSTED_PROXIES`,
    /// comma-separated): the console's cookie gets `Secure` when such a
    /// proxy says the request came over HTTPS, and login attempts are
    /// counted per client behind it. Nobody's, by default.
    pub trusted_proxies: Vec<IpAddr>,
    /// Whether a visitor who is not logged in may read the bodies of parked
    /// messages in the console (otherwise: counts, reasons and ids only).
    /// Off by default: a body may hold a customer's data.
    pub public_bodies: bool,
    /// How long a connection may take to send a request's headers, and how
    /// long an idle keep-alive connection is kept: past it, it is closed.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Longest time one console request may take (body read included);
    /// past it the request is answered 503.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Most connections open at once. Past it, a few more are taken for
    /// `/healthz`, `/readyz` and `/metrics` only (a probe still answers
    /// while the console is flooded); the rest are closed at once.
    pub max_connections: usize,
    /// Most console requests handled at once; more are answered 503 at
    /// once rather than queued.
    pub console_concurrency: usize,
    /// Console requests one client address may make per second (twice as
    /// many at once); more are answered 429. A person reading the console
    /// makes a few a minute; a flood from one address is cut to this.
    pub console_per_second: u32,
    /// Login attempts one client address may make per minute (the first
    /// ones at once, then evenly spread).
    pub login_per_minute: u32,
    /// Login attempts all clients together may make per minute.
    pub login_per_minute_total: u32,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            hosts: Vec::new(),
            trusted_proxies: Vec::new(),
            public_bodies: false,
            header_read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            max_connections: 256,
            console_concurrency: 16,
            console_per_second: 20,
            login_per_minute: 5,
            login_per_minute_total: 30,
        }
    }
}

impl HttpSettings {
    /// Whether a request naming `host` (the `Host` header, or the authority
    /// of an `Origin`) is for this service: a loopback name, an IP literal
    /// (no DNS name, so no rebinding), or one of [`HttpSettings::hosts`].
    pub fn serves_host(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let (name, port) = split_port(&host);
        if name.is_empty() {
            return false;
        }
        if name == "localhost" || name.trim_matches(['[', ']']).parse::<IpAddr>().is_ok() {
            return true;
        }
        self.hosts.iter().any(|allowed| {
            let allowed = allowed.trim().to_ascii_lowercase();
            match split_port(&allowed) {
                (n, Some(p)) => n == name && Some(p) == port,
                (n, None) => n == name,
            }
        })
    }
}

/// `host:port` as the name and the port (`[::1]:80` as `[::1]` and `80`).
fn split_port(host: &str) -> (&str, Option<&str>) {
    match host.rsplit_once(':') {
        Some((name, port))
            if !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!name.contains(':') || name.ends_with(']')) =>
        {
            (name, Some(port))
        }
        _ => (host, None),
    }
}

/// A comma-separated list from an environment variable, blanks dropped.
pub(super) fn list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_ip_literals_and_configured_hosts_are_served() {
        let mut s = HttpSettings::default();
        for host in [
            "localhost",
            "LOCALHOST:9464",
            "127.0.0.1:9464",
            "[::1]:9464",
            "10.1.2.3:9464",
            "::1",
        ] {
            assert!(s.serves_host(host), "{host}");
        }
        for host in ["evil.example", "evil.example:9464", "", ":9464"] {
            assert!(!s.serves_host(host), "{host}");
        }
        s.hosts = vec!["console.internal".into(), "ops.example:8443".into()];
        assert!(s.serves_host("console.internal:9464"));
        assert!(s.serves_host("Console.Internal"));
        assert!(s.serves_host("ops.example:8443"));
        assert!(!s.serves_host("ops.example:9464"));
        assert!(!s.serves_host("console.internal.evil.example"));
    }
}
