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

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::metrics::Metrics;
use crate::shutdown::Shutdown;

/// Time between samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
/// How far back samples are kept.
pub const KEPT: Duration = Duration::from_secs(5 * 60);

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
pub fn parse_exposition(text: &str) -> Vec<Series> {
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

/// Samples of the exposition over the last [`KEPT`].
#[derive(Debug, Default)]
pub struct Recent {
    samples: Mutex<VecDeque<(Instant, Vec<Series>)>>,
}

impl Recent {
    /// Takes a sample of `metrics` now.
    pub fn sample(&self, metrics: &Metrics) {
        let now = Instant::now();
        let series = parse_exposition(&metrics.render());
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
pub fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
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
        assert!(p99 > 8.0, "a slow timer shows in the quantile over all: {p99}");
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
