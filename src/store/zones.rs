//! **Which zone a timer's zone-less deadlines are read in, and why.**
//!
//! A `DATETIME` (MySQL, MariaDB) or `timestamp without time zone`
//! (PostgreSQL) holds a wall-clock time and no zone: the instant it stands
//! for is the one the shop meant when it wrote it, in the zone its session
//! ran in (`NOW() + INTERVAL 30 MINUTE` on a server on New York time is New
//! York time). The service reads such a deadline in its own session's zone,
//! so that zone must be the shop's:
//!
//! - `time_zone` configured: that zone, always ([`ZoneSource::Configured`]);
//! - not configured: the database's own default for new sessions, the zone
//!   the shop's ordinary sessions (and their `NOW()`) start in
//!   ([`ZoneSource::ServerDefault`]): the service sets no zone, its sessions
//!   keep that default. Where the server's sessions do not all start in one
//!   zone (PostgreSQL roles or databases with a `timezone` of their own, a
//!   MySQL `init_connect` that moves the service's session elsewhere), the
//!   service cannot know which one the shop writes in and refuses to start,
//!   naming the zones ([`decide`]).
//!
//! A deadline that names an instant (`timestamptz`, MySQL's `TIMESTAMP`,
//! seconds or milliseconds since the epoch) means the same in any zone.
//!
//! Zones with daylight saving repeat an hour in autumn and skip one in
//! spring. PostgreSQL reads an ambiguous or skipped wall-clock time as the
//! later instant; MySQL compares wall-clock times, so there the service
//! compares with a cutoff that no deadline is due before its later instant
//! ([`ZoneReport::shifts`], `mysql::statements`): never early, at most an
//! hour late around a change of offset.

use std::fmt;

/// Where the zone a timer's zone-less deadlines are read in comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneSource {
    /// `time_zone` in the timer's config.
    Configured,
    /// The database's default for new sessions (`time_zone` not set).
    ServerDefault,
}

/// What the timer's deadline is, as its type says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadlineKind {
    /// A wall-clock time with no zone (`DATETIME`, `timestamp`, `date`):
    /// read in the session's zone.
    ZoneLess,
    /// An instant (`timestamptz`, MySQL's `TIMESTAMP`, an epoch count): the
    /// same in any zone.
    Instant,
}

/// What the database says about its time zones (each dialect reads them:
/// `SqlDialect::zone_facts`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ZoneFacts {
    /// The zone of a session of the timer's pool, as the server names it.
    pub(crate) session: String,
    /// Its offset from UTC, in seconds, on 15 January and 15 July of this
    /// year (they differ in a zone with daylight saving).
    pub(crate) offsets: (i32, i32),
    /// The zone a session the service opens without setting one starts in:
    /// the server's default for new sessions, where `NOW()` runs for the
    /// shop's ordinary sessions.
    pub(crate) server: String,
    /// Zones other sessions of the database start in, and whose: each
    /// different from `server`.
    pub(crate) others: Vec<(String, String)>,
}

/// Which zone a timer's zone-less deadlines are read in, and why: what
/// `schema check` prints, the start-up log says and `explain` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneReport {
    /// The zone, as the server names it (`America/New_York`, `+08:00`,
    /// `SYSTEM (EST)`).
    pub zone: String,
    /// Why it is that zone.
    pub source: ZoneSource,
    /// The server's default for new sessions.
    pub server: String,
    /// The zone's offsets from UTC in January and July, in seconds.
    pub offsets: (i32, i32),
    /// What the deadline is.
    pub deadline: DeadlineKind,
}

impl ZoneReport {
    /// Whether the zone changes its offset during the year (daylight
    /// saving): zone-less times then repeat or skip an hour.
    pub fn shifts(&self) -> bool {
        self.offsets.0 != self.offsets.1
    }

    /// Whether releases before 0.3.0, whose default zone was UTC, read
    /// these deadlines otherwise: zone-less, no zone configured, and the
    /// server's default is not UTC.
    pub fn differs_from_utc_default(&self) -> bool {
        self.source == ZoneSource::ServerDefault
            && self.deadline == DeadlineKind::ZoneLess
            && self.offsets != (0, 0)
    }
}

/// `seconds` as a UTC offset: `+08:00`, `-05:00`, `+05:30`.
pub(crate) fn offset(seconds: i32) -> String {
    let sign = if seconds < 0 { '-' } else { '+' };
    let m = seconds.unsigned_abs() / 60;
    format!("{sign}{:02}:{:02}", m / 60, m % 60)
}

impl fmt::Display for ZoneReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (january, july) = self.offsets;
        let offsets = if self.shifts() {
            format!(
                "UTC{} in January, UTC{} in July",
                offset(january),
                offset(july)
            )
        } else {
            format!("UTC{} all year", offset(january))
        };
        match (self.deadline, self.source) {
            (DeadlineKind::Instant, _) => write!(
                f,
                "the deadline is an instant (its type has a zone): the same in any zone; the \
                 session's zone is {} ({offsets})",
                self.zone
            ),
            (DeadlineKind::ZoneLess, ZoneSource::Configured) => write!(
                f,
                "{} (configured: time_zone; {offsets}); the server's sessions start in {}",
                self.zone, self.server
            ),
            (DeadlineKind::ZoneLess, ZoneSource::ServerDefault) => write!(
                f,
                "{}: the database's default for new sessions, where its NOW() runs \
                 ({offsets}; time_zone is not set)",
                self.server
            ),
        }
    }
}

/// The zone a timer reads its deadlines in: `configured` (its
/// `time_zone`) when set; else the server's default, unless the deadline
/// is zone-less and the database's sessions do not all start in one zone
/// (then the problem, for the `time_zone` key, naming the zones).
pub(crate) fn decide(
    configured: Option<&str>,
    deadline: DeadlineKind,
    facts: &ZoneFacts,
) -> Result<ZoneReport, String> {
    let source = match configured {
        Some(_) => ZoneSource::Configured,
        None => ZoneSource::ServerDefault,
    };
    if source == ZoneSource::ServerDefault
        && deadline == DeadlineKind::ZoneLess
        && !facts.others.is_empty()
    {
        let others: Vec<String> = (facts.others.iter())
            .map(|(whose, zone)| format!("{zone} ({whose})"))
            .collect();
        return Err(format!(
            "not set, and the database's sessions do not all start in one time zone: the \
             service's start in {}, others in {}. The deadline has no zone (a wall-clock \
             time), so it must be read in the zone the shop writes it in: set time_zone to \
             that zone (the one its NOW() runs in)",
            facts.server,
            others.join(", ")
        ));
    }
    Ok(ZoneReport {
        // A configured zone as the config names it (PostgreSQL's own
        // spelling of an offset is the POSIX one, sign reversed).
        zone: configured.map_or_else(|| facts.session.clone(), str::to_owned),
        source,
        server: facts.server.clone(),
        offsets: facts.offsets,
        deadline,
    })
}

/// How a duration of `micros` reads to an operator: `4h 59m`, `27m 12s`,
/// `3s`.
pub(crate) fn readable(micros: i64) -> String {
    let s = micros.unsigned_abs() / 1_000_000;
    let (d, h, m, s) = (s / 86_400, s / 3_600 % 24, s / 60 % 60, s % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

/// The warning of `schema check` and the start-up log when every waiting
/// row is overdue by an hour or more although the deadline is zone-less:
/// rows written moments ago are not (they wait for their payment window),
/// so a whole table of them overdue by hours is the mark of a deadline
/// read in another zone than the one it was written in. `waiting` rows,
/// the newest due at `newest_us`, `now_us` the database's clock (UTC
/// microseconds).
pub(crate) fn overdue_warning(
    report: &ZoneReport,
    waiting: i64,
    newest_us: Option<i64>,
    now_us: i64,
) -> Option<String> {
    const HOUR_US: i64 = 3_600_000_000;
    let newest = newest_us?;
    if report.deadline != DeadlineKind::ZoneLess || waiting == 0 || now_us - newest < HOUR_US {
        return None;
    }
    let other = match report.source {
        ZoneSource::Configured => format!("the server's sessions start in {}", report.server),
        ZoneSource::ServerDefault => "time_zone is not set".to_owned(),
    };
    Some(format!(
        "every one of the {waiting} waiting rows is overdue, the newest by {} read in {}: if \
         rows written moments ago are among them, their deadlines are written in another zone \
         ({other}); set time_zone to the zone the shop writes them in, or every one of them is \
         cancelled at once, hours early",
        readable(now_us - newest),
        report.zone
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(others: &[(&str, &str)]) -> ZoneFacts {
        ZoneFacts {
            session: "America/New_York".into(),
            offsets: (-5 * 3600, -4 * 3600),
            server: "America/New_York".into(),
            others: (others.iter())
                .map(|(w, z)| ((*w).to_owned(), (*z).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn a_configured_zone_is_always_obeyed() {
        let disagreeing = facts(&[("role shop", "Europe/Berlin")]);
        for deadline in [DeadlineKind::ZoneLess, DeadlineKind::Instant] {
            let r = decide(Some("+08:00"), deadline, &disagreeing).unwrap();
            assert_eq!(r.source, ZoneSource::Configured);
            assert!(!r.differs_from_utc_default());
        }
    }

    #[test]
    fn without_one_the_servers_default_unless_its_sessions_disagree() {
        let r = decide(None, DeadlineKind::ZoneLess, &facts(&[])).unwrap();
        assert_eq!(r.source, ZoneSource::ServerDefault);
        assert_eq!(r.zone, "America/New_York");
        assert!(r.shifts());
        assert!(r.differs_from_utc_default());
        let problem = decide(
            None,
            DeadlineKind::ZoneLess,
            &facts(&[("role shop in this database", "Europe/Berlin")]),
        )
        .unwrap_err();
        assert!(
            problem.contains("America/New_York")
                && problem.contains("Europe/Berlin (role shop in this database)")
                && problem.contains("set time_zone"),
            "{problem}"
        );
        // An instant means the same in any zone: nothing to be unsure of.
        let instant = decide(
            None,
            DeadlineKind::Instant,
            &facts(&[("role shop", "Europe/Berlin")]),
        )
        .unwrap();
        assert!(!instant.differs_from_utc_default());
    }

    #[test]
    fn a_utc_server_reads_as_before() {
        let utc = ZoneFacts {
            session: "+00:00".into(),
            server: "+00:00".into(),
            ..ZoneFacts::default()
        };
        let r = decide(None, DeadlineKind::ZoneLess, &utc).unwrap();
        assert!(!r.differs_from_utc_default() && !r.shifts());
        assert!(r.to_string().contains("UTC+00:00 all year"), "{r}");
    }

    #[test]
    fn offsets_and_durations_read_as_people_write_them() {
        assert_eq!(offset(8 * 3600), "+08:00");
        assert_eq!(offset(-5 * 3600), "-05:00");
        assert_eq!(offset(5 * 3600 + 1800), "+05:30");
        assert_eq!(offset(0), "+00:00");
        assert_eq!(readable(17_940_000_000), "4h 59m");
        assert_eq!(readable(1_632_292_000), "27m 12s");
        assert_eq!(readable(3_000_000), "3s");
        assert_eq!(readable(90_000_000_000), "1d 1h");
    }

    #[test]
    fn the_overdue_warning_marks_a_table_overdue_by_hours() {
        let report = decide(None, DeadlineKind::ZoneLess, &facts(&[])).unwrap();
        let now = 1_800_000_000_000_000;
        let hours_ago = now - 5 * 3_600_000_000;
        let warning = overdue_warning(&report, 10, Some(hours_ago), now).unwrap();
        assert!(warning.contains("the newest by 5h 0m"), "{warning}");
        assert!(overdue_warning(&report, 10, Some(now - 60_000_000), now).is_none());
        assert!(overdue_warning(&report, 0, None, now).is_none());
        let instant = ZoneReport {
            deadline: DeadlineKind::Instant,
            ..report
        };
        assert!(overdue_warning(&instant, 10, Some(hours_ago), now).is_none());
    }
}
