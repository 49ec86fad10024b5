//! Settings that contradict themselves are refused before anything runs,
//! with the key that is wrong: a status code that means two things, a window,
//! batch, pool, interval or database timeout of zero (AMQP reads a prefetch
//! of 0 as "no limit", PostgreSQL and MariaDB a timeout of 0 as "none";
//! a zero interval spins), a retry ceiling below its base. `serve`, `schema
//! check` and every other command load the settings through
//! [`super::Settings::load`], which calls [`Settings::validate`].
//!
//! Checks that need the database dialect (how many ids one statement can
//! carry) are the store's: `store::check_batch_sizes`, called by `serve` and
//! `schema check`.

use std::time::Duration;

use super::{ConfigError, Settings, StatusValue};

impl Settings {
    /// Refuses settings that contradict themselves, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_statuses()?;
        self.check_counts()?;
        self.check_durations()?;
        self.check_timers()?;
        self.check_lanes()?;
        Ok(())
    }

    /// Each lane once (two would be one queue declared twice over), and a
    /// handful at most: each is `lane_shards` queues.
    fn check_lanes(&self) -> Result<(), ConfigError> {
        if self.lanes.len() > super::lanes::MAX_LANES {
            return Err(invalid(
                "lanes",
                format!(
                    "{} lanes; at most {} (the other windows go through the cascade)",
                    self.lanes.len(),
                    super::lanes::MAX_LANES
                ),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(twice) = self.lanes.iter().find(|lane| !seen.insert(**lane)) {
            return Err(invalid("lanes", format!("{twice} is listed twice")));
        }
        Ok(())
    }

    /// `unpaid`, `paid` and `cancelled` are three different codes, and
    /// `set` does not write the status column: with `cancelled` equal to
    /// `unpaid`, every sweep would "cancel" the same live orders and release
    /// their stock again.
    fn check_statuses(&self) -> Result<(), ConfigError> {
        let o = &self.orders;
        let same = |a: &StatusValue, b: &StatusValue| a.as_text() == b.as_text();
        if same(&o.unpaid, &o.cancelled) {
            return Err(invalid(
                "[orders].cancelled",
                format!(
                    "{} is also [orders].unpaid: the cancel would leave orders unpaid",
                    o.cancelled
                ),
            ));
        }
        if let Some(paid) = &o.paid {
            for (key, other) in [
                ("[orders].unpaid", &o.unpaid),
                ("[orders].cancelled", &o.cancelled),
            ] {
                if same(paid, other) {
                    return Err(invalid(
                        "[orders].paid",
                        format!("{paid} is also {key}: the three status codes must differ"),
                    ));
                }
            }
        }
        if o.set.keys().any(|column| column == &o.status) {
            return Err(invalid(
                "[orders].set",
                format!(
                    "sets the status column {:?}, which the cancel writes itself ([orders].cancelled)",
                    o.status
                ),
            ));
        }
        Ok(())
    }

    /// Windows, batches, pools and concurrency limits of at least one.
    fn check_counts(&self) -> Result<(), ConfigError> {
        let counts: [(&'static str, u64); 8] = [
            ("prefetch", self.prefetch.into()),
            ("batch_max", self.batch_max as u64),
            ("batch_concurrency", self.batch_concurrency as u64),
            ("db_max_connections", self.db_max_connections.into()),
            ("inventory_concurrency", self.inventory_concurrency as u64),
            ("max_body_bytes", self.max_body_bytes as u64),
            ("[retry].max_attempts", self.retry.max_attempts.into()),
            ("[sweeper].batch", self.sweeper.batch.into()),
        ];
        for (key, value) in counts {
            if value == 0 {
                return Err(invalid(
                    key,
                    if key == "prefetch" {
                        "0 means no limit in AMQP: give a window of at least 1 (default 4000)"
                            .into()
                    } else {
                        "must be at least 1".into()
                    },
                ));
            }
        }
        Ok(())
    }

    /// Intervals and timeouts that a zero would turn into a busy loop or an
    /// instant failure, and a retry ceiling not below its base.
    fn check_durations(&self) -> Result<(), ConfigError> {
        let s = &self.sweeper;
        let mut positive: Vec<(&'static str, Duration)> = vec![
            ("inventory_timeout", self.inventory_timeout),
            ("db_lock_timeout", self.db_lock_timeout),
            ("db_statement_timeout", self.db_statement_timeout),
            ("outbox_lease", self.outbox_lease),
            ("[retry].base_delay", self.retry.base_delay),
            ("[retry].max_delay", self.retry.max_delay),
        ];
        if s.enabled {
            positive.push(("[sweeper].interval", s.interval));
            positive.push(("[sweeper].outbox_retention", s.outbox_retention));
            if !s.catch_up_window.is_zero() {
                positive.push(("[sweeper].catch_up_interval", s.catch_up_interval));
            }
        }
        for (key, value) in positive {
            if value.is_zero() {
                return Err(invalid(key, "must be longer than 0s".into()));
            }
        }
        if self.batch_linger > super::MAX_BATCH_LINGER {
            return Err(invalid(
                "batch_linger",
                format!(
                    "{} would make every order that late; at most {}",
                    humantime::format_duration(self.batch_linger),
                    humantime::format_duration(super::MAX_BATCH_LINGER)
                ),
            ));
        }
        if self.retry.max_delay < self.retry.base_delay {
            return Err(invalid(
                "[retry].max_delay",
                format!(
                    "{} is below [retry].base_delay ({})",
                    humantime::format_duration(self.retry.max_delay),
                    humantime::format_duration(self.retry.base_delay)
                ),
            ));
        }
        Ok(())
    }
}

fn invalid(key: &'static str, problem: String) -> ConfigError {
    ConfigError::Invalid { key, problem }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(toml: &str) -> String {
        let settings: Settings = toml::from_str(toml).unwrap();
        settings.validate().unwrap_err().to_string()
    }

    #[test]
    fn the_defaults_and_the_examples_are_valid() {
        Settings::default().validate().unwrap();
        for text in [
            include_str!("../../config/order-timeout.example.toml"),
            include_str!("../../config/examples/mall-mysql.toml"),
            include_str!("../../config/examples/litemall-mysql.toml"),
            include_str!("../../config/examples/saleor-postgres.toml"),
        ] {
            let settings: Settings = toml::from_str(text).unwrap();
            settings.validate().unwrap();
        }
    }

    #[test]
    fn status_codes_that_mean_two_things_are_refused() {
        let err = refused("[orders]\nunpaid = 0\ncancelled = 0\npaid = 1");
        assert!(err.contains("[orders].cancelled"), "{err}");
        let err = refused("[orders]\nunpaid = \"0\"\ncancelled = 0\npaid = 1");
        assert!(err.contains("[orders].cancelled"), "{err}");
        let err = refused("[orders]\nunpaid = 0\ncancelled = 4\npaid = 4");
        assert!(err.contains("[orders].paid"), "{err}");
        let err = refused("[orders]\nset = { status = \"'X'\" }");
        assert!(err.contains("[orders].set"), "{err}");
    }

    #[test]
    fn a_batch_linger_is_at_most_a_second_and_may_be_zero() {
        let err = refused("batch_linger = \"2s\"");
        assert!(err.contains("batch_linger") && err.contains("2s"), "{err}");
        for ok in [
            "batch_linger = \"0s\"",
            "batch_linger = \"1s\"",
            "batch_linger = \"15ms\"",
        ] {
            let settings: Settings = toml::from_str(ok).unwrap();
            settings.validate().unwrap();
        }
        let settings: Settings = toml::from_str("batch_linger = \"15ms\"").unwrap();
        assert_eq!(settings.batch_linger, Duration::from_millis(15));
    }

    #[test]
    fn zeros_are_refused_with_their_key() {
        for (toml, key) in [
            ("prefetch = 0", "prefetch"),
            ("batch_max = 0", "batch_max"),
            ("batch_concurrency = 0", "batch_concurrency"),
            ("db_max_connections = 0", "db_max_connections"),
            ("inventory_concurrency = 0", "inventory_concurrency"),
            ("[sweeper]\nbatch = 0", "[sweeper].batch"),
            ("[sweeper]\ninterval = \"0s\"", "[sweeper].interval"),
            (
                "[sweeper]\noutbox_retention = \"0s\"",
                "[sweeper].outbox_retention",
            ),
            (
                "[sweeper]\ncatch_up_interval = \"0s\"",
                "[sweeper].catch_up_interval",
            ),
            ("[retry]\nmax_attempts = 0", "[retry].max_attempts"),
            (
                "[retry]\nmax_delay = \"1s\"\nbase_delay = \"2s\"",
                "[retry].max_delay",
            ),
            ("outbox_lease = \"0s\"", "outbox_lease"),
            ("db_lock_timeout = \"0s\"", "db_lock_timeout"),
            ("db_statement_timeout = \"0s\"", "db_statement_timeout"),
        ] {
            let err = refused(toml);
            assert!(err.contains(key), "{toml}: {err}");
        }
        // What is off needs no interval.
        let off: Settings =
            toml::from_str("[sweeper]\nenabled = false\ninterval = \"0s\"").unwrap();
        off.validate().unwrap();
        let no_catch_up: Settings =
            toml::from_str("[sweeper]\ncatch_up_window = \"0s\"\ncatch_up_interval = \"0s\"")
                .unwrap();
        no_catch_up.validate().unwrap();
    }
}
