//! Prometheus metrics of one service instance, served on `/metrics`.
//!
//! Each instance owns its registry (no global recorder), so several
//! instances in one process (tests, the demo) count separately. Names follow
//! Prometheus conventions: `order_timeout_` prefix, base units (seconds),
//! `_total` on counters.
//!
//! What is about one timer carries a `timer` label (messages by result,
//! lateness, the sweeper's count): its values are the timers of the config
//! (`cancel_unpaid` and the `[[timers]]` names), a bounded set. A message
//! parked before its timer was known (unparseable, or naming a timer the
//! config does not have) is counted with `timer=""`, never with the name it
//! gave.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry, Unit};

use crate::message::ParkReason;

/// The end of one message's visit to the consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This delivery cancelled the order (and released stock).
    Cancelled,
    /// The order was paid: left alone.
    AlreadyPaid,
    /// The order was already cancelled (a duplicate or a redelivery);
    /// pending release work, if any, was finished.
    AlreadyCancelled,
    /// Sent (back) through the delay store toward its deadline.
    Rescheduled,
    /// A transient failure: re-scheduled with backoff.
    Retried,
    /// Moved to the parked queue.
    Parked,
    /// Unknown order dropped by configuration.
    Dropped,
    /// Neither unpaid nor paid, failing the guard (soft-deleted), or
    /// without a deadline: left alone.
    LeftAlone,
    /// Another delivery of the same order, in the same batch, is being
    /// retried, parked or re-scheduled: one message is enough, this one is
    /// acked.
    Duplicate,
    /// Another transaction (the shop's) held the order's row, so the cancel
    /// transaction skipped it: sent back through the delay store to be
    /// asked about again in a few seconds, without spending an attempt.
    Locked,
}

impl Outcome {
    /// Every outcome, in a fixed order.
    pub const ALL: [Outcome; 10] = [
        Outcome::Cancelled,
        Outcome::AlreadyPaid,
        Outcome::AlreadyCancelled,
        Outcome::Rescheduled,
        Outcome::Retried,
        Outcome::Parked,
        Outcome::Dropped,
        Outcome::LeftAlone,
        Outcome::Duplicate,
        Outcome::Locked,
    ];

    /// The `result` label value, e.g. `already_paid`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Cancelled => "cancelled",
            Outcome::AlreadyPaid => "already_paid",
            Outcome::AlreadyCancelled => "already_cancelled",
            Outcome::Rescheduled => "rescheduled",
            Outcome::Retried => "retried",
            Outcome::Parked => "parked",
            Outcome::Dropped => "dropped",
            Outcome::LeftAlone => "left_alone",
            Outcome::Duplicate => "duplicate",
            Outcome::Locked => "locked",
        }
    }
}

/// How one sweep of one timer went: the `result` label of
/// `order_timeout_sweeps_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepResult {
    /// Every overdue row it found was settled (or parked and set aside).
    Ok,
    /// Overdue rows it found stay unsettled for now (held by another
    /// transaction, a failure waiting can fix), or pages remain: the next
    /// sweep takes them.
    LeftBehind,
    /// It could not run (a statement failed for the whole sweep).
    Failed,
}

impl SweepResult {
    /// Every result, in a fixed order.
    pub const ALL: [SweepResult; 3] = [Self::Ok, Self::LeftBehind, Self::Failed];

    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::LeftBehind => "left_behind",
            Self::Failed => "failed",
        }
    }
}

/// A timed step of the work, for `order_timeout_stage_duration_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The cancel statement for a batch.
    Db,
    /// One `ReleaseStock` call.
    Inventory,
    /// One confirmed publish (re-schedule, event, parking).
    Publish,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Stage::Db => "db",
            Stage::Inventory => "inventory",
            Stage::Publish => "publish",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
    timer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TimerLabel {
    timer: String,
}

#[derive(Clone)]
struct LatenessBuckets;

impl MetricConstructor<Histogram> for LatenessBuckets {
    fn new_metric(&self) -> Histogram {
        // 1 ms … ~65 s: ms-level lateness is the product, minutes are an incident.
        Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
            0.001, 2.0, 17,
        ))
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabel {
    target: &'static str,
}

/// The statements of a timer whose failures of the environment readiness
/// reports ([`Metrics::set_timer_failing`]).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) enum Statements {
    /// The cancel transaction (the consumer's and the sweeper's).
    Cancel,
    /// The sweeper's scans of overdue rows and outbox work.
    Sweep,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabel {
    task: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: &'static str,
}

#[derive(Clone)]
struct StageBuckets;

impl MetricConstructor<Histogram> for StageBuckets {
    fn new_metric(&self) -> Histogram {
        // 0.5 ms … ~16 s
        Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
            0.0005, 2.0, 16,
        ))
    }
}

/// The instance's metrics.
pub struct Metrics {
    registry: Registry,
    /// The timers whose series exist from the start (the config's).
    timers: Vec<String>,
    messages: Family<ResultLabel, Counter>,
    parked: Family<ReasonLabel, Counter>,
    lateness: Family<TimerLabel, Histogram, LatenessBuckets>,
    in_flight: Gauge,
    held: Gauge,
    stage: Family<StageLabel, Histogram, StageBuckets>,
    reconnects: Family<TargetLabel, Counter>,
    release_failures: Counter,
    publish_failures: Counter,
    requeued: Counter,
    swept: Family<TimerLabel, Counter>,
    sweeps: Family<ResultLabel, Counter>,
    watched: Family<TimerLabel, Counter>,
    outbox_given_up: Counter,
    outbox_deleted: Counter,
    readiness_probes: Counter,
    console_overviews: Counter,
    http_refused: Family<ReasonLabel, Counter>,
    ready: Gauge,
    broker_session_up: Gauge,
    timer_failing: Family<TimerLabel, Gauge>,
    /// Which statements of which timers fail for a reason of the
    /// environment: the gauge is 1 while any of a timer's do.
    failing: std::sync::Mutex<std::collections::HashSet<(String, Statements)>>,
    sweep_last_success: Family<TimerLabel, Gauge>,
    set_aside_rows: Family<TimerLabel, Gauge>,
    late_message_deadlines: Family<TimerLabel, Counter>,
    task_panics: Family<TaskLabel, Counter>,
    queue_messages: Family<QueueLabel, Gauge>,
    parked_messages: Gauge,
    /// What waits in the delay cascade (`observe/pending.rs`).
    pending: super::pending::PendingGauges,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The release this binary is (`order-timeout --version`, the start-up log
/// line and `order_timeout_build_info{version}`): during a rolling upgrade
/// it tells which replicas run which release (CHANGELOG.md, docs/upgrading.md).
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The `timer` label of a message parked before its timer was known.
pub(crate) const NO_TIMER: &str = "";

/// Registers `metric` under `name` and returns it (metrics are cheap
/// handles on shared state: the registry keeps one, the caller the other).
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// [`register`] with the unit seconds (`_seconds` suffix).
fn register_seconds<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register_with_unit(name, help, Unit::Seconds, metric.clone());
    metric
}

impl Metrics {
    /// A fresh registry with every metric registered, every known series
    /// at 0, for the default timer only.
    pub fn new() -> Self {
        Self::for_timers([crate::settings::DEFAULT_TIMER])
    }

    /// [`Metrics::new`] with every series the service can serve present
    /// (the pending gauges and the parked queue's depth too, which the
    /// service sets only once it has looked): what a dashboard's or an
    /// alert's queries are checked against. Outside the crate metrics are
    /// only read; this is the one way to see every name.
    pub fn with_every_series() -> Self {
        let metrics = Self::new();
        metrics.pending().set_level(0, 0, 0);
        metrics.pending().set_latest_due_secs(0);
        metrics
            .pending()
            .set_consumers(crate::broker::topology::DUE_QUEUE, 0);
        metrics.set_queue_depth(crate::broker::topology::PARKED_QUEUE, 0);
        metrics
    }

    /// [`Metrics::new`] for the timers named `timers` (the config's): their
    /// series start at 0.
    #[allow(
        clippy::too_many_lines,
        reason = "one registration per metric: a flat list, not steps"
    )]
    pub fn for_timers<S: AsRef<str>>(timers: impl IntoIterator<Item = S>) -> Self {
        let mut r = Registry::with_prefix("order_timeout");
        let mut metrics = Self {
            timers: timers.into_iter().map(|t| t.as_ref().to_owned()).collect(),
            messages: register(
                &mut r,
                "messages",
                "Timeout messages processed, by result and timer",
                Family::default(),
            ),
            parked: register(
                &mut r,
                "parked",
                "Messages moved to the parked queue, by reason",
                Family::default(),
            ),
            lateness: register_seconds(
                &mut r,
                "cancel_lateness",
                "Actual cancel (flip) time minus the row's deadline, by timer",
                Family::new_with_constructor(LatenessBuckets),
            ),
            in_flight: register(
                &mut r,
                "in_flight_messages",
                "Deliveries received and not yet acked",
                Gauge::default(),
            ),
            held: register(
                &mut r,
                "held_messages",
                "Deliveries held in-process for their sub-second remainder",
                Gauge::default(),
            ),
            stage: register_seconds(
                &mut r,
                "stage_duration",
                "Duration of one step: db (cancel statement), inventory (ReleaseStock), publish",
                Family::new_with_constructor(StageBuckets),
            ),
            reconnects: register(
                &mut r,
                "reconnects",
                "Broker sessions re-established after a failure",
                Family::default(),
            ),
            release_failures: register(
                &mut r,
                "inventory_release_failures",
                "ReleaseStock calls that failed after in-process retries",
                Counter::default(),
            ),
            publish_failures: register(
                &mut r,
                "publish_failures",
                "Confirmed publishes (re-schedule, park) the broker refused or that failed; each is tried again with backoff",
                Counter::default(),
            ),
            requeued: register(
                &mut r,
                "requeued",
                "Deliveries returned to the queue unfinished (a publish kept failing, or the session ended)",
                Counter::default(),
            ),
            swept: register(
                &mut r,
                "sweeper_orders",
                "Orders (rows) the sweeper cancelled (flipped) or finished, no message did, by timer",
                Family::default(),
            ),
            sweeps: register(
                &mut r,
                "sweeps",
                "Sweeps by timer and result: ok, left_behind (overdue rows it found stay unsettled for now), failed (it could not run)",
                Family::default(),
            ),
            watched: register(
                &mut r,
                "watch_scheduled",
                "Rows a timer's watch found falling due within its window and scheduled, by timer",
                Family::default(),
            ),
            outbox_given_up: register(
                &mut r,
                "outbox_given_up",
                "Outbox rows whose stock release can never succeed (a permanent inventory error, or the attempts ran out): set aside and parked as release_failed",
                Counter::default(),
            ),
            outbox_deleted: register(
                &mut r,
                "outbox_deleted",
                "Finished outbox rows deleted after [sweeper] outbox_retention",
                Counter::default(),
            ),
            readiness_probes: register(
                &mut r,
                "readiness_probes",
                "Readiness evaluations that probed the dependencies (a database ping, an inventory connect): at most one per second whatever the number of /readyz and console requests",
                Counter::default(),
            ),
            console_overviews: register(
                &mut r,
                "console_overviews",
                "Times the console's overview was computed: at most once per 2 s, whatever the number of viewers",
                Counter::default(),
            ),
            http_refused: register(
                &mut r,
                "http_refused",
                "HTTP connections and requests refused to protect the service, by reason (connections: past max_connections; busy: past console_concurrency; timeout: past request_timeout; rate: past console_per_second; login_limited: past the login limits; host: a host name not configured)",
                Family::default(),
            ),
            ready: register(
                &mut r,
                "ready",
                "1 when broker, database and inventory are reachable, else 0",
                Gauge::default(),
            ),
            broker_session_up: register(
                &mut r,
                "broker_session_up",
                "1 while a broker session is up (connected, consuming), else 0: a node cut off is noticed within twice the heartbeat ([liveness])",
                Gauge::default(),
            ),
            timer_failing: register(
                &mut r,
                "timer_failing",
                "1 while a timer's statements fail for a reason of the environment (a privilege, a missing table or column, the database unreachable): its due orders wait, none is parked or set aside",
                Family::default(),
            ),
            failing: std::sync::Mutex::default(),
            sweep_last_success: register(
                &mut r,
                "sweep_last_success_timestamp_seconds",
                "When a sweep of the timer last completed (Unix seconds; the sweeper's start before its first sweep), by timer",
                Family::default(),
            ),
            set_aside_rows: register(
                &mut r,
                "set_aside_rows",
                "Rows whose flip failed for their own values, parked and set aside (tried again hourly, then daily), by timer, as the last sweep counted them",
                Family::default(),
            ),
            late_message_deadlines: register(
                &mut r,
                "late_message_deadlines",
                "Orders cancelled for a timeout message whose deadline (cancel_at, created_at + timeout_ms) was more than a second later than the row's: cancelled late by that much, as the message asked",
                Family::default(),
            ),
            task_panics: register(
                &mut r,
                "task_panics",
                "Tasks that ended in a panic and were restarted (batch: its session too, so its deliveries return), by task",
                Family::default(),
            ),
            queue_messages: register(
                &mut r,
                "queue_messages",
                "Messages ready in the service's queues (due, parked)",
                Family::default(),
            ),
            parked_messages: register(
                &mut r,
                "parked_messages",
                "Parked messages kept in the parked store (order_timeout_parked), where operators read, replay and purge them; those not yet moved there are order_timeout_queue_messages{queue=\"order-timeout.parked\"}",
                Gauge::default(),
            ),
            pending: super::pending::PendingGauges::register(&mut r),
            registry: r,
        };
        metrics.registry.register(
            "build",
            "The running release: version (CHANGELOG.md), always 1",
            Info::new(vec![("version", VERSION)]),
        );
        metrics.create_known_series();
        metrics
    }

    /// Every known series starts at 0, so rate() and alerts see the first
    /// increment instead of a series appearing out of nowhere.
    fn create_known_series(&self) {
        for timer in &self.timers {
            for outcome in Outcome::ALL {
                let _ = self.messages.get_or_create(&ResultLabel {
                    result: outcome.as_str(),
                    timer: timer.clone(),
                });
            }
            let label = TimerLabel {
                timer: timer.clone(),
            };
            let _ = self.lateness.get_or_create(&label);
            let _ = self.swept.get_or_create(&label);
            for result in SweepResult::ALL {
                let _ = self.sweeps.get_or_create(&ResultLabel {
                    result: result.as_str(),
                    timer: timer.clone(),
                });
            }
            let _ = self.watched.get_or_create(&label);
            let _ = self.timer_failing.get_or_create(&label);
            let _ = self.set_aside_rows.get_or_create(&label);
            let _ = self.late_message_deadlines.get_or_create(&label);
        }
        for task in ["batch", "sweeper", "watch"] {
            let _ = self.task_panics.get_or_create(&TaskLabel { task });
        }
        for s in [Stage::Db, Stage::Inventory, Stage::Publish] {
            let _ = self.stage.get_or_create(&StageLabel { stage: s.as_str() });
        }
        let _ = self
            .reconnects
            .get_or_create(&TargetLabel { target: "amqp" });
        for reason in ParkReason::ALL {
            let _ = self.parked.get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            });
        }
    }

    /// Counts one message of `timer` (a name of the config, or
    /// [`NO_TIMER`]) ending with `outcome`.
    pub(crate) fn record(&self, timer: &str, outcome: Outcome) {
        self.messages
            .get_or_create(&ResultLabel {
                result: outcome.as_str(),
                timer: timer.to_owned(),
            })
            .inc();
    }

    /// How many messages ended with `outcome`, whatever their timer.
    pub fn count(&self, outcome: Outcome) -> u64 {
        self.label_values()
            .map(|timer| self.count_of(timer, outcome))
            .sum()
    }

    /// How many messages of `timer` ended with `outcome`.
    pub fn count_of(&self, timer: &str, outcome: Outcome) -> u64 {
        self.messages
            .get_or_create(&ResultLabel {
                result: outcome.as_str(),
                timer: timer.to_owned(),
            })
            .get()
    }

    /// Every `timer` label value: the config's timers and [`NO_TIMER`].
    fn label_values(&self) -> impl Iterator<Item = &str> {
        self.timers.iter().map(String::as_str).chain([NO_TIMER])
    }

    /// Messages processed to any outcome.
    pub fn total(&self) -> u64 {
        Outcome::ALL.iter().map(|o| self.count(*o)).sum()
    }

    /// Counts a parked message by its reason (`x-error-kind`).
    pub(crate) fn parked(&self, reason: ParkReason) {
        self.parked
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Records the lateness of a cancellation (a flip) of `timer`
    /// (negative values, impossible by construction, would land in the
    /// first bucket).
    pub(crate) fn lateness(&self, timer: &str, lateness: chrono::Duration) {
        self.lateness
            .get_or_create(&TimerLabel {
                timer: timer.to_owned(),
            })
            .observe(lateness.num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6);
    }

    /// Times one step.
    pub(crate) fn stage(&self, stage: Stage, took: Duration) {
        self.stage
            .get_or_create(&StageLabel {
                stage: stage.as_str(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts a broker reconnect.
    pub(crate) fn reconnect(&self) {
        self.reconnects
            .get_or_create(&TargetLabel { target: "amqp" })
            .inc();
    }

    /// Broker reconnects so far.
    pub fn reconnects(&self) -> u64 {
        self.reconnects
            .get_or_create(&TargetLabel { target: "amqp" })
            .get()
    }

    /// Orders (rows) the sweeper settled so far, of every timer.
    pub fn swept_total(&self) -> u64 {
        self.label_values().map(|timer| self.swept_of(timer)).sum()
    }

    /// Rows the sweeper settled so far for `timer`.
    pub fn swept_of(&self, timer: &str) -> u64 {
        self.swept
            .get_or_create(&TimerLabel {
                timer: timer.to_owned(),
            })
            .get()
    }

    /// Counts a failed stock release.
    pub(crate) fn release_failed(&self) {
        self.release_failures.inc();
    }

    /// Stock releases that failed so far.
    pub fn release_failures(&self) -> u64 {
        self.release_failures.get()
    }

    /// Counts an outbox row given up.
    pub(crate) fn outbox_given_up(&self) {
        self.outbox_given_up.inc();
    }

    /// Outbox rows given up so far.
    pub fn outbox_given_up_total(&self) -> u64 {
        self.outbox_given_up.get()
    }

    /// Counts finished outbox rows deleted by retention.
    pub(crate) fn outbox_deleted(&self, n: u64) {
        self.outbox_deleted.inc_by(n);
    }

    /// Finished outbox rows deleted so far.
    pub fn outbox_deleted_total(&self) -> u64 {
        self.outbox_deleted.get()
    }

    /// Counts a readiness evaluation that probed the dependencies.
    pub(crate) fn readiness_probed(&self) {
        self.readiness_probes.inc();
    }

    /// Readiness evaluations that probed the dependencies so far.
    pub fn readiness_probes_total(&self) -> u64 {
        self.readiness_probes.get()
    }

    /// Counts a computation of the console's overview.
    pub(crate) fn console_overview_computed(&self) {
        self.console_overviews.inc();
    }

    /// Console overviews computed so far.
    pub fn console_overviews_total(&self) -> u64 {
        self.console_overviews.get()
    }

    /// Counts an HTTP connection or request refused for `reason`.
    pub(crate) fn http_refused(&self, reason: &'static str) {
        self.http_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// HTTP connections or requests refused for `reason` so far.
    pub fn http_refused_of(&self, reason: &'static str) -> u64 {
        self.http_refused
            .get_or_create(&ReasonLabel { reason })
            .get()
    }

    /// Counts a failed confirmed publish (re-schedule, park).
    pub(crate) fn publish_failed(&self) {
        self.publish_failures.inc();
    }

    /// Confirmed publishes that failed so far.
    pub fn publish_failures(&self) -> u64 {
        self.publish_failures.get()
    }

    /// Counts a delivery returned to the queue unfinished.
    pub(crate) fn requeued(&self) {
        self.requeued.inc();
    }

    /// Deliveries returned to the queue unfinished so far.
    pub fn requeued_total(&self) -> u64 {
        self.requeued.get()
    }

    /// Counts rows of `timer` the sweeper settled.
    pub(crate) fn swept(&self, timer: &str, n: u64) {
        self.swept
            .get_or_create(&TimerLabel {
                timer: timer.to_owned(),
            })
            .inc_by(n);
    }

    /// Counts one sweep of `timer` that ended with `result`.
    pub(crate) fn sweep(&self, timer: &str, result: SweepResult) {
        self.sweeps
            .get_or_create(&ResultLabel {
                result: result.as_str(),
                timer: timer.to_owned(),
            })
            .inc();
    }

    /// Sweeps of `timer` that ended with `result` so far.
    pub fn sweeps_of(&self, timer: &str, result: SweepResult) -> u64 {
        self.sweeps
            .get_or_create(&ResultLabel {
                result: result.as_str(),
                timer: timer.to_owned(),
            })
            .get()
    }

    /// Counts rows of `timer` its watch scheduled.
    pub(crate) fn watched(&self, timer: &str, n: u64) {
        self.watched
            .get_or_create(&TimerLabel {
                timer: timer.to_owned(),
            })
            .inc_by(n);
    }

    /// Rows of `timer` its watch scheduled so far.
    pub fn watched_of(&self, timer: &str) -> u64 {
        self.watched
            .get_or_create(&TimerLabel {
                timer: timer.to_owned(),
            })
            .get()
    }

    /// Sets the readiness gauge.
    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Records whether a broker session is up (the alert
    /// `OrderTimeoutBrokerSessionDown` fires after a minute without one).
    pub(crate) fn set_broker_session_up(&self, up: bool) {
        self.broker_session_up.set(i64::from(up));
    }

    /// Records whether `timer`'s `statements` fail for a reason of the
    /// environment ([`crate::store::StoreError::is_row_fault`] says which
    /// do not): readiness and an alert say so while any of its statements
    /// do. Each kind is set and cleared by what runs it, so that a sweep
    /// finding nothing overdue does not clear a failing cancel statement.
    pub(crate) fn set_timer_failing(&self, timer: &str, statements: Statements, failing: bool) {
        let any = {
            let mut set = self.failing.lock().unwrap_or_else(|e| e.into_inner());
            let key = (timer.to_owned(), statements);
            if failing {
                set.insert(key);
            } else {
                set.remove(&key);
            }
            set.iter().any(|(t, _)| t == timer)
        };
        let label = TimerLabel {
            timer: timer.to_owned(),
        };
        let gauge = self.timer_failing.get_or_create(&label);
        let was = gauge.set(i64::from(any)) == 1;
        if was != any {
            if any {
                tracing::warn!(%timer, "the timer's statements fail for a reason of the environment: not ready until they run again");
            } else {
                tracing::info!(%timer, "the timer's statements run again");
            }
        }
    }

    /// The timers whose statements fail for a reason of the environment,
    /// in the config's order.
    pub fn failing_timers(&self) -> Vec<String> {
        let set = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        self.timers
            .iter()
            .filter(|timer| set.iter().any(|(t, _)| t == *timer))
            .cloned()
            .collect()
    }

    /// Records that a sweep of `timer` completed now (the sweeper also
    /// calls it when it starts, so the series exists from then).
    pub(crate) fn sweep_succeeded(&self, timer: &str) {
        self.sweep_last_success
            .get_or_create(&TimerLabel {
                timer: timer.to_owned(),
            })
            .set(chrono::Utc::now().timestamp());
    }

    /// When a sweep of `timer` last completed (Unix seconds; 0: never).
    pub fn sweep_last_success_of(&self, timer: &str) -> i64 {
        self.sweep_last_success
            .get_or_create(&TimerLabel {
                timer: timer.to_owned(),
            })
            .get()
    }

    /// Sets how many rows of `timer` are set aside.
    pub(crate) fn set_set_aside_rows(&self, timer: &str, rows: u64) {
        self.set_aside_rows
            .get_or_create(&TimerLabel {
                timer: timer.to_owned(),
            })
            .set(i64::try_from(rows).unwrap_or(i64::MAX));
    }

    /// Rows of `timer` set aside, as last counted.
    pub fn set_aside_rows_of(&self, timer: &str) -> i64 {
        self.set_aside_rows
            .get_or_create(&TimerLabel {
                timer: timer.to_owned(),
            })
            .get()
    }

    /// Counts an order of `timer` cancelled for a message whose deadline
    /// was later than the row's.
    pub(crate) fn late_message_deadline(&self, timer: &str) {
        self.late_message_deadlines
            .get_or_create(&TimerLabel {
                timer: timer.to_owned(),
            })
            .inc();
    }

    /// Orders of `timer` cancelled for a message whose deadline was later
    /// than the row's, so far.
    pub fn late_message_deadlines_of(&self, timer: &str) -> u64 {
        self.late_message_deadlines
            .get_or_create(&TimerLabel {
                timer: timer.to_owned(),
            })
            .get()
    }

    /// Counts a task (`batch`, `sweeper`, `watch`) that ended in a panic.
    pub(crate) fn task_panicked(&self, task: &'static str) {
        self.task_panics.get_or_create(&TaskLabel { task }).inc();
    }

    /// Tasks named `task` that ended in a panic so far.
    pub fn task_panics_of(&self, task: &'static str) -> u64 {
        self.task_panics.get_or_create(&TaskLabel { task }).get()
    }

    /// Sets a queue depth gauge.
    pub(crate) fn set_queue_depth(&self, queue: &'static str, messages: u32) {
        self.queue_messages
            .get_or_create(&QueueLabel { queue })
            .set(i64::from(messages));
    }

    /// Sets how many parked messages the parked store keeps.
    pub(crate) fn set_parked_messages(&self, messages: u64) {
        self.parked_messages
            .set(i64::try_from(messages).unwrap_or(i64::MAX));
    }

    /// Parked messages in the parked store, as last counted.
    pub fn parked_messages(&self) -> i64 {
        self.parked_messages.get()
    }

    /// The pending-timeout gauges (`observe/pending.rs`).
    pub(crate) fn pending(&self) -> &super::pending::PendingGauges {
        &self.pending
    }

    /// A guard counting one in-flight delivery until dropped.
    pub(crate) fn in_flight(self: &Arc<Self>) -> GaugeGuard {
        GaugeGuard::new(self.in_flight.clone())
    }

    /// A guard counting one held delivery until dropped.
    pub(crate) fn held(self: &Arc<Self>) -> GaugeGuard {
        GaugeGuard::new(self.held.clone())
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Increments a gauge on creation and decrements it on drop, so every
/// path out of a piece of work (ack, requeue, panic) is counted.
#[derive(Debug)]
pub(crate) struct GaugeGuard(Gauge);

impl GaugeGuard {
    fn new(gauge: Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_uses_prometheus_names() {
        let m = Arc::new(Metrics::for_timers(["cancel_unpaid", "auto_receive"]));
        m.record("cancel_unpaid", Outcome::Cancelled);
        m.record("cancel_unpaid", Outcome::AlreadyPaid);
        m.record("auto_receive", Outcome::Cancelled);
        m.record(NO_TIMER, Outcome::Parked);
        m.parked(ParkReason::NotJson);
        m.lateness("cancel_unpaid", chrono::Duration::milliseconds(12));
        m.swept("auto_receive", 2);
        m.stage(Stage::Db, Duration::from_millis(3));
        let guard = m.in_flight();
        let text = m.render();
        for needle in [
            r#"order_timeout_messages_total{result="cancelled",timer="cancel_unpaid"} 1"#,
            r#"order_timeout_messages_total{result="already_paid",timer="cancel_unpaid"} 1"#,
            r#"order_timeout_messages_total{result="cancelled",timer="auto_receive"} 1"#,
            r#"order_timeout_messages_total{result="parked",timer=""} 1"#,
            r#"order_timeout_parked_total{reason="not_json"} 1"#,
            r#"order_timeout_cancel_lateness_seconds_count{timer="cancel_unpaid"} 1"#,
            r#"order_timeout_cancel_lateness_seconds_count{timer="auto_receive"} 0"#,
            r#"order_timeout_sweeper_orders_total{timer="auto_receive"} 2"#,
            r#"order_timeout_stage_duration_seconds_count{stage="db"} 1"#,
            "order_timeout_in_flight_messages 1",
            r#"order_timeout_messages_total{result="duplicate",timer="auto_receive"} 0"#,
            r#"order_timeout_parked_total{reason="permanent_failure"} 0"#,
            r#"order_timeout_parked_total{reason="delivery_limit"} 0"#,
            r#"order_timeout_parked_total{reason="release_failed"} 0"#,
            "order_timeout_outbox_given_up_total 0",
            "order_timeout_outbox_deleted_total 0",
            "order_timeout_publish_failures_total 0",
            "order_timeout_requeued_total 0",
            concat!(
                r#"order_timeout_build_info{version=""#,
                env!("CARGO_PKG_VERSION"),
                r#""} 1"#
            ),
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        drop(guard);
        assert!(m.render().contains("order_timeout_in_flight_messages 0"));
        assert_eq!(m.count(Outcome::Cancelled), 2);
        assert_eq!(m.count_of("auto_receive", Outcome::Cancelled), 1);
        assert_eq!(m.total(), 4);
        assert_eq!(m.swept_total(), 2);
    }

    #[test]
    fn every_metric_the_alert_rules_use_is_served() {
        let m = Metrics::new();
        m.set_queue_depth(crate::broker::topology::PARKED_QUEUE, 0);
        // Served from the sweeper's start (none when it is disabled, so
        // that its stall alert cannot fire then).
        m.sweep_succeeded(crate::settings::DEFAULT_TIMER);
        let text = m.render();
        let rules = include_str!("../../deploy/prometheus-alerts.yml");
        let mut names: Vec<&str> = rules
            .match_indices("order_timeout_")
            .map(|(at, _)| {
                let rest = &rules[at..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        assert!(names.len() >= 6, "{names:?}");
        for name in names {
            assert!(
                text.lines().any(|l| l.starts_with(name) && {
                    let rest = &l[name.len()..];
                    let rest = ["_bucket", "_sum", "_count"]
                        .iter()
                        .find_map(|suffix| rest.strip_prefix(suffix))
                        .unwrap_or(rest);
                    rest.starts_with([' ', '{'])
                }),
                "deploy/prometheus-alerts.yml uses {name}, which /metrics does not serve:\n{text}"
            );
        }
        assert!(text.contains(r#"order_timeout_queue_messages{queue="order-timeout.parked"} 0"#));
    }
}
