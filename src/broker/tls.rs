//! `amqps://`: TLS to the broker, configured by each node URL's query
//! parameters, named as in RabbitMQ's URI query parameter spec (the Erlang
//! client's): managed brokers accept only TLS, often with a private CA and
//! sometimes with client certificates.
//!
//! | parameter    | meaning |
//! |--------------|---------|
//! | `cacertfile` | PEM file of CA certificates trusted for the broker's certificate, besides the bundled public roots (webpki-roots) |
//! | `certfile`   | PEM file of the client certificate (chain) to present |
//! | `keyfile`    | PEM file of its private key (unencrypted PKCS#8, PKCS#1 or SEC1) |
//! | `verify`     | `verify_peer` only (the default): the broker's certificate and host name are always verified |
//!
//! The broker's certificate must name the URL's host. lapin reads the other
//! query parameters (`heartbeat`, `auth_mechanism`, …) and ignores these.
//! The files are read on every (re)connect, so renewed certificates are
//! picked up without a restart; [`check`] reads them once at start-up so a
//! wrong path stops the service there instead of failing every reconnect.

use std::path::PathBuf;

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};

use crate::settings::redact_url;
use crate::tls::{TlsFileError, read_certificates, read_private_key};

/// The CA file parameter.
pub(crate) const CA_FILE: &str = "cacertfile";
/// The client certificate parameter.
pub(crate) const CERT_FILE: &str = "certfile";
/// The client key parameter.
pub(crate) const KEY_FILE: &str = "keyfile";
/// The verification parameter (only `verify_peer`).
pub(crate) const VERIFY: &str = "verify";

/// An `AMQP_URL` whose TLS parameters cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AmqpTlsError {
    /// A file a parameter names cannot be used.
    #[error(transparent)]
    File(#[from] TlsFileError),
    /// TLS parameters on a plaintext `amqp://` URL: they would be ignored,
    /// and the connection would not be encrypted.
    #[error(
        "AMQP_URL {url}: {param} is a TLS parameter but the URL is amqp:// (plaintext); use amqps://"
    )]
    NotTls {
        /// The node URL, password redacted.
        url: String,
        /// The parameter.
        param: &'static str,
    },
    /// `certfile` without `keyfile` or the other way round.
    #[error("AMQP_URL {url}: {given} needs {missing} too (a client certificate and its key)")]
    HalfIdentity {
        /// The node URL, password redacted.
        url: String,
        /// The parameter given.
        given: &'static str,
        /// The parameter missing.
        missing: &'static str,
    },
    /// `verify` other than `verify_peer`.
    #[error(
        "AMQP_URL {url}: verify={value} is not supported: the broker's certificate is always verified (verify_peer)"
    )]
    Verify {
        /// The node URL, password redacted.
        url: String,
        /// The value given.
        value: String,
    },
    /// The node URL does not parse.
    #[error("AMQP_URL {url}: {reason}")]
    Url {
        /// The node URL, password redacted.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
}

/// The TLS parameters of one node URL.
#[derive(Debug, Default, PartialEq, Eq)]
struct NodeTls {
    amqps: bool,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

impl NodeTls {
    fn of(node: &str) -> Result<Self, AmqpTlsError> {
        let shown = || redact_url(node);
        let url = url::Url::parse(node).map_err(|e| AmqpTlsError::Url {
            url: shown(),
            reason: e.to_string(),
        })?;
        let mut tls = Self {
            amqps: url.scheme() == "amqps",
            ..Self::default()
        };
        for (key, value) in url.query_pairs() {
            let param = match &*key {
                CA_FILE => {
                    tls.ca_file = Some(PathBuf::from(&*value));
                    CA_FILE
                }
                CERT_FILE => {
                    tls.cert_file = Some(PathBuf::from(&*value));
                    CERT_FILE
                }
                KEY_FILE => {
                    tls.key_file = Some(PathBuf::from(&*value));
                    KEY_FILE
                }
                VERIFY if value == "verify_peer" => VERIFY,
                VERIFY => {
                    return Err(AmqpTlsError::Verify {
                        url: shown(),
                        value: value.into_owned(),
                    });
                }
                _ => continue,
            };
            if !tls.amqps {
                return Err(AmqpTlsError::NotTls {
                    url: shown(),
                    param,
                });
            }
        }
        match (&tls.cert_file, &tls.key_file) {
            (Some(_), None) => Err(AmqpTlsError::HalfIdentity {
                url: shown(),
                given: CERT_FILE,
                missing: KEY_FILE,
            }),
            (None, Some(_)) => Err(AmqpTlsError::HalfIdentity {
                url: shown(),
                given: KEY_FILE,
                missing: CERT_FILE,
            }),
            _ => Ok(tls),
        }
    }

    /// Reads the files into lapin's TLS configuration.
    fn load(&self) -> Result<OwnedTLSConfig, AmqpTlsError> {
        let cert_chain = self
            .ca_file
            .as_deref()
            .map(|path| read_certificates("AMQP_URL cacertfile", path))
            .transpose()?;
        let identity = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some(OwnedIdentity::PKCS8 {
                pem: read_certificates("AMQP_URL certfile", cert)?.into_bytes(),
                key: read_private_key("AMQP_URL keyfile", key)?,
            }),
            _ => None,
        };
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }
}

/// lapin's TLS configuration for one node URL: empty for `amqp://` and for
/// `amqps://` without parameters (the bundled public roots, no client
/// certificate), else with the CA file and the client identity read.
#[tracing::instrument(skip_all, fields(node = %redact_url(node)))]
pub(crate) fn node_config(node: &str) -> Result<OwnedTLSConfig, AmqpTlsError> {
    NodeTls::of(node)?.load()
}

/// Reads the TLS files of every node of `AMQP_URL` once: a start-up check,
/// so that a wrong path or a file without a certificate stops the service
/// with the parameter's name.
pub(crate) fn check(urls: &str) -> Result<(), AmqpTlsError> {
    for node in super::broker_nodes(urls) {
        node_config(node)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_urls_need_no_tls() {
        let tls = NodeTls::of("amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10").unwrap();
        assert_eq!(tls, NodeTls::default());
        assert_eq!(
            node_config("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap(),
            OwnedTLSConfig::default()
        );
        assert_eq!(
            node_config("amqps://u:p@mq.example:5671/shop").unwrap(),
            OwnedTLSConfig::default(),
            "amqps without parameters: the bundled roots"
        );
    }

    #[test]
    fn the_parameters_are_read() {
        let tls = NodeTls::of(
            "amqps://u:p@mq:5671/shop?cacertfile=/etc/ca.pem&certfile=/etc/c.pem&keyfile=%2Fetc%2Fc.key&verify=verify_peer&heartbeat=5",
        )
        .unwrap();
        assert!(tls.amqps);
        assert_eq!(tls.ca_file, Some("/etc/ca.pem".into()));
        assert_eq!(tls.cert_file, Some("/etc/c.pem".into()));
        assert_eq!(tls.key_file, Some("/etc/c.key".into()));
    }

    #[test]
    fn tls_parameters_on_plaintext_urls_are_refused() {
        let err = NodeTls::of("amqp://u:s3cret@mq/%2f?cacertfile=/etc/ca.pem").unwrap_err();
        assert!(
            matches!(
                err,
                AmqpTlsError::NotTls {
                    param: "cacertfile",
                    ..
                }
            ),
            "{err}"
        );
        let shown = err.to_string();
        assert!(shown.contains("use amqps://"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn half_an_identity_and_verify_none_are_refused() {
        let err = NodeTls::of("amqps://mq/%2f?certfile=/c.pem").unwrap_err();
        assert!(
            matches!(
                err,
                AmqpTlsError::HalfIdentity {
                    given: "certfile",
                    missing: "keyfile",
                    ..
                }
            ),
            "{err}"
        );
        let err = NodeTls::of("amqps://mq/%2f?keyfile=/c.key").unwrap_err();
        assert!(
            matches!(
                err,
                AmqpTlsError::HalfIdentity {
                    given: "keyfile",
                    ..
                }
            ),
            "{err}"
        );
        let err = NodeTls::of("amqps://mq/%2f?verify=verify_none").unwrap_err();
        assert!(matches!(err, AmqpTlsError::Verify { .. }), "{err}");
    }

    #[test]
    fn a_missing_ca_file_names_the_parameter() {
        let err = check("amqp://a/%2f,amqps://b/%2f?cacertfile=/nonexistent/ca.pem").unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with("AMQP_URL cacertfile: cannot read /nonexistent/ca.pem"),
            "{shown}"
        );
    }
}
