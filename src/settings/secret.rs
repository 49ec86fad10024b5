//! Credentials as a type: a connection URL that may carry a password.

use std::fmt;

use serde::Deserialize;

/// A connection URL (`AMQP_URL`, `DATABASE_URL`, `INVENTORY_URL`) that may
/// carry a password (as userinfo or in a query parameter). `Debug` and
/// `Display` show it with every credential replaced by `***` ([`redact_url`]), so settings, spans and error messages can print it
/// freely; only [`SecretUrl::expose`] gives the real text, and only the code
/// that opens a connection calls it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "String")]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL with its password, to connect with. Never log this.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for SecretUrl {
    fn from(url: String) -> Self {
        Self(url)
    }
}

impl From<&str> for SecretUrl {
    fn from(url: &str) -> Self {
        Self(url.to_owned())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({:?})", redact_url(&self.0))
    }
}

/// A URL with every credential replaced by `***`, for logs and error
/// messages: the password of its userinfo (`user:***@host`) and the value of
/// every query parameter that carries one ([`is_secret_param`]: `password=`,
/// `sslpassword=`, tokens, inline key material). A comma-separated list of
/// URLs (several broker nodes in `AMQP_URL`) is redacted URL by URL; text
/// that does not parse as a URL is not shown at all.
pub fn redact_url(raw: &str) -> String {
    raw.split(',').map(redact_one).collect::<Vec<_>>().join(",")
}

fn redact_one(raw: &str) -> String {
    let Ok(mut url) = url::Url::parse(raw.trim()) else {
        return "<unparseable url>".into();
    };
    if url.cannot_be_a_base() {
        // `amqp:user:password@host`: no `//`, so no userinfo to redact —
        // the password is somewhere in the path. Show none of it.
        return format!("{}:<url without a host part>", url.scheme());
    }
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    }
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if pairs.iter().any(|(k, v)| is_secret_param(k, v)) {
        let mut query = url.query_pairs_mut();
        query.clear();
        for (key, value) in &pairs {
            let shown = if is_secret_param(key, value) {
                "***"
            } else {
                value.as_str()
            };
            query.append_pair(key, shown);
        }
    }
    url.to_string()
}

/// Whether a URL query parameter carries a credential: a password
/// (`password`, `sslpassword`, `pass`, `pwd`…), a secret, token or API key,
/// or key material given inline (a PEM block). File *paths* (`sslkey`,
/// `keyfile`) are not secrets and stay visible, so errors about them can name
/// the file.
pub fn is_secret_param(key: &str, value: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let named = [
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "api_key",
        "credential",
    ]
    .iter()
    .any(|word| key.contains(word))
        || matches!(
            key.as_str(),
            "pass" | "pwd" | "auth" | "key" | "private_key"
        );
    named || value.contains("-----BEGIN") || value.contains("PRIVATE KEY")
}

/// The console's write token (`ADMIN_TOKEN`): with it set, an operator who
/// presents it may replay and purge parked messages from the console.
/// `Debug` never shows it; only [`AdminToken::expose`] does, for the
/// console's signing and comparison.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// Shortest token accepted: a guessable token would open the write
    /// actions to anyone who can reach `HTTP_ADDR`.
    pub const MIN_LEN: usize = 16;

    /// Fewest different characters accepted: `aaaaaaaaaaaaaaaa`, sixteen
    /// spaces or `abababab…` are long enough and guessed at once. A random
    /// hex token of 16 characters has fewer than this with a chance below
    /// one in ten thousand.
    pub const MIN_DISTINCT: usize = 6;

    /// Checks a token's length and variety: refused, the service does not
    /// start (the error names `ADMIN_TOKEN`).
    pub fn parse(token: &str) -> Result<Self, String> {
        if token.chars().count() < Self::MIN_LEN {
            return Err(format!(
                "ADMIN_TOKEN must be at least {} characters (e.g. `openssl rand -hex 24`)",
                Self::MIN_LEN
            ));
        }
        let distinct: std::collections::BTreeSet<char> =
            token.chars().filter(|c| !c.is_whitespace()).collect();
        if distinct.len() < Self::MIN_DISTINCT {
            return Err(format!(
                "ADMIN_TOKEN is too easy to guess: it must use at least {} different characters besides spaces (e.g. `openssl rand -hex 24`)",
                Self::MIN_DISTINCT
            ));
        }
        Ok(Self(token.to_owned()))
    }

    /// The token itself. Never log this.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("amqp://guest:s3cret@host:5672/%2f"),
            "amqp://guest:***@host:5672/%2f"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1/db"),
            "postgres://postgres@127.0.0.1/db"
        );
        assert!(!redact_url("not a url s3cret").contains("s3cret"));
        assert_eq!(
            redact_url("amqp:guest:s3cret@localhost"),
            "amqp:<url without a host part>"
        );
    }

    #[test]
    fn credentials_in_query_parameters_are_redacted() {
        let shown = redact_url(
            "postgres://shop@db/shop?sslmode=verify-full&password=Pw1&sslpassword=Pw2&sslkey=/k.pem",
        );
        assert_eq!(
            shown,
            "postgres://shop@db/shop?sslmode=verify-full&password=***&sslpassword=***&sslkey=%2Fk.pem"
        );
        let shown =
            redact_url("mysql://u@db/shop?PASSWORD=Pw3&ssl-key=-----BEGIN%20PRIVATE%20KEY-----x");
        assert!(
            !shown.contains("Pw3") && !shown.contains("BEGIN"),
            "{shown}"
        );
        let shown = redact_url("amqps://u:Pw4@mq/%2f?access_token=Tk5&keyfile=/etc/k.pem");
        assert!(!shown.contains("Pw4") && !shown.contains("Tk5"), "{shown}");
        assert!(shown.contains("keyfile=%2Fetc%2Fk.pem"), "{shown}");
        // A URL without credentials is shown as it is.
        assert_eq!(
            redact_url("amqp://mq:5672/shop?heartbeat=10"),
            "amqp://mq:5672/shop?heartbeat=10"
        );
    }

    #[test]
    fn every_url_of_a_list_is_redacted() {
        let nodes = redact_url("amqp://u:p1@n1:5672/shop, amqp://u:p2@n2:5672/shop");
        assert_eq!(nodes, "amqp://u:***@n1:5672/shop,amqp://u:***@n2:5672/shop");
        assert!(!redact_url("amqp://u:p1@n1/x,garbage p2").contains("p2"));
    }

    #[test]
    fn debug_and_display_never_show_the_password() {
        let url = SecretUrl::new("postgres://shop:s3cret@db.internal:5432/shop");
        for shown in [format!("{url}"), format!("{url:?}"), format!("{:#?}", url)] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("shop:***@db.internal"), "{shown}");
        }
        assert_eq!(url.expose(), "postgres://shop:s3cret@db.internal:5432/shop");
        let settings = crate::settings::Settings {
            amqp_url: SecretUrl::new("amqp://u:hunter2@mq/%2f"),
            ..Default::default()
        };
        assert!(!format!("{settings:?}").contains("hunter2"));
    }

    #[test]
    fn the_admin_token_is_long_enough_and_never_shown() {
        assert!(AdminToken::parse("short").is_err());
        for weak in [
            "aaaaaaaaaaaaaaaa",
            "                ",
            "abababababababab",
            "12345123451234512345",
        ] {
            let refused = AdminToken::parse(weak).unwrap_err();
            assert!(refused.contains("ADMIN_TOKEN"), "{refused}");
        }
        let token = AdminToken::parse("0123456789abcdef-s3cret").unwrap();
        assert!(!format!("{token:?}").contains("s3cret"));
        assert_eq!(token.expose(), "0123456789abcdef-s3cret");
    }
}
