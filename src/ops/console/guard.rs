//! What a login attempt costs: attempts are limited per client address and
//! in total ([`LoginGuard`], GCRA rate limits from `governor`), so guessing
//! `ADMIN_TOKEN` runs at a few tries a minute whatever the number of
//! parallel requests, and an attempt past the limit is refused before its
//! token is even compared. Login bodies are capped at [`LOGIN_BODY_LIMIT`].
//!
//! Behind a proxy named in `[http] trusted_proxies` the client is the
//! address the proxy appended to `X-Forwarded-For`; otherwise the peer.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::HeaderMap;
use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Largest login form accepted: the token and a little more.
pub(super) const LOGIN_BODY_LIMIT: usize = 4096;

/// Client addresses remembered before the stale ones are forgotten.
const REMEMBERED: usize = 10_000;

/// The login limits.
pub(super) struct LoginGuard {
    per_client: DefaultKeyedRateLimiter<IpAddr>,
    total: DefaultDirectRateLimiter,
    clock: DefaultClock,
}

impl std::fmt::Debug for LoginGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginGuard").finish_non_exhaustive()
    }
}

impl LoginGuard {
    /// At most `per_client` attempts a minute from one address and `total`
    /// from all of them (each at least 1), the first ones at once.
    pub(super) fn new(per_client: u32, total: u32) -> Self {
        let quota =
            |n: u32| Quota::per_minute(NonZeroU32::new(n.max(1)).unwrap_or(NonZeroU32::MIN));
        Self {
            per_client: RateLimiter::keyed(quota(per_client)),
            total: RateLimiter::direct(quota(total)),
            clock: DefaultClock::default(),
        }
    }

    /// Admits one attempt from `client`, or says how long until the next
    /// one may be made.
    pub(super) fn admit(&self, client: IpAddr) -> Result<(), Duration> {
        if self.per_client.len() > REMEMBERED {
            self.per_client.retain_recent();
            self.per_client.shrink_to_fit();
        }
        let now = self.clock.now();
        self.per_client
            .check_key(&client)
            .map_err(|until| until.wait_time_from(now))?;
        self.total
            .check()
            .map_err(|until| until.wait_time_from(now))
    }
}

/// Console requests per client address and second (`[http]
/// console_per_second`, twice as many at once): a flood from one address
/// is answered 429 before any page is looked at.
pub(super) struct VisitGuard {
    per_client: DefaultKeyedRateLimiter<IpAddr>,
}

impl std::fmt::Debug for VisitGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VisitGuard").finish_non_exhaustive()
    }
}

impl VisitGuard {
    /// `per_second` requests a second per client (at least 1), twice as
    /// many at once.
    pub(super) fn new(per_second: u32) -> Self {
        let rate = NonZeroU32::new(per_second.max(1)).unwrap_or(NonZeroU32::MIN);
        let burst = rate.saturating_mul(NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN));
        Self {
            per_client: RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)),
        }
    }

    /// Whether `client` may make one more request now.
    pub(super) fn admit(&self, client: IpAddr) -> bool {
        if self.per_client.len() > REMEMBERED {
            self.per_client.retain_recent();
            self.per_client.shrink_to_fit();
        }
        self.per_client.check_key(&client).is_ok()
    }
}

/// Who sent the request: the peer, or behind a trusted proxy the address
/// the proxy appended to `X-Forwarded-For` (the last one: what came before
/// it the client wrote itself).
pub(super) fn client(peer: SocketAddr, headers: &HeaderMap, trusted: &[IpAddr]) -> IpAddr {
    if !trusted.contains(&peer.ip()) {
        return peer.ip();
    }
    headers
        .get_all("x-forwarded-for")
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .and_then(|a| a.trim().parse().ok())
        .unwrap_or(peer.ip())
}

/// Whether the browser reached the console over HTTPS: behind a trusted
/// proxy that says so in `X-Forwarded-Proto` (the HTTP side itself speaks
/// plain HTTP).
pub(super) fn over_https(peer: SocketAddr, headers: &HeaderMap, trusted: &[IpAddr]) -> bool {
    trusted.contains(&peer.ip())
        && headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn attempts_are_limited_per_client_and_in_total() {
        let guard = LoginGuard::new(3, 5);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let c: IpAddr = "192.0.2.3".parse().unwrap();
        for _ in 0..3 {
            assert!(guard.admit(a).is_ok());
        }
        let wait = guard.admit(a).unwrap_err();
        assert!(wait > Duration::from_secs(10), "{wait:?}");
        assert!(guard.admit(b).is_ok());
        assert!(guard.admit(b).is_ok());
        assert!(guard.admit(c).is_err(), "five in total");
    }

    #[test]
    fn visits_are_limited_per_client() {
        let guard = VisitGuard::new(2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let admitted = (0..10).filter(|_| guard.admit(a)).count();
        assert_eq!(admitted, 4, "twice the rate at once");
        assert!(guard.admit(b));
    }

    #[test]
    fn forwarded_headers_count_only_from_trusted_proxies() {
        let proxy: SocketAddr = "10.0.0.9:4000".parse().unwrap();
        let stranger: SocketAddr = "203.0.113.7:4000".parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            HeaderValue::from_static("1.1.1.1, 198.51.100.4"),
        );
        headers.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let trusted = ["10.0.0.9".parse().unwrap()];
        assert_eq!(
            client(proxy, &headers, &trusted),
            "198.51.100.4".parse::<IpAddr>().unwrap()
        );
        assert_eq!(client(stranger, &headers, &trusted), stranger.ip());
        assert!(over_https(proxy, &headers, &trusted));
        assert!(!over_https(stranger, &headers, &trusted));
        assert!(!over_https(proxy, &headers, &[]));
    }
}
