//! The numbers a bench run reports, and the JSON they are written as.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use serde::Serialize;

use super::sys::{MemSample, Usage};

/// Lateness percentiles (`cancelled_at - expires_at`, from the database).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LatenessStats {
    /// Cancellations measured.
    pub count: u64,
    /// Cancelled before the deadline (must be 0).
    pub early: u64,
    /// Most negative lateness seen (ms), if any order was early.
    pub earliest_ms: Option<f64>,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// Worst, ms.
    pub max_ms: f64,
    /// Mean, ms.
    pub mean_ms: f64,
}

impl LatenessStats {
    /// Percentiles of `lateness_ms` (one value per cancelled order; early
    /// ones are negative and counted in `early`). Microsecond resolution,
    /// 3 significant digits.
    pub fn from_ms(lateness_ms: &[f64]) -> Self {
        let mut hist =
            Histogram::<u64>::new_with_bounds(1, 24 * 3600 * 1_000_000, 3).expect("valid bounds");
        let mut early = 0;
        let mut earliest: Option<f64> = None;
        let mut sum = 0.0;
        for &ms in lateness_ms {
            sum += ms;
            if ms < 0.0 {
                early += 1;
                earliest = Some(earliest.map_or(ms, |e: f64| e.min(ms)));
            }
            let us = (ms.max(0.0) * 1000.0).round() as u64;
            hist.saturating_record(us.max(1));
        }
        let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
        let n = lateness_ms.len() as u64;
        if n == 0 {
            return Self::default();
        }
        Self {
            count: n,
            early,
            earliest_ms: earliest,
            p50_ms: q(0.5),
            p90_ms: q(0.9),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: hist.max() as f64 / 1000.0,
            mean_ms: sum / n as f64,
        }
    }
}

/// Lateness of the orders due in one second of the run.
#[derive(Clone, Debug, Serialize)]
pub struct SecondStats {
    /// Seconds since the first order was created (by deadline).
    pub t_s: u64,
    /// Orders cancelled that were due in this second.
    pub cancelled: u64,
    /// Median lateness, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Worst, ms.
    pub max_ms: f64,
}

/// The median of `values` (the mean of the middle two for an even count);
/// `None` if there are none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Per-second lateness, by deadline: `points` are `(seconds since start,
/// lateness ms)` of each cancelled order.
pub fn per_second(points: &[(f64, f64)]) -> Vec<SecondStats> {
    let mut buckets: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for &(t, ms) in points {
        buckets.entry(t.max(0.0) as u64).or_default().push(ms);
    }
    buckets
        .into_iter()
        .map(|(t_s, v)| {
            let s = LatenessStats::from_ms(&v);
            SecondStats {
                t_s,
                cancelled: s.count,
                p50_ms: s.p50_ms,
                p99_ms: s.p99_ms,
                max_ms: s.max_ms,
            }
        })
        .collect()
}

/// Something the database server did during a phase that can hold up
/// everything on the machine for a while (a checkpoint's sync, the bench's
/// stand-in for autovacuum's `ANALYZE`), on the clock of
/// [`SecondStats::t_s`], so a slow second can be matched against it.
#[derive(Clone, Debug, Serialize)]
pub struct DbEvent {
    /// When it began, seconds since the phase's first order was created
    /// (negative: before).
    pub t_s: f64,
    /// How long it took, ms.
    pub took_ms: f64,
    /// What: `ANALYZE public.orders`, `checkpoint (timed): …`.
    pub what: String,
}

impl DbEvent {
    /// `what`, begun at `began` and taking `took`, on the clock of a phase
    /// whose first order was created at `started`.
    pub fn on_phase_clock(
        started: DateTime<Utc>,
        (began, took, what): (DateTime<Utc>, Duration, String),
    ) -> Self {
        Self {
            t_s: (began - started).as_seconds_f64(),
            took_ms: took.as_secs_f64() * 1000.0,
            what,
        }
    }
}

/// The `n` seconds with the highest p99 lateness, worst first.
pub fn slowest_seconds(seconds: &[SecondStats], n: usize) -> Vec<&SecondStats> {
    let mut by_p99: Vec<&SecondStats> = seconds.iter().collect();
    by_p99.sort_by(|a, b| b.p99_ms.total_cmp(&a.p99_ms));
    by_p99.truncate(n);
    by_p99
}

/// The outcome of one workload phase (the product, or a baseline).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseReport {
    /// With `--flood N`: what the HTTP clients hammering the services got
    /// during the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood: Option<super::flood::FloodReport>,
    /// With `--flood-every`: the lateness of the orders due in quiet and in
    /// flooded turns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood_split: Option<FloodSplit>,
    /// `cascade` (the product), `single-queue` or `seed` (the baselines).
    pub design: String,
    /// The workload (`shop (every order 31s)`, `mix (…)`, `custom (…)`).
    pub workload: String,
    /// Orders per second asked for.
    pub target_rate: f64,
    /// Orders created.
    pub orders: u64,
    /// Orders per second achieved, from `orders.created_at` (first to last
    /// insert).
    pub achieved_rate: f64,
    /// Seconds the generator took to create them.
    pub create_seconds: f64,
    /// Orders the generator could not create or publish (errors).
    pub create_errors: u64,
    /// Orders paid before their deadline (and so never to be cancelled).
    pub paid: u64,
    /// Payments made before the deadline that found the order no longer
    /// UNPAID (must be 0: that would mean it was cancelled early).
    pub pay_failures: u64,
    /// Payments the generator made only after the deadline because it fell
    /// behind (an overloaded machine); those orders are refused payment and
    /// must be cancelled like any unpaid order. Not a failure, but a sign
    /// that the machine, not only the service, was saturated.
    pub late_payments: u64,
    /// Orders cancelled.
    pub cancelled: u64,
    /// Unpaid orders not cancelled by the end of the settle wait (must be 0).
    pub not_cancelled: u64,
    /// Paid orders that were touched (cancelled, outbox row, stock released;
    /// must be 0).
    pub paid_touched: u64,
    /// Cancelled orders whose stock release or event is still pending.
    pub outbox_pending: u64,
    /// Orders whose stock was released (must equal `cancelled`).
    pub stock_releases: u64,
    /// Release calls beyond the first per order (absorbed duplicates).
    pub duplicate_release_calls: u64,
    /// Peak cancellations in one second (by `cancelled_at`).
    pub peak_cancel_rate: u64,
    /// Lateness percentiles.
    pub lateness: LatenessStats,
    /// Lateness per second of deadline.
    pub per_second: Vec<SecondStats>,
    /// What the database server did meanwhile that can stall it, on the
    /// same clock.
    pub db_events: Vec<DbEvent>,
    /// CPU and memory per process group while the phase ran.
    pub resources: BTreeMap<String, Usage>,
    /// CPU time per order created, ms, per process the design runs on
    /// (the phase's CPU seconds from its first order to the last settled,
    /// divided by its orders).
    pub cpu_ms_per_order: BTreeMap<String, f64>,
    /// Their sum, if every one of them was readable.
    pub cpu_ms_per_order_total: Option<f64>,
    /// The design's own process among them (`service`, or `seed` for the
    /// seed consumer).
    pub own_process: String,
    /// PostgreSQL's CPU time per order (of `cpu_ms_per_order`'s
    /// `postgres`) by whose statements it ran: `bench` (the shop's order
    /// service and payments, and the bench's own reads), `service` or
    /// `seed`, `inventory`. The rest is the server's own processes.
    pub postgres_ms_per_order_by_client: BTreeMap<String, f64>,
    /// Context switches per order, per process of the design: how often
    /// it slept and was woken (or was preempted) for each order.
    pub switches_per_order: BTreeMap<String, f64>,
    /// Orders the service's sweeper settled during the phase (no timeout
    /// message did; from `/metrics`). After each start of the service it
    /// sweeps every second for 5 minutes, so this caps lateness near 1–2 s
    /// then.
    pub swept: u64,
    /// `/proc/loadavg` at the start and the end of the phase.
    pub loadavg: (String, String),
    /// The services' own counters over the phase (`/metrics` deltas):
    /// time spent per stage (`…_sum` seconds, `…_count` calls), outcomes.
    pub service_metrics: BTreeMap<String, f64>,
    /// Problems found (an empty list means every check passed).
    pub failures: Vec<String>,
}

/// CPU time per order, ms, of the `groups` found in `resources` (in that
/// order), and their total if every one of them was readable.
pub fn cpu_per_order(
    resources: &BTreeMap<String, Usage>,
    orders: u64,
    groups: &[&str],
) -> (BTreeMap<String, f64>, Option<f64>) {
    let mut per = BTreeMap::new();
    let mut total = Some(0.0);
    for g in groups {
        let Some(u) = resources.get(*g) else {
            continue;
        };
        match (u.cpu_seconds, orders) {
            (Some(s), n) if n > 0 => {
                let ms = s * 1000.0 / n as f64;
                per.insert((*g).to_owned(), ms);
                total = total.map(|t| t + ms);
            }
            _ => total = None,
        }
    }
    (per, total)
}

/// Context switches per order of the `groups` found in `resources` whose
/// switches were read.
pub fn switches_per_order(
    resources: &BTreeMap<String, Usage>,
    orders: u64,
    groups: &[&str],
) -> BTreeMap<String, f64> {
    groups
        .iter()
        .filter(|_| orders > 0)
        .filter_map(|g| {
            let n = resources.get(*g)?.switches?;
            Some(((*g).to_owned(), n as f64 / orders as f64))
        })
        .collect()
}

/// One run of the workload (`--repeat` makes several, back to back): each
/// design's phase, in the order they ran.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunReport {
    /// 1, 2, … in the order the runs were made.
    pub run: usize,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// One per design: the product's first, then the baselines'.
    pub phases: Vec<PhaseReport>,
}

/// Whether a design stayed within the lateness target in every run.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Verdict {
    /// The design.
    pub design: String,
    /// Runs made.
    pub runs: usize,
    /// The target: lateness p99 at most this, ms.
    pub p99_target_ms: f64,
    /// Each run's p99, ms.
    pub p99_ms: Vec<f64>,
    /// Runs with p99 within the target and every check passed (0 early,
    /// 0 not cancelled, paid orders untouched…).
    pub within_target: usize,
    /// Every run within the target: stable, not lucky.
    pub stable: bool,
}

/// One [`Verdict`] per design, over `runs`.
pub fn verdicts(runs: &[RunReport], p99_target_ms: f64) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = Vec::new();
    for phase in runs.iter().flat_map(|r| &r.phases) {
        let i = match out.iter().position(|v| v.design == phase.design) {
            Some(i) => i,
            None => {
                out.push(Verdict {
                    design: phase.design.clone(),
                    p99_target_ms,
                    ..Default::default()
                });
                out.len() - 1
            }
        };
        let v = &mut out[i];
        v.runs += 1;
        v.p99_ms.push(phase.lateness.p99_ms);
        if phase.lateness.p99_ms <= p99_target_ms && phase.failures.is_empty() {
            v.within_target += 1;
        }
    }
    for v in &mut out {
        v.stable = v.runs > 0 && v.within_target == v.runs;
    }
    out
}

/// The one-hop broker ceiling: publish (confirms) → fixed-TTL queue →
/// dead-letter → consume, no database.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CeilingReport {
    /// Queue type used.
    pub queue_type: String,
    /// TTL of the delay queue, ms.
    pub ttl_ms: u64,
    /// Messages published (and confirmed).
    pub published: u64,
    /// Messages consumed.
    pub consumed: u64,
    /// Confirmed publishes per second while publishing.
    pub publish_rate: f64,
    /// Consumed per second, first to last delivery (includes draining the
    /// backlog after publishing stopped).
    pub consume_rate: f64,
    /// Consumed per second while the publisher was still running (from one
    /// second after the first delivery to the end of publishing, the
    /// publisher held to at most 15,000 messages ahead of the consumer):
    /// the ceiling, one hop sustained while also taking the publishes.
    pub sustained_rate: Option<f64>,
    /// Lateness of the dead-lettered messages (delivery − publish − TTL).
    /// Saturated, so this grows with the backlog; for information only.
    pub lateness: LatenessStats,
    /// CPU and memory per process group while it ran.
    pub resources: BTreeMap<String, Usage>,
    /// `/proc/loadavg` at start and end.
    pub loadavg: (String, String),
}

/// Memory and disk with many orders pending (`--pending N`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PendingReport {
    /// Orders created and scheduled.
    pub orders: u64,
    /// Timeouts used.
    pub timeouts: String,
    /// Seconds to declare the topology.
    pub declare_seconds: f64,
    /// Seconds to insert the rows and publish the messages (confirmed).
    pub publish_seconds: f64,
    /// Seconds until every message had left `order-timeout.due` for the
    /// cascade (from the first publish).
    pub fill_seconds: f64,
    /// Messages per cascade queue at the end (queue → count).
    pub queue_messages: BTreeMap<String, u64>,
    /// Broker memory of this vhost's queues (`rabbitmqctl list_queues
    /// memory`), MiB, if readable.
    pub queue_memory_mib: Option<f64>,
    /// Broker's own total memory figure (`rabbitmqctl status`), MiB,
    /// before and after, if readable.
    pub broker_memory_mib: (Option<f64>, Option<f64>),
    /// Broker data directory size before and after filling, MiB, if readable.
    pub broker_disk_mib: (Option<f64>, Option<f64>),
    /// Service memory over time (PSS/RSS, MiB).
    pub service_memory: Vec<MemSample>,
    /// Broker memory over time (PSS/RSS, MiB).
    pub broker_memory: Vec<MemSample>,
    /// CPU and memory per group over the whole fill.
    pub resources: BTreeMap<String, Usage>,
    /// `/proc/loadavg` at start and end.
    pub loadavg: (String, String),
    /// Problems found.
    pub failures: Vec<String>,
}

/// Everything one `bench` run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BenchReport {
    /// The command line.
    pub command: String,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// Machine: cores, memory, broker and database versions.
    pub machine: BTreeMap<String, String>,
    /// Service settings that matter for the numbers.
    pub settings: BTreeMap<String, String>,
    /// The one-hop broker ceiling, if measured.
    pub broker_ceiling: Option<CeilingReport>,
    /// The broker's CPU per message on each delay path, if measured
    /// (`--baseline broker-paths`).
    pub broker_paths: Vec<PathCost>,
    /// The workload's runs (one unless `--repeat`).
    pub runs: Vec<RunReport>,
    /// Per design: were all runs within the lateness target?
    pub verdicts: Vec<Verdict>,
    /// The pending-orders measurement, if asked for.
    pub pending: Option<PendingReport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[4.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn percentiles_and_early_count() {
        let v: Vec<f64> = (1..=1000).map(|i| i as f64).collect();
        let s = LatenessStats::from_ms(&v);
        assert_eq!(s.count, 1000);
        assert_eq!(s.early, 0);
        assert!((s.p50_ms - 500.0).abs() < 1.0, "{}", s.p50_ms);
        assert!((s.p99_ms - 990.0).abs() < 1.5, "{}", s.p99_ms);
        assert!((s.max_ms - 1000.0).abs() < 1.0);
        let s = LatenessStats::from_ms(&[-2.0, 1.0, 3.0]);
        assert_eq!((s.early, s.earliest_ms), (1, Some(-2.0)));
        assert_eq!(LatenessStats::from_ms(&[]), LatenessStats::default());
    }

    #[test]
    fn cpu_per_order_of_the_designs_processes() {
        let u = |s: Option<f64>| Usage {
            cpu_seconds: s,
            ..Default::default()
        };
        let r: BTreeMap<String, Usage> = [
            ("broker".to_owned(), u(Some(30.0))),
            ("service".to_owned(), u(Some(10.0))),
            ("seed".to_owned(), u(Some(99.0))),
        ]
        .into();
        let (per, total) = cpu_per_order(&r, 20_000, &["broker", "service", "mariadb"]);
        assert_eq!(per.len(), 2);
        assert!((per["broker"] - 1.5).abs() < 1e-9);
        assert!((total.unwrap() - 2.0).abs() < 1e-9);
        let r: BTreeMap<String, Usage> = [("broker".to_owned(), u(None))].into();
        assert_eq!(cpu_per_order(&r, 10, &["broker"]).1, None);
    }

    #[test]
    fn switches_per_order_of_the_processes_read() {
        let u = |n: Option<u64>| Usage {
            switches: n,
            ..Default::default()
        };
        let r: BTreeMap<String, Usage> = [
            ("broker".to_owned(), u(Some(29_000))),
            ("service".to_owned(), u(None)),
        ]
        .into();
        let per = switches_per_order(&r, 2_000, &["broker", "service", "bench"]);
        assert_eq!(per.len(), 1);
        assert!((per["broker"] - 14.5).abs() < 1e-9);
        assert!(switches_per_order(&r, 0, &["broker"]).is_empty());
    }

    #[test]
    fn a_design_is_stable_when_every_run_is_within_target() {
        let phase = |design: &str, p99: f64, failed: bool| PhaseReport {
            design: design.into(),
            lateness: LatenessStats {
                p99_ms: p99,
                ..Default::default()
            },
            failures: if failed { vec!["x".into()] } else { vec![] },
            ..Default::default()
        };
        let runs: Vec<RunReport> = [(20.0, 30.0), (19.0, 704.0), (21.0, 40.0)]
            .iter()
            .enumerate()
            .map(|(i, (seed, service))| RunReport {
                run: i + 1,
                phases: vec![
                    phase("service", *service, false),
                    phase("seed", *seed, i == 2),
                ],
                ..Default::default()
            })
            .collect();
        let v = verdicts(&runs, 50.0);
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].design.as_str(), v[0].runs, v[0].within_target),
            ("service", 3, 2)
        );
        assert!(!v[0].stable);
        assert_eq!(v[0].p99_ms, vec![30.0, 704.0, 40.0]);
        // Within the p99 target, but a check failed in run 3.
        assert_eq!((v[1].within_target, v[1].stable), (2, false));
        assert!(verdicts(&runs[..1], 50.0).iter().all(|v| v.stable));
    }

    #[test]
    fn buckets_by_second() {
        let pts = [(0.1, 1.0), (0.9, 3.0), (1.5, 10.0)];
        let s = per_second(&pts);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].t_s, s[0].cancelled), (0, 2));
        assert!((s[1].max_ms - 10.0).abs() < 0.1);
    }
}

/// The broker's cost on one path.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PathCost {
    /// Short name (`lane, held`, `seed`, …).
    pub path: String,
    /// Which round (from 1): the paths run in turn, round after round, so
    /// that a drift of the machine spreads over all of them.
    pub round: usize,
    /// What the path is.
    pub what: String,
    /// Messages consumed in the measured window.
    pub messages: u64,
    /// Length of the measured window, s.
    pub seconds: f64,
    /// The broker's CPU per message in the window, ms.
    pub broker_ms_per_message: Option<f64>,
    /// The broker's context switches per message in the window.
    pub broker_switches_per_message: Option<f64>,
    /// Messages published and not consumed by the end (should be 0).
    pub lost: u64,
}

/// The lateness of the orders due in quiet windows and of those due in
/// flooded ones (`points`: seconds from `started` to each deadline, and
/// its lateness in ms). An order due within [`SETTLING`] of a switch
/// counts for neither.
pub fn flood_split(
    points: &[(f64, f64)],
    started: DateTime<Utc>,
    windows: &super::flood::Windows,
) -> FloodSplit {
    let margin = SETTLING.as_secs_f64();
    let on: Vec<(f64, f64)> = windows
        .iter()
        .map(|(from, to)| (seconds(*from - started), seconds(*to - started)))
        .collect();
    let (mut quiet, mut flooded) = (Vec::new(), Vec::new());
    for &(due, late) in points {
        if on.iter().any(|&(a, b)| due >= a + margin && due < b) {
            flooded.push(late);
        } else if !on.iter().any(|&(a, b)| due >= a && due < b + margin) {
            quiet.push(late);
        }
    }
    FloodSplit {
        windows: on.len(),
        quiet: LatenessStats::from_ms(&quiet),
        flooded: LatenessStats::from_ms(&flooded),
    }
}

/// How long after a switch the orders due are counted for neither window.
const SETTLING: Duration = Duration::from_millis(500);

fn seconds(d: chrono::TimeDelta) -> f64 {
    d.num_milliseconds() as f64 / 1000.0
}

/// [`flood_split`]'s answer.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FloodSplit {
    /// Flooded windows.
    pub windows: usize,
    /// Orders due in quiet windows.
    pub quiet: LatenessStats,
    /// Orders due in flooded windows.
    pub flooded: LatenessStats,
}
