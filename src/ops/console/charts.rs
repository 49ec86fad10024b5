//! The console's pictures: inline SVG rendered here, on the server. No
//! script, no external resource, no style sheet of their own (presentation
//! attributes only), so they work under the console's Content-Security-Policy
//! unchanged and offline. Each picture is an `<svg role="img">` labelled by
//! its `<title>` and `<desc>` (what a screen reader says, and the numbers
//! that matter in words), with its axes and legend in text, and a `<title>`
//! on every point and bar (the browser's tooltip).
//!
//! Three kinds: a timer's lateness p50/p99 per minute over the last hour
//! (log scale: milliseconds and a minute's incident on one picture), the
//! rows flipped and messages parked per minute over the last hour (bars),
//! and the timeouts waiting by due window (bars).

use std::fmt::Write as _;

use chrono::{DateTime, TimeDelta, Timelike as _, Utc};

use super::html::esc;
use crate::observe::recent::{HISTORY_MINUTES, Minute, TimerMinute};
use crate::ops::pending::DueWindow;

/// The picture's size in CSS pixels (it shrinks with the window, never
/// grows: `max-width: 100%` in the page's style).
const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 220.0;
/// Room for the y labels, the legend, the x labels.
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 36.0;

const TEXT: &str = "#1b1f24";
const GRID: &str = "#d0d7de";
const AXIS: &str = "#57606a";
/// p50 and the due windows.
const BLUE: &str = "#0969da";
/// p99.
const ORANGE: &str = "#bc4c00";
/// Flipped (cancelled).
const GREEN: &str = "#1a7f37";
/// Parked.
const RED: &str = "#cf222e";

fn plot_width() -> f64 {
    WIDTH - LEFT - RIGHT
}

fn plot_height() -> f64 {
    HEIGHT - TOP - BOTTOM
}

/// The opening of a picture: its size, its label and description.
fn open(svg: &mut String, id: &str, title: &str, desc: &str) {
    let _ = write!(
        svg,
        "<svg class=\"chart\" id=\"{id}\" role=\"img\" aria-labelledby=\"{id}-title {id}-desc\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         font-family=\"system-ui,sans-serif\" font-size=\"12\" fill=\"{TEXT}\">\
         <title id=\"{id}-title\">{}</title><desc id=\"{id}-desc\">{}</desc>",
        esc(title),
        esc(desc)
    );
}

/// Horizontal grid lines with their labels at the left, `(value's y, label)`.
fn y_axis(svg: &mut String, ticks: &[(f64, String)]) {
    for (y, label) in ticks {
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{GRID}\"/>\
             <text x=\"{:.1}\" y=\"{y:.1}\" dy=\"0.35em\" text-anchor=\"end\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            esc(label)
        );
    }
    let _ = write!(
        svg,
        "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"{AXIS}\"/>",
        WIDTH - RIGHT,
        TOP + plot_height(),
        TOP + plot_height()
    );
}

/// A legend entry at the top: a swatch and its name; returns the x after it.
fn legend(svg: &mut String, x: f64, color: &str, name: &str) -> f64 {
    let _ = write!(
        svg,
        "<rect x=\"{x:.1}\" y=\"8\" width=\"14\" height=\"10\" fill=\"{color}\"/>\
         <text x=\"{:.1}\" y=\"17\">{}</text>",
        x + 18.0,
        esc(name)
    );
    // Wide enough for the names used here at 12 px.
    x + 26.0 + 7.0 * name.chars().count() as f64
}

/// A note across the middle of an empty picture.
fn empty_note(svg: &mut String, note: &str) {
    let _ = write!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"{AXIS}\">{}</text>",
        LEFT + plot_width() / 2.0,
        TOP + plot_height() / 2.0,
        esc(note)
    );
}

/// Draws a y axis of counts from 0 to `most` rounded up to a nice number
/// ([`nice_scale`]), and returns where a count sits on it.
fn count_axis(svg: &mut String, most: f64) -> impl Fn(f64) -> f64 + use<> {
    let (top, step) = nice_scale(most);
    let y = move |v: f64| TOP + plot_height() * (1.0 - v / top);
    let ticks: Vec<(f64, String)> = (0..=((top / step).round() as u64))
        .map(|k| {
            let v = k as f64 * step;
            (y(v), count(v))
        })
        .collect();
    y_axis(svg, &ticks);
    y
}

/// Round steps for a linear axis up to at least `most`: (top, step).
fn nice_scale(most: f64) -> (f64, f64) {
    if most <= 0.0 {
        return (1.0, 1.0);
    }
    let rough = most / 4.0;
    let magnitude = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= rough)
        .unwrap_or(10.0 * magnitude)
        .max(1.0);
    ((most / step).ceil() * step, step)
}

/// A count for an axis or a bar: `1,234`.
fn count(n: f64) -> String {
    let n = n.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds for a lateness label: `0.1 ms`, `12.3 ms`, `1 s`, `2.5 s`.
fn lateness(secs: f64) -> String {
    if secs < 0.001 {
        format!("{:.1} ms", secs * 1000.0)
    } else if secs < 1.0 {
        let ms = secs * 1000.0;
        if ms < 10.0 {
            format!("{ms:.1} ms")
        } else {
            format!("{ms:.0} ms")
        }
    } else if secs < 10.0 {
        format!("{secs:.1} s")
    } else {
        format!("{secs:.0} s")
    }
}

/// The last hour as [`HISTORY_MINUTES`] slots, oldest first, the current
/// minute last: each slot's minute, and the [`Minute`] recorded for it.
struct Hour<'a> {
    first: DateTime<Utc>,
    slots: Vec<Option<&'a Minute>>,
}

impl<'a> Hour<'a> {
    fn new(minutes: &'a [Minute], now: DateTime<Utc>) -> Self {
        let current = now
            .with_second(0)
            .and_then(|t| t.with_nanosecond(0))
            .unwrap_or(now);
        let first = current - TimeDelta::minutes(HISTORY_MINUTES as i64 - 1);
        let slots = (0..HISTORY_MINUTES)
            .map(|i| {
                let start = first + TimeDelta::minutes(i as i64);
                minutes.iter().find(|m| m.start == start)
            })
            .collect();
        Self { first, slots }
    }

    fn slot_width() -> f64 {
        plot_width() / HISTORY_MINUTES as f64
    }

    /// The middle of slot `i`.
    fn x(i: usize) -> f64 {
        LEFT + (i as f64 + 0.5) * Self::slot_width()
    }

    fn minute(&self, i: usize) -> DateTime<Utc> {
        self.first + TimeDelta::minutes(i as i64)
    }

    /// `HH:MM` under every slot whose minute is a multiple of ten.
    fn x_axis(&self, svg: &mut String) {
        for i in 0..HISTORY_MINUTES {
            let minute = self.minute(i);
            if !minute.minute().is_multiple_of(10) {
                continue;
            }
            let _ = write!(
                svg,
                "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"{AXIS}\"/>\
                 <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                TOP + plot_height(),
                TOP + plot_height() + 4.0,
                TOP + plot_height() + 20.0,
                minute.format("%H:%M"),
                x = Self::x(i),
            );
        }
    }
}

/// One quantile's points over the hour: `(slot, seconds)` where there is
/// one, `None` in minutes without flips.
type Points = Vec<Option<(usize, f64)>>;

/// `timer`'s lateness p50 and p99 per minute over the last hour, on a log
/// scale.
pub(super) fn lateness_chart(
    id: &str,
    timer: &str,
    minutes: &[Minute],
    now: DateTime<Utc>,
) -> String {
    let hour = Hour::new(minutes, now);
    let figures: Vec<Option<&TimerMinute>> = hour
        .slots
        .iter()
        .map(|m| m.and_then(|m| m.timers.get(timer)))
        .collect();
    let quantile = |pick: fn(&TimerMinute) -> Option<f64>| -> Points {
        figures
            .iter()
            .enumerate()
            .map(|(i, f)| Some((i, pick((*f)?)?)))
            .collect()
    };
    let p50 = quantile(|t| t.p50);
    let p99 = quantile(|t| t.p99);
    let mut svg = String::new();
    open(
        &mut svg,
        id,
        &format!("Lateness of {timer}, p50 and p99 per minute, last hour"),
        &lateness_desc(&hour, &figures),
    );
    let scale = LogScale::around(p50.iter().chain(&p99).flatten().map(|(_, v)| *v));
    let ticks: Vec<(f64, String)> = (scale.lo..=scale.hi)
        .map(|e| {
            let v = 10f64.powi(e);
            (scale.y(v), lateness(v))
        })
        .collect();
    y_axis(&mut svg, &ticks);
    hour.x_axis(&mut svg);
    let x = legend(&mut svg, LEFT, BLUE, "p50");
    legend(&mut svg, x, ORANGE, "p99");
    if p99.iter().all(Option::is_none) {
        empty_note(&mut svg, "no row flipped in the last hour");
    }
    for (name, color, points) in [("p50", BLUE, &p50), ("p99", ORANGE, &p99)] {
        quantile_line(&mut svg, &hour, &scale, (name, color), points);
    }
    svg.push_str("</svg>");
    svg
}

/// One quantile's line (a polyline per run of consecutive minutes with a
/// value) and its points, each titled with its minute and figure.
fn quantile_line(
    svg: &mut String,
    hour: &Hour<'_>,
    scale: &LogScale,
    (name, color): (&str, &str),
    points: &Points,
) {
    for run in points.split(Option::is_none).filter(|r| r.len() > 1) {
        let coords: Vec<String> = run
            .iter()
            .flatten()
            .map(|(i, v)| format!("{:.1},{:.1}", Hour::x(*i), scale.y(*v)))
            .collect();
        let _ = write!(
            svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>",
            coords.join(" ")
        );
    }
    for (i, v) in points.iter().flatten() {
        let _ = write!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{color}\"><title>{} UTC: {name} {}</title></circle>",
            Hour::x(*i),
            scale.y(*v),
            hour.minute(*i).format("%H:%M"),
            lateness(*v)
        );
    }
}

/// The lateness picture in words: the hour's flips, its worst p99 and the
/// latest minute's figures.
fn lateness_desc(hour: &Hour<'_>, figures: &[Option<&TimerMinute>]) -> String {
    let flips: u64 = figures.iter().flatten().map(|t| t.flips).sum();
    let worst = figures
        .iter()
        .enumerate()
        .filter_map(|(i, t)| Some((i, (*t)?.p99?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let latest = figures.iter().rev().flatten().find(|t| t.p50.is_some());
    match (worst, latest) {
        (Some((i, p99)), Some(last)) => format!(
            "{} rows flipped in the last hour. Highest p99 {} in the minute from {} UTC. Latest minute with flips: p50 {}, p99 {}.",
            count(flips as f64),
            lateness(p99),
            hour.minute(i).format("%H:%M"),
            last.p50.map_or("–".into(), lateness),
            last.p99.map_or("–".into(), lateness),
        ),
        _ => "No row flipped in the last hour.".to_owned(),
    }
}

/// A log scale of whole decades of seconds, `10^lo` to `10^hi`.
struct LogScale {
    lo: i32,
    hi: i32,
}

impl LogScale {
    /// Whole decades around `values`, at least two and down to 1 ms; 1 ms
    /// to 1 s without values.
    fn around(values: impl Iterator<Item = f64>) -> Self {
        let (least, most) = values
            .map(|v| v.max(1e-4))
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        if most <= 0.0 {
            return Self { lo: -3, hi: 0 };
        }
        let lo = (least.log10().floor() as i32).min(-3);
        Self {
            lo,
            hi: (most.log10().ceil() as i32).max(lo + 2),
        }
    }

    /// The height of `secs` in the picture.
    fn y(&self, secs: f64) -> f64 {
        let lo = f64::from(self.lo);
        let span = f64::from(self.hi - self.lo);
        TOP + plot_height() * (1.0 - (secs.max(10f64.powf(lo)).log10() - lo) / span)
    }
}

/// Rows flipped (`flipped`: "cancelled" when the only timer is
/// cancel_unpaid) and messages parked per minute over the last hour, as
/// bars side by side.
pub(super) fn flips_chart(
    id: &str,
    flipped: &str,
    minutes: &[Minute],
    now: DateTime<Utc>,
) -> String {
    let hour = Hour::new(minutes, now);
    let per_slot: Vec<(u64, u64)> = hour
        .slots
        .iter()
        .map(|m| {
            m.map_or((0, 0), |m| {
                (m.timers.values().map(|t| t.flips).sum(), m.parked)
            })
        })
        .collect();
    let total_flips: u64 = per_slot.iter().map(|s| s.0).sum();
    let total_parked: u64 = per_slot.iter().map(|s| s.1).sum();
    let most = per_slot.iter().map(|s| s.0.max(s.1)).max().unwrap_or(0);
    let mut svg = String::new();
    open(
        &mut svg,
        id,
        &format!("Rows {flipped} and messages parked per minute, last hour"),
        &format!(
            "{} {flipped} and {} parked in the last hour; at most {} in one minute.",
            count(total_flips as f64),
            count(total_parked as f64),
            count(most as f64)
        ),
    );
    let y = count_axis(&mut svg, most as f64);
    hour.x_axis(&mut svg);
    let x = legend(&mut svg, LEFT, GREEN, flipped);
    legend(&mut svg, x, RED, "parked");
    if most == 0 {
        empty_note(
            &mut svg,
            &format!("nothing {flipped} or parked in the last hour"),
        );
    }
    let bar = (Hour::slot_width() / 2.0 - 1.0).max(1.0);
    for (i, (flips, parked)) in per_slot.iter().enumerate() {
        let minute = hour.minute(i).format("%H:%M");
        for (n, color, offset, what) in [
            (*flips, GREEN, -bar - 0.5, flipped),
            (*parked, RED, 0.5, "parked"),
        ] {
            if n == 0 {
                continue;
            }
            let top_y = y(n as f64);
            let _ = write!(
                svg,
                "<rect x=\"{:.1}\" y=\"{top_y:.1}\" width=\"{bar:.1}\" height=\"{:.1}\" fill=\"{color}\">\
                 <title>{minute} UTC: {} {what}</title></rect>",
                Hour::x(i) + offset,
                (TOP + plot_height() - top_y).max(1.0),
                count(n as f64)
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// `within 1 hour`, or `later` (beyond the last window).
fn when(w: &DueWindow) -> String {
    if w.at_most_secs.is_some() {
        format!("within {}", w.label())
    } else {
        "later".to_owned()
    }
}

/// The timeouts waiting by due window, a bar each with its count.
pub(super) fn due_windows_chart(id: &str, windows: &[DueWindow]) -> String {
    let total: u64 = windows.iter().map(|w| w.messages).sum();
    let most = windows.iter().map(|w| w.messages).max().unwrap_or(0);
    let words: Vec<String> = windows
        .iter()
        .map(|w| format!("{} {}", count(w.messages as f64), when(w)))
        .collect();
    let mut svg = String::new();
    open(
        &mut svg,
        id,
        "What falls due when: timeouts waiting, by due window (at the latest)",
        &format!(
            "{} timeouts wait: {}. Bounds from each queue's TTL, not exact times: a timeout counted in a window falls due within it at the latest, maybe sooner.",
            count(total as f64),
            words.join(", ")
        ),
    );
    // Headroom above the tallest bar for its count.
    let y = count_axis(&mut svg, most as f64 * 1.2);
    let slot = plot_width() / windows.len().max(1) as f64;
    let bar = slot * 0.6;
    for (i, w) in windows.iter().enumerate() {
        let middle = LEFT + (i as f64 + 0.5) * slot;
        let label = if w.at_most_secs.is_some() {
            format!("≤ {}", w.label())
        } else {
            w.label().to_owned()
        };
        let top_y = y(w.messages as f64);
        if w.messages > 0 {
            let _ = write!(
                svg,
                "<rect x=\"{:.1}\" y=\"{top_y:.1}\" width=\"{bar:.1}\" height=\"{:.1}\" fill=\"{BLUE}\">\
                 <title>{} due {}</title></rect>",
                middle - bar / 2.0,
                (TOP + plot_height() - top_y).max(1.0),
                count(w.messages as f64),
                when(w)
            );
        }
        let _ = write!(
            svg,
            "<text x=\"{middle:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-weight=\"bold\">{}</text>\
             <text x=\"{middle:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            top_y - 5.0,
            count(w.messages as f64),
            TOP + plot_height() + 18.0,
            esc(&label)
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{LEFT}\" y=\"17\" fill=\"{AXIS}\">due within, at the latest</text></svg>"
    );
    svg
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn minute(start: DateTime<Utc>, p50: f64, p99: f64, flips: u64, parked: u64) -> Minute {
        Minute {
            start,
            timers: BTreeMap::from([(
                "cancel_unpaid".to_owned(),
                TimerMinute {
                    p50: Some(p50),
                    p99: Some(p99),
                    flips,
                },
            )]),
            parked,
            partial: false,
        }
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-27T10:42:31Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn scales_and_numbers() {
        assert_eq!(nice_scale(0.0), (1.0, 1.0));
        assert_eq!(nice_scale(3.0), (3.0, 1.0));
        assert_eq!(nice_scale(37.0), (40.0, 10.0));
        assert_eq!(nice_scale(1234.0), (1500.0, 500.0));
        assert_eq!(count(1_234_567.0), "1,234,567");
        assert_eq!(count(12.0), "12");
        assert_eq!(lateness(0.0123), "12 ms");
        assert_eq!(lateness(0.0031), "3.1 ms");
        assert_eq!(lateness(0.0001), "0.1 ms");
        assert_eq!(lateness(2.5), "2.5 s");
    }

    #[test]
    fn the_lateness_picture_is_labelled_and_places_each_minute_by_its_time() {
        let start = |m: i64| now().with_second(0).unwrap() - TimeDelta::minutes(m);
        let minutes = [
            minute(start(59), 0.002, 0.004, 10, 0),
            minute(start(3), 0.012, 0.031, 40, 1),
            minute(start(2), 0.010, 3.0, 50, 0),
            minute(start(0), 0.011, 0.020, 5, 0),
            // Older than the hour: not drawn.
            minute(start(60), 0.5, 9.0, 1, 0),
        ];
        let svg = lateness_chart("lateness-x", "cancel_unpaid", &minutes, now());
        assert!(svg.starts_with("<svg class=\"chart\" id=\"lateness-x\" role=\"img\""));
        assert!(svg.contains("aria-labelledby=\"lateness-x-title lateness-x-desc\""));
        assert!(svg.contains("<title id=\"lateness-x-title\">Lateness of cancel_unpaid, p50 and p99 per minute, last hour</title>"));
        assert!(
            svg.contains(
                "105 rows flipped in the last hour. Highest p99 3.0 s in the minute from 10:40 UTC."
            ),
            "{svg}"
        );
        assert!(
            svg.contains("Latest minute with flips: p50 11 ms, p99 20 ms."),
            "{svg}"
        );
        // 1 ms … 10 s in decades; the 10:00 to 10:40 ticks.
        for label in [
            ">1.0 ms<", ">10 ms<", ">100 ms<", ">1.0 s<", ">10 s<", ">10:00<", ">10:40<",
        ] {
            assert!(svg.contains(label), "{label} in {svg}");
        }
        assert!(!svg.contains("09:42 UTC"), "the older minute is left out");
        // Minutes 10:39-10:40 make a line; 10:42 is a point of its own.
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert_eq!(svg.matches("<circle").count(), 8);
        assert!(svg.contains("<title>10:40 UTC: p99 3.0 s</title>"));
        // The first and the last slot of the hour.
        assert!(svg.contains(&format!("cx=\"{:.1}\"", LEFT + 0.5 * Hour::slot_width())));
        assert!(svg.contains(&format!(
            "cx=\"{:.1}\"",
            WIDTH - RIGHT - 0.5 * Hour::slot_width()
        )));
        assert!(svg.ends_with("</svg>"));

        let empty = lateness_chart("l", "cancel_unpaid", &[], now());
        assert!(empty.contains("No row flipped in the last hour."));
        assert!(empty.contains("no row flipped in the last hour</text>"));
    }

    #[test]
    fn bars_per_minute_and_per_due_window() {
        let start = now().with_second(0).unwrap();
        let minutes = [minute(start - TimeDelta::minutes(1), 0.01, 0.02, 30, 2)];
        let svg = flips_chart("flips", "cancelled", &minutes, now());
        assert!(
            svg.contains("30 cancelled and 2 parked in the last hour; at most 30 in one minute.")
        );
        assert!(svg.contains("<title>10:41 UTC: 30 cancelled</title>"));
        assert!(svg.contains("<title>10:41 UTC: 2 parked</title>"));
        assert_eq!(
            svg.matches("<rect").count(),
            2 + 2,
            "two bars, two swatches"
        );

        let windows: Vec<DueWindow> = [
            ("1m", Some(60), 3),
            ("10m", Some(600), 0),
            ("later", None, 1200),
        ]
        .into_iter()
        .map(|(window, at_most_secs, messages)| DueWindow {
            window,
            at_most_secs,
            messages,
            cumulative: 0,
        })
        .collect();
        let svg = due_windows_chart("due", &windows);
        assert!(
            svg.contains(
                "1,203 timeouts wait: 3 within 1 minute, 0 within 10 minutes, 1,200 later."
            ),
            "{svg}"
        );
        assert!(svg.contains("not exact times"));
        assert!(svg.contains(">≤ 1 minute<") && svg.contains(">later<"));
        assert!(svg.contains("<title>1,200 due later</title>"), "{svg}");
        assert_eq!(
            svg.matches("<rect").count(),
            2,
            "no bar for an empty window"
        );
    }
}
