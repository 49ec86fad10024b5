//! TLS to the database, configured by `DATABASE_URL`'s query parameters as
//! sqlx reads them (rustls with ring underneath):
//!
//! - PostgreSQL: `sslmode` (`disable`, `prefer`, `require`, `verify-ca`,
//!   `verify-full`), `sslrootcert` (CA file), `sslcert` + `sslkey` (client
//!   certificate); `PGSSLMODE` and friends apply as in libpq.
//! - MySQL/MariaDB: `ssl-mode` (`DISABLED`, `PREFERRED`, `REQUIRED`,
//!   `VERIFY_CA`, `VERIFY_IDENTITY`), `ssl-ca`, `ssl-cert` + `ssl-key`.
//!
//! Two rules of this service on top of sqlx's:
//! - **Plaintext unless the URL asks for TLS.** sqlx (like libpq) defaults
//!   to `prefer`: TLS without verifying anything whenever the server offers
//!   it. A URL without a mode (and, for PostgreSQL, no `PGSSLMODE`) connects
//!   in plaintext here, as it did before TLS was built in, so existing
//!   deployments and the benchmarks see no change.
//! - **A CA or client certificate needs a mode.** `sslrootcert` without
//!   `sslmode` would otherwise mean `prefer`, which does not verify against
//!   it; such a URL is refused with the parameter's name.
//!
//! The files the URL names are checked once when the options are built
//! (start-up), so that a wrong path stops the service with the parameter's
//! name; sqlx reads them again for every new connection.

use std::path::Path;

use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use super::StoreError;
use crate::settings::SecretUrl;
use crate::tls::{check_certificates, check_private_key, read_certificates, read_private_key};

/// What a parameter of `DATABASE_URL` is about.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Param {
    Mode,
    Certificates,
    Key,
}

fn pg_param(key: &str) -> Option<Param> {
    match key {
        "sslmode" | "ssl-mode" => Some(Param::Mode),
        "sslrootcert" | "ssl-root-cert" | "ssl-ca" | "sslcert" | "ssl-cert" => {
            Some(Param::Certificates)
        }
        "sslkey" | "ssl-key" => Some(Param::Key),
        _ => None,
    }
}

fn mysql_param(key: &str) -> Option<Param> {
    match key {
        "sslmode" | "ssl-mode" => Some(Param::Mode),
        "sslca" | "ssl-ca" | "sslcert" | "ssl-cert" => Some(Param::Certificates),
        "sslkey" | "ssl-key" => Some(Param::Key),
        _ => None,
    }
}

/// Whether `url` names a TLS mode, after checking the files it names.
fn names_a_mode(
    url: &SecretUrl,
    classify: fn(&str) -> Option<Param>,
    mode_from_env: bool,
) -> Result<bool, StoreError> {
    let parsed = url::Url::parse(url.expose()).map_err(|e| StoreError::Url {
        url: url.clone(),
        error: sqlx::Error::Configuration(e.into()),
    })?;
    let mut mode = mode_from_env;
    let mut files = Vec::new();
    for (key, value) in parsed.query_pairs() {
        match classify(&key) {
            Some(Param::Mode) => mode = true,
            Some(param) => files.push((key.into_owned(), value.into_owned(), param)),
            None => {}
        }
    }
    if let (false, Some((param, _, _))) = (mode, files.first()) {
        return Err(StoreError::TlsWithoutMode {
            url: url.clone(),
            param: param.clone(),
        });
    }
    for (key, value, param) in &files {
        check_file(&format!("DATABASE_URL {key}"), value, *param)?;
    }
    Ok(mode)
}

/// The query parameters sqlx reads from a PostgreSQL URL (`options[…]` too).
const PG_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "application_name",
    "options",
];

/// The query parameters sqlx reads from a MySQL URL.
const MYSQL_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslca",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "charset",
    "collation",
    "statement-cache-capacity",
    "socket",
    "timezone",
    "time-zone",
];

/// `url` with only the query parameters sqlx reads (`known`), and the
/// password a `password=` parameter gives (libpq's form; read here for MySQL
/// too, which sqlx would ignore). Any other parameter is dropped with a
/// warning that names it but never shows its value: sqlx itself logs
/// unrecognized PostgreSQL parameters *with* their values, which would print
/// an `sslpassword=`. `sslpassword` is refused: it decrypts an encrypted
/// client key, and keys are read unencrypted only.
fn known_params(url: &SecretUrl, known: &[&str]) -> Result<(String, Option<String>), StoreError> {
    let mut parsed = url::Url::parse(url.expose()).map_err(|e| StoreError::Url {
        url: url.clone(),
        error: sqlx::Error::Configuration(e.into()),
    })?;
    let mut kept = Vec::new();
    let mut password = None;
    for (key, value) in parsed.query_pairs() {
        if key == "sslpassword" {
            return Err(StoreError::Url {
                url: url.clone(),
                error: sqlx::Error::Configuration(
                    "sslpassword: encrypted client keys are not supported; give sslkey as an \
                     unencrypted PEM file"
                        .into(),
                ),
            });
        }
        if key == "password" {
            password = Some(value.into_owned());
        } else if known.contains(&key.as_ref()) || key.starts_with("options[") {
            kept.push((key.into_owned(), value.into_owned()));
        } else {
            tracing::warn!(param = %key, "ignoring a DATABASE_URL parameter this service does not use");
        }
    }
    if kept.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(&kept);
    }
    Ok((parsed.to_string(), password))
}

/// Checks a file parameter's value: a path, or (as sqlx accepts) the PEM
/// text itself.
fn check_file(setting: &str, value: &str, param: Param) -> Result<(), StoreError> {
    let inline = value.trim_start().starts_with("-----BEGIN");
    let result = match (param, inline) {
        (Param::Certificates, true) => {
            check_certificates(setting, Path::new("(inline PEM)"), value.as_bytes())
        }
        (Param::Certificates, false) => read_certificates(setting, Path::new(value)).map(drop),
        (_, true) => check_private_key(setting, Path::new("(inline PEM)"), value.as_bytes()),
        (_, false) => read_private_key(setting, Path::new(value)).map(drop),
    };
    result.map_err(StoreError::Tls)
}

/// `DATABASE_URL` as PostgreSQL connect options, with this service's TLS
/// rules (see the module): plaintext unless the URL or `PGSSLMODE` names an
/// `sslmode`, the files it names checked. The tools connect with these too,
/// so the demo and the bench talk to the database as the service does.
#[tracing::instrument(skip_all, fields(url = %url))]
pub fn pg_options(url: &SecretUrl) -> Result<PgConnectOptions, StoreError> {
    let mode_from_env = std::env::var_os("PGSSLMODE").is_some();
    let named = names_a_mode(url, pg_param, mode_from_env)?;
    let (known, password) = known_params(url, PG_PARAMS)?;
    let options = known
        .parse::<PgConnectOptions>()
        .map_err(|error| StoreError::Url {
            url: url.clone(),
            error,
        })?;
    let options = match password {
        Some(password) => options.password(&password),
        None => options,
    };
    Ok(if named {
        options
    } else {
        options.ssl_mode(PgSslMode::Disable)
    })
}

/// `DATABASE_URL` as MySQL/MariaDB connect options, with this service's TLS
/// rules (see the module): plaintext unless the URL names an `ssl-mode`, the
/// files it names checked.
#[tracing::instrument(skip_all, fields(url = %url))]
pub fn mysql_options(url: &SecretUrl) -> Result<MySqlConnectOptions, StoreError> {
    let named = names_a_mode(url, mysql_param, false)?;
    let (known, password) = known_params(url, MYSQL_PARAMS)?;
    let options = known
        .parse::<MySqlConnectOptions>()
        .map_err(|error| StoreError::Url {
            url: url.clone(),
            error,
        })?;
    let options = match password {
        Some(password) => options.password(&password),
        None => options,
    };
    Ok(if named {
        options
    } else {
        options.ssl_mode(MySqlSslMode::Disabled)
    })
}

#[cfg(test)]
mod tests {
    use sqlx::ConnectOptions;

    use super::*;

    #[test]
    fn a_password_parameter_is_read_and_other_unknown_parameters_dropped() {
        let url: SecretUrl =
            "postgres://u@db:5432/shop?password=Pw1&application_name=x&bogus=Pw2".into();
        let (known, password) = known_params(&url, PG_PARAMS).unwrap();
        assert_eq!(known, "postgres://u@db:5432/shop?application_name=x");
        assert_eq!(password.as_deref(), Some("Pw1"));
        let (known, password) = known_params(&"mysql://u@db/shop".into(), MYSQL_PARAMS).unwrap();
        assert_eq!((known.as_str(), password), ("mysql://u@db/shop", None));
        let err = pg_options(&"postgres://u@db/shop?sslpassword=Pw3".into()).unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.contains("sslpassword") && !shown.contains("Pw3"),
            "{shown}"
        );
    }

    #[test]
    fn without_a_mode_the_connection_is_plaintext() {
        // (PGSSLMODE is not set where the tests run.)
        if std::env::var_os("PGSSLMODE").is_none() {
            let pg = pg_options(&"postgres://u:p@db:5432/shop".into()).unwrap();
            assert!(matches!(pg.get_ssl_mode(), PgSslMode::Disable));
        }
        let my = mysql_options(&"mysql://u:p@db:3306/shop".into()).unwrap();
        // MySqlConnectOptions has no getter for the mode: its URL form says it.
        assert!(
            my.to_url_lossy().as_str().contains("ssl-mode=DISABLED"),
            "{}",
            my.to_url_lossy()
        );
    }

    #[test]
    fn a_named_mode_is_kept() {
        let pg = pg_options(&"postgres://db/shop?sslmode=require".into()).unwrap();
        assert!(matches!(pg.get_ssl_mode(), PgSslMode::Require));
        let pg = pg_options(&"postgres://db/shop?sslmode=prefer".into()).unwrap();
        assert!(matches!(pg.get_ssl_mode(), PgSslMode::Prefer));
        let my = mysql_options(&"mysql://db/shop?ssl-mode=REQUIRED".into()).unwrap();
        assert!(my.to_url_lossy().as_str().contains("ssl-mode=REQUIRED"));
    }

    #[test]
    fn a_ca_without_a_mode_is_refused() {
        if std::env::var_os("PGSSLMODE").is_some() {
            return;
        }
        // Checked before the file: the mode is the mistake to report.
        let err = pg_options(&"postgres://u:s3cret@db/shop?sslrootcert=/nonexistent/ca.pem".into())
            .unwrap_err();
        let shown = err.to_string();
        assert!(matches!(err, StoreError::TlsWithoutMode { .. }), "{shown}");
        assert!(shown.contains("sslrootcert"), "{shown}");
        assert!(err.is_config());
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn a_missing_file_names_the_parameter() {
        let err = mysql_options(
            &"mysql://db/shop?ssl-mode=VERIFY_IDENTITY&ssl-ca=/nonexistent/ca.pem".into(),
        )
        .unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.contains("DATABASE_URL ssl-ca: cannot read /nonexistent/ca.pem"),
            "{shown}"
        );
        assert!(err.is_config());
    }
}
