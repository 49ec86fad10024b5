//! `order-timeout pending [--json]`: argument parsing and printing around
//! [`crate::ops::pending`].

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

use clap::Args;

use super::connect;
use crate::broker::topology::{DUE_QUEUE, Layout, PARKED_QUEUE};
use crate::ops::leftovers::{self, LeftoverError, LeftoverReport};
use crate::ops::parked;
use crate::ops::pending::{self, PARKED_SCAN_LIMIT, PendingReport};
use crate::settings::Settings;
use crate::store;

/// Arguments of `pending`.
#[derive(Debug, Args)]
pub struct PendingArgs {
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Count parked messages by reason (one query of the parked store) only
    /// when the store keeps at most this many; 0 never reads the store.
    #[arg(long, value_name = "N", default_value_t = PARKED_SCAN_LIMIT)]
    pub parked_scan_limit: u32,
}

/// Runs `pending`.
pub(super) async fn run(settings: Settings, args: PendingArgs) -> anyhow::Result<ExitCode> {
    let conn = connect(&settings, "order-timeout-pending").await?;
    let result = measure(&conn, &settings, &args).await;
    crate::broker::close_quietly(&conn).await;
    let (report, kept, leftovers) = result?;
    // The reasons only while the store keeps at most --parked-scan-limit.
    let reasons: Option<BTreeMap<String, usize>> = kept
        .as_ref()
        .filter(|k| k.total <= args.parked_scan_limit as usize)
        .map(|k| k.by_reason.clone());
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut json = serde_json::to_value(report.to_json(reasons.as_ref()))?;
        if let (Some(parked), Some(kept)) = (json["parked"].as_object_mut(), &kept) {
            // `messages`: every parked message, kept or still waiting.
            let waiting = parked["messages"].as_u64().unwrap_or(0);
            parked.insert("waiting".into(), waiting.into());
            parked.insert("kept".into(), kept.total.into());
            parked.insert("messages".into(), (waiting + kept.total as u64).into());
        }
        if let Some(object) = json.as_object_mut() {
            // Queues of earlier layouts: their timeouts are not in the
            // figures above, and are delivered where they are. When they
            // could not be listed, both are null and `leftover_error` says
            // why.
            let (queues, messages) = match &leftovers {
                Ok(found) => (
                    serde_json::to_value(&found.queues)?,
                    found.messages().into(),
                ),
                Err(e) => {
                    object.insert("leftover_error".into(), e.to_string().into());
                    (serde_json::Value::Null, serde_json::Value::Null)
                }
            };
            object.insert("leftover_queues".into(), queues);
            object.insert("leftover_messages".into(), messages);
        }
        serde_json::to_writer(&mut out, &json)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, &report, kept.as_ref(), args.parked_scan_limit)?;
        for line in leftovers::lines_or_reason(&leftovers, &Layout::of(&settings)) {
            writeln!(out, "{line}")?;
        }
    }
    Ok(if report.missing_queues().is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The report, what the parked store keeps (unless `--parked-scan-limit
/// 0`), and the queues earlier layouts left. Only the last may fail
/// without failing the command: it is informational (those queues are
/// delivered where they are), as in `topology check`.
async fn measure(
    conn: &lapin::Connection,
    settings: &Settings,
    args: &PendingArgs,
) -> anyhow::Result<(
    PendingReport,
    Option<Kept>,
    Result<LeftoverReport, LeftoverError>,
)> {
    let report = pending::measure(conn, &Layout::of(settings)).await?;
    let leftovers = leftovers::find(conn, &Layout::of(settings)).await;
    let kept: Option<Kept> = if args.parked_scan_limit == 0 {
        None
    } else {
        Some(kept_parked(settings).await?)
    };
    Ok((report, kept, leftovers))
}

/// The parked messages the parked store keeps, by reason.
async fn kept_parked(settings: &Settings) -> anyhow::Result<Kept> {
    let pool = store::PoolSettings::of(settings).with_max_connections(1);
    let stores = store::connect_timers(&settings.database_url, pool, &settings.timers()?)?;
    let listing = parked::list(
        stores.default_timer(),
        &parked::Page {
            selection: parked::Selection::All,
            after: 0,
            limit: 0,
            excerpt: Some(1),
        },
    )
    .await?;
    Ok(Kept {
        total: listing.total,
        by_reason: listing.by_reason,
    })
}

/// What the parked store keeps.
struct Kept {
    total: usize,
    by_reason: BTreeMap<String, usize>,
}

fn write_text(
    out: &mut impl Write,
    report: &PendingReport,
    kept: Option<&Kept>,
    scan_limit: u32,
) -> std::io::Result<()> {
    let due = |s: Option<u64>| s.map_or("-".to_owned(), human);
    writeln!(
        out,
        "{} timeouts wait in the delay cascade ({} shard{}); all due within {}",
        report.waiting(None),
        report.shards,
        if report.shards == 1 { "" } else { "s" },
        due(report.latest_due_secs(None)),
    )?;
    write_due_windows(out, report)?;
    let mut rows = vec![
        std::iter::once("DUE WITHIN".to_owned())
            .chain(std::iter::once("LEVEL".to_owned()))
            .chain((0..report.shards).map(|s| format!("SHARD {s}")))
            .chain(std::iter::once("TOTAL".to_owned()))
            .collect::<Vec<_>>(),
    ];
    for w in report.windows().iter().filter(|w| w.messages > 0) {
        rows.push(
            [human(w.due_within_secs), w.level.to_string()]
                .into_iter()
                .chain(w.by_shard.iter().map(u64::to_string))
                .chain(std::iter::once(w.messages.to_string()))
                .collect(),
        );
    }
    let shards = || (0..report.shards).map(Some);
    rows.push(
        ["TOTAL".to_owned(), String::new()]
            .into_iter()
            .chain(shards().map(|s| report.waiting(s).to_string()))
            .chain(std::iter::once(report.waiting(None).to_string()))
            .collect(),
    );
    rows.push(
        ["ALL DUE WITHIN".to_owned(), String::new()]
            .into_iter()
            .chain(
                shards()
                    .chain([None])
                    .map(|s| due(report.latest_due_secs(s))),
            )
            .collect(),
    );
    write_table(out, &rows)?;
    write_lanes(out, report)?;
    write_queues(out, report, kept, scan_limit)
}

/// What falls due when: the delay store by due window, with a bar each,
/// said to be a bound.
fn write_due_windows(out: &mut impl Write, report: &PendingReport) -> std::io::Result<()> {
    let windows = report.due_windows();
    writeln!(
        out,
        "\nWhat falls due when, of the {} timeouts in the delay store (cascade and lanes).\n\
         At the latest: each queue's TTL bounds when its timeouts fall due, not an exact time; some fall due sooner.",
        report.total_waiting()
    )?;
    let most = windows.iter().map(|w| w.messages).max().unwrap_or(0);
    let mut rows = vec![vec![
        "DUE WITHIN".to_owned(),
        "TIMEOUTS".to_owned(),
        "BY THEN".to_owned(),
        String::new(),
    ]];
    for w in &windows {
        rows.push(vec![
            w.label().to_owned(),
            w.messages.to_string(),
            w.cumulative.to_string(),
            bar(w.messages, most),
        ]);
    }
    write_table(out, &rows)?;
    writeln!(out)
}

/// `n` of `most` as up to 40 `#`, at least one when `n` is not 0.
fn bar(n: u64, most: u64) -> String {
    const WIDTH: u64 = 40;
    if n == 0 || most == 0 {
        return String::new();
    }
    let len = (n * WIDTH).div_ceil(most).max(1);
    format!("{:<w$}", "#".repeat(len as usize), w = WIDTH as usize)
}

/// One line per lane, when lanes are configured.
fn write_lanes(out: &mut impl Write, report: &PendingReport) -> std::io::Result<()> {
    for w in report.lane_windows() {
        let shards: Vec<String> = w.by_shard.iter().map(u64::to_string).collect();
        writeln!(
            out,
            "lane {} ({}): {} timeouts, all due within {} (by shard: {})",
            w.lane,
            human(w.due_within_secs),
            w.messages,
            human(w.due_within_secs),
            shards.join(" ")
        )?;
    }
    if !report.lanes.is_empty() {
        writeln!(
            out,
            "{} timeouts wait in the delay store (cascade and lanes); all due within {}",
            report.total_waiting(),
            report.total_latest_due_secs().map_or("-".to_owned(), human),
        )?;
    }
    Ok(())
}

fn write_queues(
    out: &mut impl Write,
    report: &PendingReport,
    kept: Option<&Kept>,
    scan_limit: u32,
) -> std::io::Result<()> {
    match report.due {
        Some(d) => writeln!(
            out,
            "{DUE_QUEUE}: {} ready, {} consumer{}",
            d.messages,
            d.consumers,
            if d.consumers == 1 { "" } else { "s" }
        )?,
        None => writeln!(out, "{DUE_QUEUE}: MISSING")?,
    }
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    match (report.parked, kept) {
        (None, _) => writeln!(out, "{PARKED_QUEUE}: MISSING")?,
        (Some(p), None) => writeln!(
            out,
            "{PARKED_QUEUE}: {} message{} waiting to be moved into the parked store (the store not read, by reason: not counted: --parked-scan-limit 0)",
            p.messages,
            plural(p.messages as usize)
        )?,
        (Some(p), Some(kept)) => {
            let by = if kept.total > scan_limit as usize {
                format!(" (by reason: not counted, more than --parked-scan-limit {scan_limit})")
            } else if kept.by_reason.is_empty() {
                String::new()
            } else {
                let by: Vec<String> = kept
                    .by_reason
                    .iter()
                    .map(|(r, n)| format!("{r} {n}"))
                    .collect();
                format!(" ({})", by.join(", "))
            };
            let all = kept.total + p.messages as usize;
            writeln!(
                out,
                "{PARKED_QUEUE}: {all} message{}{by}: {} in the parked store (`order-timeout parked list`), {} waiting in the queue",
                plural(all),
                kept.total,
                p.messages
            )?
        }
    }
    for queue in report.missing_queues() {
        writeln!(
            out,
            "MISSING  queue {queue} (run `order-timeout topology check`)"
        )?;
    }
    Ok(())
}

/// Whole seconds as `1h 8m 16s`.
fn human(secs: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

/// Left-aligned first column, right-aligned numbers.
fn write_table(out: &mut impl Write, rows: &[Vec<String>]) -> std::io::Result<()> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                if c == 0 {
                    format!("{cell:<w$}", w = widths[c])
                } else {
                    format!("{cell:>w$}", w = widths[c])
                }
            })
            .collect();
        writeln!(out, "{}", cells.join("  ").trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::cascade::LEVELS;
    use crate::ops::pending::{LevelDepth, QueueDepth};

    #[test]
    fn the_text_shows_what_falls_due_when_and_says_it_is_a_bound() {
        // 2 in level 8 (due within 512 s), 3 in level 11 (4,096 s).
        let levels = (0..LEVELS)
            .map(|level| LevelDepth {
                shard: 0,
                level,
                messages: Some(match level {
                    8 => 2,
                    11 => 3,
                    _ => 0,
                }),
            })
            .collect();
        let report = PendingReport {
            measured_at: chrono::Utc::now(),
            shards: 1,
            levels,
            lanes: Vec::new(),
            due: Some(QueueDepth::default()),
            parked: Some(QueueDepth::default()),
        };
        let mut out = Vec::new();
        let kept = Kept {
            total: 0,
            by_reason: BTreeMap::new(),
        };
        write_text(&mut out, &report, Some(&kept), 10).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("At the latest"), "{text}");
        assert!(text.contains("not an exact time"), "{text}");
        let row = |label: &str| {
            text.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("no {label} row in\n{text}"))
                .split_whitespace()
                .filter(|w| !w.chars().all(|c| c.is_alphabetic()))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(row("1 minute"), ["1", "0", "0"]);
        assert_eq!(
            row("10 minutes"),
            ["10", "2", "2", "###########################"]
        );
        assert_eq!(row("1 hour"), ["1", "0", "2"]);
        assert_eq!(row("1 day"), ["1", "3", "5", &"#".repeat(40)]);
        assert_eq!(row("later"), ["0", "5"]);
    }
}
