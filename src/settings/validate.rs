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
        self.liveness.check()?;
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
        let counts: [(&'static str, u64); 13] = [
            ("prefetch", self.prefetch.into()),
            ("batch_max", self.batch_max as u64),
            ("batch_concurrency", self.batch_concurrency as u64),
            ("db_max_connections", self.db_max_connections.into()),
            ("inventory_concurrency", self.inventory_concurrency as u64),
            ("max_body_bytes", self.max_body_bytes as u64),
            ("[retry].max_attempts", self.retry.max_attempts.into()),
            ("[sweeper].batch", self.sweeper.batch.into()),
            ("[http].max_connections", self.http.max_connections as u64),
            (
                "[http].console_concurrency",
                self.http.console_concurrency as u64,
            ),
            (
                "[http].console_per_second",
                self.http.console_per_second.into(),
            ),
            ("[http].login_per_minute", self.http.login_per_minute.into()),
            (
                "[http].login_per_minute_total",
                self.http.login_per_minute_total.into(),
            ),
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
    /// instant failure; then their ceilings.
    fn check_durations(&self) -> Result<(), ConfigError> {
        let s = &self.sweeper;
        let mut positive: Vec<(&'static str, Duration)> = vec![
            ("inventory_timeout", self.inventory_timeout),
            ("db_lock_timeout", self.db_lock_timeout),
            ("db_statement_timeout", self.db_statement_timeout),
            ("outbox_lease", self.outbox_lease),
            ("[retry].base_delay", self.retry.base_delay),
            ("[retry].max_delay", self.retry.max_delay),
            ("[http].header_read_timeout", self.http.header_read_timeout),
            ("[http].request_timeout", self.http.request_timeout),
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
        self.check_duration_ceilings()
    }

    /// No duration past what the databases and the clock carry
    /// ([`MAX_DURATION`]), a batch linger within its bound, and a retry
    /// ceiling not below its base.
    fn check_duration_ceilings(&self) -> Result<(), ConfigError> {
        let s = &self.sweeper;
        let every: [(&'static str, Duration); 14] = [
            ("inventory_timeout", self.inventory_timeout),
            ("db_lock_timeout", self.db_lock_timeout),
            ("db_statement_timeout", self.db_statement_timeout),
            ("outbox_lease", self.outbox_lease),
            ("shutdown_timeout", self.shutdown_timeout),
            ("batch_linger", self.batch_linger),
            ("[retry].base_delay", self.retry.base_delay),
            ("[retry].max_delay", self.retry.max_delay),
            ("[sweeper].interval", s.interval),
            ("[sweeper].grace", s.grace),
            ("[sweeper].catch_up_window", s.catch_up_window),
            ("[sweeper].catch_up_interval", s.catch_up_interval),
            ("[sweeper].catch_up_grace", s.catch_up_grace),
            ("[sweeper].outbox_retention", s.outbox_retention),
        ];
        for (key, value) in every {
            if value > MAX_DURATION {
                return Err(invalid(
                    key,
                    format!(
                        "{} is longer than any timeout the databases and the clock can \
                         carry through (at most {})",
                        humantime::format_duration(value),
                        humantime::format_duration(MAX_DURATION)
                    ),
                ));
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

/// The longest duration any setting may have: 100 years. Every duration
/// becomes an interval in SQL (`now() + lease`), an instant on the clock
/// or a timer; far longer ones overflow one of them (a lease of 300
/// billion years fails every cancel statement).
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

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

    #[test]
    fn durations_no_clock_or_database_carries_are_refused_with_their_key() {
        for (toml, key) in [
            ("outbox_lease = \"300000000000years\"", "outbox_lease"),
            ("shutdown_timeout = \"101years\"", "shutdown_timeout"),
            ("[sweeper]\ngrace = \"1000years\"", "[sweeper].grace"),
            ("[retry]\nmax_delay = \"500years\"", "[retry].max_delay"),
        ] {
            let err = refused(toml);
            assert!(
                err.contains(key) && err.contains("longer than"),
                "{toml}: {err}"
            );
        }
        let settings: Settings =
            toml::from_str("[sweeper]\noutbox_retention = \"99years\"").unwrap();
        settings.validate().unwrap();
    }

    mod any_input {
        //! No config file makes any command panic: whatever the keys'
        //! values, it is refused with an error, or it is valid and every
        //! value derived from it (timers, lanes and the delay routes, the
        //! retry delays, the watch's lease, the pool) is computed without
        //! overflow.

        use proptest::prelude::*;

        use super::*;

        /// A duration as an operator might write one, or anything else.
        fn duration() -> impl Strategy<Value = String> {
            let unit = "(ns|us|ms|s|m|min|h|d|day|days|w|week|M|month|y|year|years)";
            let regex = |r: &str| prop::string::string_regex(r).expect("a valid regex");
            prop_oneof![
                8 => regex(&format!("[0-9]{{1,4}}{unit}")),
                2 => regex(&format!("[0-9]{{5,22}}{unit}")),
                1 => regex("[0-9]{1,6}(s|m|h) [0-9]{1,6}(s|ms)"),
                1 => regex(".{0,12}"),
                // The edges: a day, a century, and what overflows a
                // doubling, a chrono duration or u64 seconds.
                3 => prop::sample::select(vec![
                    "0s".to_owned(),
                    "1day".to_owned(),
                    "100years".to_owned(),
                    "300000000000years".to_owned(),
                    "584942417355years".to_owned(),
                    "18446744073709551615s".to_owned(),
                ]),
            ]
        }

        fn count() -> impl Strategy<Value = String> {
            prop_oneof![
                (0u64..5).prop_map(|n| n.to_string()),
                any::<i64>().prop_map(|n| n.to_string()),
                any::<u64>().prop_map(|n| n.to_string()),
            ]
        }

        /// One `key = value` line of a section, or a timer.
        fn line() -> impl Strategy<Value = (&'static str, String)> {
            let durations = prop::sample::select(vec![
                ("", "inventory_timeout"),
                ("", "db_lock_timeout"),
                ("", "db_statement_timeout"),
                ("", "outbox_lease"),
                ("", "shutdown_timeout"),
                ("", "batch_linger"),
                ("retry", "base_delay"),
                ("retry", "max_delay"),
                ("sweeper", "interval"),
                ("sweeper", "grace"),
                ("sweeper", "catch_up_window"),
                ("sweeper", "catch_up_interval"),
                ("sweeper", "catch_up_grace"),
                ("sweeper", "outbox_retention"),
            ]);
            let counts = prop::sample::select(vec![
                ("", "prefetch"),
                ("", "batch_max"),
                ("", "batch_concurrency"),
                ("", "db_max_connections"),
                ("", "inventory_concurrency"),
                ("", "max_body_bytes"),
                ("", "cascade_shards"),
                ("", "lane_shards"),
                ("retry", "max_attempts"),
                ("retry", "quick_retries"),
                ("sweeper", "batch"),
            ]);
            prop_oneof![
                (durations, duration())
                    .prop_map(|((section, key), v)| (section, format!("{key} = {v:?}"))),
                (counts, count()).prop_map(|((section, key), v)| (section, format!("{key} = {v}"))),
                prop::collection::vec(duration(), 0..3)
                    .prop_map(|lanes| ("", format!("lanes = {lanes:?}"))),
                duration().prop_map(|w| (
                    "timer",
                    format!(
                        "name = \"watched\"\nfrom = 2\nto = 3\ndeadline = \"due\"\nwatch = {w:?}"
                    )
                )),
                any::<bool>().prop_map(|b| ("sweeper", format!("enabled = {b}"))),
            ]
        }

        /// A config file of `lines`, each under its section.
        fn document(lines: &[(&'static str, String)]) -> String {
            let mut text = String::new();
            for (section, line) in lines.iter().filter(|(s, _)| s.is_empty()) {
                let _ = section;
                text.push_str(line);
                text.push('\n');
            }
            for name in ["retry", "sweeper"] {
                text.push_str(&format!("[{name}]\n"));
                for (_, line) in lines.iter().filter(|(s, _)| *s == name) {
                    text.push_str(line);
                    text.push('\n');
                }
            }
            for (_, line) in lines.iter().filter(|(s, _)| *s == "timer") {
                text.push_str("[[timers]]\n");
                text.push_str(line);
                text.push('\n');
            }
            text
        }

        /// What a running service derives from valid settings.
        fn derive(settings: &Settings) {
            let timers = settings.timers().expect("valid settings have timers");
            for timer in &timers {
                if let Some(window) = timer.watch {
                    let _ = crate::pipeline::watch::lease_for(window);
                    let _ = chrono::Duration::from_std(window);
                }
            }
            let layout = crate::broker::topology::Layout::of(settings);
            let _ = crate::broker::topology::queue_specs(&layout);
            for remaining_ms in [0, 1_500, 60_000, u64::MAX / 2, u64::MAX] {
                let _ = layout.route(remaining_ms, "202611210001");
            }
            let retry = crate::pipeline::retry::RetryPolicy::new(settings.retry.clone());
            for attempt in [0, 1, 2, 30, settings.retry.max_attempts, u32::MAX] {
                let _ = retry.next_delay(attempt);
                let _ = retry.outbox_delay(attempt);
            }
            let _ = retry.quick_backoff();
            let _ = crate::store::PoolSettings::of(settings);
            let _ = crate::store::check_batch_sizes(settings);
            for d in [
                settings.outbox_lease,
                settings.sweeper.outbox_retention,
                settings.sweeper.grace,
            ] {
                let at = chrono::Utc::now();
                let _ = chrono::Duration::from_std(d)
                    .ok()
                    .and_then(|d| at.checked_add_signed(d));
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2_000))]

            #[test]
            fn any_config_is_refused_or_valid_and_never_panics(
                lines in prop::collection::vec(line(), 0..12)
            ) {
                let text = document(&lines);
                let Ok(settings) = toml::from_str::<Settings>(&text) else {
                    return Ok(());
                };
                if settings.validate().is_ok() {
                    derive(&settings);
                }
            }
        }
    }

    #[test]
    fn a_watch_needs_a_window_of_a_second_to_a_day_and_the_sweeper() {
        let timer = |watch: &str| {
            format!(
                "[[timers]]\nname = \"receive\"\nfrom = 2\nto = 3\ndeadline = \"due\"\nwatch = \"{watch}\"\n"
            )
        };
        for (toml, words) in [
            (timer("300000000000years"), "longer than 1day"),
            (timer("2days"), "longer than 1day"),
            (timer("500ms"), "under 1s"),
            (
                format!("{}[sweeper]\nenabled = false\n", timer("1m")),
                "needs the sweeper",
            ),
        ] {
            let err = refused(&toml);
            assert!(
                err.starts_with("config [[timers]].watch: timer receive: ") && err.contains(words),
                "{toml}: {err}"
            );
        }
        for ok in ["1s", "1m", "24h"] {
            let settings: Settings = toml::from_str(&timer(ok)).unwrap();
            settings.validate().unwrap();
        }
    }
}
