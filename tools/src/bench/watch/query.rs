//! Part (a) of `bench-watch`: the cost of the watch's scan on a big table.
//! The table is filled ([`table::fill`]), then each window is read as a
//! tick of the watch reads it — the store's own `due_between`, in pages of
//! [`PAGE`] rows along the (deadline, id) cursor — `--repeat` times; the
//! median is reported per window, per statement and per row, beside the
//! plan of the page statement.

use std::time::Instant;

use chrono::{DateTime, Utc};
use order_timeout::settings::Timer;
use order_timeout::testing::store::{PoolSettings, RowCursor, Store};
use serde::Serialize;

use super::super::BenchError;
use super::super::env::BenchEnv;
use super::super::report::median;
use super::table::{self, Filled, Plan};

/// Rows per statement of a scan: `src/pipeline/watch.rs` `PAGE`.
pub const PAGE: u32 = 1_000;

/// One window's scan, measured.
#[derive(Clone, Debug, Serialize)]
pub struct WindowCost {
    /// What the window is.
    pub window: String,
    /// Rows the scan returned.
    pub rows: u64,
    /// Statements one scan took (pages; at least 1).
    pub statements: u32,
    /// Each repetition's scan time, ms.
    pub runs_ms: Vec<f64>,
    /// The median scan time, ms.
    pub median_ms: f64,
    /// The median per statement, ms.
    pub ms_per_statement: f64,
    /// The median per row, ms (absent for an empty window).
    pub ms_per_row: Option<f64>,
    /// The first statement of the last run, ms.
    pub first_statement_ms: f64,
    /// The last statement of the last run, ms.
    pub last_statement_ms: f64,
    /// The plan of the window's first page statement.
    pub plan: Plan,
    /// The plan of its middle page statement (from a cursor with an id),
    /// when a scan takes more than one.
    pub middle_plan: Option<Plan>,
}

/// Part (a)'s results.
#[derive(Clone, Debug, Serialize)]
pub struct QueryReport {
    /// Rows in the table.
    pub rows: u64,
    /// Rows in the timer's from-status.
    pub rows_in_from: u64,
    /// Filling, indexing and analyzing took, s.
    pub fill_seconds: f64,
    /// Each window's cost.
    pub windows: Vec<WindowCost>,
    /// The literal statement given to `EXPLAIN` returned the same rows as
    /// the store's `due_between` (the 1,000-row window's first page).
    pub explained_statement_matches_store: bool,
    /// Problems found.
    pub failures: Vec<String>,
}

/// One scan of a window, as a watch tick makes it.
struct Scan {
    /// The whole scan, ms.
    ms: f64,
    /// Each statement, ms.
    statements_ms: Vec<f64>,
    /// Rows returned.
    rows: u64,
    /// The cursor the middle statement started from (the scan took more
    /// than one).
    middle: Option<RowCursor>,
}

/// One scan of (`after`, `until`] as a watch tick makes it.
async fn scan(
    store: &Store,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Scan, BenchError> {
    let started = Instant::now();
    let mut cursor = RowCursor {
        deadline: after,
        id: None,
    };
    let (mut statements_ms, mut rows, mut cursors) = (Vec::new(), 0u64, Vec::new());
    loop {
        cursors.push(cursor.clone());
        let t = Instant::now();
        let page = store.due_between(&cursor, until, PAGE).await?;
        statements_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        rows += page.rows.len() as u64;
        let Some(next) = page.next else { break };
        cursor = next;
    }
    let middle = (cursors.len() > 1).then(|| cursors[cursors.len() / 2].clone());
    Ok(Scan {
        ms: started.elapsed().as_secs_f64() * 1000.0,
        statements_ms,
        rows,
        middle,
    })
}

/// A window part (a) times: (`after`, `until`], and the rows the fill
/// put in it.
struct Window {
    label: String,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
    at_least: u64,
    at_most: u64,
}

/// The windows part (a) times.
fn windows(f: &Filled) -> Vec<Window> {
    let ms = chrono::Duration::milliseconds;
    let (base, block) = (f.base, f.block_start);
    let week = base + chrono::Duration::days(7);
    let w = |label: &str, after, until, at_least, at_most| Window {
        label: label.into(),
        after,
        until,
        at_least,
        at_most,
    };
    // Background rows in the from-status: 15 % of the rest over ~14 days,
    // so ~1 per 8 s of the block's minute on 1,000,000 rows.
    vec![
        w(
            "empty: the next minute (nothing in the from-status due)",
            base,
            base + ms(60_000),
            0,
            0,
        ),
        w(
            "sparse: a minute 7 days ahead (background only)",
            week,
            week + ms(60_000),
            0,
            100,
        ),
        w(
            "1 s of the 1,000 rows/s stretch (~1,000 rows)",
            block - ms(1),
            block + ms(999),
            1_000,
            1_010,
        ),
        w(
            "1 min of the 1,000 rows/s stretch (~60,000 rows)",
            block - ms(1),
            block + ms(59_999),
            table::BLOCK_ROWS,
            table::BLOCK_ROWS + 100,
        ),
    ]
}

/// Fills the table with `rows` rows and times the watch's scan of each
/// window `repeat` times through the store of `timer` (a watched timer of
/// the table's [`table::FILL_FROM`]).
pub async fn measure(
    env: &BenchEnv,
    timer: &Timer,
    rows: u64,
    repeat: usize,
) -> Result<QueryReport, BenchError> {
    let db = &env.db.orders;
    eprintln!(
        "== part (a): filling {TABLE} with {rows} rows",
        TABLE = table::TABLE
    );
    let filled = table::fill(db, rows).await?;
    eprintln!(
        "   {} rows ({} in {}) in {:.1} s, index {} created and analyzed",
        filled.rows,
        filled.in_from,
        table::FILL_FROM,
        filled.seconds,
        table::INDEX
    );
    let store = order_timeout::testing::store::connect_timer(
        &env.settings.database_url,
        PoolSettings::new(2),
        timer,
    )?;
    store.prepare().await?;
    let mut report = QueryReport {
        rows: filled.rows,
        rows_in_from: filled.in_from,
        fill_seconds: filled.seconds,
        windows: Vec::new(),
        explained_statement_matches_store: false,
        failures: Vec::new(),
    };
    for w in windows(&filled) {
        let cost = measure_window(&store, db, &w, repeat, &mut report.failures).await?;
        print_window(&cost);
        report.windows.push(cost);
    }
    report.explained_statement_matches_store = check_statement(&store, db, &filled).await?;
    if !report.explained_statement_matches_store {
        report.failures.push(
            "the statement given to EXPLAIN returned other rows than the store's due_between: \
             the store renders it differently now (update tools/src/bench/watch/table.rs)"
                .into(),
        );
    }
    Ok(report)
}

/// One window: a warm-up scan, `repeat` timed ones, the plans.
async fn measure_window(
    store: &Store,
    db: &crate::shop::ShopDb,
    w: &Window,
    repeat: usize,
    failures: &mut Vec<String>,
) -> Result<WindowCost, BenchError> {
    let label = &w.label;
    // One scan to warm the cache, as a watch's every tick finds it.
    scan(store, w.after, w.until).await?;
    let mut runs_ms = Vec::with_capacity(repeat);
    let mut last = None;
    for _ in 0..repeat {
        let s = scan(store, w.after, w.until).await?;
        runs_ms.push(s.ms);
        last = Some(s);
    }
    let Some(last) = last else {
        return Err(BenchError::Args("--repeat must be positive".into()));
    };
    let (statements, got) = (last.statements_ms.len() as u32, last.rows);
    if !(w.at_least..=w.at_most).contains(&got) {
        failures.push(format!(
            "window {label:?}: {got} rows, expected {}..={}",
            w.at_least, w.at_most
        ));
    }
    let plan = table::explain(db, w.after, None, w.until, PAGE).await?;
    let middle_plan = match &last.middle {
        Some(c) => {
            let id = c.id.as_deref();
            Some(table::explain(db, c.deadline, id, w.until, PAGE).await?)
        }
        None => None,
    };
    for p in std::iter::once(&plan).chain(&middle_plan) {
        if !p.uses_index {
            failures.push(format!(
                "window {label:?}: the plan does not use {}",
                table::INDEX
            ));
        }
    }
    let m = median(&runs_ms).unwrap_or(0.0);
    Ok(WindowCost {
        window: label.clone(),
        rows: got,
        statements,
        median_ms: m,
        ms_per_statement: m / f64::from(statements.max(1)),
        ms_per_row: (got > 0).then(|| m / got as f64),
        runs_ms,
        first_statement_ms: last.statements_ms.first().copied().unwrap_or(0.0),
        last_statement_ms: last.statements_ms.last().copied().unwrap_or(0.0),
        plan,
        middle_plan,
    })
}

/// Whether [`table::due_sql_literal`] returns the store's first page of
/// the 1,000-row window.
async fn check_statement(
    store: &Store,
    db: &crate::shop::ShopDb,
    f: &Filled,
) -> Result<bool, BenchError> {
    let ms = chrono::Duration::milliseconds;
    let (after, until) = (f.block_start - ms(1), f.block_start + ms(999));
    let cursor = RowCursor {
        deadline: after,
        id: None,
    };
    let from_store: Vec<String> = store
        .due_between(&cursor, until, PAGE)
        .await?
        .rows
        .into_iter()
        .map(|(id, _)| id.as_str().to_owned())
        .collect();
    let literal = table::literal_ids(db, after, until, PAGE).await?;
    Ok(from_store == literal)
}

fn print_window(c: &WindowCost) {
    let per_row = c.ms_per_row.map_or("-".into(), |ms| {
        format!("{:.4} ms ({:.1} µs)", ms, ms * 1000.0)
    });
    println!(
        "watch scan, {}: {} rows in {} statement(s); median {:.2} ms per scan, {:.3} ms per statement, {} per row (runs: {})",
        c.window,
        c.rows,
        c.statements,
        c.median_ms,
        c.ms_per_statement,
        per_row,
        c.runs_ms
            .iter()
            .map(|ms| format!("{ms:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if c.statements > 1 {
        println!(
            "   first statement {:.3} ms, last statement {:.3} ms",
            c.first_statement_ms, c.last_statement_ms
        );
    }
    print_plan("first page", &c.plan);
    if let Some(p) = &c.middle_plan {
        print_plan("middle page (cursor with an id)", p);
    }
}

fn print_plan(which: &str, p: &Plan) {
    let bound = match p.lower_bound {
        Some(true) => ", the index range bounded below by the cursor",
        Some(false) => {
            ", the index range NOT bounded below (reads every from-status row due before the window's end)"
        }
        None => "",
    };
    println!(
        "   plan of the {which} statement: {} {}{bound}",
        if p.uses_index {
            "uses index"
        } else {
            "DOES NOT USE index"
        },
        table::INDEX
    );
    for l in &p.lines {
        println!("      {l}");
    }
}
