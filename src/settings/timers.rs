//! Timers: every timed transition of a row the service runs — a guarded
//! status flip in a table of the shop's when a deadline passes.
//!
//! The default timer, `cancel_unpaid`, is `[orders]`/`[items]`/`[inventory]`
//! exactly as they were (unpaid → cancelled, with `paid` told apart in the
//! metrics). Further timers are `[[timers]]` tables ([`TimerMapping`]):
//! auto-confirm receipt, auto-complete, coupon expiry, each with its own
//! table, status codes, deadline, guard, `set`, `also`, release and event.
//! [`Settings::timers`] turns both into one list of [`Timer`]s, the only
//! form the rest of the service sees.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::schema::{DeadlineUnit, ItemsMapping, OrdersMapping, Release, StatusValue};
use super::{ConfigError, Settings};

/// The default timer's name: cancel unpaid orders (`[orders]`).
pub const DEFAULT_TIMER: &str = "cancel_unpaid";

/// The routing key of the default timer's event on `order-timeout.events`.
pub const CANCELLED_EVENT: &str = "order.cancelled";

/// A timer's name, as messages (`"timer": "auto_receive"`), events, metrics
/// labels and `backfill --timer` spell it: `[a-z0-9_]{1,64}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerName(String);

impl TimerName {
    /// Parses a name: 1 to 64 of `a-z`, `0-9` and `_`.
    pub fn parse(name: &str) -> Result<Self, String> {
        let ok = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if ok {
            Ok(Self(name.to_owned()))
        } else {
            Err(format!(
                "timer name {name:?} must be 1 to 64 of a-z, 0-9 and _"
            ))
        }
    }

    /// The default timer (`cancel_unpaid`).
    pub fn default_timer() -> Self {
        Self(DEFAULT_TIMER.to_owned())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the default timer.
    pub fn is_default(&self) -> bool {
        self.0 == DEFAULT_TIMER
    }
}

impl fmt::Display for TimerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One `[[timers]]` table of the config file, as written (keys fixed by the
/// contract; defaults from `[orders]` where it says so).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimerMapping {
    /// Required; `[a-z0-9_]{1,64}`, unique, not `cancel_unpaid`.
    pub name: String,
    /// Default: `[orders].table`.
    pub table: Option<String>,
    /// Default: `[orders].id`.
    pub id: Option<String>,
    /// Default: `[orders].status`.
    pub status: Option<String>,
    /// Required: the status the row must still have.
    pub from: StatusValue,
    /// Required: the status it gets.
    pub to: StatusValue,
    /// Required: a column, or an SQL expression over the row.
    pub deadline: String,
    /// `time` (default), `s` or `ms`: what `deadline` is.
    #[serde(default)]
    pub deadline_unit: DeadlineUnit,
    /// Optional extra condition.
    #[serde(default)]
    pub guard: String,
    /// Default: `[orders].time_zone`.
    pub time_zone: Option<String>,
    /// Extra columns set by the flip; values are SQL expressions.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Statements run in the flip's transaction, once per row it flips.
    #[serde(default)]
    pub also: Vec<String>,
    /// The keys the `also` statements write, locked in a stable order first
    /// (as `[orders].also_keys`); empty for none.
    #[serde(default)]
    pub also_keys: String,
    /// `none` (default) or `grpc` (`ReleaseStock` from `[items]`).
    #[serde(default = "no_release")]
    pub release: Release,
    /// Routing key of its event; default `order.<name>`.
    pub event: Option<String>,
    /// e.g. `1m`: the service schedules rows falling due within the next
    /// window itself; empty or absent: off.
    #[serde(default)]
    pub watch: String,
}

fn no_release() -> Release {
    Release::None
}

/// A timer as the service runs it: the default one from `[orders]`, or a
/// `[[timers]]` table with its defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timer {
    /// Its name.
    pub name: TimerName,
    /// The table, optionally schema-qualified.
    pub table: String,
    /// The id column messages' `order_id` matches.
    pub id: String,
    /// The status column.
    pub status: String,
    /// The status a row must still have to be flipped.
    pub from: StatusValue,
    /// The status the flip writes.
    pub to: StatusValue,
    /// The default timer's `paid` code: tells "already paid" apart in the
    /// metrics. `None` for other timers.
    pub paid: Option<StatusValue>,
    /// The deadline: a column or an SQL expression.
    pub deadline: String,
    /// What the deadline is: a time, or seconds or milliseconds since the
    /// epoch.
    pub deadline_unit: DeadlineUnit,
    /// An extra SQL condition (empty: none).
    pub guard: String,
    /// The zone its zone-less deadlines are read in (`[orders].time_zone`):
    /// `None`, the database's own session default.
    pub time_zone: Option<String>,
    /// Extra columns set by the flip.
    pub set: BTreeMap<String, String>,
    /// Statements run once per flipped row, in the same transaction.
    pub also: Vec<String>,
    /// A query returning the keys of the rows the `also` statements write
    /// for a row, locked in a stable order before they run (empty: none).
    pub also_keys: String,
    /// Whether stock is released over gRPC after the flip.
    pub release: Release,
    /// Where the lines of a gRPC release come from.
    pub items: ItemsMapping,
    /// Routing key of its event on `order-timeout.events`.
    pub event: String,
    /// The watch window, if the service schedules this timer's rows itself.
    pub watch: Option<Duration>,
}

impl Timer {
    /// The default timer, `cancel_unpaid`: `[orders]` (unpaid → cancelled,
    /// `paid` told apart), its items and how its stock goes back, event
    /// `order.cancelled`, no watch.
    pub fn cancel_unpaid(orders: &OrdersMapping, items: &ItemsMapping, release: Release) -> Self {
        let o = orders;
        Self {
            name: TimerName::default_timer(),
            table: o.table.clone(),
            id: o.id.clone(),
            status: o.status.clone(),
            from: o.unpaid.clone(),
            to: o.cancelled.clone(),
            paid: o.paid.clone(),
            deadline: o.deadline.clone(),
            deadline_unit: o.deadline_unit,
            guard: o.guard.clone(),
            time_zone: o.time_zone.clone(),
            set: o.set.clone(),
            also: o.also.clone(),
            also_keys: o.also_keys.clone(),
            release,
            items: items.clone(),
            event: CANCELLED_EVENT.to_owned(),
            watch: None,
        }
    }

    /// Whether this is the default timer (`cancel_unpaid`).
    pub fn is_default(&self) -> bool {
        self.name.is_default()
    }

    /// The config key a problem with `key` of this timer names:
    /// `[orders].unpaid` for the default timer's `from`, `[[timers]].from`
    /// for another's (whose name the problem text then gives).
    pub fn key(&self, key: TimerKey) -> &'static str {
        use TimerKey as K;
        if self.is_default() {
            match key {
                K::Table => "[orders].table",
                K::Id => "[orders].id",
                K::Status => "[orders].status",
                K::From => "[orders].unpaid",
                K::To => "[orders].cancelled",
                K::Paid => "[orders].paid",
                K::Deadline => "[orders].deadline",
                K::DeadlineUnit => "[orders].deadline_unit",
                K::TimeZone => "[orders].time_zone",
                K::Guard => "[orders].guard",
                K::DeadlineGuard => "[orders].deadline / [orders].guard",
                K::Set => "[orders].set",
                K::Flip => "[orders].set / [orders].deadline / [orders].guard",
                K::Also => "[orders].also",
                K::AlsoKeys => "[orders].also_keys",
            }
        } else {
            match key {
                K::Table => "[[timers]].table",
                K::Id => "[[timers]].id",
                K::Status => "[[timers]].status",
                K::From => "[[timers]].from",
                K::To => "[[timers]].to",
                K::Paid => "[[timers]].from",
                K::Deadline => "[[timers]].deadline",
                K::DeadlineUnit => "[[timers]].deadline_unit",
                K::TimeZone => "[[timers]].time_zone",
                K::Guard => "[[timers]].guard",
                K::DeadlineGuard => "[[timers]].deadline / [[timers]].guard",
                K::Set => "[[timers]].set",
                K::Flip => "[[timers]].set / [[timers]].deadline / [[timers]].guard",
                K::Also => "[[timers]].also",
                K::AlsoKeys => "[[timers]].also_keys",
            }
        }
    }

    /// `problem` about this timer's mapping as a config error's text: as
    /// it is for the default timer, `timer NAME: problem` for another (its
    /// key, `[[timers]].x`, does not say which).
    pub fn problem(&self, problem: impl fmt::Display) -> String {
        if self.is_default() {
            problem.to_string()
        } else {
            format!("timer {}: {problem}", self.name)
        }
    }
}

/// A key of a timer's mapping, for [`Timer::key`]: the default timer spells
/// them as `[orders]` does (`unpaid`, `cancelled`), the others as
/// `[[timers]]` does (`from`, `to`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimerKey {
    /// The table.
    Table,
    /// The id column.
    Id,
    /// The status column.
    Status,
    /// The status a row must still have.
    From,
    /// The status the flip writes.
    To,
    /// The default timer's `paid`.
    Paid,
    /// The deadline.
    Deadline,
    /// What the deadline is (`deadline_unit`).
    DeadlineUnit,
    /// The session time zone.
    TimeZone,
    /// The guard.
    Guard,
    /// The deadline or the guard (evaluated together).
    DeadlineGuard,
    /// The `set` columns.
    Set,
    /// The flip statement: `set`, deadline and guard together.
    Flip,
    /// The `also` statements.
    Also,
    /// The query of the keys the `also` statements write.
    AlsoKeys,
}

/// `also_keys` only beside `also` statements: it orders their locks.
fn check_also_keys(timer: &Timer) -> Result<(), ConfigError> {
    if timer.also_keys.trim().is_empty() || !timer.also.is_empty() {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        key: timer.key(TimerKey::AlsoKeys),
        problem: timer.problem(
            "orders the locks of the `also` statements, and there are none: \
             set `also` or remove `also_keys`",
        ),
    })
}

/// The longest watch window: a day. A replica holds a timer's watch for
/// two windows, so a longer one would leave a dead replica's watch
/// unscanned for days, and a day of rows in the delay store at once.
pub const MAX_WATCH: Duration = Duration::from_secs(24 * 3600);

impl Settings {
    /// Every timer: the default one (`[orders]`, `[items]`, `[inventory]`)
    /// first, then the `[[timers]]` in file order. Valid settings
    /// ([`Settings::validate`]) always give a list; the error is for
    /// settings built in code without validation.
    pub fn timers(&self) -> Result<Vec<Timer>, ConfigError> {
        let mut timers = vec![Timer::cancel_unpaid(
            &self.orders,
            &self.items,
            self.inventory.release,
        )];
        for t in &self.timers {
            timers.push(self.timer_of(t)?);
        }
        Ok(timers)
    }

    fn timer_of(&self, t: &TimerMapping) -> Result<Timer, ConfigError> {
        let invalid = |key: &'static str, problem: String| ConfigError::Invalid { key, problem };
        let name = TimerName::parse(&t.name).map_err(|e| invalid("[[timers]].name", e))?;
        let watch = match t.watch.trim() {
            "" => None,
            text => Some(humantime::parse_duration(text).map_err(|e| {
                invalid(
                    "[[timers]].watch",
                    format!("timer {name}: {text:?} is not a duration: {e}"),
                )
            })?),
        };
        let o = &self.orders;
        Ok(Timer {
            event: t.event.clone().unwrap_or_else(|| format!("order.{name}")),
            table: t.table.clone().unwrap_or_else(|| o.table.clone()),
            id: t.id.clone().unwrap_or_else(|| o.id.clone()),
            status: t.status.clone().unwrap_or_else(|| o.status.clone()),
            from: t.from.clone(),
            to: t.to.clone(),
            paid: None,
            deadline: t.deadline.clone(),
            deadline_unit: t.deadline_unit,
            guard: t.guard.clone(),
            time_zone: t.time_zone.clone().or_else(|| o.time_zone.clone()),
            set: t.set.clone(),
            also: t.also.clone(),
            also_keys: t.also_keys.clone(),
            release: t.release,
            items: self.items.clone(),
            watch,
            name,
        })
    }

    /// The `[[timers]]` checks: names valid, unique and not the default's;
    /// `also_keys` only beside `also` statements;
    /// `from` and `to` different; a deadline; `set` not writing the status
    /// column; events routable; a watch window of a second to a day, with
    /// the sweeper on.
    pub(super) fn check_timers(&self) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, problem: String| ConfigError::Invalid { key, problem };
        let timers = self.timers()?;
        let mut seen = std::collections::HashSet::new();
        for (i, timer) in timers.iter().enumerate() {
            let name = &timer.name;
            if i > 0 && name.is_default() {
                return Err(invalid(
                    "[[timers]].name",
                    format!("{DEFAULT_TIMER} is the default timer ([orders]); pick another name"),
                ));
            }
            if !seen.insert(name.clone()) {
                return Err(invalid(
                    "[[timers]].name",
                    format!("two timers are named {name}"),
                ));
            }
            check_also_keys(timer)?;
            if i == 0 {
                continue;
            }
            if timer.from.as_text() == timer.to.as_text() {
                return Err(invalid(
                    "[[timers]].to",
                    format!("timer {name}: {} is also its `from`", timer.to),
                ));
            }
            if timer.deadline.trim().is_empty() {
                return Err(invalid(
                    "[[timers]].deadline",
                    format!("timer {name}: a deadline (column or SQL expression) is required"),
                ));
            }
            if timer.set.keys().any(|column| column == &timer.status) {
                return Err(invalid(
                    "[[timers]].set",
                    format!(
                        "timer {name}: sets the status column {:?}, which the flip writes itself (`to`)",
                        timer.status
                    ),
                ));
            }
            let routable = !timer.event.is_empty()
                && timer.event.len() <= 255
                && !timer.event.contains(['*', '#']);
            if !routable {
                return Err(invalid(
                    "[[timers]].event",
                    format!(
                        "timer {name}: {:?} is not a routing key (1-255 bytes, no * or #)",
                        timer.event
                    ),
                ));
            }
            self.check_watch(timer)?;
        }
        Ok(())
    }

    /// A watch window of at least a second and at most [`MAX_WATCH`], and
    /// the sweeper on: the watch leaves it the rows that enter the `from`
    /// status with a deadline inside a window already scanned, and those
    /// already overdue when the watch starts.
    fn check_watch(&self, timer: &Timer) -> Result<(), ConfigError> {
        let invalid = |problem: String| ConfigError::Invalid {
            key: "[[timers]].watch",
            problem: format!("timer {}: {problem}", timer.name),
        };
        let Some(window) = timer.watch else {
            return Ok(());
        };
        if window < Duration::from_secs(1) {
            return Err(invalid(
                "a watch window under 1s would query without pause".into(),
            ));
        }
        if window > MAX_WATCH {
            return Err(invalid(format!(
                "a window of {} is longer than {}: the watch's lease is two windows, so a \
                 replica that dies would be replaced only that much later",
                humantime::format_duration(window),
                humantime::format_duration(MAX_WATCH)
            )));
        }
        if !self.sweeper.enabled {
            return Err(invalid(
                "a watch needs the sweeper ([sweeper] enabled = true): rows entering the \
                 status inside a window already scanned are the sweeper's"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(toml: &str) -> Settings {
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn the_default_timer_is_orders_exactly() {
        let s = Settings::default();
        let timers = s.timers().unwrap();
        assert_eq!(timers.len(), 1);
        let t = &timers[0];
        assert_eq!(t.name.as_str(), "cancel_unpaid");
        assert_eq!(
            (&t.table, &t.from, &t.to),
            (&s.orders.table, &s.orders.unpaid, &s.orders.cancelled)
        );
        assert_eq!(t.paid, s.orders.paid);
        assert_eq!(t.event, "order.cancelled");
        assert_eq!(t.set, s.orders.set);
        assert_eq!(t.release, Release::Grpc);
        assert_eq!(t.watch, None);
    }

    #[test]
    fn a_timer_takes_its_defaults_from_orders() {
        let s = settings(
            r#"
            [orders]
            table = "oms_order"
            unpaid = 0
            paid = 1
            cancelled = 4
            time_zone = "+08:00"
            [[timers]]
            name = "auto_receive"
            from = 2
            to = 3
            deadline = "delivery_time + INTERVAL 15 DAY"
            set = { confirm_status = "1", receive_time = "NOW()" }
            watch = "1m"
            [[timers]]
            name = "coupon_expiry"
            table = "litemall_coupon_user"
            status = "status"
            from = 0
            to = 2
            deadline = "end_time"
            event = "coupon.expired"
            release = "none"
            "#,
        );
        s.validate().unwrap();
        let timers = s.timers().unwrap();
        let receive = &timers[1];
        assert_eq!(receive.table, "oms_order");
        assert_eq!(receive.time_zone.as_deref(), Some("+08:00"));
        assert_eq!(receive.event, "order.auto_receive");
        assert_eq!(receive.watch, Some(Duration::from_secs(60)));
        assert_eq!(receive.release, Release::None);
        assert_eq!(receive.paid, None);
        assert_eq!(timers[2].event, "coupon.expired");
        assert_eq!(timers[2].watch, None);
    }

    #[test]
    fn contradictions_are_refused_with_their_key() {
        let base = "[[timers]]\nfrom = 2\nto = 3\ndeadline = \"d\"\n";
        for (extra, key) in [
            ("name = \"cancel_unpaid\"", "[[timers]].name"),
            ("name = \"Auto-Receive\"", "[[timers]].name"),
            ("name = \"x\"\nwatch = \"soon\"", "[[timers]].watch"),
            ("name = \"x\"\nwatch = \"100ms\"", "[[timers]].watch"),
            ("name = \"x\"\nevent = \"order.*\"", "[[timers]].event"),
            ("name = \"x\"\nset = { status = \"1\" }", "[[timers]].set"),
            (
                "name = \"x\"\nalso_keys = \"SELECT 1\"",
                "[[timers]].also_keys",
            ),
        ] {
            let s = settings(&format!("{base}{extra}"));
            let err = s.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{extra}: {err}");
        }
        let same = settings("[[timers]]\nname = \"x\"\nfrom = 2\nto = 2\ndeadline = \"d\"");
        assert!(
            same.validate()
                .unwrap_err()
                .to_string()
                .contains("[[timers]].to")
        );
        let twice = settings(&format!("{base}name = \"x\"\n{base}name = \"x\""));
        assert!(
            twice
                .validate()
                .unwrap_err()
                .to_string()
                .contains("two timers")
        );
        let keys_alone = settings("[orders]\nalso_keys = \"SELECT sku FROM items WHERE id = $1\"");
        let err = keys_alone.validate().unwrap_err().to_string();
        assert!(err.contains("[orders].also_keys"), "{err}");
        let keys = settings("[orders]\nalso = [\"UPDATE s SET n = 1\"]\nalso_keys = \"SELECT 1\"");
        keys.validate().unwrap();
        assert_eq!(keys.timers().unwrap()[0].also_keys, "SELECT 1");
        // Required keys and unknown keys are parse errors.
        assert!(toml::from_str::<Settings>("[[timers]]\nname = \"x\"\nfrom = 1").is_err());
        assert!(toml::from_str::<Settings>(&format!("{base}name = \"x\"\nwhen = 1")).is_err());
    }
}
