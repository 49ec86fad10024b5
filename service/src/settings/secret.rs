//! Credentials as a type: a connection URL that may carry a password.

use std::fmt;

use serde::Deserialize;

/// A connection URL (`AMQP_URL`, `DATABASE_URL`, `INVENTORY_URL`) that may
/// carry a password. `Debug` and `Display` show it with the password
/// replaced by `***`, so settings, spans and error messages can print it
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

/// A URL with its password replaced by `***`, for logs and error messages.
/// A comma-separated list of URLs (several broker nodes in `AMQP_URL`) is
/// redacted URL by URL.
pub fn redact_url(raw: &str) -> String {
    raw.split(',').map(redact_one).collect::<Vec<_>>().join(",")
}

fn redact_one(raw: &str) -> String {
    match url::Url::parse(raw.trim()) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        Ok(url) => url.to_string(),
        Err(_) => "<unparseable url>".into(),
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
}
