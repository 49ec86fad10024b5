//! What waits, and by when it falls due: the `order-timeout pending`
//! command, the console's pending page and the pending gauges on
//! `/metrics` all read one [`PendingReport`].
//!
//! The figures come from **passive queue declares** only: the broker
//! answers each with the queue's message and consumer counts, so a
//! measurement costs one round trip per queue (28 levels per cascade
//! shard, each lane's shards, the due and parked queues) and never reads a
//! message.
//!
//! **Due windows.** A message in level k of the cascade waits there at most
//! 2^k s, then passes through lower levels only, which add at most
//! 2^k − 1 s: it reaches the consumer within 2^(k+1) s
//! ([`due_within_secs`]). The latest due bound of a shard (or of the whole
//! cascade) is that of its highest non-empty level. The bound is an upper
//! one: a message may have entered its level at any time within the last
//! 2^k s. A message in lane W falls due within W s (the lane holds it
//! W − 2 s, the consumer the rest).
//!
//! **What falls due when.** [`PendingReport::due_windows`] sorts every
//! waiting timeout, cascade and lanes, into [`DUE_WINDOWS`] (within 1
//! minute, 10 minutes, 1 hour, 1 day, 7 days, later) by that bound: a
//! timeout counted under "1 hour" falls due within the hour at the latest,
//! maybe much sooner. It is a bound, not an exact time, and every place that
//! shows it says so.
//!
//! The parked queue's depth is measured the same way: the messages that
//! wait there to be moved into the parked store. What the store keeps, by
//! reason, is one query of the database (`pending` runs it unless the
//! operator says `--parked-scan-limit 0`; the keeper counts the store for
//! its gauge).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::{Channel, Connection};
use serde::Serialize;

use crate::broker::cascade::{LEVELS, shard_level_name};
use crate::broker::lanes::lane_name;
use crate::broker::refusals::is_not_found;
use crate::broker::topology::{DUE_QUEUE, Layout, PARKED_QUEUE};
use crate::message::format_instant;
use crate::observe::metrics::Metrics;
use crate::settings::Lane;
use crate::shutdown::Shutdown;

/// How often the running service refreshes the pending gauges.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// `pending` shows the parked messages by reason only while the parked
/// store keeps at most this many (beyond it, their number alone).
pub const PARKED_SCAN_LIMIT: u32 = 10_000;

/// A message in cascade level `level` reaches the consumer within this
/// many seconds: 2^(level+1).
pub fn due_within_secs(level: u32) -> u64 {
    1u64 << (level + 1)
}

/// The due windows of [`PendingReport::due_windows`]: a name and the
/// bound in seconds; what is due later than the last is "later".
pub const DUE_WINDOWS: [(&str, u64); 5] = [
    ("1m", 60),
    ("10m", 600),
    ("1h", 3_600),
    ("1d", 86_400),
    ("7d", 604_800),
];

/// The name of the window after the last of [`DUE_WINDOWS`].
pub const LATER: &str = "later";

/// The index in [`DUE_WINDOWS`] (or its length: later) of the first window
/// whose bound is at least `bound_secs`.
fn due_window_of(bound_secs: u64) -> usize {
    DUE_WINDOWS
        .iter()
        .position(|(_, secs)| bound_secs <= *secs)
        .unwrap_or(DUE_WINDOWS.len())
}

/// Timeouts waiting whose due bound falls in one window: what falls due
/// when, at the latest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DueWindow {
    /// `1m`, `10m`, `1h`, `1d`, `7d` or `later`.
    pub window: &'static str,
    /// Each of them falls due within this many seconds at the latest (an
    /// upper bound from its queue's TTL, not its time); null for `later`.
    pub at_most_secs: Option<u64>,
    /// Timeouts whose bound is in this window (beyond the previous one's).
    pub messages: u64,
    /// This window's and every sooner one's: at least this many fall due
    /// within `at_most_secs` (some counted later may come sooner too).
    pub cumulative: u64,
}

impl DueWindow {
    /// The window in words: `1 minute`, `10 minutes`, …, `later`.
    pub fn label(&self) -> &'static str {
        match self.window {
            "1m" => "1 minute",
            "10m" => "10 minutes",
            "1h" => "1 hour",
            "1d" => "1 day",
            "7d" => "7 days",
            _ => "later",
        }
    }
}

/// Errors measuring.
#[derive(Debug, thiserror::Error)]
pub enum PendingError {
    /// The broker could not be asked (connection or channel failure).
    #[error("talking to the broker: {0}")]
    Amqp(#[source] lapin::Error),
}

/// Messages and consumers of one queue, from a passive declare.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueDepth {
    /// Messages ready in the queue.
    pub messages: u32,
    /// Consumers subscribed to it.
    pub consumers: u32,
}

/// One cascade level of one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LevelDepth {
    /// The cascade shard.
    pub shard: u32,
    /// The level (its queue holds messages 2^level s).
    pub level: u32,
    /// Messages waiting in it; `None` when the queue does not exist.
    pub messages: Option<u32>,
}

/// One shard of one lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneDepth {
    /// The lane.
    pub lane: Lane,
    /// The lane's shard.
    pub shard: u32,
    /// Messages waiting in it; `None` when the queue does not exist.
    pub messages: Option<u32>,
}

/// What waits in the delay store (cascade and lanes) and the service's
/// queues at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingReport {
    /// When it was measured.
    pub measured_at: DateTime<Utc>,
    /// Cascade shards measured.
    pub shards: u32,
    /// Every level of every shard, shard by shard, lowest level first.
    pub levels: Vec<LevelDepth>,
    /// Every shard of every lane, lane by lane.
    pub lanes: Vec<LaneDepth>,
    /// The due queue (`None`: missing).
    pub due: Option<QueueDepth>,
    /// The parked queue (`None`: missing).
    pub parked: Option<QueueDepth>,
}

/// One lane of [`PendingReport::lane_windows`], across its shards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LaneWindow {
    /// The lane (`1800s`).
    pub lane: String,
    /// Its messages reach the consumer within this many seconds.
    pub due_within_secs: u64,
    /// Messages in this lane, all shards.
    pub messages: u64,
    /// Messages per lane shard (index = shard).
    pub by_shard: Vec<u64>,
}

/// One due window of [`PendingReport::windows`]: a cascade level across
/// shards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Window {
    /// The cascade level.
    pub level: u32,
    /// Its messages reach the consumer within this many seconds.
    pub due_within_secs: u64,
    /// Messages in this level, all shards.
    pub messages: u64,
    /// Messages in this level per shard (index = shard).
    pub by_shard: Vec<u64>,
}

impl PendingReport {
    fn in_shard(&self, shard: Option<u32>) -> impl Iterator<Item = &LevelDepth> {
        self.levels
            .iter()
            .filter(move |l| shard.is_none_or(|s| l.shard == s))
    }

    /// Timeouts waiting in the cascade: in `shard`, or in all (`None`).
    pub fn waiting(&self, shard: Option<u32>) -> u64 {
        self.in_shard(shard)
            .map(|l| u64::from(l.messages.unwrap_or(0)))
            .sum()
    }

    /// Every timeout waiting in cascade shard `shard` (or in the whole
    /// cascade, `None`) falls due within this many seconds; `None` when
    /// nothing waits.
    pub fn latest_due_secs(&self, shard: Option<u32>) -> Option<u64> {
        self.in_shard(shard)
            .filter(|l| l.messages.unwrap_or(0) > 0)
            .map(|l| due_within_secs(l.level))
            .max()
    }

    /// Timeouts waiting in the whole delay store: the cascade and the lanes.
    pub fn total_waiting(&self) -> u64 {
        self.waiting(None)
            + self
                .lanes
                .iter()
                .map(|l| u64::from(l.messages.unwrap_or(0)))
                .sum::<u64>()
    }

    /// Every timeout waiting in the delay store, cascade and lanes, falls
    /// due within this many seconds; `None` when nothing waits.
    pub fn total_latest_due_secs(&self) -> Option<u64> {
        self.lanes
            .iter()
            .filter(|l| l.messages.unwrap_or(0) > 0)
            .map(|l| l.lane.secs())
            .chain(self.latest_due_secs(None))
            .max()
    }

    /// The lanes, each summed over its shards, shortest first.
    pub fn lane_windows(&self) -> Vec<LaneWindow> {
        let mut windows: Vec<LaneWindow> = Vec::new();
        for l in &self.lanes {
            let name = l.lane.to_string();
            let n = l.messages.map_or(0, u64::from);
            match windows.iter_mut().find(|w| w.lane == name) {
                Some(w) => {
                    w.messages += n;
                    w.by_shard.push(n);
                }
                None => windows.push(LaneWindow {
                    lane: name,
                    due_within_secs: l.lane.secs(),
                    messages: n,
                    by_shard: vec![n],
                }),
            }
        }
        windows.sort_by_key(|w| w.due_within_secs);
        windows
    }

    /// The levels, each summed over the shards, lowest (soonest) first.
    pub fn windows(&self) -> Vec<Window> {
        (0..LEVELS)
            .map(|level| {
                let by_shard: Vec<u64> = (0..self.shards)
                    .map(|shard| {
                        self.levels
                            .iter()
                            .find(|l| l.shard == shard && l.level == level)
                            .and_then(|l| l.messages)
                            .map_or(0, u64::from)
                    })
                    .collect();
                Window {
                    level,
                    due_within_secs: due_within_secs(level),
                    messages: by_shard.iter().sum(),
                    by_shard,
                }
            })
            .collect()
    }

    /// Every timeout waiting in the delay store, cascade levels and lanes,
    /// by the window its due bound falls in ([`DUE_WINDOWS`], then later),
    /// soonest first; all six windows, empty ones too.
    pub fn due_windows(&self) -> Vec<DueWindow> {
        let mut counts = [0u64; DUE_WINDOWS.len() + 1];
        for l in &self.levels {
            counts[due_window_of(due_within_secs(l.level))] += u64::from(l.messages.unwrap_or(0));
        }
        for l in &self.lanes {
            counts[due_window_of(l.lane.secs())] += u64::from(l.messages.unwrap_or(0));
        }
        let mut cumulative = 0;
        counts
            .iter()
            .enumerate()
            .map(|(i, &messages)| {
                cumulative += messages;
                let (window, at_most_secs) = DUE_WINDOWS
                    .get(i)
                    .map_or((LATER, None), |&(name, secs)| (name, Some(secs)));
                DueWindow {
                    window,
                    at_most_secs,
                    messages,
                    cumulative,
                }
            })
            .collect()
    }

    /// Queues that were expected but do not exist.
    pub fn missing_queues(&self) -> Vec<String> {
        let mut missing: Vec<String> = self
            .levels
            .iter()
            .filter(|l| l.messages.is_none())
            .map(|l| shard_level_name(l.shard, l.level))
            .chain(
                self.lanes
                    .iter()
                    .filter(|l| l.messages.is_none())
                    .map(|l| lane_name(l.lane, l.shard)),
            )
            .collect();
        for (queue, depth) in [(DUE_QUEUE, self.due), (PARKED_QUEUE, self.parked)] {
            if depth.is_none() {
                missing.push(queue.to_owned());
            }
        }
        missing
    }

    /// Sets the instance's gauges: every level's depth, the latest due
    /// bound, the due queue's consumers, and the due and parked depths
    /// (`order_timeout_queue_messages`, which the alerts read).
    pub fn export(&self, metrics: &Metrics) {
        let gauges = metrics.pending();
        for l in &self.levels {
            gauges.set_level(l.shard, l.level, l.messages.unwrap_or(0));
        }
        for l in &self.lanes {
            gauges.set_lane(l.shard, l.lane, l.messages.unwrap_or(0));
        }
        gauges.set_latest_due_secs(self.total_latest_due_secs().unwrap_or(0));
        if let Some(due) = self.due {
            metrics.set_queue_depth(DUE_QUEUE, due.messages);
            gauges.set_consumers(DUE_QUEUE, due.consumers);
        }
        if let Some(parked) = self.parked {
            metrics.set_queue_depth(PARKED_QUEUE, parked.messages);
        }
    }

    /// The JSON printed by `pending --json`, with the parked messages'
    /// reasons when they were counted.
    pub fn to_json(&self, parked_reasons: Option<&BTreeMap<String, usize>>) -> PendingJson {
        let shard = |s: u32| ShardJson {
            shard: s,
            messages: self.waiting(Some(s)),
            latest_due_secs: self.latest_due_secs(Some(s)),
        };
        PendingJson {
            measured_at: format_instant(self.measured_at),
            total: ShardTotalJson {
                messages: self.total_waiting(),
                latest_due_secs: self.total_latest_due_secs(),
            },
            shards: (0..self.shards).map(shard).collect(),
            due_windows: self.due_windows(),
            windows: self.windows(),
            lanes: self.lane_windows(),
            due: self.due.map(|d| QueueJson {
                queue: DUE_QUEUE,
                messages: d.messages,
                consumers: d.consumers,
            }),
            parked: self.parked.map(|d| ParkedQueueJson {
                queue: PARKED_QUEUE,
                messages: d.messages,
                by_reason: parked_reasons.cloned(),
            }),
            missing_queues: self.missing_queues(),
        }
    }
}

/// `pending --json`: a stable contract for scripts.
#[derive(Clone, Debug, Serialize)]
pub struct PendingJson {
    /// RFC 3339.
    pub measured_at: String,
    /// The whole delay store: the cascade and the lanes.
    pub total: ShardTotalJson,
    /// Per cascade shard.
    pub shards: Vec<ShardJson>,
    /// What falls due when: the delay store (cascade and lanes) by due
    /// window, `1m` … `7d`, `later`; upper bounds, not times.
    pub due_windows: Vec<DueWindow>,
    /// Per cascade level, every level, soonest first.
    pub windows: Vec<Window>,
    /// Per lane, shortest first (empty without lanes).
    pub lanes: Vec<LaneWindow>,
    /// The due queue; null when it does not exist.
    pub due: Option<QueueJson>,
    /// The parked queue; null when it does not exist.
    pub parked: Option<ParkedQueueJson>,
    /// Expected queues that do not exist.
    pub missing_queues: Vec<String>,
}

/// Totals of the delay store in [`PendingJson`].
#[derive(Clone, Debug, Serialize)]
pub struct ShardTotalJson {
    /// Timeouts waiting.
    pub messages: u64,
    /// All of them fall due within this many seconds; null when none waits.
    pub latest_due_secs: Option<u64>,
}

/// One shard in [`PendingJson`].
#[derive(Clone, Debug, Serialize)]
pub struct ShardJson {
    /// The shard.
    pub shard: u32,
    /// Timeouts waiting in it.
    pub messages: u64,
    /// All of them fall due within this many seconds; null when none waits.
    pub latest_due_secs: Option<u64>,
}

/// A queue in [`PendingJson`].
#[derive(Clone, Debug, Serialize)]
pub struct QueueJson {
    /// Its name.
    pub queue: &'static str,
    /// Messages ready.
    pub messages: u32,
    /// Consumers.
    pub consumers: u32,
}

/// The parked queue in [`PendingJson`].
#[derive(Clone, Debug, Serialize)]
pub struct ParkedQueueJson {
    /// Its name.
    pub queue: &'static str,
    /// Messages parked.
    pub messages: u32,
    /// Parked messages by `x-error-kind`; null when not counted (more than
    /// [`PARKED_SCAN_LIMIT`] parked, or `--parked-scan-limit 0`).
    pub by_reason: Option<BTreeMap<String, usize>>,
}

/// Passive declares on one channel. A missing queue closes the channel it
/// was asked on: with a connection to open another, it is reported as
/// missing and the measurement goes on; without, it is an error.
struct Prober<'a> {
    channel: Channel,
    reopen: Option<&'a Connection>,
}

impl Prober<'_> {
    async fn depth(&mut self, queue: &str) -> Result<Option<QueueDepth>, PendingError> {
        let declared = crate::broker::peek_queue(&self.channel, queue).await;
        match (declared, self.reopen) {
            (Ok(q), _) => Ok(Some(QueueDepth {
                messages: q.message_count(),
                consumers: q.consumer_count(),
            })),
            (Err(e), Some(connection)) if is_not_found(&e) => {
                self.channel = connection
                    .create_channel()
                    .await
                    .map_err(PendingError::Amqp)?;
                Ok(None)
            }
            (Err(e), _) => Err(PendingError::Amqp(e)),
        }
    }

    async fn measure(&mut self, layout: &Layout) -> Result<PendingReport, PendingError> {
        let mut levels = Vec::with_capacity((layout.shards.get() * LEVELS) as usize);
        for shard in 0..layout.shards.get() {
            for level in 0..LEVELS {
                let depth = self.depth(&shard_level_name(shard, level)).await?;
                levels.push(LevelDepth {
                    shard,
                    level,
                    messages: depth.map(|d| d.messages),
                });
            }
        }
        let mut lanes = Vec::new();
        for &lane in &layout.lanes {
            for shard in 0..layout.lane_shards.get() {
                let depth = self.depth(&lane_name(lane, shard)).await?;
                lanes.push(LaneDepth {
                    lane,
                    shard,
                    messages: depth.map(|d| d.messages),
                });
            }
        }
        Ok(PendingReport {
            measured_at: Utc::now(),
            shards: layout.shards.get(),
            levels,
            lanes,
            due: self.depth(DUE_QUEUE).await?,
            parked: self.depth(PARKED_QUEUE).await?,
        })
    }
}

/// Measures the cascade, due and parked queues of `layout` on a channel of
/// its own; missing queues are reported, not created.
#[tracing::instrument(skip(connection))]
pub async fn measure(
    connection: &Connection,
    layout: &Layout,
) -> Result<PendingReport, PendingError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(PendingError::Amqp)?;
    let mut prober = Prober {
        channel,
        reopen: Some(connection),
    };
    let report = prober.measure(layout).await;
    crate::broker::close_channel_quietly(&prober.channel).await;
    report
}

/// The latest [`PendingReport`] of the running service, for the console.
#[derive(Debug, Default)]
pub struct PendingBoard(RwLock<Option<PendingReport>>);

impl PendingBoard {
    /// The latest report, if one was measured.
    pub fn latest(&self) -> Option<PendingReport> {
        self.0.read().map(|r| r.clone()).unwrap_or_default()
    }

    fn set(&self, report: PendingReport) {
        if let Ok(mut latest) = self.0.write() {
            *latest = Some(report);
        }
    }
}

/// Measures every [`REFRESH_INTERVAL`] on `channel` (a broker session's),
/// sets the gauges and the board, until `stop` fires or the channel fails
/// (a queue deleted under the running service closes it; the next
/// session, which declares the topology again, polls anew).
pub async fn poll(
    channel: Channel,
    layout: Layout,
    metrics: Arc<Metrics>,
    board: Arc<PendingBoard>,
    stop: Shutdown,
) {
    let mut prober = Prober {
        channel,
        reopen: None,
    };
    loop {
        match prober.measure(&layout).await {
            Ok(report) => {
                report.export(&metrics);
                board.set(report);
            }
            Err(e) => {
                tracing::warn!(error = %e, "pending poll failed; the pending gauges stay as they are until the next broker session");
                return;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(REFRESH_INTERVAL) => {}
            _ = stop.wait() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn report(shards: u32, filled: &[(u32, u32, u32)]) -> PendingReport {
        let mut levels = Vec::new();
        for shard in 0..shards {
            for level in 0..LEVELS {
                let messages = filled
                    .iter()
                    .find(|(s, l, _)| *s == shard && *l == level)
                    .map_or(0, |(_, _, n)| *n);
                levels.push(LevelDepth {
                    shard,
                    level,
                    messages: Some(messages),
                });
            }
        }
        PendingReport {
            measured_at: Utc::now(),
            shards,
            levels,
            lanes: Vec::new(),
            due: Some(QueueDepth {
                messages: 3,
                consumers: 1,
            }),
            parked: Some(QueueDepth::default()),
        }
    }

    #[test]
    fn a_message_in_level_k_is_due_within_two_to_the_k_plus_one_seconds() {
        // The longest stay from level k down: 2^k + 2^(k-1) + … + 1 s.
        for k in 0..LEVELS {
            let longest: u64 = (0..=k).map(|j| 1u64 << j).sum();
            assert!(longest < due_within_secs(k), "level {k}");
            assert!(
                longest + 1 == due_within_secs(k),
                "and no looser, level {k}"
            );
        }
        assert_eq!(due_within_secs(0), 2);
        assert_eq!(due_within_secs(10), 2048);
    }

    #[test]
    fn totals_windows_and_bounds_per_shard() {
        let r = report(2, &[(0, 0, 4), (0, 10, 2), (1, 3, 5)]);
        assert_eq!(r.waiting(None), 11);
        assert_eq!(r.waiting(Some(0)), 6);
        assert_eq!(r.waiting(Some(1)), 5);
        assert_eq!(r.latest_due_secs(Some(0)), Some(2048));
        assert_eq!(r.latest_due_secs(Some(1)), Some(16));
        assert_eq!(r.latest_due_secs(None), Some(2048));
        let windows = r.windows();
        assert_eq!(windows.len(), LEVELS as usize);
        assert_eq!(windows[0].by_shard, vec![4, 0]);
        assert_eq!(windows[3].messages, 5);
        assert_eq!(windows[10].due_within_secs, 2048);
        assert!(r.missing_queues().is_empty());

        let empty = report(1, &[]);
        assert_eq!(empty.latest_due_secs(None), None);
        let json = serde_json::to_value(empty.to_json(None)).unwrap();
        assert_eq!(json["total"]["messages"], 0);
        assert_eq!(json["total"]["latest_due_secs"], serde_json::Value::Null);
        assert_eq!(json["due"]["consumers"], 1);
        assert_eq!(json["parked"]["by_reason"], serde_json::Value::Null);
    }

    #[test]
    fn lanes_count_in_the_total_and_bound_it_by_their_window() {
        let lane = Lane::try_from("30m".to_string()).unwrap();
        let mut r = report(2, &[(0, 3, 4)]);
        r.lanes = (0..3)
            .map(|shard| LaneDepth {
                lane,
                shard,
                messages: (shard != 2).then_some(10 + shard),
            })
            .collect();
        assert_eq!(r.total_waiting(), 4 + 10 + 11);
        assert_eq!(r.waiting(None), 4, "the cascade alone");
        assert_eq!(r.total_latest_due_secs(), Some(1800));
        assert_eq!(r.latest_due_secs(None), Some(16));
        let windows = r.lane_windows();
        assert_eq!(windows.len(), 1);
        assert_eq!(windows[0].lane, "1800s");
        assert_eq!(windows[0].by_shard, vec![10, 11, 0]);
        assert_eq!(r.missing_queues(), vec!["order-timeout.lane.1800s.s2"]);
        let json = serde_json::to_value(r.to_json(None)).unwrap();
        assert_eq!(json["lanes"][0]["messages"], 21);
        assert_eq!(json["total"]["latest_due_secs"], 1800);
        let metrics = Metrics::new();
        r.export(&metrics);
        let text = metrics.render();
        let needle = r#"order_timeout_pending_messages{shard="1",level="lane_1800s"} 11"#;
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }

    #[test]
    fn due_windows_sort_levels_and_lanes_by_their_bound() {
        // Level k is due within 2^(k+1) s: levels 0-4 (≤ 32 s) within a
        // minute, 5-8 (≤ 512 s) 10 minutes, 9-10 (≤ 2,048 s) an hour,
        // 11-15 (≤ 65,536 s) a day, 16-18 (≤ 524,288 s) 7 days, 19+ later.
        let mut expected = [0u64; 6];
        for level in 0..LEVELS {
            let window = match level {
                0..=4 => 0,
                5..=8 => 1,
                9..=10 => 2,
                11..=15 => 3,
                16..=18 => 4,
                _ => 5,
            };
            expected[window] += u64::from(level) + 1;
        }
        let filled: Vec<(u32, u32, u32)> = (0..LEVELS).map(|l| (0, l, l + 1)).collect();
        let windows = report(1, &filled).due_windows();
        let names: Vec<&str> = windows.iter().map(|w| w.window).collect();
        assert_eq!(names, ["1m", "10m", "1h", "1d", "7d", "later"]);
        assert_eq!(
            windows.iter().map(|w| w.messages).collect::<Vec<_>>(),
            expected
        );
        assert_eq!(windows[5].at_most_secs, None);
        assert_eq!(windows[2].at_most_secs, Some(3600));
        assert_eq!(windows[2].label(), "1 hour");
        let total: u64 = expected.iter().sum();
        assert_eq!(windows[5].cumulative, total);
        assert_eq!(windows[1].cumulative, expected[0] + expected[1]);
        // The boundaries: a bound equal to a window's is in it.
        for (bound, window) in [
            (60, 0),
            (61, 1),
            (600, 1),
            (3600, 2),
            (604_800, 4),
            (604_801, 5),
        ] {
            assert_eq!(due_window_of(bound), window, "{bound} s");
        }
    }

    #[test]
    fn due_windows_count_lanes_by_their_window_and_shards_together() {
        let mut r = report(2, &[(0, 3, 4), (1, 3, 1), (1, 12, 2)]);
        r.lanes = [("30m", 0, 10), ("30m", 1, 11), ("60s", 0, 3), ("2h", 0, 5)]
            .into_iter()
            .map(|(lane, shard, n)| LaneDepth {
                lane: Lane::try_from(lane.to_string()).unwrap(),
                shard,
                messages: Some(n),
            })
            .collect();
        r.lanes.push(LaneDepth {
            lane: Lane::try_from("30m".to_string()).unwrap(),
            shard: 2,
            messages: None,
        });
        let windows = r.due_windows();
        let counts: Vec<u64> = windows.iter().map(|w| w.messages).collect();
        // Level 3 (16 s) of both shards and the 60 s lane; the 30 min lane;
        // level 12 (8,192 s) and the 2 h lane.
        assert_eq!(counts, [4 + 1 + 3, 0, 21, 2 + 5, 0, 0]);
        assert_eq!(windows[5].cumulative, r.total_waiting());
        let json = serde_json::to_value(r.to_json(None)).unwrap();
        assert_eq!(json["due_windows"][2]["window"], "1h");
        assert_eq!(json["due_windows"][2]["at_most_secs"], 3600);
        assert_eq!(json["due_windows"][2]["messages"], 21);
        assert_eq!(json["due_windows"][2]["cumulative"], 29);
        assert_eq!(json["due_windows"][5]["at_most_secs"], Value::Null);
    }

    #[test]
    fn the_gauges_show_the_report() {
        let metrics = Metrics::new();
        let mut r = report(2, &[(1, 5, 9)]);
        r.levels[0].messages = None;
        r.export(&metrics);
        let text = metrics.render();
        for needle in [
            r#"order_timeout_pending_messages{shard="1",level="05"} 9"#,
            r#"order_timeout_pending_messages{shard="0",level="00"} 0"#,
            "order_timeout_pending_latest_due_seconds 64",
            r#"order_timeout_queue_consumers{queue="order-timeout.due"} 1"#,
            r#"order_timeout_queue_messages{queue="order-timeout.due"} 3"#,
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert_eq!(r.missing_queues(), vec![shard_level_name(0, 0)]);
    }
}
