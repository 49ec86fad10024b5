//! PostgreSQL's checkpoints during a phase, placed on the phase's clock.
//!
//! A checkpoint writes every dirty buffer and then syncs the data files; on
//! a small machine that sync competes with every commit's WAL flush and the
//! broker's log sync. Runs that miss their target by one stall of a few
//! seconds (a 2,000/s set's fifth run: p99 88–213 ms in four seconds, ≤ 30
//! ms in every other) were never matched against what the database server
//! was doing then: PostgreSQL logs its checkpoints, but only to the
//! server's own log. [`Checkpoints`] looks at the control file's last
//! checkpoint (`pg_control_checkpoint()`) and the checkpointer's counters
//! (`pg_stat_bgwriter`) once a second and reports each checkpoint that
//! ended, from its beginning, with its write and sync times, so a phase's
//! report shows them beside its lateness second by second.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How often the server is looked at: a checkpoint's end is placed within
/// this.
const POLL: Duration = Duration::from_secs(1);

/// Something the database server did during a phase, on the wall clock:
/// `(began, took, what)`.
pub type Happened = (DateTime<Utc>, Duration, String);

/// One look at the checkpointer: the last checkpoint (from the control
/// file, rewritten at every checkpoint's end) and the cumulative counters.
struct Look {
    /// The last checkpoint's record: changes when a checkpoint ends.
    lsn: String,
    /// When that checkpoint began (whole seconds).
    began: DateTime<Utc>,
    /// Checkpoints requested (WAL past `max_wal_size`, or a `CHECKPOINT`),
    /// as opposed to timed.
    requested: i64,
    /// Time spent writing and syncing, ms; buffers written.
    write_ms: f64,
    sync_ms: f64,
    buffers: i64,
    /// Whether the checkpointer is in a checkpoint now (its wait event is
    /// other than its idle loop's).
    busy: bool,
}

async fn look(pool: &PgPool) -> Result<Look, sqlx::Error> {
    let (lsn, began, requested, write_ms, sync_ms, buffers, busy) = sqlx::query_as(
        "SELECT c.checkpoint_lsn::text, c.checkpoint_time, b.checkpoints_req, \
                b.checkpoint_write_time, b.checkpoint_sync_time, b.buffers_checkpoint, \
                coalesce((SELECT wait_event IS DISTINCT FROM 'CheckpointerMain' \
                            FROM pg_stat_activity WHERE backend_type = 'checkpointer'), false) \
           FROM pg_control_checkpoint() c, pg_stat_bgwriter b",
    )
    .fetch_one(pool)
    .await?;
    Ok(Look {
        lsn,
        began,
        requested,
        write_ms,
        sync_ms,
        buffers,
        busy,
    })
}

/// The checkpoint that ended between two looks, `now` being the second's:
/// from its beginning to `now`, with what the counters say it did (they
/// may lag its end by a moment: then they are missing).
fn ended(before: &Look, after: &Look, now: DateTime<Utc>) -> Option<Happened> {
    if after.lsn == before.lsn {
        return None;
    }
    let kind = if after.requested > before.requested {
        "requested"
    } else {
        "timed"
    };
    let write_ms = after.write_ms - before.write_ms;
    let sync_ms = after.sync_ms - before.sync_ms;
    let what = if after.buffers > before.buffers || write_ms > 0.0 || sync_ms > 0.0 {
        format!(
            "checkpoint ({kind}): {} buffers written over {:.1} s, then files synced in {:.0} ms",
            after.buffers - before.buffers,
            write_ms / 1000.0,
            sync_ms
        )
    } else {
        format!("checkpoint ({kind})")
    };
    let took = (now - after.began).to_std().unwrap_or_default();
    Some((after.began, took, what))
}

/// Looks at the checkpointer every [`POLL`] until stopped.
pub struct Checkpoints {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Vec<Happened>>,
}

impl Checkpoints {
    /// Starts watching the server behind `pool`; `None` (with a warning)
    /// where it cannot be looked at.
    pub async fn start(pool: &PgPool) -> Option<Self> {
        let first = match look(pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read PostgreSQL's checkpoints; they are not reported");
                return None;
            }
        };
        let pool = pool.clone();
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            // A checkpoint under way and not yet ended: since when it was
            // seen (a spread checkpoint writes for minutes, across phases).
            let mut busy_since = first.busy.then(Utc::now);
            let mut last = first;
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tokio::time::sleep(POLL) => {}
                }
                let Ok(now_look) = look(&pool).await else {
                    continue;
                };
                let now = Utc::now();
                if let Some(done) = ended(&last, &now_look, now) {
                    seen.push(done);
                    busy_since = None;
                }
                if now_look.busy {
                    busy_since.get_or_insert(now);
                }
                last = now_look;
            }
            if let Some(since) = busy_since {
                let took = (Utc::now() - since).to_std().unwrap_or_default();
                seen.push((
                    since,
                    took,
                    "a checkpoint under way, not ended by the phase's end (seen from here)"
                        .to_owned(),
                ));
            }
            seen
        });
        Some(Self { stop, task })
    }

    /// Stops; the checkpoints that ended meanwhile, and the one still under
    /// way if any.
    pub async fn stop(self) -> Vec<Happened> {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{scratch, shop};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn look_at(lsn: &str, began: &str, requested: i64, write_ms: f64, sync_ms: f64) -> Look {
        Look {
            lsn: lsn.into(),
            began: at(began),
            requested,
            write_ms,
            sync_ms,
            buffers: (write_ms / 10.0) as i64,
            busy: false,
        }
    }

    #[test]
    fn an_ended_checkpoint_runs_from_its_beginning_to_the_look_that_saw_it() {
        let before = look_at("0/1", "2026-11-27T00:55:00Z", 0, 1_000.0, 10.0);
        let after = look_at("0/2", "2026-11-27T01:00:00Z", 0, 26_000.0, 1_510.0);
        let (began, took, what) = ended(&before, &after, at("2026-11-27T01:00:27.5Z")).unwrap();
        assert_eq!(began, at("2026-11-27T01:00:00Z"));
        assert_eq!(took, Duration::from_millis(27_500));
        assert_eq!(
            what,
            "checkpoint (timed): 2500 buffers written over 25.0 s, then files synced in 1500 ms"
        );
    }

    #[test]
    fn no_new_checkpoint_record_no_checkpoint() {
        let before = look_at("0/1", "2026-11-27T00:55:00Z", 0, 1_000.0, 10.0);
        // Counters move while a checkpoint is still writing: not ended yet.
        let during = look_at("0/1", "2026-11-27T00:55:00Z", 1, 1_000.0, 10.0);
        assert!(ended(&before, &during, Utc::now()).is_none());
        // Ended, its counters not yet reported.
        let after = look_at("0/2", "2026-11-27T01:00:00Z", 1, 1_000.0, 10.0);
        let (_, _, what) = ended(&during, &after, at("2026-11-27T01:00:01Z")).unwrap();
        assert_eq!(what, "checkpoint (timed)");
        let (_, _, what) = ended(&before, &after, at("2026-11-27T01:00:01Z")).unwrap();
        assert_eq!(what, "checkpoint (requested)");
    }

    #[tokio::test]
    async fn a_checkpoint_on_the_real_server_is_reported() {
        let db = scratch::ScratchDatabase::on_test_server("ot_tools_checkpoints");
        let pool = shop::prepare_database(&db.url().unwrap(), 2)
            .await
            .expect("prepare the database");
        let watch = Checkpoints::start(&pool).await.expect("the checkpointer");
        let asked = Utc::now();
        sqlx::query("CHECKPOINT").execute(&pool).await.unwrap();
        tokio::time::sleep(POLL * 3).await;
        let seen = watch.stop().await;
        // Ours, or another's that ended meanwhile (tests drop databases,
        // which checkpoints): at least one, begun no earlier than a second
        // (the control file's resolution) before it was asked for.
        assert!(
            seen.iter()
                .any(|(began, _, what)| what.starts_with("checkpoint")
                    && *began >= asked - chrono::Duration::seconds(1)),
            "{seen:?}"
        );
        pool.close().await;
    }
}
