//! The PNG: lateness over time (each cancelled order by its deadline, plus
//! the per-second p99) and the lateness distribution (CDF), for the product
//! and, when measured, the single-queue and seed baselines. Pure Rust: a bitmap
//! backend and an embedded font (DejaVu Sans Mono), no system libraries.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::BenchError;
use super::report::per_second;

static FONT: &[u8] = include_bytes!("fonts/DejaVuSansMono.ttf");

/// One design's cancellations: `(seconds since start by deadline,
/// lateness ms)`.
pub struct Series<'a> {
    /// Label.
    pub name: &'a str,
    /// The points.
    pub points: &'a [(f64, f64)],
}

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Plot(e.to_string())
}

/// Lateness floor on the log axis (0.1 ms).
const FLOOR_MS: f64 = 0.1;

/// The designs' colours, product first.
const COLORS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
];

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// Draws the PNG.
pub fn draw(path: &Path, title: &str, series: &[Series<'_>]) -> Result<(), BenchError> {
    // Registering twice is harmless; the font is static.
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    let root = BitMapBackend::new(path, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(err)?;
    let (top, bottom) = root.split_vertically(520);
    let all = series.iter().flat_map(|s| s.points.iter());
    let t_max = all.clone().map(|p| p.0).fold(1.0_f64, f64::max) * 1.02;
    let y_max = all.map(|p| p.1).fold(10.0_f64, f64::max) * 1.5;
    draw_over_time(&top, series, t_max, y_max)?;
    draw_distribution(&bottom, series, y_max)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Top: each cancelled order's lateness by its deadline, and the p99 of
/// each second.
fn draw_over_time(
    area: &Area<'_>,
    series: &[Series<'_>],
    t_max: f64,
    y_max: f64,
) -> Result<(), BenchError> {
    let mut chart = ChartBuilder::on(area)
        .caption(
            "lateness of each cancelled order, by its deadline (dots), per-second p99 (line)",
            ("sans-serif", 16),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..t_max, (FLOOR_MS..y_max).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("deadline, seconds since the first order")
        .y_desc("lateness, ms (log)")
        .draw()
        .map_err(err)?;
    for (s, color) in series.iter().zip(COLORS) {
        // Thin out huge runs: at most ~60k dots per design.
        let step = (s.points.len() / 60_000).max(1);
        chart
            .draw_series(
                s.points.iter().step_by(step).map(|&(t, ms)| {
                    Circle::new((t, ms.max(FLOOR_MS)), 1, color.mix(0.25).filled())
                }),
            )
            .map_err(err)?;
        let p99: Vec<(f64, f64)> = per_second(s.points)
            .iter()
            .map(|b| (b.t_s as f64 + 0.5, b.p99_ms.max(FLOOR_MS)))
            .collect();
        chart
            .draw_series(LineSeries::new(p99, color.stroke_width(2)))
            .map_err(err)?
            .label(format!("{} (p99 per second)", s.name))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(err)
}

/// Bottom: the distribution, the share of orders with lateness <= x.
fn draw_distribution(area: &Area<'_>, series: &[Series<'_>], y_max: f64) -> Result<(), BenchError> {
    let mut cdf = ChartBuilder::on(area)
        .caption(
            "distribution: share of cancelled orders at most this late",
            ("sans-serif", 16),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d((FLOOR_MS..y_max).log_scale(), 0.0..1.0_f64)
        .map_err(err)?;
    cdf.configure_mesh()
        .x_desc("lateness, ms (log)")
        .y_desc("share of orders")
        .draw()
        .map_err(err)?;
    for (s, color) in series.iter().zip(COLORS) {
        cdf.draw_series(LineSeries::new(cdf_line(s.points), color.stroke_width(2)))
            .map_err(err)?
            .label(s.name.to_string())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
    }
    cdf.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(err)
}

/// The distribution's line: at most ~2,000 points, ending at 1.0.
fn cdf_line(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = points.iter().map(|p| p.1.max(FLOOR_MS)).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len().max(1) as f64;
    let step = (v.len() / 2000).max(1);
    let mut line: Vec<(f64, f64)> = v
        .iter()
        .enumerate()
        .step_by(step)
        .map(|(i, &x)| (x, (i + 1) as f64 / n))
        .collect();
    if let Some(&x) = v.last() {
        line.push((x, 1.0));
    }
    line
}
