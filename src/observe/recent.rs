//! The instance's recent history, for the console's overview: what
//! Prometheus would compute with `rate()` and `histogram_quantile()`,
//! without a Prometheus. Every [`SAMPLE_INTERVAL`] the service keeps a
//! sample of its own `/metrics` exposition for the last [`KEPT`]; the
//! overview compares the current figures with the sample a minute (or five)
//! ago.
//!
//! It reads the exposition text rather than the metric handles, so every
//! series there is (a new `result` label, say) shows up without a change
//! here.
//!
//! For the console's pictures of the last hour it also keeps, per minute of
//! the clock (UTC), what the lateness histogram and the parked counter did
//! in that minute ([`Minute`]): per timer the p50 and p99 lateness and the
//! rows flipped, and the messages parked. At most [`HISTORY_MINUTES`]
//! minutes, the current one included, a few numbers each: bounded, whatever
//! the traffic.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, DurationRound as _, TimeDelta, Utc};

use super::metrics::Metrics;
use crate::shutdown::Shutdown;

/// Time between samples.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
/// How far back samples are kept.
pub(crate) const KEPT: Duration = Duration::from_secs(5 * 60);

/// One series of an exposition: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Metric name as exposed (with `_total`, `_bucket`… suffixes).
    pub name: String,
    /// Label pairs in exposition order.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Series {
    /// The value of label `name`, if the series has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the text exposition format (comments skipped; label values
/// unescaped). Lines that do not parse are skipped.
pub(crate) fn parse_exposition(text: &str) -> Vec<Series> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Series> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => parse_labels(inner)?,
        None => (Vec::new(), rest),
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Series {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// `k="v",k2="v2"} rest` → the pairs and `rest`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches(',');
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (key, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key.to_owned(), value));
        s = &rest[end + 1..];
    }
}

/// Minutes of history kept for the console's pictures: the last hour, the
/// current minute included.
pub(crate) const HISTORY_MINUTES: usize = 60;

/// The lateness histogram, summed per timer.
const LATENESS: &str = "order_timeout_cancel_lateness_seconds_bucket";
/// Parkings, every reason.
const PARKED: &str = "order_timeout_parked_total";

/// One timer's figures in one [`Minute`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimerMinute {
    /// Median lateness (seconds) of the rows flipped in the minute; `None`
    /// when none was.
    pub p50: Option<f64>,
    /// 99th percentile lateness (seconds); `None` when no row was flipped.
    pub p99: Option<f64>,
    /// Rows flipped (orders cancelled, for `cancel_unpaid`), by a message or
    /// by the sweeper: every observation of the lateness histogram.
    pub flips: u64,
}

/// What the instance did in one minute of the clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Minute {
    /// The minute's start, UTC, whole minutes.
    pub start: DateTime<Utc>,
    /// Per timer (the lateness histogram's `timer` label values).
    pub timers: BTreeMap<String, TimerMinute>,
    /// Messages parked, every reason.
    pub parked: u64,
    /// The current minute, so far.
    pub partial: bool,
}

/// The counters [`Minute`]s are differences of: per timer the lateness
/// histogram's cumulative `(le, count)` buckets, sorted by `le`, and the
/// parked total.
#[derive(Clone, Debug, Default, PartialEq)]
struct Totals {
    lateness: BTreeMap<String, Vec<(f64, f64)>>,
    parked: f64,
}

impl Totals {
    fn of(series: &[Series]) -> Self {
        let mut totals = Self::default();
        for s in series {
            if s.name == PARKED {
                totals.parked += s.value;
                continue;
            }
            if s.name != LATENESS {
                continue;
            }
            let (Some(timer), Some(le)) = (s.label("timer"), s.label("le")) else {
                continue;
            };
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                match le.parse() {
                    Ok(le) => le,
                    Err(_) => continue,
                }
            };
            let buckets = totals.lateness.entry(timer.to_owned()).or_default();
            match buckets.iter_mut().find(|(bound, _)| *bound == le) {
                Some((_, count)) => *count += s.value,
                None => buckets.push((le, s.value)),
            }
        }
        for buckets in totals.lateness.values_mut() {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        totals
    }

    /// What happened from `then` to `self`, as the minute starting at `start`.
    fn since(&self, then: &Totals, start: DateTime<Utc>, partial: bool) -> Minute {
        let timers = self
            .lateness
            .iter()
            .filter(|(timer, _)| !timer.is_empty())
            .map(|(timer, now)| {
                let before = then.lateness.get(timer);
                let buckets: Vec<(f64, f64)> = now
                    .iter()
                    .map(|&(le, count)| {
                        let was = before
                            .and_then(|b| b.iter().find(|(bound, _)| *bound == le))
                            .map_or(0.0, |(_, c)| *c);
                        (le, (count - was).max(0.0))
                    })
                    .collect();
                let figures = TimerMinute {
                    p50: histogram_quantile(0.5, &buckets),
                    p99: histogram_quantile(0.99, &buckets),
                    flips: buckets.last().map_or(0, |(_, n)| *n as u64),
                };
                (timer.clone(), figures)
            })
            .collect();
        Minute {
            start,
            timers,
            parked: (self.parked - then.parked).max(0.0) as u64,
            partial,
        }
    }
}

/// The closed minutes and the totals the current one started from.
#[derive(Debug, Default)]
struct History {
    current: Option<(DateTime<Utc>, Totals)>,
    closed: VecDeque<Minute>,
}

/// The minute of the clock `at` is in.
fn minute_of(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::minutes(1)).unwrap_or(at)
}

impl History {
    /// A sample taken `at`: the first one in a later minute closes the
    /// current minute with it (what happened up to this sample counts for
    /// the minute it started in: a few seconds' blur at most).
    fn observe(&mut self, at: DateTime<Utc>, totals: Totals) {
        let minute = minute_of(at);
        match &self.current {
            Some((start, _)) if minute <= *start => {}
            Some((start, base)) => {
                self.closed.push_back(totals.since(base, *start, false));
                while self.closed.len() >= HISTORY_MINUTES {
                    self.closed.pop_front();
                }
                self.current = Some((minute, totals));
            }
            None => self.current = Some((minute, totals)),
        }
    }

    /// The minutes of the last hour up to `at`, oldest first: the closed
    /// ones, then the current one so far (from `totals`, the figures at
    /// `at`).
    fn minutes(&self, at: DateTime<Utc>, totals: &Totals) -> Vec<Minute> {
        let oldest = minute_of(at) - TimeDelta::minutes(HISTORY_MINUTES as i64 - 1);
        let mut minutes: Vec<Minute> = self
            .closed
            .iter()
            .filter(|m| m.start >= oldest)
            .cloned()
            .collect();
        if let Some((start, base)) = &self.current {
            minutes.push(totals.since(base, *start, true));
        }
        minutes
    }
}

/// Samples of the exposition over the last [`KEPT`], and the last hour
/// per minute.
#[derive(Debug, Default)]
pub struct Recent {
    samples: Mutex<VecDeque<(Instant, Vec<Series>)>>,
    history: Mutex<History>,
}

impl Recent {
    /// Takes a sample of `metrics` now.
    pub fn sample(&self, metrics: &Metrics) {
        let now = Instant::now();
        let series = parse_exposition(&metrics.render());
        if let Ok(mut history) = self.history.lock() {
            history.observe(Utc::now(), Totals::of(&series));
        }
        if let Ok(mut samples) = self.samples.lock() {
            samples.push_back((now, series));
            // Keep one sample older than KEPT, so a full window has a base.
            while samples
                .get(1)
                .is_some_and(|(at, _)| now.duration_since(*at) >= KEPT)
            {
                samples.pop_front();
            }
        }
    }

    /// Samples every [`SAMPLE_INTERVAL`] until `stop` fires.
    pub async fn record(self: Arc<Self>, metrics: Arc<Metrics>, stop: Shutdown) {
        loop {
            self.sample(&metrics);
            tokio::select! {
                _ = tokio::time::sleep(SAMPLE_INTERVAL) => {}
                _ = stop.wait() => return,
            }
        }
    }

    /// The last hour per minute of the clock, oldest first, the current
    /// minute (so far, from `metrics` now) last; at most
    /// [`HISTORY_MINUTES`]. Minutes before the first sample are missing.
    pub fn minutes(&self, metrics: &Metrics) -> Vec<Minute> {
        let totals = Totals::of(&parse_exposition(&metrics.render()));
        self.history
            .lock()
            .map(|h| h.minutes(Utc::now(), &totals))
            .unwrap_or_default()
    }

    /// The change from the newest sample at least `over` old (or the
    /// oldest one, when the service is younger than that) to `metrics` now.
    pub fn change(&self, metrics: &Metrics, over: Duration) -> Change {
        let now_at = Instant::now();
        let now = parse_exposition(&metrics.render());
        let base = self.samples.lock().ok().and_then(|samples| {
            samples
                .iter()
                .rev()
                .find(|(at, _)| now_at.duration_since(*at) >= over)
                .or_else(|| samples.front())
                .cloned()
        });
        match base {
            Some((at, then)) => Change {
                seconds: now_at.duration_since(at).as_secs_f64(),
                now,
                then,
            },
            None => Change {
                seconds: 0.0,
                then: Vec::new(),
                now,
            },
        }
    }
}

/// Two expositions and the seconds between them ([`Recent::change`]).
#[derive(Clone, Debug)]
pub struct Change {
    /// Seconds between `then` and `now` (0: no earlier sample).
    pub seconds: f64,
    /// The series then (empty: none yet).
    pub then: Vec<Series>,
    /// The series now.
    pub now: Vec<Series>,
}

fn sum(series: &[Series], name: &str, keep: &dyn Fn(&Series) -> bool) -> f64 {
    series
        .iter()
        .filter(|s| s.name == name && keep(s))
        .map(|s| s.value)
        .sum()
}

impl Change {
    /// How much the counters `name` whose series pass `keep` grew.
    pub fn increase(&self, name: &str, keep: &dyn Fn(&Series) -> bool) -> f64 {
        (sum(&self.now, name, keep) - sum(&self.then, name, keep)).max(0.0)
    }

    /// [`Change::increase`] per minute; `None` without an earlier sample.
    pub fn per_minute(&self, name: &str, keep: &dyn Fn(&Series) -> bool) -> Option<f64> {
        (self.seconds >= 1.0).then(|| self.increase(name, keep) * 60.0 / self.seconds)
    }

    /// The `q` quantile of histogram `name` (its `_bucket` series) over the
    /// change, summed over its other labels (every timer's lateness), as
    /// `histogram_quantile(q, sum by (le) (increase(…)))` does, interpolated
    /// within the bucket; `None` when nothing was observed.
    pub fn quantile(&self, name: &str, q: f64) -> Option<f64> {
        self.quantile_of(name, q, &|_| true)
    }

    /// [`Change::quantile`] over the series that pass `keep` (one timer's).
    pub fn quantile_of(&self, name: &str, q: f64, keep: &dyn Fn(&Series) -> bool) -> Option<f64> {
        let bucket = format!("{name}_bucket");
        // Cumulative counts by bound, summed over the series' other labels.
        let by_le = |series: &[Series]| {
            let mut sums: Vec<(f64, f64)> = Vec::new();
            for s in series.iter().filter(|s| s.name == bucket && keep(s)) {
                let Some(le) = s.label("le") else { continue };
                let le: f64 = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    match le.parse() {
                        Ok(le) => le,
                        Err(_) => continue,
                    }
                };
                match sums.iter_mut().find(|(bound, _)| *bound == le) {
                    Some((_, sum)) => *sum += s.value,
                    None => sums.push((le, s.value)),
                }
            }
            sums
        };
        let then = by_le(&self.then);
        let mut buckets: Vec<(f64, f64)> = by_le(&self.now)
            .into_iter()
            .map(|(le, now)| {
                let before = then
                    .iter()
                    .find(|(bound, _)| *bound == le)
                    .map_or(0.0, |(_, v)| *v);
                (le, (now - before).max(0.0))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        histogram_quantile(q, &buckets)
    }
}

/// `histogram_quantile()` over cumulative `(le, count)` buckets sorted by
/// `le`: the bucket where the rank falls, interpolated linearly; in the
/// `+Inf` bucket, the highest finite bound.
pub(crate) fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let width = count - lower.1;
            let within = if width > 0.0 {
                (rank - lower.1) / width
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * within);
        }
        lower = (le, count);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_metrics_render() {
        let text = "# HELP x_total X.\n# TYPE x_total counter\nx_total{result=\"cancelled\"} 3\nplain 1.5\nh_bucket{le=\"+Inf\"} 4\nodd{a=\"q\\\"uote\",b=\"2\"} 7\n# EOF\n";
        let s = parse_exposition(text);
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].label("result"), Some("cancelled"));
        assert_eq!(s[0].value, 3.0);
        assert_eq!(s[1].name, "plain");
        assert_eq!(s[2].label("le"), Some("+Inf"));
        assert_eq!(s[3].label("a"), Some("q\"uote"));
        assert_eq!(s[3].label("b"), Some("2"));
    }

    #[test]
    fn quantiles_interpolate_like_prometheus() {
        // 10 observations ≤ 1, 10 more ≤ 2, none beyond.
        let b = [(1.0, 10.0), (2.0, 20.0), (f64::INFINITY, 20.0)];
        assert_eq!(histogram_quantile(0.5, &b), Some(1.0));
        assert_eq!(histogram_quantile(0.75, &b), Some(1.5));
        assert_eq!(histogram_quantile(0.25, &b), Some(0.5));
        let beyond = [(1.0, 0.0), (f64::INFINITY, 5.0)];
        assert_eq!(histogram_quantile(0.99, &beyond), Some(1.0));
        assert_eq!(histogram_quantile(0.5, &[(1.0, 0.0)]), None);
    }

    fn at(minute: u32, second: u32) -> DateTime<Utc> {
        use chrono::TimeZone as _;
        Utc.with_ymd_and_hms(2026, 11, 27, 10, minute, second)
            .unwrap()
    }

    #[test]
    fn the_last_hour_per_minute_of_the_clock() {
        let metrics = Metrics::for_timers(["cancel_unpaid", "auto_receive"]);
        let totals = || Totals::of(&parse_exposition(&metrics.render()));
        let mut history = History::default();
        history.observe(at(0, 3), totals());
        // Minute 10:00: four cancellations, 2-4 ms late, and one 3 s late;
        // one auto_receive flip; two messages parked.
        for ms in [2, 3, 3, 4] {
            metrics.lateness("cancel_unpaid", chrono::Duration::milliseconds(ms));
        }
        metrics.lateness("cancel_unpaid", chrono::Duration::seconds(3));
        metrics.lateness("auto_receive", chrono::Duration::milliseconds(20));
        metrics.parked(crate::message::ParkReason::NotJson);
        metrics.parked(crate::message::ParkReason::UnknownOrder);
        history.observe(at(0, 58), totals());
        // 10:01: the first sample of the next minute closes 10:00.
        history.observe(at(1, 3), totals());
        metrics.lateness("cancel_unpaid", chrono::Duration::milliseconds(7));
        let minutes = history.minutes(at(1, 30), &totals());
        assert_eq!(minutes.len(), 2);
        let first = &minutes[0];
        assert_eq!(
            (first.start, first.partial, first.parked),
            (at(0, 0), false, 2)
        );
        let cancel = &first.timers["cancel_unpaid"];
        assert_eq!(cancel.flips, 5);
        assert!((0.002..=0.004).contains(&cancel.p50.unwrap()), "{cancel:?}");
        assert!(cancel.p99.unwrap() > 2.0, "the 3 s one: {cancel:?}");
        assert_eq!(first.timers["auto_receive"].flips, 1);
        // The current minute so far.
        let now = &minutes[1];
        assert_eq!((now.start, now.partial, now.parked), (at(1, 0), true, 0));
        assert_eq!(now.timers["cancel_unpaid"].flips, 1);
        assert_eq!(now.timers["auto_receive"].flips, 0);
        assert_eq!(now.timers["auto_receive"].p99, None, "nothing flipped");
    }

    #[test]
    fn the_history_keeps_one_hour_and_skips_quiet_gaps() {
        let metrics = Metrics::new();
        let totals = || Totals::of(&parse_exposition(&metrics.render()));
        let mut history = History::default();
        let start = at(0, 0);
        // Three hours of samples every 5 s: at most 60 minutes, the current
        // one included, in order, one per minute.
        for i in 0..(3 * 3600 / 5) {
            metrics.lateness("cancel_unpaid", chrono::Duration::milliseconds(5));
            history.observe(start + TimeDelta::seconds(i * 5), totals());
        }
        // The last sample's time.
        let end = start + TimeDelta::seconds(3 * 3600 - 5);
        let minutes = history.minutes(end, &totals());
        assert_eq!(minutes.len(), HISTORY_MINUTES);
        assert!(history.closed.len() < HISTORY_MINUTES);
        assert!(
            minutes
                .windows(2)
                .all(|w| w[1].start - w[0].start == TimeDelta::minutes(1))
        );
        assert_eq!(minutes.last().unwrap().start, minute_of(end));
        assert_eq!(minutes[10].timers["cancel_unpaid"].flips, 12);
        // An hour later with no sample in between: the old minutes are out
        // of the window, only the current one is left.
        let later = end + TimeDelta::hours(1);
        assert_eq!(history.minutes(later, &totals()).len(), 1);
    }

    #[test]
    fn rates_and_quantiles_of_this_instance() {
        let metrics = Metrics::for_timers(["cancel_unpaid", "auto_receive"]);
        let recent = Recent::default();
        metrics.lateness("auto_receive", chrono::Duration::milliseconds(3));
        recent.sample(&metrics);
        metrics.lateness("cancel_unpaid", chrono::Duration::milliseconds(3));
        metrics.lateness("auto_receive", chrono::Duration::milliseconds(3));
        let change = recent.change(&metrics, Duration::from_secs(60));
        let lateness = "order_timeout_cancel_lateness_seconds";
        // Over every timer, and only what changed since the sample.
        let p50 = change.quantile(lateness, 0.5).unwrap();
        assert!((0.002..=0.004).contains(&p50), "{p50}");
        assert_eq!(
            change.increase(&format!("{lateness}_count"), &|_| true),
            2.0
        );
        metrics.lateness("auto_receive", chrono::Duration::seconds(10));
        let change = recent.change(&metrics, Duration::from_secs(60));
        let p99 = change.quantile(lateness, 0.99).unwrap();
        assert!(
            p99 > 8.0,
            "a slow timer shows in the quantile over all: {p99}"
        );
        // Less than a second between the two: no rate yet.
        assert_eq!(
            change.per_minute(&format!("{lateness}_count"), &|_| true),
            None
        );
        let since_start = Change {
            seconds: 30.0,
            ..change
        };
        assert_eq!(
            since_start.per_minute(&format!("{lateness}_count"), &|_| true),
            Some(6.0)
        );
    }
}
