//! Who may write: the console's login, session and CSRF tokens, all
//! derived from `ADMIN_TOKEN` with HMAC-SHA-256, so they need no server
//! state to be checked (replicas behind one address accept each other's
//! sessions, and changing `ADMIN_TOKEN` ends every session). A logout
//! revokes its session on every replica: the one that served it refuses
//! it at once and records it in the service's database
//! (`order_timeout_logouts`, by a MAC of the cookie), which every replica
//! reads every [`LOGOUTS_FRESH`](super::LOGOUTS_FRESH); each refuses the
//! session until it would have expired.
//!
//! - **Login**: the operator types `ADMIN_TOKEN` into the login form; the
//!   comparison is constant-time.
//! - **Session**: a cookie `ot_console=EXPIRY.MAC(session, EXPIRY)`
//!   (`HttpOnly`, `SameSite=Strict`, [`SESSION_TTL`]; `Secure` when a
//!   trusted proxy says the browser came over HTTPS).
//! - **CSRF**: every write form carries `csrf = MAC(csrf, session cookie)`;
//!   a POST without the session cookie, or without the matching `csrf`
//!   field, or sent from another origin (`Origin`, `Sec-Fetch-Site`), is
//!   refused. `SameSite=Strict` already keeps the cookie off cross-site
//!   requests; the token is the second, independent line.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, header};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::settings::AdminToken;

/// Name of the session cookie.
pub(super) const COOKIE: &str = "ot_console";
/// How long a login lasts.
pub(super) const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

/// Who is asking, as far as writing goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Access {
    /// `ADMIN_TOKEN` is not set: nobody may write.
    ReadOnly,
    /// `ADMIN_TOKEN` is set, no valid session.
    LoggedOut,
    /// A valid session; `csrf` is the token its forms carry.
    Admin {
        /// The CSRF token of this session.
        csrf: String,
    },
}

impl Access {
    /// Whether this visitor may read the bodies of parked messages: a
    /// logged-in operator always; anyone else only when the operator opted
    /// in (`public_bodies`, `[http] public_bodies`). A body may hold a
    /// customer's data: an anonymous visitor sees counts, reasons and ids.
    pub(super) fn may_see_bodies(&self, public_bodies: bool) -> bool {
        public_bodies || matches!(self, Self::Admin { .. })
    }
}

/// Why a write was refused (each a 403).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// `ADMIN_TOKEN` is not set.
    ReadOnly,
    /// The request came from another site.
    CrossSite,
    /// No valid session cookie.
    NotLoggedIn,
    /// The `csrf` field is missing or wrong.
    BadCsrf,
}

impl Refusal {
    /// What the refusal page says.
    pub(super) fn explain(self) -> &'static str {
        match self {
            Self::ReadOnly => {
                "This console is read-only: ADMIN_TOKEN is not set. Use `order-timeout parked replay|purge`, or set ADMIN_TOKEN and restart the service."
            }
            Self::CrossSite => "Refused: the request did not come from this console's own pages.",
            Self::NotLoggedIn => "Refused: log in with ADMIN_TOKEN first (or the session expired).",
            Self::BadCsrf => {
                "Refused: the form's CSRF token is missing or wrong. Reload the page and try again."
            }
        }
    }
}

/// The signer of sessions and CSRF tokens.
#[derive(Clone, Debug)]
pub(super) struct Admin {
    token: AdminToken,
    /// Sessions logged out (by [`Admin::logout_mac`]), here or on another
    /// replica, with their expiry: refused until then.
    revoked: Arc<Mutex<HashMap<String, i64>>>,
}

impl Admin {
    /// With `ADMIN_TOKEN` as the key.
    pub(super) fn new(token: AdminToken) -> Self {
        Self {
            token,
            revoked: Arc::default(),
        }
    }

    /// Ends `session` here: its cookie and CSRF token are refused from now
    /// on. Only valid sessions are recorded (a logout needs one, and its
    /// CSRF token), and each only until it would have expired anyway.
    /// Returns what the other replicas must learn ([`Admin::learn`]): the
    /// session's MAC and its expiry (Unix seconds).
    pub(super) fn revoke(&self, session: &str) -> Option<(String, i64)> {
        let expires = self.expiry(session)?;
        let mac = self.logout_mac(session);
        self.learn([(mac.clone(), expires)]);
        Some((mac, expires))
    }

    /// Refuses the sessions of `logouts` (`(MAC, expiry)`, recorded by any
    /// replica) from now on, each until it expires.
    pub(super) fn learn(&self, logouts: impl IntoIterator<Item = (String, i64)>) {
        let now = Utc::now().timestamp();
        let mut revoked = self.revoked.lock().unwrap_or_else(|e| e.into_inner());
        revoked.retain(|_, at| *at > now);
        revoked.extend(logouts.into_iter().filter(|(_, at)| *at > now));
    }

    /// How a logout names a session, to this replica and in the shared
    /// record of logouts: a MAC of its cookie value, which opens nothing.
    fn logout_mac(&self, session: &str) -> String {
        self.sign("logout", session.as_bytes())
    }

    fn is_revoked(&self, session: &str) -> bool {
        let mac = self.logout_mac(session);
        self.revoked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&mac)
    }

    fn mac(&self, purpose: &str, value: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(self.token.expose().as_bytes())
            .expect("HMAC takes keys of any length");
        mac.update(purpose.as_bytes());
        mac.update(&[0]);
        mac.update(value);
        mac
    }

    fn sign(&self, purpose: &str, value: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(self.mac(purpose, value).finalize().into_bytes())
    }

    fn verify(&self, purpose: &str, value: &[u8], signature: &str) -> bool {
        URL_SAFE_NO_PAD
            .decode(signature)
            .is_ok_and(|sig| self.mac(purpose, value).verify_slice(&sig).is_ok())
    }

    /// Whether `presented` is `ADMIN_TOKEN`, compared in constant time
    /// (through the MACs of both).
    pub(super) fn token_matches(&self, presented: &str) -> bool {
        let expected = self.mac("login", self.token.expose().as_bytes()).finalize();
        self.mac("login", presented.as_bytes())
            .verify_slice(&expected.into_bytes())
            .is_ok()
    }

    /// A new session cookie value, valid for [`SESSION_TTL`].
    pub(super) fn new_session(&self) -> String {
        static ISSUED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let expires = Utc::now().timestamp() + SESSION_TTL.as_secs() as i64;
        // Unique per login, so that revoking one session ends no other
        // issued in the same second.
        let nth = ISSUED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = Utc::now().timestamp_subsec_nanos();
        let value = format!("{expires}~{nanos:x}{nth:x}");
        format!("{value}.{}", self.sign("session", value.as_bytes()))
    }

    /// Whether `session` is a cookie value this token issued and it has
    /// not expired.
    pub(super) fn session_valid(&self, session: &str) -> bool {
        self.expiry(session).is_some() && !self.is_revoked(session)
    }

    /// The expiry of `session` if this token issued it and it has not
    /// expired (revoked or not).
    fn expiry(&self, session: &str) -> Option<i64> {
        let (value, signature) = session.split_once('.')?;
        let expires = value.split_once('~').map_or(value, |(expires, _)| expires);
        let at = expires.parse::<i64>().ok()?;
        (at > Utc::now().timestamp() && self.verify("session", value.as_bytes(), signature))
            .then_some(at)
    }

    /// The CSRF token of a session.
    pub(super) fn csrf(&self, session: &str) -> String {
        self.sign("csrf", session.as_bytes())
    }

    /// Whether `csrf` is the CSRF token of `session`.
    pub(super) fn csrf_valid(&self, session: &str, csrf: &str) -> bool {
        self.verify("csrf", session.as_bytes(), csrf)
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Who is asking.
pub(super) fn access(admin: Option<&Admin>, headers: &HeaderMap) -> Access {
    let Some(admin) = admin else {
        return Access::ReadOnly;
    };
    match cookie(headers, COOKIE).filter(|s| admin.session_valid(s)) {
        Some(session) => Access::Admin {
            csrf: admin.csrf(session),
        },
        None => Access::LoggedOut,
    }
}

/// Whether the request comes from this site: a browser names the origin of
/// a form POST (`Origin`) and whether it is cross-site (`Sec-Fetch-Site`);
/// a request without either (a script, `curl`) still needs the session and
/// its CSRF token.
pub(super) fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site"))
        && !matches!(site, "same-origin" | "none")
    {
        return false;
    }
    match (text(header::ORIGIN), text(header::HOST)) {
        (None, _) => true,
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host)),
        (Some(_), None) => false,
    }
}

/// Checks a write request: `ADMIN_TOKEN` set, same origin, a valid session
/// and its CSRF token in the form's `csrf` field.
pub(super) fn authorize_write(
    admin: Option<&Admin>,
    headers: &HeaderMap,
    csrf: Option<&str>,
) -> Result<(), Refusal> {
    let admin = admin.ok_or(Refusal::ReadOnly)?;
    if !same_origin(headers) {
        return Err(Refusal::CrossSite);
    }
    let session = cookie(headers, COOKIE)
        .filter(|s| admin.session_valid(s))
        .ok_or(Refusal::NotLoggedIn)?;
    match csrf {
        Some(csrf) if admin.csrf_valid(session, csrf) => Ok(()),
        _ => Err(Refusal::BadCsrf),
    }
}

/// The `Set-Cookie` value that starts a session; `secure` when the browser
/// came over HTTPS, so it never sends the cookie over plain HTTP.
pub(super) fn session_cookie(session: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={session}; Path=/console; Max-Age={}; HttpOnly; SameSite=Strict{}",
        SESSION_TTL.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that ends a session.
pub(super) fn cleared_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/console; Max-Age=0; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn admin(token: &str) -> Admin {
        Admin::new(AdminToken::parse(token).unwrap())
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn sessions_and_csrf_tokens_are_bound_to_the_admin_token() {
        let a = admin("0123456789abcdef-one");
        let b = admin("0123456789abcdef-two");
        assert!(a.token_matches("0123456789abcdef-one"));
        assert!(!a.token_matches("0123456789abcdef-on"));
        assert!(!a.token_matches(""));
        let session = a.new_session();
        assert!(a.session_valid(&session));
        assert!(!b.session_valid(&session), "another token's session");
        assert!(!a.session_valid("9999999999.forged"));
        let (value, sig) = session.split_once('.').unwrap();
        let (expires, nonce) = value.split_once('~').unwrap();
        let later = format!("{}~{nonce}.{sig}", expires.parse::<i64>().unwrap() + 3600);
        assert!(!a.session_valid(&later), "the expiry is signed");
        let expired = format!("1.{}", a.sign("session", b"1"));
        assert!(!a.session_valid(&expired));
        let csrf = a.csrf(&session);
        assert!(a.csrf_valid(&session, &csrf));
        assert!(!a.csrf_valid(&a.new_session().replace('.', ".x"), &csrf));
        assert!(!b.csrf_valid(&session, &csrf));
        let (mac, until) = a.revoke(&session).expect("a real session is recorded");
        assert!(!a.session_valid(&session), "logged out");
        // Another replica (the same token) learns the logout from the
        // record and refuses the session too.
        let replica = admin("0123456789abcdef-one");
        assert!(replica.session_valid(&session));
        replica.learn([(mac.clone(), until)]);
        assert!(!replica.session_valid(&session), "logged out elsewhere");
        assert!(!mac.contains(session.split_once('.').unwrap().1), "{mac}");
        assert!(
            a.session_valid(&a.new_session()),
            "a new login in the same second"
        );
        assert_eq!(a.revoke("9999999999.forged"), None);
        assert_eq!(
            a.revoked.lock().unwrap().len(),
            1,
            "only real sessions recorded"
        );
    }

    #[test]
    fn a_write_needs_the_token_a_session_its_csrf_and_this_origin() {
        let a = admin("0123456789abcdef-one");
        let session = a.new_session();
        let csrf = a.csrf(&session);
        let cookie = format!("other=1; {COOKIE}={session}");
        let good = headers(&[
            ("cookie", &cookie),
            ("origin", "http://console.local:9464"),
            ("host", "console.local:9464"),
            ("sec-fetch-site", "same-origin"),
        ]);
        assert_eq!(authorize_write(Some(&a), &good, Some(&csrf)), Ok(()));
        assert_eq!(
            authorize_write(None, &good, Some(&csrf)),
            Err(Refusal::ReadOnly)
        );
        assert_eq!(
            authorize_write(Some(&a), &good, None),
            Err(Refusal::BadCsrf)
        );
        assert_eq!(
            authorize_write(Some(&a), &good, Some("x")),
            Err(Refusal::BadCsrf)
        );
        let no_cookie = headers(&[("host", "console.local:9464")]);
        assert_eq!(
            authorize_write(Some(&a), &no_cookie, Some(&csrf)),
            Err(Refusal::NotLoggedIn)
        );
        let elsewhere = headers(&[
            ("cookie", &cookie),
            ("origin", "https://evil.example"),
            ("host", "console.local:9464"),
        ]);
        assert_eq!(
            authorize_write(Some(&a), &elsewhere, Some(&csrf)),
            Err(Refusal::CrossSite)
        );
        let cross = headers(&[("cookie", &cookie), ("sec-fetch-site", "cross-site")]);
        assert_eq!(
            authorize_write(Some(&a), &cross, Some(&csrf)),
            Err(Refusal::CrossSite)
        );
        assert_eq!(access(Some(&a), &good), Access::Admin { csrf });
        assert_eq!(access(Some(&a), &no_cookie), Access::LoggedOut);
        assert_eq!(access(None, &good), Access::ReadOnly);
    }
}
