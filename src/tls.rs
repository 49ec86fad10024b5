//! What the broker and the database connections share about TLS: the one
//! rustls crypto provider (ring) and the checks of the PEM files a URL names,
//! so that a missing file, an unreadable one or one without a certificate or
//! key stops the service at start-up with the setting's name, rather than
//! showing up later as a failed handshake.
//!
//! Which files and modes apply is each URL's business: `broker/tls.rs` reads
//! `AMQP_URL`'s `cacertfile`/`certfile`/`keyfile`, `store/tls.rs`
//! `DATABASE_URL`'s `sslrootcert`/`sslcert`/`sslkey` (`ssl-ca`, …).

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Makes ring the process-wide rustls crypto provider, once, at start-up
/// (`main` of both binaries).
///
/// Today ring is the only provider in the dependency graph, so rustls would
/// pick it anyway; installing it explicitly keeps it so if a dependency ever
/// enables aws-lc-rs as well (rustls then refuses to choose and panics in
/// `ClientConfig::builder()`, and lapin's connector would switch to aws-lc).
/// sqlx passes ring explicitly and does not depend on this. Calling it again,
/// or after another provider was installed, does nothing.
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A PEM file named by a setting that cannot be used. `setting` names the
/// URL and its parameter, e.g. `AMQP_URL cacertfile` or
/// `DATABASE_URL sslrootcert`.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// The file cannot be read (missing, permissions, …).
    #[error("{setting}: cannot read {path}: {error}")]
    Read {
        /// The URL and parameter that name the file.
        setting: String,
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        error: std::io::Error,
    },
    /// The file is not valid PEM (a broken base64 block, a truncated file).
    #[error("{setting}: {path} is not valid PEM: {reason}")]
    InvalidPem {
        /// The URL and parameter that name the file.
        setting: String,
        /// The file.
        path: PathBuf,
        /// The PEM parser's complaint.
        reason: String,
    },
    /// The file holds no `CERTIFICATE` block.
    #[error("{setting}: {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate {
        /// The URL and parameter that name the file.
        setting: String,
        /// The file.
        path: PathBuf,
    },
    /// A `CERTIFICATE` block that is not an X.509 certificate rustls can
    /// use as a trust anchor.
    #[error("{setting}: {path} holds a certificate that cannot be used as a CA: {reason}")]
    InvalidCertificate {
        /// The URL and parameter that name the file.
        setting: String,
        /// The file.
        path: PathBuf,
        /// Why not.
        reason: String,
    },
    /// The file holds no private key rustls reads: an unencrypted PKCS#8,
    /// PKCS#1 (RSA) or SEC1 (EC) PEM block.
    #[error(
        "{setting}: {path} holds no private key (expected an unencrypted PKCS#8, PKCS#1 or SEC1 PEM block)"
    )]
    NoKey {
        /// The URL and parameter that name the file.
        setting: String,
        /// The file.
        path: PathBuf,
    },
}

fn read(setting: &str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|error| TlsFileError::Read {
        setting: setting.to_owned(),
        path: path.to_owned(),
        error,
    })
}

/// Reads a PEM file of certificates (a CA bundle or a client certificate
/// chain) and returns its text, after checking that it holds at least one
/// certificate and nothing unparsable.
pub(crate) fn read_certificates(setting: &str, path: &Path) -> Result<String, TlsFileError> {
    let bytes = read(setting, path)?;
    check_certificates(setting, path, &bytes)?;
    String::from_utf8(bytes).map_err(|e| TlsFileError::InvalidPem {
        setting: setting.to_owned(),
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Checks PEM text of certificates: at least one, each one parsable as a
/// trust anchor.
pub(crate) fn check_certificates(
    setting: &str,
    path: &Path,
    pem_bytes: &[u8],
) -> Result<(), TlsFileError> {
    let certs = CertificateDer::pem_slice_iter(pem_bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsFileError::InvalidPem {
            setting: setting.to_owned(),
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsFileError::NoCertificate {
            setting: setting.to_owned(),
            path: path.to_owned(),
        });
    }
    for cert in &certs {
        webpki_anchor(cert).map_err(|reason| TlsFileError::InvalidCertificate {
            setting: setting.to_owned(),
            path: path.to_owned(),
            reason,
        })?;
    }
    Ok(())
}

fn webpki_anchor(cert: &CertificateDer<'_>) -> Result<(), String> {
    let mut store = rustls::RootCertStore::empty();
    store.add(cert.clone()).map_err(|e| e.to_string())
}

/// Reads a PEM private key file and returns its bytes, after checking that
/// rustls can use it.
pub(crate) fn read_private_key(setting: &str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    let bytes = read(setting, path)?;
    check_private_key(setting, path, &bytes)?;
    Ok(bytes)
}

/// Checks PEM text holding a private key.
pub(crate) fn check_private_key(
    setting: &str,
    path: &Path,
    pem_bytes: &[u8],
) -> Result<(), TlsFileError> {
    match PrivateKeyDer::from_pem_slice(pem_bytes) {
        Ok(_) => Ok(()),
        Err(pem::Error::NoItemsFound) => Err(TlsFileError::NoKey {
            setting: setting.to_owned(),
            path: path.to_owned(),
        }),
        Err(e) => Err(TlsFileError::InvalidPem {
            setting: setting.to_owned(),
            path: path.to_owned(),
            reason: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, contents: &[u8]) -> PathBuf {
        let path = std::env::temp_dir().join(format!("ot-tls-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        path
    }

    #[test]
    fn a_missing_file_names_the_setting_and_the_path() {
        let err =
            read_certificates("AMQP_URL cacertfile", Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(matches!(err, TlsFileError::Read { .. }), "{err:?}");
        let shown = err.to_string();
        assert!(
            shown.starts_with("AMQP_URL cacertfile: cannot read /nonexistent/ca.pem"),
            "{shown}"
        );
    }

    #[test]
    fn a_file_without_a_certificate_or_key_is_refused() {
        let text = temp_file("text.pem", b"just some text\n");
        let err = read_certificates("DATABASE_URL sslrootcert", &text).unwrap_err();
        assert!(matches!(err, TlsFileError::NoCertificate { .. }), "{err}");
        let err = read_private_key("AMQP_URL keyfile", &text).unwrap_err();
        assert!(matches!(err, TlsFileError::NoKey { .. }), "{err}");
        assert!(err.to_string().contains("AMQP_URL keyfile"), "{err}");
        let _ = std::fs::remove_file(text);
    }

    #[test]
    fn a_broken_pem_block_is_invalid_pem() {
        let broken = temp_file(
            "broken.pem",
            b"-----BEGIN CERTIFICATE-----\n%%%% not base64 %%%%\n-----END CERTIFICATE-----\n",
        );
        let err = read_certificates("AMQP_URL cacertfile", &broken).unwrap_err();
        assert!(matches!(err, TlsFileError::InvalidPem { .. }), "{err}");
        let _ = std::fs::remove_file(broken);
    }

    #[test]
    fn a_certificate_block_that_is_not_x509_is_refused() {
        // Valid base64, valid PEM framing, not a certificate.
        let bogus = temp_file(
            "bogus.pem",
            b"-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
        );
        let err = read_certificates("AMQP_URL cacertfile", &bogus).unwrap_err();
        assert!(
            matches!(err, TlsFileError::InvalidCertificate { .. }),
            "{err}"
        );
        let _ = std::fs::remove_file(bogus);
    }
}
