//! `order-timeout parked list|show|replay|purge`: argument parsing and
//! printing around [`crate::ops::parked`]. Every command first moves the
//! messages waiting in the parked queue into the parked store, then works
//! on the store: reading delivers nothing.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use lapin::Connection;

use super::connect;
use crate::ops::parked::{self, Page, ParkedMessage, PurgePlan, Selection};
use crate::settings::Settings;
use crate::store::{self, Store};

/// `order-timeout parked …`.
#[derive(Debug, Subcommand)]
pub enum ParkedCommand {
    /// Show parked messages with their reason, oldest first; changes
    /// nothing (they are read from the parked store, not delivered).
    List(ListArgs),
    /// Show one parked message (by the ID `list` prints) with its whole
    /// body.
    Show(ShowArgs),
    /// Republish parked messages to the entry exchange with a fresh
    /// attempt budget (publisher confirms; removed from the parked store
    /// only once confirmed).
    Replay(ReplayArgs),
    /// Delete parked messages (all, or those parked longer ago than
    /// --older-than), after a confirmation prompt.
    Purge(PurgeArgs),
}

/// Arguments of `parked list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Show at most N messages (oldest first); the total is always counted.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: usize,
    /// Print one JSON object per line (with the body) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Show the messages after this ID (the next page).
    #[arg(long, value_name = "ID", default_value_t = 0)]
    pub after: i64,
    /// Show only the messages of this order.
    #[arg(long, value_name = "ID")]
    pub order_id: Option<String>,
    /// Show only the messages with this reason (x-error-kind).
    #[arg(long, value_name = "KIND")]
    pub reason: Option<String>,
}

/// Arguments of `parked show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The message's ID (the first column of `parked list`).
    pub id: i64,
    /// Print it as one JSON object instead.
    #[arg(long)]
    pub json: bool,
    /// Print the body alone, byte for byte (for a file or a pipe).
    #[arg(long, conflicts_with = "json")]
    pub body: bool,
}

/// Arguments of `parked replay`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["all", "order_id", "timer"])))]
pub struct ReplayArgs {
    /// Replay every message that is parked when the command starts.
    #[arg(long)]
    pub all: bool,
    /// Replay only the messages of this order (x-order-id, or the body's order_id).
    #[arg(long, value_name = "ID")]
    pub order_id: Option<String>,
    /// Replay only the messages of this timer (the body's "timer";
    /// cancel_unpaid for a body without one).
    #[arg(long, value_name = "NAME")]
    pub timer: Option<String>,
}

/// Arguments of `parked purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Delete only messages parked longer ago than this (x-parked-at), e.g. 7d, 12h, 30m.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub older_than: Option<Duration>,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
}
/// Runs `parked …`.
pub(super) async fn run(settings: Settings, command: ParkedCommand) -> anyhow::Result<ExitCode> {
    let conn = connect(&settings, "order-timeout-parked-cli").await?;
    let pool = store::PoolSettings::of(&settings).with_max_connections(1);
    let stores = store::connect_timers(&settings.database_url, pool, &settings.timers()?)?;
    let store = stores.default_timer().clone();
    let result = async {
        parked::take_in(&conn, &store).await?;
        match command {
            ParkedCommand::List(args) => list(&store, args).await,
            ParkedCommand::Show(args) => show(&store, args).await,
            ParkedCommand::Replay(args) => replay(&conn, &store, args).await,
            ParkedCommand::Purge(args) => purge(&store, args).await,
        }
    }
    .await;
    crate::broker::close_quietly(&conn).await;
    result
}

/// How many messages `list --json` reads at a time (whole bodies).
const JSON_PAGE: u32 = 20;

async fn list(store: &Store, args: ListArgs) -> anyhow::Result<ExitCode> {
    let selection = match (args.order_id, args.reason) {
        (Some(id), _) => Selection::OrderId(id),
        (None, Some(kind)) => Selection::Reason(kind),
        (None, None) => Selection::All,
    };
    let limit = u32::try_from(args.limit).unwrap_or(u32::MAX);
    let now = Utc::now();
    let mut out = std::io::stdout().lock();
    if args.json {
        // Page by page: at most JSON_PAGE whole bodies in memory.
        let (mut after, mut left) = (args.after, limit);
        while left > 0 {
            let page = Page {
                selection: selection.clone(),
                after,
                limit: left.min(JSON_PAGE),
                excerpt: None,
            };
            let listing = parked::list(store, &page).await?;
            let Some(last) = listing.messages.last() else {
                break;
            };
            after = last.id.unwrap_or(i64::MAX);
            left -= u32::try_from(listing.messages.len()).unwrap_or(left);
            for msg in &listing.messages {
                serde_json::to_writer(&mut out, &msg.to_json(now))?;
                writeln!(out)?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let page = Page {
        selection,
        after: args.after,
        limit,
        excerpt: Some(1),
    };
    let listing = parked::list(store, &page).await?;
    write_table(&mut out, &listing.messages, now)?;
    let shown = listing.messages.len();
    if shown < listing.total {
        let next = listing
            .messages
            .last()
            .and_then(|m| m.id)
            .map_or(String::new(), |id| format!("; next: --after {id}"));
        writeln!(
            out,
            "{shown} of {} parked messages shown (--limit{next})",
            listing.total
        )?;
    } else {
        writeln!(out, "{} parked messages", listing.total)?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn show(store: &Store, args: ShowArgs) -> anyhow::Result<ExitCode> {
    let Some(msg) = parked::show(store, args.id).await? else {
        eprintln!("no parked message {} (replayed or purged?)", args.id);
        return Ok(ExitCode::FAILURE);
    };
    let mut out = std::io::stdout().lock();
    if args.body {
        out.write_all(&msg.body)?;
    } else if args.json {
        serde_json::to_writer(&mut out, &msg.to_json(Utc::now()))?;
        writeln!(out)?;
    } else {
        write_details(&mut out, &msg)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One message, field by field, then its body.
fn write_details(out: &mut impl Write, msg: &ParkedMessage) -> std::io::Result<()> {
    let json = msg.to_json(Utc::now());
    let value = serde_json::to_value(&json).unwrap_or_default();
    if let serde_json::Value::Object(fields) = value {
        for (name, value) in fields {
            if name == "body" || name == "body_base64" || value.is_null() {
                continue;
            }
            let text = match value {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            writeln!(out, "{name:<20} {}", clip(&text, 200))?;
        }
    }
    if !msg.body_is_whole() {
        writeln!(
            out,
            "(the store keeps only the first {} of {} bytes of this body)",
            msg.body.len(),
            msg.body_size
        )?;
    }
    writeln!(out, "body:")?;
    match msg.body_text() {
        Some(text) => writeln!(out, "{text}"),
        None => writeln!(out, "(not UTF-8; base64) {}", msg.body_base64()),
    }
}

/// At most `max` characters, with `…` when cut; one line.
fn clip(s: &str, max: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

fn write_table(
    out: &mut impl Write,
    messages: &[ParkedMessage],
    now: DateTime<Utc>,
) -> std::io::Result<()> {
    let time = |t: Option<chrono::DateTime<Utc>>| {
        t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_else(|| "-".into())
    };
    let rows: Vec<[String; 8]> = messages
        .iter()
        .map(|m| {
            [
                m.id.map_or("-".into(), |id| id.to_string()),
                clip(m.order_id.as_deref().unwrap_or("-"), 32),
                clip(m.timer.as_deref().unwrap_or("-"), 32),
                m.attempts.map_or("-".into(), |a| a.to_string()),
                time(m.first_failure),
                time(m.last_failure),
                m.age(now).map_or("-".into(), |d| {
                    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
                }),
                clip(&m.reason(), 100),
            ]
        })
        .collect();
    let header = [
        "ID",
        "ORDER ID",
        "TIMER",
        "ATTEMPTS",
        "FIRST FAILURE (UTC)",
        "LAST FAILURE (UTC)",
        "AGE",
        "REASON",
    ];
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut dyn Write, cells: [&str; 8]| -> std::io::Result<()> {
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                writeln!(out, "{cell}")?;
            } else {
                write!(out, "{cell:<w$}  ", w = widths[i])?;
            }
        }
        Ok(())
    };
    line(out, header)?;
    for row in &rows {
        line(out, row.each_ref().map(String::as_str))?;
    }
    Ok(())
}

async fn replay(conn: &Connection, store: &Store, args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let selection = match (args.order_id, args.timer) {
        (Some(id), _) => Selection::OrderId(id),
        (None, Some(timer)) => Selection::Timer(timer),
        (None, None) => Selection::All,
    };
    let report = parked::replay(conn, store, &selection).await?;
    println!(
        "replayed {} parked message{} to {}/{} ({} left parked)",
        report.replayed,
        if report.replayed == 1 { "" } else { "s" },
        crate::broker::topology::ENTRY_EXCHANGE,
        crate::broker::topology::SCHEDULE_ROUTING_KEY,
        report.kept
    );
    if report.cut > 0 {
        println!(
            "{} selected message{} kept parked: the store keeps only the first bytes of {} body (see `parked show ID`)",
            report.cut,
            if report.cut == 1 { "" } else { "s" },
            if report.cut == 1 { "its" } else { "their" },
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The cut-off of `--older-than`: `now - older_than`, or the earliest
/// time there is for an age longer than the calendar (never a panic).
fn parked_before(now: DateTime<Utc>, older_than: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(older_than)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

async fn purge(store: &Store, args: PurgeArgs) -> anyhow::Result<ExitCode> {
    let selection = match args.older_than {
        Some(d) => Selection::ParkedBefore(parked_before(Utc::now(), d)),
        None => Selection::All,
    };
    let plan = PurgePlan::prepare(store, &selection).await?;
    let n = plan.selected();
    if n == 0 {
        let report = plan.abort();
        println!("deleted 0 parked messages ({} kept)", report.kept);
        return Ok(ExitCode::SUCCESS);
    }
    if !args.yes {
        let question = format!(
            "Delete {n} parked message{}? [y/N] ",
            if n == 1 { "" } else { "s" }
        );
        let yes = tokio::task::spawn_blocking(move || ask(&question)).await??;
        if !yes {
            let report = plan.abort();
            println!("deleted 0 parked messages ({} kept)", report.kept);
            return Ok(ExitCode::SUCCESS);
        }
    }
    let report = plan.commit().await?;
    println!(
        "deleted {} parked message{} ({} kept)",
        report.deleted,
        if report.deleted == 1 { "" } else { "s" },
        report.kept
    );
    Ok(ExitCode::SUCCESS)
}

/// Asks on stderr, reads one line from stdin; only `y`/`yes` is a yes
/// (end of input is a no).
fn ask(question: &str) -> std::io::Result<bool> {
    let mut err = std::io::stderr().lock();
    write!(err, "{question}")?;
    err.flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_age_beyond_the_calendar_selects_everything_instead_of_panicking() {
        let now = Utc::now();
        let week = Duration::from_secs(7 * 86_400);
        assert_eq!(parked_before(now, week), now - chrono::Duration::days(7));
        for huge in [
            humantime::parse_duration("1000000years").unwrap(),
            Duration::MAX,
        ] {
            assert_eq!(parked_before(now, huge), DateTime::<Utc>::MIN_UTC);
        }
    }
}
