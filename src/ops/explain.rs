//! **"What happened to order 123?"**: everything the service knows of one
//! order, read without changing anything, and what happens to it next
//! (`order-timeout explain ID` and the console's order page).
//!
//! Per timer, the store reads the facts ([`OrderFacts`]: the row's status,
//! guard and deadline on the database's clock, the outbox row this timer
//! wrote when it flipped the order, its set-aside mark); the parked store
//! adds the parked messages that name the order. One function,
//! [`verdict`], turns the facts into what the order's state means and what
//! comes next, as a value ([`Verdict`]) that the command prints and the
//! console renders alike ([`Explanation::lines`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::parked::{self, ParkedMessage, Selection};
use crate::message::OrderId;
use crate::settings::SweeperSettings;
use crate::store::zones::ZoneReport;
use crate::store::{OrderFacts, OutboxFacts, Store, StoreError};

/// Where an order stands for one timer, and what comes next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Verdict {
    /// No row with this id in the timer's table.
    Unknown,
    /// Flipped by this timer (its outbox row says when).
    Flipped {
        /// When (the cancel transaction's start).
        at: DateTime<Utc>,
        /// How long after its deadline, when the deadline is known.
        late_ms: Option<i64>,
    },
    /// In the timer's `to` status, but not flipped by this timer.
    InToStatus,
    /// Paid: nothing will happen.
    Paid,
    /// Waiting: due at `due_at`; if no message comes, the sweeper flips it
    /// by `swept_by` at the latest.
    NotYetDue {
        /// Its deadline.
        due_at: DateTime<Utc>,
        /// Seconds until then, on the database's clock.
        in_secs: i64,
        /// When the sweeper covers it at the latest.
        swept_by: Option<DateTime<Utc>>,
    },
    /// Overdue and waiting: flipped at its message, or by the sweeper by
    /// `swept_by` at the latest.
    Overdue {
        /// Its deadline.
        due_at: DateTime<Utc>,
        /// When the sweeper covers it at the latest.
        swept_by: Option<DateTime<Utc>>,
    },
    /// Its flip failed for its own values: set aside, tried again at
    /// `retry_at` (or at once when the row changes or it is replayed).
    SetAside {
        /// The database's error.
        reason: String,
        /// When the sweeper tries it again.
        retry_at: DateTime<Utc>,
    },
    /// Left alone, and why.
    LeftAlone {
        /// Why: the guard, the status, no usable deadline, or reopened.
        why: String,
    },
}

/// What a timer did of the order's stock release and event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "release", rename_all = "snake_case")]
pub enum Effects {
    /// Not flipped by this timer: nothing to do.
    None,
    /// Stock released and event published.
    Done {
        /// When the stock was released.
        released_at: DateTime<Utc>,
    },
    /// Pending: retried by the sweeper.
    Pending {
        /// Failed attempts so far.
        attempts: i32,
        /// The last error.
        last_error: Option<String>,
        /// The next try.
        next_attempt_at: Option<DateTime<Utc>>,
    },
    /// Given up (refused for good, or out of attempts), parked as
    /// `release_failed`.
    GivenUp {
        /// When.
        at: DateTime<Utc>,
        /// The last error.
        last_error: Option<String>,
    },
}

/// One timer's view of the order.
#[derive(Clone, Debug, Serialize)]
pub struct TimerView {
    /// The timer.
    pub timer: String,
    /// Its table.
    pub table: String,
    /// The facts read.
    pub facts: OrderFacts,
    /// What they mean.
    pub verdict: Verdict,
    /// The stock release and event.
    pub effects: Effects,
    /// Which zone its deadline is read in, and why (a zone-less deadline
    /// is the wall-clock time the shop wrote, in that zone).
    #[serde(serialize_with = "as_text")]
    pub zone: ZoneReport,
}

/// A value as its text (`serialize_with`).
fn as_text<T: std::fmt::Display, S: serde::Serializer>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

/// Everything known of one order.
#[derive(Clone, Debug, Serialize)]
pub struct Explanation {
    /// The order id asked about.
    pub order_id: String,
    /// Per timer.
    pub timers: Vec<TimerView>,
    /// Parked messages naming the order (bodies cut to 1 KiB).
    #[serde(skip)]
    pub parked: Vec<ParkedMessage>,
    /// Their ids in the parked store.
    pub parked_ids: Vec<i64>,
}

/// Why reading failed.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// Not an order id.
    #[error("not an order id: {0}")]
    BadId(String),
    /// A store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The parked store failed.
    #[error(transparent)]
    Parked(#[from] parked::ParkedError),
}

/// Reads what `stores` know of order `id`, and the parked messages naming
/// it in `parked_store`.
#[tracing::instrument(skip(stores, parked_store, sweeper))]
pub async fn explain(
    stores: &[Store],
    parked_store: &Store,
    sweeper: &SweeperSettings,
    id: &str,
) -> Result<Explanation, ExplainError> {
    let order = OrderId::parse(id).map_err(|e| ExplainError::BadId(e.to_string()))?;
    let mut timers = Vec::new();
    for store in stores {
        let timer = store.timer();
        let canonical = store.canonical(&order).unwrap_or_else(|_| order.clone());
        let report = store.prepare().await?;
        let facts = store.explain(&canonical).await?;
        let verdict = verdict(&facts, sweeper);
        let effects = effects(facts.outbox.as_ref());
        timers.push(TimerView {
            timer: timer.name.to_string(),
            table: report.table.clone(),
            facts,
            verdict,
            effects,
            zone: report.zone.clone(),
        });
    }
    let page = parked::Page {
        selection: Selection::OrderId(order.as_str().to_owned()),
        after: 0,
        limit: 100,
        excerpt: Some(1024),
    };
    let parked = parked::list(parked_store, &page).await?.messages;
    Ok(Explanation {
        order_id: order.as_str().to_owned(),
        parked_ids: parked.iter().filter_map(|m| m.id).collect(),
        timers,
        parked,
    })
}

/// **What the facts mean**: the one place that decides.
pub fn verdict(facts: &OrderFacts, sweeper: &SweeperSettings) -> Verdict {
    let Some(row) = &facts.row else {
        return Verdict::Unknown;
    };
    if let Some(outbox) = &facts.outbox {
        if row.is_from {
            return Verdict::LeftAlone {
                why: "reopened after this timer flipped it: a timer flips a row once".into(),
            };
        }
        return Verdict::Flipped {
            at: outbox.created_at,
            late_ms: row
                .expires_at
                .map(|due| (outbox.created_at - due).num_milliseconds()),
        };
    }
    if row.is_to {
        return Verdict::InToStatus;
    }
    if row.is_paid {
        return Verdict::Paid;
    }
    if !row.is_from {
        return Verdict::LeftAlone {
            why: "its status is none this timer flips".into(),
        };
    }
    if !row.guard_ok {
        return Verdict::LeftAlone {
            why: "it does not pass the guard".into(),
        };
    }
    let Some(due_at) = row.expires_at else {
        return Verdict::LeftAlone {
            why: "its deadline is NULL or no usable time".into(),
        };
    };
    if let Some(mark) = &facts.set_aside {
        return Verdict::SetAside {
            reason: mark.reason.clone(),
            retry_at: mark.retry_at,
        };
    }
    let swept_by = swept_by(due_at, facts.db_now, sweeper);
    if due_at > facts.db_now {
        Verdict::NotYetDue {
            due_at,
            in_secs: (due_at - facts.db_now).num_seconds(),
            swept_by,
        }
    } else {
        Verdict::Overdue { due_at, swept_by }
    }
}

/// The latest the sweeper flips a row due at `due_at`: once it is overdue
/// by the grace, at the next sweep (`None`: the sweeper is off).
fn swept_by(
    due_at: DateTime<Utc>,
    now: DateTime<Utc>,
    sweeper: &SweeperSettings,
) -> Option<DateTime<Utc>> {
    if !sweeper.enabled {
        return None;
    }
    let add = |t: DateTime<Utc>, d: Duration| {
        chrono::Duration::from_std(d)
            .ok()
            .and_then(|d| t.checked_add_signed(d))
    };
    let eligible = add(due_at, sweeper.grace)?.max(now);
    add(eligible, sweeper.interval)
}

/// What the outbox row says of the release and the event.
fn effects(outbox: Option<&OutboxFacts>) -> Effects {
    let Some(o) = outbox else {
        return Effects::None;
    };
    match (o.stock_released_at, o.gave_up_at) {
        (Some(released_at), _) if o.event_published_at.is_some() => Effects::Done { released_at },
        (_, Some(at)) => Effects::GivenUp {
            at,
            last_error: o.last_error.clone(),
        },
        _ => Effects::Pending {
            attempts: o.attempts,
            last_error: o.last_error.clone(),
            next_attempt_at: o.next_attempt_at,
        },
    }
}

/// A time as the lines show it.
fn at(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// Whole seconds as `1h 2m 3s`.
fn span(secs: i64) -> String {
    humantime::format_duration(Duration::from_secs(secs.unsigned_abs())).to_string()
}

impl TimerView {
    /// The row, in words.
    fn row_line(&self) -> String {
        let Some(row) = &self.facts.row else {
            return format!("no row with this id in {}", self.table);
        };
        let status = match (row.is_from, row.is_paid, row.is_to) {
            (true, _, _) => "in its from status (unpaid)",
            (_, true, _) => "paid",
            (_, _, true) => "in its to status (cancelled)",
            _ => "in another status",
        };
        let guard = if row.guard_ok {
            "passes the guard"
        } else {
            "fails the guard"
        };
        let deadline = match row.expires_at {
            Some(due) => format!(
                "deadline {} (database clock {})",
                at(due),
                at(self.facts.db_now)
            ),
            None => "no usable deadline".into(),
        };
        format!("{status}, {guard}, {deadline}")
    }

    /// What comes next, in words.
    fn next_line(&self) -> String {
        let swept = |by: &Option<DateTime<Utc>>| match by {
            Some(t) => format!(
                "; if no message arrives, the sweeper covers it by {}",
                at(*t)
            ),
            None => "; the sweeper is off".into(),
        };
        match &self.verdict {
            Verdict::Unknown => "nothing: a message for it is parked as unknown_order".into(),
            Verdict::Flipped { at: when, late_ms } => format!(
                "done: flipped by this service at {}{}",
                at(*when),
                late_ms.map_or(String::new(), |ms| format!(" ({ms} ms after its deadline)"))
            ),
            Verdict::InToStatus => "nothing: already flipped, not by this service".into(),
            Verdict::Paid => "nothing: paid".into(),
            Verdict::NotYetDue {
                in_secs, swept_by, ..
            } => format!("due in {}{}", span(*in_secs), swept(swept_by)),
            Verdict::Overdue { due_at, swept_by } => format!(
                "overdue by {}: flipped when its message arrives{}",
                span((self.facts.db_now - *due_at).num_seconds()),
                swept(swept_by)
            ),
            Verdict::SetAside { reason, retry_at } => format!(
                "set aside (its flip failed: {reason}); the sweeper tries again at {} \
                 (`order-timeout set-aside retry` or a replay tries at once)",
                at(*retry_at)
            ),
            Verdict::LeftAlone { why } => format!("left alone: {why}"),
        }
    }

    /// The release and the event, in words.
    fn effects_line(&self) -> String {
        match &self.effects {
            Effects::None => "none (not flipped by this timer)".into(),
            Effects::Done { released_at } => {
                format!("stock released at {}, event published", at(*released_at))
            }
            Effects::Pending {
                attempts,
                last_error,
                next_attempt_at,
            } => format!(
                "pending after {attempts} failed attempt(s){}{}",
                last_error
                    .as_deref()
                    .map_or(String::new(), |e| format!(", last error: {e}")),
                next_attempt_at.map_or(String::new(), |t| format!(", next try {}", at(t)))
            ),
            Effects::GivenUp {
                at: when,
                last_error,
            } => format!(
                "given up at {} ({}), parked as release_failed",
                at(*when),
                last_error.as_deref().unwrap_or("no error recorded")
            ),
        }
    }
}

impl Explanation {
    /// The explanation as `(label, text)` lines, per timer then the parked
    /// messages: what the command prints and the console shows.
    pub fn lines(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for view in &self.timers {
            out.push((
                "timer".into(),
                format!("{} (table {})", view.timer, view.table),
            ));
            out.push(("  row".into(), view.row_line()));
            out.push(("  deadline zone".into(), view.zone.to_string()));
            out.push(("  next".into(), view.next_line()));
            out.push(("  stock and event".into(), view.effects_line()));
        }
        out.push((
            "parked".into(),
            match self.parked.len() {
                0 => "no parked message names it".into(),
                n => format!("{n} parked message(s) name it"),
            },
        ));
        for m in &self.parked {
            out.push((
                format!("  #{}", m.id.unwrap_or_default()),
                format!("{} {}", m.parked_at.map(at).unwrap_or_default(), m.reason()),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RowFacts, SetAsideRow};

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn facts(row: Option<RowFacts>) -> OrderFacts {
        OrderFacts {
            row,
            db_now: t("2026-11-28T10:00:00Z"),
            outbox: None,
            set_aside: None,
        }
    }

    fn unpaid(due: &str) -> RowFacts {
        RowFacts {
            is_to: false,
            is_paid: false,
            is_from: true,
            guard_ok: true,
            expires_at: Some(t(due)),
        }
    }

    #[test]
    fn each_state_of_a_row_means_one_thing() {
        let sweeper = SweeperSettings::default();
        assert_eq!(verdict(&facts(None), &sweeper), Verdict::Unknown);
        let waiting = verdict(&facts(Some(unpaid("2026-11-28T10:04:12Z"))), &sweeper);
        let Verdict::NotYetDue {
            in_secs, swept_by, ..
        } = waiting
        else {
            panic!("{waiting:?}")
        };
        assert_eq!(in_secs, 252);
        let grace = chrono::Duration::from_std(sweeper.grace + sweeper.interval).unwrap();
        assert_eq!(swept_by, Some(t("2026-11-28T10:04:12Z") + grace));
        assert!(matches!(
            verdict(&facts(Some(unpaid("2026-11-28T09:00:00Z"))), &sweeper),
            Verdict::Overdue { .. }
        ));
        let paid = RowFacts {
            is_paid: true,
            is_from: false,
            ..unpaid("2026-11-28T09:00:00Z")
        };
        assert_eq!(verdict(&facts(Some(paid)), &sweeper), Verdict::Paid);
        let guarded = RowFacts {
            guard_ok: false,
            ..unpaid("2026-11-28T09:00:00Z")
        };
        assert!(matches!(
            verdict(&facts(Some(guarded)), &sweeper),
            Verdict::LeftAlone { .. }
        ));
    }

    #[test]
    fn a_row_set_aside_or_flipped_says_so() {
        let sweeper = SweeperSettings::default();
        let mut set_aside = facts(Some(unpaid("2026-11-28T09:00:00Z")));
        set_aside.set_aside = Some(SetAsideRow {
            order_id: "1".into(),
            reason: "check violation".into(),
            set_aside_at: t("2026-11-28T09:30:00Z"),
            attempts: 1,
            retry_at: t("2026-11-28T10:30:00Z"),
        });
        assert!(matches!(
            verdict(&set_aside, &sweeper),
            Verdict::SetAside { .. }
        ));
        let mut flipped = facts(Some(RowFacts {
            is_to: true,
            is_from: false,
            ..unpaid("2026-11-28T09:00:00Z")
        }));
        flipped.outbox = Some(OutboxFacts {
            created_at: t("2026-11-28T09:00:00.025Z"),
            stock_released_at: Some(t("2026-11-28T09:00:00.040Z")),
            event_published_at: Some(t("2026-11-28T09:00:00.041Z")),
            attempts: 0,
            last_error: None,
            next_attempt_at: None,
            gave_up_at: None,
        });
        assert_eq!(
            verdict(&flipped, &sweeper),
            Verdict::Flipped {
                at: t("2026-11-28T09:00:00.025Z"),
                late_ms: Some(25)
            }
        );
        assert!(matches!(
            effects(flipped.outbox.as_ref()),
            Effects::Done { .. }
        ));
    }
}
