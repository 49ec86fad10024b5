//! Part (b) of `bench-watch`: lateness of a watched timer with nobody
//! publishing. A generator inserts `--rate` rows/s into the timer's
//! from-status, each due `lead` after the database's clock at its insert
//! (rows of one insert spaced `1 s / rate` apart); the service's watch
//! finds them and schedules them; the flip writes `flipped_at` from the
//! database's clock. Lateness is `flipped_at - expires_at`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::{MySqlPool, PgPool};

use super::super::BenchError;
use super::super::env::{BenchEnv, http_get};
use super::super::load::Route;
use super::super::report::{LatenessStats, cpu_per_order};
use super::super::sys::{Sampling, Usage};
use super::table::TO;
use crate::shop::ShopDb;

/// Most rows one insert of the generator carries (when it fell behind).
const MAX_INSERT: u64 = 1_000;

/// One watched timer's phase.
#[derive(Clone, Debug)]
pub struct Phase {
    /// The timer's name.
    pub timer: String,
    /// Its watch window.
    pub window: Duration,
    /// Its from-status.
    pub from: String,
    /// How long before its deadline each row enters the from-status.
    pub lead: Duration,
    /// Rows per second.
    pub rate: f64,
    /// How long to generate.
    pub duration: Duration,
    /// Longest wait after the last deadline.
    pub settle_timeout: Duration,
    /// Id prefix of the phase's rows.
    pub prefix: String,
}

/// One phase's results.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LatenessReport {
    /// The timer.
    pub timer: String,
    /// Its watch window, s.
    pub window_s: f64,
    /// Lead of each row, s.
    pub lead_s: f64,
    /// Target rows/s.
    pub target_rate: f64,
    /// Rows inserted.
    pub rows: u64,
    /// Rows/s achieved.
    pub achieved_rate: f64,
    /// Rows flipped.
    pub flipped: u64,
    /// Rows never flipped (lost).
    pub lost: u64,
    /// `flipped_at - expires_at`.
    pub lateness: LatenessStats,
    /// Rows the watch scheduled (the service's counter, this timer).
    pub scheduled_by_watch: f64,
    /// Rows the sweeper settled (the service's counter, this timer):
    /// flipped, or whose outbox work (the event) it finished after
    /// `[sweeper] grace`. A flip by the sweeper shows as lateness over the
    /// grace.
    pub swept: f64,
    /// CPU and memory per process over the phase.
    pub resources: BTreeMap<String, Usage>,
    /// CPU time per row, ms, per process.
    pub cpu_ms_per_row: BTreeMap<String, f64>,
    /// Their total, if every one was readable.
    pub cpu_ms_per_row_total: Option<f64>,
    /// `/proc/loadavg` before and after.
    pub loadavg: (String, String),
    /// Problems found.
    pub failures: Vec<String>,
}

/// Runs one phase: generate, settle, measure.
pub async fn run(
    env: &BenchEnv,
    p: &Phase,
    sampling: &Sampling,
) -> Result<LatenessReport, BenchError> {
    eprintln!(
        "== part (b): timer {} (watch {}), {} rows/s for {:?}, each due {:?} after its insert",
        p.timer,
        humantime::format_duration(p.window),
        p.rate,
        p.duration,
        p.lead
    );
    let db = &env.db.orders;
    sampling.reset();
    let la0 = super::super::loadavg();
    let m0 = counters(env, &p.timer).await;
    let started = Instant::now();
    let rows = generate(db, p).await?;
    let create_s = started.elapsed().as_secs_f64();
    let waiting = settle(db, p).await?;
    let resources = sampling.usage();
    let m1 = counters(env, &p.timer).await;
    let ms = lateness_ms(db, &p.prefix).await?;
    let lateness = LatenessStats::from_ms(&ms);
    let flipped = ms.len() as u64;
    let (per, total) = cpu_per_order(&resources, rows, Route::Service.processes());
    let mut r = LatenessReport {
        timer: p.timer.clone(),
        window_s: p.window.as_secs_f64(),
        lead_s: p.lead.as_secs_f64(),
        target_rate: p.rate,
        rows,
        achieved_rate: rows as f64 / create_s.max(1e-9),
        flipped,
        lost: rows.saturating_sub(flipped),
        lateness,
        scheduled_by_watch: m1.0 - m0.0,
        swept: m1.1 - m0.1,
        resources,
        cpu_ms_per_row: per,
        cpu_ms_per_row_total: total,
        loadavg: (la0, super::super::loadavg()),
        failures: Vec::new(),
    };
    if r.lateness.early > 0 {
        r.failures.push(format!(
            "{} rows flipped before their deadline",
            r.lateness.early
        ));
    }
    if r.lost > 0 || waiting > 0 {
        r.failures.push(format!(
            "{} rows not flipped within {:?} of the last deadline",
            r.lost, p.settle_timeout
        ));
    }
    Ok(r)
}

/// Inserts `rate` rows/s for `duration` in the from-status; returns how
/// many.
async fn generate(db: &ShopDb, p: &Phase) -> Result<u64, BenchError> {
    let total = (p.rate * p.duration.as_secs_f64()).round() as u64;
    let step_us = (1_000_000.0 / p.rate).round() as i64;
    let lead_us = i64::try_from(p.lead.as_micros()).unwrap_or(i64::MAX);
    let started = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_millis(10));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sent = 0u64;
    while sent < total {
        ticks.tick().await;
        let target = ((started.elapsed().as_secs_f64() * p.rate) as u64).min(total);
        while sent < target {
            let n = (target - sent).min(MAX_INSERT);
            let (lo, hi) = (sent + 1, sent + n);
            match db {
                ShopDb::Postgres(pool) => insert_pg(pool, p, lo, hi, lead_us, step_us).await?,
                ShopDb::MySql(pool) => insert_mysql(pool, p, lo, hi, lead_us, step_us).await?,
            }
            sent = hi;
        }
    }
    Ok(sent)
}

async fn insert_pg(
    pool: &PgPool,
    p: &Phase,
    lo: u64,
    hi: u64,
    lead_us: i64,
    step_us: i64,
) -> Result<(), BenchError> {
    sqlx::query(
        "INSERT INTO watched_orders (id, status, expires_at) \
         SELECT $1 || lpad(g::text, 9, '0'), $2, \
                clock_timestamp() + ($3::bigint + (g - $4) * $5::bigint) * interval '1 microsecond' \
           FROM generate_series($4::bigint, $6::bigint) AS g",
    )
    .bind(&p.prefix)
    .bind(&p.from)
    .bind(lead_us)
    .bind(lo as i64)
    .bind(step_us)
    .bind(hi as i64)
    .execute(pool)
    .await?;
    Ok(())
}

async fn insert_mysql(
    pool: &MySqlPool,
    p: &Phase,
    lo: u64,
    hi: u64,
    lead_us: i64,
    step_us: i64,
) -> Result<(), BenchError> {
    let values =
        vec!["(?, ?, TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6)))"; (hi - lo + 1) as usize];
    let sql = format!(
        "INSERT INTO watched_orders (id, status, expires_at) VALUES {}",
        values.join(", ")
    );
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
    for g in lo..=hi {
        q = q
            .bind(format!("{}{g:09}", p.prefix))
            .bind(&p.from)
            .bind(lead_us + (g - lo) as i64 * step_us);
    }
    q.execute(pool).await?;
    Ok(())
}

/// Rows of the phase still in the from-status.
async fn waiting(db: &ShopDb, p: &Phase) -> Result<i64, BenchError> {
    Ok(match db {
        ShopDb::Postgres(pool) => {
            sqlx::query_scalar(
                "SELECT count(*) FROM watched_orders WHERE status = $1 AND starts_with(id, $2)",
            )
            .bind(&p.from)
            .bind(&p.prefix)
            .fetch_one(pool)
            .await?
        }
        ShopDb::MySql(pool) => {
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM watched_orders WHERE status = ? AND id LIKE CONCAT(?, '%')",
            )
            .bind(&p.from)
            .bind(&p.prefix)
            .fetch_one(pool)
            .await?
        }
    })
}

/// Waits until every row of the phase is flipped, or `settle_timeout`
/// after the last deadline; returns how many still wait.
async fn settle(db: &ShopDb, p: &Phase) -> Result<i64, BenchError> {
    let until = tokio::time::Instant::now() + p.lead + p.settle_timeout;
    loop {
        let n = waiting(db, p).await?;
        if n == 0 || tokio::time::Instant::now() >= until {
            eprintln!();
            return Ok(n);
        }
        eprint!("\r   {n} rows waiting for their deadline   ");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `flipped_at - expires_at` of the phase's flipped rows, ms, from the
/// database's timestamps.
async fn lateness_ms(db: &ShopDb, prefix: &str) -> Result<Vec<f64>, BenchError> {
    Ok(match db {
        ShopDb::Postgres(pool) => {
            sqlx::query_scalar::<_, f64>(
                "SELECT extract(epoch FROM flipped_at - expires_at)::float8 * 1000 \
                   FROM watched_orders \
                  WHERE status = $1 AND starts_with(id, $2) AND flipped_at IS NOT NULL",
            )
            .bind(TO)
            .bind(prefix)
            .fetch_all(pool)
            .await?
        }
        ShopDb::MySql(pool) => sqlx::query_scalar::<_, i64>(
            "SELECT TIMESTAMPDIFF(MICROSECOND, expires_at, flipped_at) FROM watched_orders \
              WHERE status = ? AND id LIKE CONCAT(?, '%') AND flipped_at IS NOT NULL",
        )
        .bind(TO)
        .bind(prefix)
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|us| us as f64 / 1000.0)
        .collect(),
    })
}

/// The services' `order_timeout_watch_scheduled_total` and
/// `order_timeout_sweeper_orders_total` of `timer`, summed over instances
/// (0 where unreadable).
async fn counters(env: &BenchEnv, timer: &str) -> (f64, f64) {
    let label = format!("timer=\"{timer}\"");
    let (mut scheduled, mut swept) = (0.0, 0.0);
    for port in &env.metrics_ports {
        let Ok(Ok(text)) =
            tokio::time::timeout(Duration::from_secs(3), http_get(*port, "/metrics")).await
        else {
            continue;
        };
        for line in text.lines().filter(|l| l.contains(&label)) {
            let Some(v) = line
                .rsplit_once(' ')
                .and_then(|(_, v)| v.parse::<f64>().ok())
            else {
                continue;
            };
            if line.starts_with("order_timeout_watch_scheduled_total") {
                scheduled += v;
            } else if line.starts_with("order_timeout_sweeper_orders_total") {
                swept += v;
            }
        }
    }
    (scheduled, swept)
}

/// Prints a phase's paragraph.
pub fn print(r: &LatenessReport) {
    let l = &r.lateness;
    println!(
        "watch lateness, timer {} (watch {} s, lead {} s): {} rows at {:.0}/s (target {}), {} flipped; lateness p50 {:.1} / p90 {:.1} / p99 {:.1} / max {:.1} ms; {} early, {} lost (not flipped)",
        r.timer,
        r.window_s,
        r.lead_s,
        r.rows,
        r.achieved_rate,
        r.target_rate,
        r.flipped,
        l.p50_ms,
        l.p90_ms,
        l.p99_ms,
        l.max_ms,
        l.early,
        r.lost
    );
    println!(
        "   scheduled by the watch {:.0}; settled by the sweeper (flipped, or the event finished, after its grace) {:.0}",
        r.scheduled_by_watch, r.swept
    );
    let per: Vec<String> = r
        .cpu_ms_per_row
        .iter()
        .map(|(k, ms)| format!("{k} {ms:.3}"))
        .collect();
    let own = r.cpu_ms_per_row.get("service");
    match (r.cpu_ms_per_row_total, own) {
        (Some(total), Some(own)) if total > 0.0 => println!(
            "   CPU per row: {} ms; all {total:.3} ms; the service's own {own:.3} ms ({:.0} %)",
            per.join(", "),
            own / total * 100.0
        ),
        _ => println!("   CPU per row: {} ms; total unreadable", per.join(", ")),
    }
    println!("   loadavg: {} -> {}", r.loadavg.0, r.loadavg.1);
    for f in &r.failures {
        println!("   FAIL: {f}");
    }
}
