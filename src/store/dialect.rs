//! The SQL dialects the service speaks ([`Dialect`], picked by
//! `DATABASE_URL`'s scheme), and how many order ids one cancel transaction
//! of each can carry.

use super::StoreError;
use super::outbox::Vocabulary;
use super::{mysql, postgres};
use crate::settings::{ConfigError, SecretUrl, Settings};

/// How many order ids one cancel transaction of `dialect` can carry, so
/// that the settings can refuse a batch size over it: MySQL's statements
/// have at most 65,535 placeholders and the cancel transaction's outbox
/// insert binds four per order (16,383 ids); PostgreSQL binds the ids as
/// one array and the outbox rows as four, with no such limit
/// (`usize::MAX`).
pub fn max_batch_ids(dialect: Dialect) -> usize {
    match dialect {
        Dialect::Postgres => postgres::Postgres::MAX_BATCH_IDS,
        Dialect::MySql => mysql::MySql::MAX_BATCH_IDS,
    }
}

/// Refuses, naming the key, a batch size that one cancel transaction of
/// `DATABASE_URL`'s dialect cannot carry ([`max_batch_ids`]): the store
/// would split such a batch into several transactions, so the setting would
/// not mean what it says. A URL of no known dialect is left to
/// [`connect_lazy`], which names it.
pub(crate) fn check_batch_sizes(settings: &Settings) -> Result<(), ConfigError> {
    let Ok(dialect) = Dialect::of(&settings.database_url) else {
        return Ok(());
    };
    let max = max_batch_ids(dialect);
    let sizes: [(&'static str, usize); 2] = [
        ("batch_max", settings.batch_max),
        (
            "[sweeper].batch",
            usize::try_from(settings.sweeper.batch).unwrap_or(usize::MAX),
        ),
    ];
    for (key, value) in sizes {
        if value > max {
            return Err(ConfigError::Invalid {
                key,
                problem: format!(
                    "{value} orders per cancel transaction is over what one statement can carry \
                     on {dialect:?} ({max}: 65,535 placeholders, 4 per order)"
                ),
            });
        }
    }
    Ok(())
}

/// The SQL dialects the service speaks, picked by `DATABASE_URL`'s scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` (MySQL 5.7/8, MariaDB 10.x).
    MySql,
}

impl Dialect {
    /// The dialect of `url`.
    pub fn of(url: &SecretUrl) -> Result<Self, StoreError> {
        let scheme = url.expose().split_once("://").map(|(s, _)| s);
        match scheme {
            Some("postgres" | "postgresql") => Ok(Self::Postgres),
            Some("mysql" | "mariadb") => Ok(Self::MySql),
            _ => Err(StoreError::Scheme { url: url.clone() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_sizes_over_the_dialects_limit_are_refused_with_the_key() {
        let mut settings = Settings {
            database_url: SecretUrl::new("mysql://root@127.0.0.1/shop"),
            ..Settings::default()
        };
        settings.batch_max = max_batch_ids(Dialect::MySql);
        assert!(
            check_batch_sizes(&settings).is_ok(),
            "the limit itself fits"
        );
        settings.batch_max += 1;
        let err = check_batch_sizes(&settings).unwrap_err().to_string();
        assert!(err.starts_with("config batch_max: 16384 orders"), "{err}");
        settings.batch_max = 200;
        settings.sweeper.batch = 20_000;
        let err = check_batch_sizes(&settings).unwrap_err().to_string();
        assert!(err.starts_with("config [sweeper].batch: 20000"), "{err}");
        // PostgreSQL binds arrays: no such limit.
        settings.database_url = SecretUrl::new("postgres://postgres@127.0.0.1/shop");
        settings.sweeper.batch = 200;
        settings.batch_max = 100_000;
        assert!(check_batch_sizes(&settings).is_ok());
    }
}
