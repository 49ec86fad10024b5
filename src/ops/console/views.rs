//! The pages of figures: the overview (rates, lateness, readiness, what
//! waits, and pictures of the last hour) and pending by due window (with a
//! picture of what falls due when). Both reload every 10 s and read only
//! what the service already holds: no broker round trip per view, and each
//! is computed at most once per [`super::PAGE_FRESH`] whatever the number
//! of viewers (readiness as last probed, no database ping per view).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::Console;
use super::charts;
use super::html::{Page, esc, millis, rate, secs, time, up};
use crate::broker::topology::{DUE_QUEUE, PARKED_QUEUE};
use crate::observe::recent::{Change, Minute, Series};
use crate::ops::pending::PendingReport;
use crate::settings::DEFAULT_TIMER;

const MESSAGES: &str = "order_timeout_messages_total";
const PARKED: &str = "order_timeout_parked_total";
const LATENESS: &str = "order_timeout_cancel_lateness_seconds";
const SWEPT: &str = "order_timeout_sweeper_orders_total";
const WATCHED: &str = "order_timeout_watch_scheduled_total";

fn result_is(names: &'static [&'static str]) -> impl Fn(&Series) -> bool {
    move |s| s.label("result").is_some_and(|r| names.contains(&r))
}

/// `GET /console`.
pub(super) async fn overview(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let access = console.access(&headers);
    let body = console
        .overview
        .get_or(async || overview_body(&console).await)
        .await;
    Page {
        title: "Overview",
        access: &access,
        refresh: true,
        body: body.to_string(),
    }
    .ok()
}

/// The overview's figures, computed (and counted) once per
/// [`super::PAGE_FRESH`].
async fn overview_body(console: &Console) -> String {
    console.metrics.console_overview_computed();
    let readiness = console
        .health
        .check_cached(crate::observe::http::READYZ_FRESH)
        .await;
    let minute = console
        .recent
        .change(&console.metrics, Duration::from_secs(60));
    let five = console
        .recent
        .change(&console.metrics, Duration::from_secs(300));
    let mut body = String::new();
    let per_minute = |keep: &dyn Fn(&Series) -> bool, name| rate(minute.per_minute(name, keep));
    let _ = write!(
        body,
        "<h2>Last minute</h2><table><tr><th>rescheduled /min</th><th>cancelled /min</th>\
         <th>left alone /min</th><th>parked /min</th></tr><tr><td class=\"num\">{}</td>\
         <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr></table>\
         <p class=\"muted\">rescheduled: sent into the delay cascade (the metrics' <code>result=\"rescheduled\"</code>); left alone: paid, or no longer \
         unpaid, or failing the guard. This instance only, over the last {:.0} s.</p>",
        per_minute(&result_is(&["rescheduled"]), MESSAGES),
        per_minute(&result_is(&["cancelled"]), MESSAGES),
        per_minute(&result_is(&["already_paid", "left_alone"]), MESSAGES),
        per_minute(&|_| true, PARKED),
        minute.seconds,
    );
    last_hour(&mut body, &console.recent.minutes(&console.metrics), &five);
    lateness_table(&mut body, &five);
    let _ = write!(
        body,
        "<h2>Readiness</h2><table><tr><th>broker</th><th>database</th><th>inventory</th>\
         <th>statements</th></tr><tr>{}{}{}{}</tr></table>",
        up(readiness.broker),
        up(readiness.database),
        if console.health.uses_inventory() {
            up(readiness.inventory)
        } else {
            r#"<td class="muted">not used</td>"#
        },
        up(readiness.statements)
    );
    waiting_summary(&mut body, console.board.latest().as_ref());
    timers_table(&mut body, &five);
    outcomes_table(&mut body, &minute);
    body
}

/// The pictures of the last hour: each timer's lateness, then what was
/// flipped and parked, per minute.
fn last_hour(body: &mut String, minutes: &[Minute], five: &Change) {
    // The timers the history knows; before its first sample, the metrics'.
    let mut timers: Vec<&str> = minutes
        .iter()
        .flat_map(|m| m.timers.keys().map(String::as_str))
        .chain(
            five.now
                .iter()
                .filter(|s| s.name == format!("{LATENESS}_count"))
                .filter_map(|s| s.label("timer")),
        )
        .filter(|t| !t.is_empty())
        .collect();
    timers.sort_unstable();
    timers.dedup();
    let now = chrono::Utc::now();
    body.push_str("<h2>Last hour</h2>");
    for (i, timer) in timers.iter().enumerate() {
        let _ = write!(body, "<h3>Lateness of {}</h3>", esc(timer));
        body.push_str(&charts::lateness_chart(
            &format!("lateness-{i}"),
            timer,
            minutes,
            now,
        ));
    }
    let (flipped, heading) = if timers == [DEFAULT_TIMER] {
        ("cancelled", "Orders cancelled and messages parked")
    } else {
        ("flipped", "Rows flipped (every timer) and messages parked")
    };
    let _ = write!(body, "<h3>{heading}</h3>");
    body.push_str(&charts::flips_chart("flips", flipped, minutes, now));
    body.push_str(
        "<p class=\"muted\">Per minute of the clock (UTC), this instance only; the last minute is \
         the current one so far. Lateness: the time a row was flipped (an order cancelled) minus \
         its deadline, p50 and p99 of the minute's flips, on a log scale; no point where nothing \
         was flipped. Hover a point or a bar for its figure.</p>",
    );
}

fn lateness_table(body: &mut String, five: &Change) {
    let since_start = Change {
        seconds: 0.0,
        then: Vec::new(),
        now: five.now.clone(),
    };
    let _ = write!(
        body,
        "<h2>Lateness</h2><table><tr><th></th><th>p50</th><th>p99</th><th>cancellations</th></tr>\
         <tr><th>last {:.0} s</th><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>\
         <tr><th>since start</th><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr></table>\
         <p class=\"muted\">Cancel time minus the order's deadline, from the histogram's buckets \
         (as histogram_quantile() computes it).</p>",
        five.seconds,
        millis(five.quantile(LATENESS, 0.5)),
        millis(five.quantile(LATENESS, 0.99)),
        five.increase(&format!("{LATENESS}_count"), &|_| true),
        millis(since_start.quantile(LATENESS, 0.5)),
        millis(since_start.quantile(LATENESS, 0.99)),
        since_start.increase(&format!("{LATENESS}_count"), &|_| true),
    );
}

fn waiting_summary(body: &mut String, report: Option<&PendingReport>) {
    let Some(r) = report else {
        body.push_str(
            "<h2>Waiting</h2><p class=\"muted\">Not measured yet (no broker session).</p>",
        );
        return;
    };
    let depth = |d: Option<crate::ops::pending::QueueDepth>| {
        d.map_or("missing".into(), |d| d.messages.to_string())
    };
    let _ = write!(
        body,
        "<h2>Waiting</h2><table><tr><th>in the delay cascade</th><th>all due within</th>\
         <th>{DUE_QUEUE}</th><th>consumers</th><th>{PARKED_QUEUE}</th></tr>\
         <tr><td class=\"num\"><a href=\"/console/pending\">{}</a></td><td>{}</td>\
         <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\"><a href=\"/console/parked\">{}</a></td></tr></table>\
         <p class=\"muted\">As of {}.</p>",
        r.waiting(None),
        r.latest_due_secs(None).map_or("–".into(), secs),
        depth(r.due),
        r.due.map_or("–".into(), |d| d.consumers.to_string()),
        depth(r.parked),
        time(Some(r.measured_at)),
    );
}

/// Per timer (cancel_unpaid and the `[[timers]]`): flips over the last
/// minutes and since start, their lateness, and what the sweeper and the
/// watch did.
fn timers_table(body: &mut String, five: &Change) {
    let mut timers: Vec<&str> = five
        .now
        .iter()
        .filter(|s| s.name == MESSAGES)
        .filter_map(|s| s.label("timer"))
        .filter(|t| !t.is_empty())
        .collect();
    timers.sort_unstable();
    timers.dedup();
    let _ = write!(
        body,
        "<h2>Timers</h2><table><tr><th>timer</th><th>flipped /min</th><th>flipped since start</th>\
         <th>p99 lateness, last {:.0} s</th><th>swept since start</th><th>watch scheduled since start</th></tr>",
        five.seconds
    );
    for timer in timers {
        let of_timer = |s: &Series| s.label("timer") == Some(timer);
        let flipped = |s: &Series| of_timer(s) && s.label("result") == Some("cancelled");
        let total = |name: &str, keep: &dyn Fn(&Series) -> bool| -> f64 {
            five.now
                .iter()
                .filter(|s| s.name == name && keep(s))
                .map(|s| s.value)
                .sum()
        };
        let _ = write!(
            body,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(timer),
            rate(five.per_minute(MESSAGES, &flipped)),
            total(MESSAGES, &flipped),
            millis(five.quantile_of(LATENESS, 0.99, &of_timer)),
            total(SWEPT, &of_timer),
            total(WATCHED, &of_timer),
        );
    }
    body.push_str(
        "</table><p class=\"muted\">flipped: cancelled, for cancel_unpaid; moved from the timer's \
         <code>from</code> to its <code>to</code> status, for the others.</p>",
    );
}

fn outcomes_table(body: &mut String, minute: &Change) {
    // Several series per result (one per timer): each result once, in the
    // order the exposition first shows it.
    let mut results: Vec<&str> = Vec::new();
    for result in minute
        .now
        .iter()
        .filter(|s| s.name == MESSAGES)
        .filter_map(|s| s.label("result"))
    {
        if !results.contains(&result) {
            results.push(result);
        }
    }
    body.push_str(
        "<h2>Messages by result</h2><table><tr><th>result</th><th>per minute</th><th>since start</th></tr>",
    );
    for result in results {
        let keep = |s: &Series| s.label("result") == Some(result);
        let total: f64 = minute
            .now
            .iter()
            .filter(|s| s.name == MESSAGES && keep(s))
            .map(|s| s.value)
            .sum();
        let _ = write!(
            body,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{total}</td></tr>",
            esc(result),
            rate(minute.per_minute(MESSAGES, &keep)),
        );
    }
    body.push_str("</table>");
}

/// `GET /console/pending`.
pub(super) async fn pending(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let access = console.access(&headers);
    let body = console
        .pending
        .get_or(async || pending_body(&console))
        .await;
    Page {
        title: "Pending timeouts",
        access: &access,
        refresh: true,
        body: body.to_string(),
    }
    .ok()
}

/// The pending page's figures, computed once per [`super::PAGE_FRESH`].
fn pending_body(console: &Console) -> String {
    let mut body = String::new();
    match console.board.latest() {
        None => body.push_str(
            "<p class=\"muted\">Not measured yet: the service measures every 5 s while it is connected to the broker.</p>",
        ),
        Some(report) => {
            due_windows(&mut body, &report);
            body.push_str("<h2>By cascade level</h2>");
            windows_table(&mut body, &report);
            let missing = report.missing_queues();
            if !missing.is_empty() {
                let _ = write!(
                    body,
                    "<p class=\"error\">Missing queues: {} (run <code>order-timeout topology check</code>).</p>",
                    esc(&missing.join(", "))
                );
            }
            waiting_summary(&mut body, Some(&report));
        }
    }
    parked_since_start(
        &mut body,
        &console.recent.change(&console.metrics, Duration::ZERO),
    );
    body
}

/// What falls due when: a picture and a table of the due windows, said
/// to be bounds.
fn due_windows(body: &mut String, report: &PendingReport) {
    let windows = report.due_windows();
    let _ = write!(
        body,
        "<h2>What falls due when</h2><p>{} timeouts wait in the delay store (cascade and lanes). \
         <b>At the latest:</b> each queue's TTL bounds when its timeouts fall due, not an exact \
         time; a timeout counted under &ldquo;1 hour&rdquo; falls due within the hour, maybe much sooner.</p>",
        report.total_waiting()
    );
    body.push_str(&charts::due_windows_chart("due-windows", &windows));
    body.push_str(
        "<table><tr><th>due within, at the latest</th><th>timeouts</th>\
         <th>at least this many due by then</th></tr>",
    );
    for w in &windows {
        let _ = write!(
            body,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            w.label(),
            w.messages,
            if w.at_most_secs.is_some() {
                w.cumulative.to_string()
            } else {
                "–".into()
            }
        );
    }
    body.push_str("</table>");
}

fn windows_table(body: &mut String, report: &PendingReport) {
    let _ = write!(
        body,
        "<p>{} timeouts wait in the delay cascade ({} shard{}); every one falls due within {}. \
         A message in level k reaches the service within 2<sup>k+1</sup> s.</p>",
        report.waiting(None),
        report.shards,
        if report.shards == 1 { "" } else { "s" },
        report
            .latest_due_secs(None)
            .map_or("– (none waits)".into(), secs),
    );
    body.push_str("<table><tr><th>due within</th><th>level</th>");
    for shard in 0..report.shards {
        let _ = write!(body, "<th>shard {shard}</th>");
    }
    body.push_str("<th>total</th></tr>");
    for w in report.windows().iter().filter(|w| w.messages > 0) {
        let _ = write!(
            body,
            "<tr><td>{}</td><td class=\"num\">{}</td>",
            secs(w.due_within_secs),
            w.level
        );
        for n in &w.by_shard {
            let _ = write!(body, "<td class=\"num\">{n}</td>");
        }
        let _ = write!(body, "<td class=\"num\">{}</td></tr>", w.messages);
    }
    body.push_str("<tr><th colspan=\"2\">total</th>");
    for shard in 0..report.shards {
        let _ = write!(
            body,
            "<th class=\"num\">{}</th>",
            report.waiting(Some(shard))
        );
    }
    let _ = write!(
        body,
        "<th class=\"num\">{}</th></tr><tr><th colspan=\"2\">all due within</th>",
        report.waiting(None)
    );
    for shard in (0..report.shards).map(Some).chain([None]) {
        let _ = write!(
            body,
            "<td>{}</td>",
            report.latest_due_secs(shard).map_or("–".into(), secs)
        );
    }
    body.push_str("</tr></table>");
    lanes_table(body, report);
}

/// The lanes, one row each, when lanes are configured.
fn lanes_table(body: &mut String, report: &PendingReport) {
    let lanes = report.lane_windows();
    if lanes.is_empty() {
        return;
    }
    let _ = write!(
        body,
        "<h2>Lanes</h2><p>A message in a lane reaches the service within the lane's window.          With the cascade, {} timeouts wait in the delay store.</p>\
         <table><tr><th>lane</th><th>due within</th><th>by shard</th><th>total</th></tr>",
        report.total_waiting()
    );
    for w in &lanes {
        let shards: Vec<String> = w.by_shard.iter().map(u64::to_string).collect();
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
            w.lane,
            secs(w.due_within_secs),
            shards.join(" "),
            w.messages
        );
    }
    body.push_str("</table>");
}

fn parked_since_start(body: &mut String, now: &Change) {
    body.push_str(
        "<h2>Parked by reason</h2><p class=\"muted\">Messages this instance parked since it started \
         (order_timeout_parked_total); the <a href=\"/console/parked\">parked page</a> counts what is in the queue now.</p>\
         <table><tr><th>reason</th><th>parked</th></tr>",
    );
    for s in now.now.iter().filter(|s| s.name == PARKED && s.value > 0.0) {
        let _ = write!(
            body,
            "<tr><td>{}</td><td class=\"num\">{}</td></tr>",
            esc(s.label("reason").unwrap_or("-")),
            s.value
        );
    }
    body.push_str("</table>");
}

/// The rows set aside, per timer: rows whose flip fails for their own
/// values, parked once, tried again hourly then daily. Read-only: the
/// operator fixes the rows, then `order-timeout set-aside retry`.
pub(super) async fn set_aside(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    /// Rows shown per timer.
    const SHOWN: u32 = 200;
    let access = console.access(&headers);
    let now = chrono::Utc::now();
    let mut body = String::from(
        "<p>Rows whose flip fails for their own values (a constraint, a CHECK, a trigger \
         refusing the row, a value out of range): parked once, then tried again an hour \
         later (a day later after 24 failures) and at once when the row changes. Fix the \
         rows or what refuses them, then <code>order-timeout set-aside retry --all</code>. \
         Failures of the environment (a privilege, a missing table) never set rows aside: \
         readiness and <code>order_timeout_timer_failing</code> show them.</p>",
    );
    for (timer, read) in console.set_aside_rows(SHOWN).await {
        let _ = write!(body, "<h2>Timer {}</h2>", esc(&timer));
        match read {
            Err(e) => {
                let _ = write!(
                    body,
                    "<p class=\"error\">Cannot read the rows set aside: {}</p>",
                    esc(&e)
                );
            }
            Ok(rows) if rows.is_empty() => body.push_str("<p class=\"muted\">None.</p>"),
            Ok(rows) => set_aside_table(&mut body, &rows, now, SHOWN),
        }
    }
    Page {
        title: "Rows set aside",
        access: &access,
        refresh: true,
        body,
    }
    .ok()
}

/// The rows set aside of one timer as a table, ages as of `now`; a note
/// when `shown` of them (the most read) are shown.
fn set_aside_table(
    body: &mut String,
    rows: &[crate::store::SetAsideRow],
    now: chrono::DateTime<chrono::Utc>,
    shown: u32,
) {
    let span = |d: chrono::TimeDelta| {
        let whole = Duration::from_secs(d.to_std().unwrap_or_default().as_secs());
        esc(&humantime::format_duration(whole).to_string())
    };
    body.push_str(
        "<table><tr><th>order id</th><th>set aside</th><th>failures</th>\
         <th>next try</th><th>reason</th></tr>",
    );
    for row in rows {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{} ago</td><td>{}</td><td>in {}</td><td>{}</td></tr>",
            esc(&row.order_id),
            span(now - row.set_aside_at),
            row.attempts,
            span(row.retry_at - now),
            esc(&row.reason),
        );
    }
    body.push_str("</table>");
    if rows.len() == shown as usize {
        let _ = write!(
            body,
            "<p class=\"muted\">The oldest {shown} shown: <code>order-timeout set-aside list --limit N</code> lists more.</p>"
        );
    }
}
