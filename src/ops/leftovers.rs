//! **Leftover queues**: the delay queues of earlier layouts that the
//! current one no longer declares, whether they still hold timeouts, and
//! when they can go. `topology check` and `pending` print them.
//!
//! A leftover queue is served where it is: the service deletes nothing, so
//! an old cascade shard keeps its TTLs and its dead-letter chain through its
//! own lower levels' exchanges to `order-timeout.ready`, and an old lane
//! shard dead-letters into `order-timeout.ready` directly
//! ([`crate::broker::topology`]). Deleting one too early is what would lose
//! timeouts, hence the advice ([`Leftover`]):
//!
//! - a queue that holds messages: leave it, they will be delivered;
//! - an old **cascade shard** can go once *all* its queues are empty: a
//!   message in a higher level still passes through the lower levels'
//!   queues, and a deleted queue takes its bindings with it;
//! - an old **lane shard** can go once it is empty, but shard 0 of a removed
//!   lane is where the lane entry (`schedule.<W>s`) still routes: once it is
//!   deleted, what an order service publishes with that key is dropped.
//!
//! The candidates are found by **passive declares** of every name an
//! earlier layout could have given a queue: every cascade shard up to
//! [`Shards::MAX`] beyond the current count, every shard of every lane the
//! current layout or [`crate::broker::layouts`]' record knows beyond the
//! current `lane_shards` (or all of them for a lane no longer configured).
//! Shards need no record, a removed lane's window does. A missing record
//! (a vhost no `serve` of this version declared yet) leaves only removed
//! lanes unnamed, and the report says so.

use lapin::{Channel, Connection};
use serde::Serialize;

use crate::broker::cascade::{LEVELS, shard_level_name};
use crate::broker::lanes::lane_name;
use crate::broker::layouts;
use crate::broker::refusals::is_not_found;
use crate::broker::topology::{Layout, lane_entry_key};
use crate::settings::{Lane, Shards};

/// Errors looking for leftovers (the broker cannot be asked).
#[derive(Debug, thiserror::Error)]
pub enum LeftoverError {
    /// Opening a channel failed, or a passive declare failed otherwise
    /// than with `NOT_FOUND`.
    #[error("talking to the broker: {0}")]
    Amqp(#[source] lapin::Error),
}

/// Where a leftover queue belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Place {
    /// Level `level` of cascade shard `shard`.
    Cascade {
        /// The shard.
        shard: u32,
        /// The level.
        level: u32,
    },
    /// Shard `shard` of lane `lane`.
    Lane {
        /// The lane's window in seconds.
        lane_secs: u64,
        /// The lane shard.
        shard: u32,
    },
}

/// One queue of an earlier layout that exists on the broker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeftoverQueue {
    /// Its name.
    pub queue: String,
    /// Where it belongs.
    pub place: Place,
    /// Messages waiting in it.
    pub messages: u32,
}

/// What to do about one group of leftover queues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leftover {
    /// A queue that holds messages: they will be delivered; delete it
    /// once empty (with its shard, for the cascade).
    Holds(LeftoverQueue),
    /// Every queue left of an old cascade shard is empty: the shard's
    /// queues and exchanges can be deleted together.
    EmptyShard {
        /// The shard.
        shard: u32,
        /// Its queues that exist.
        queues: Vec<String>,
    },
    /// Empty queues of a cascade shard of which another queue still holds
    /// messages: keep them until the whole shard is empty.
    EmptyButShardBusy {
        /// The shard.
        shard: u32,
        /// How many of its queues are empty.
        queues: usize,
    },
    /// An empty lane shard's queue: it can be deleted.
    EmptyLane {
        /// The queue.
        queue: String,
        /// The lane entry key still bound to it when it is shard 0 of a
        /// lane the current layout does not have.
        entry_key: Option<String>,
    },
}

/// Every leftover queue and whether the record could be read.
#[derive(Clone, Debug)]
pub struct LeftoverReport {
    /// Every existing queue of an earlier layout, cascade first.
    pub queues: Vec<LeftoverQueue>,
    /// Why the record of layouts could not be read (removed lanes are then
    /// not looked for), if it could not.
    pub record_unread: Option<String>,
}

impl LeftoverReport {
    /// Leftover queues that hold messages.
    pub fn holding(&self) -> impl Iterator<Item = &LeftoverQueue> {
        self.queues.iter().filter(|q| q.messages > 0)
    }

    /// Messages in leftover queues.
    pub fn messages(&self) -> u64 {
        self.queues.iter().map(|q| u64::from(q.messages)).sum()
    }

    /// What to do, group by group: each queue that holds messages, then the
    /// empty ones by cascade shard or lane shard.
    pub fn advice(&self, current: &Layout) -> Vec<Leftover> {
        let mut out: Vec<Leftover> = self.holding().cloned().map(Leftover::Holds).collect();
        let mut shards: Vec<u32> = self
            .queues
            .iter()
            .filter_map(|q| match q.place {
                Place::Cascade { shard, .. } => Some(shard),
                Place::Lane { .. } => None,
            })
            .collect();
        shards.dedup();
        for shard in shards {
            let of_shard: Vec<&LeftoverQueue> = self
                .queues
                .iter()
                .filter(|q| matches!(q.place, Place::Cascade { shard: s, .. } if s == shard))
                .collect();
            let empty: Vec<String> = of_shard
                .iter()
                .filter(|q| q.messages == 0)
                .map(|q| q.queue.clone())
                .collect();
            if empty.len() == of_shard.len() {
                out.push(Leftover::EmptyShard {
                    shard,
                    queues: empty,
                });
            } else if !empty.is_empty() {
                out.push(Leftover::EmptyButShardBusy {
                    shard,
                    queues: empty.len(),
                });
            }
        }
        for q in self.queues.iter().filter(|q| q.messages == 0) {
            if let Place::Lane { lane_secs, shard } = q.place {
                let removed = !current.lanes.iter().any(|l| l.secs() == lane_secs);
                out.push(Leftover::EmptyLane {
                    queue: q.queue.clone(),
                    entry_key: (removed && shard == 0)
                        .then(|| Lane::try_from(format!("{lane_secs}s")).ok())
                        .flatten()
                        .map(lane_entry_key),
                });
            }
        }
        out
    }
}

/// The names an earlier layout could have given a queue that `current`
/// does not declare, for the lanes `current` has and `recorded` ones.
pub fn candidates(current: &Layout, recorded: &[Lane]) -> Vec<(String, Place)> {
    let mut names = Vec::new();
    for shard in current.shards.get()..Shards::MAX {
        for level in 0..LEVELS {
            names.push((
                shard_level_name(shard, level),
                Place::Cascade { shard, level },
            ));
        }
    }
    let mut lanes: Vec<Lane> = current.lanes.iter().chain(recorded).copied().collect();
    lanes.sort();
    lanes.dedup();
    for lane in lanes {
        let first = if current.lanes.contains(&lane) {
            current.lane_shards.get()
        } else {
            0
        };
        for shard in first..Shards::MAX {
            names.push((
                lane_name(lane, shard),
                Place::Lane {
                    lane_secs: lane.secs(),
                    shard,
                },
            ));
        }
    }
    names
}

/// Finds the leftover queues of `current` (see the module docs): reads the
/// record, then passive-declares every candidate on a channel of its own.
/// Creates nothing.
#[tracing::instrument(skip(connection))]
pub async fn find(
    connection: &Connection,
    current: &Layout,
) -> Result<LeftoverReport, LeftoverError> {
    let (recorded, record_unread) = match layouts::read(connection).await {
        Ok(layouts) => (layouts.iter().flat_map(|l| l.lanes()).collect(), None),
        // Only removed lanes need the record; the rest is still looked for
        // (a broken connection fails the probes below).
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let mut channel = open(connection).await?;
    let mut queues = Vec::new();
    for (queue, place) in candidates(current, &recorded) {
        match crate::broker::peek_queue(&channel, &queue).await {
            Ok(q) => queues.push(LeftoverQueue {
                queue,
                place,
                messages: q.message_count(),
            }),
            Err(e) if is_not_found(&e) => channel = open(connection).await?,
            Err(e) => return Err(LeftoverError::Amqp(e)),
        }
    }
    crate::broker::close_channel_quietly(&channel).await;
    Ok(LeftoverReport {
        queues,
        record_unread,
    })
}

async fn open(connection: &Connection) -> Result<Channel, LeftoverError> {
    connection
        .create_channel()
        .await
        .map_err(LeftoverError::Amqp)
}

/// The lines `topology check` and `pending` print for what [`find`] gave:
/// [`lines`], or the one line saying why the leftovers could not be listed
/// (informational, so neither command fails for it).
pub fn lines_or_reason(
    found: &Result<LeftoverReport, LeftoverError>,
    current: &Layout,
) -> Vec<String> {
    match found {
        Ok(report) => lines(report, current),
        Err(e) => vec![format!(
            "queues left over from earlier layouts could not be listed: {e}"
        )],
    }
}

/// The lines `topology check` and `pending` print for `report` (none when
/// nothing is left over).
pub fn lines(report: &LeftoverReport, current: &Layout) -> Vec<String> {
    let mut out = Vec::new();
    for advice in report.advice(current) {
        out.push(match advice {
            Leftover::Holds(q) => format!(
                "LEFTOVER queue {} holds {} message{}: left over from an earlier layout; they will still be delivered; delete it once empty{}",
                q.queue,
                q.messages,
                if q.messages == 1 { "" } else { "s" },
                match q.place {
                    Place::Cascade { shard, .. } => format!(
                        " (with the rest of cascade shard {shard}: its lower levels carry the messages of its higher ones)"
                    ),
                    Place::Lane { .. } => String::new(),
                }
            ),
            Leftover::EmptyShard { shard, queues } => format!(
                "EMPTY    left over from an earlier layout: cascade shard {shard} ({} queue{} {}, and its exchanges of the same names): empty, can be deleted",
                queues.len(),
                if queues.len() == 1 { "" } else { "s" },
                shard_level_name(shard, 0).replace(".00.", ".NN."),
            ),
            Leftover::EmptyButShardBusy { shard, queues } => format!(
                "         {queues} more queue{} of leftover cascade shard {shard} {} empty: keep {} until the whole shard is",
                if queues == 1 { "" } else { "s" },
                if queues == 1 { "is" } else { "are" },
                if queues == 1 { "it" } else { "them" },
            ),
            Leftover::EmptyLane { queue, entry_key } => match entry_key {
                None => format!(
                    "EMPTY    left over from an earlier layout: queue {queue}: empty, can be deleted"
                ),
                Some(key) => format!(
                    "EMPTY    left over from an earlier layout: queue {queue}: empty, can be deleted once no order service publishes with the lane entry key {key:?} (still bound to it; with the queue gone those messages are dropped)"
                ),
            },
        });
    }
    let holding = report.holding().count();
    out.push(if report.queues.is_empty() {
        "no queues left over from earlier layouts".to_owned()
    } else {
        format!(
            "{} queue{} left over from earlier layouts, {holding} holding {} timeout{} (delivered where they are)",
            report.queues.len(),
            if report.queues.len() == 1 { "" } else { "s" },
            report.messages(),
            if report.messages() == 1 { "" } else { "s" },
        )
    });
    if let Some(why) = &report.record_unread {
        out.push(format!(
            "note: {why}; the queues of lanes removed since are not looked for"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::QueueType;

    fn lane(text: &str) -> Lane {
        Lane::try_from(text.to_string()).unwrap()
    }

    fn layout(shards: u32, lanes: &[&str], lane_shards: u32) -> Layout {
        Layout {
            queue_type: QueueType::Quorum,
            shards: Shards::try_from(shards).unwrap(),
            lanes: lanes.iter().map(|l| lane(l)).collect(),
            lane_shards: Shards::try_from(lane_shards).unwrap(),
        }
    }

    #[test]
    fn candidates_are_every_name_the_current_layout_does_not_declare() {
        let current = layout(2, &["30m"], 2);
        let names: Vec<String> = candidates(&current, &[lane("7s"), lane("30m")])
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let declared: Vec<String> = crate::broker::topology::queue_specs(&current)
            .into_iter()
            .map(|q| q.name)
            .collect();
        assert!(names.iter().all(|n| !declared.contains(n)));
        assert!(names.contains(&"order-timeout.delay.12.s3".to_owned()));
        assert!(names.contains(&"order-timeout.delay.27.s15".to_owned()));
        assert!(names.contains(&"order-timeout.lane.1800s.s2".to_owned()));
        assert!(
            names.contains(&"order-timeout.lane.7s".to_owned()),
            "a removed lane"
        );
        assert!(names.contains(&"order-timeout.lane.7s.s15".to_owned()));
        let expected = (16 - 2) * LEVELS as usize + (16 - 2) + 16;
        assert_eq!(names.len(), expected);
        // Every name of a layout of at most 16 shards is in the list or declared.
        let earlier = layout(16, &["7s", "30m"], 16);
        for q in crate::broker::topology::queue_specs(&earlier) {
            let other = q.name.starts_with("order-timeout.delay.")
                || q.name.starts_with("order-timeout.lane.");
            if other {
                assert!(
                    names.contains(&q.name) || declared.contains(&q.name),
                    "{}",
                    q.name
                );
            }
        }
    }

    fn queue(name: &str, place: Place, messages: u32) -> LeftoverQueue {
        LeftoverQueue {
            queue: name.into(),
            place,
            messages,
        }
    }

    /// Shard 2 all empty, shard 3 partly; the removed 7 s lane's shard 0
    /// empty and its shard 1 holding; an empty shard of the kept lane.
    fn sample() -> LeftoverReport {
        let cascade = |shard, level| Place::Cascade { shard, level };
        let lane = |lane_secs, shard| Place::Lane { lane_secs, shard };
        LeftoverReport {
            queues: vec![
                queue("order-timeout.delay.00.s2", cascade(2, 0), 0),
                queue("order-timeout.delay.01.s2", cascade(2, 1), 0),
                queue("order-timeout.delay.00.s3", cascade(3, 0), 0),
                queue("order-timeout.delay.03.s3", cascade(3, 3), 5),
                queue("order-timeout.lane.7s", lane(7, 0), 0),
                queue("order-timeout.lane.7s.s1", lane(7, 1), 2),
                queue("order-timeout.lane.1800s.s1", lane(1800, 1), 0),
            ],
            record_unread: None,
        }
    }

    #[test]
    fn a_shard_may_go_only_when_all_of_it_is_empty_and_a_removed_lanes_entry_is_named() {
        let current = layout(2, &["30m"], 1);
        let report = sample();
        assert_eq!(report.messages(), 7);
        let advice = report.advice(&current);
        assert_eq!(advice.len(), 6, "{advice:?}");
        assert!(matches!(&advice[0], Leftover::Holds(q) if q.queue == "order-timeout.delay.03.s3"));
        assert!(matches!(&advice[1], Leftover::Holds(q) if q.queue == "order-timeout.lane.7s.s1"));
        assert!(
            matches!(&advice[2], Leftover::EmptyShard { shard: 2, queues } if queues.len() == 2)
        );
        assert_eq!(
            advice[3],
            Leftover::EmptyButShardBusy {
                shard: 3,
                queues: 1
            }
        );
        assert_eq!(
            advice[4],
            Leftover::EmptyLane {
                queue: "order-timeout.lane.7s".into(),
                entry_key: Some("schedule.7s".into())
            }
        );
        assert_eq!(
            advice[5],
            Leftover::EmptyLane {
                queue: "order-timeout.lane.1800s.s1".into(),
                entry_key: None
            }
        );
    }

    #[test]
    fn the_lines_say_what_is_held_what_can_go_and_what_was_not_looked_for() {
        let current = layout(2, &["30m"], 1);
        let text = lines(&sample(), &current).join("\n");
        assert!(
            text.contains("LEFTOVER queue order-timeout.delay.03.s3 holds 5 messages"),
            "{text}"
        );
        assert!(
            text.contains("they will still be delivered; delete it once empty"),
            "{text}"
        );
        assert!(
            text.contains("cascade shard 2 (2 queues order-timeout.delay.NN.s2"),
            "{text}"
        );
        assert!(
            text.contains("7 queues left over from earlier layouts, 2 holding 7 timeouts"),
            "{text}"
        );
        let none = LeftoverReport {
            queues: Vec::new(),
            record_unread: Some(
                "the layout record order-timeout.layouts does not exist yet".into(),
            ),
        };
        let text = lines(&none, &current).join("\n");
        assert!(text.contains("no queues left over"), "{text}");
        assert!(text.contains("removed since are not looked for"), "{text}");
    }
}
