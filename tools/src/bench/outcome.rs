//! The outcome of a load phase, measured from the database: waiting until
//! every order is settled ([`settle`]), then counting what happened to each
//! (cancelled on time, paid, released once, parked) and the lateness
//! ([`measure`]), and what of it is a failure of the run.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressStyle};
use sqlx::{MySqlPool, PgPool};

use super::BenchError;
use super::load::{BenchDb, Generated, Route, Workload};
use super::report::{LatenessStats, PhaseReport, per_second};
use crate::shop::ShopDb;

/// Waits until every order of the phase is settled (cancelled, or paid
/// with its deadline passed) and no outbox work is pending, or until
/// `settle_timeout` after the last deadline.
pub async fn settle(db: &BenchDb, g: Generated, w: &Workload) -> Result<Settled, BenchError> {
    let Generated {
        prefix,
        started,
        last_deadline,
        created,
        errors,
        create_seconds,
        counters,
        payer,
    } = g;
    let bar = ProgressBar::new(created + errors).with_style(
        ProgressStyle::with_template(
            "{spinner} settling [{elapsed_precise}] {bar:30} {pos}/{len} settled {msg}",
        )
        .map_err(|e| BenchError::Setup(e.to_string()))?,
    );
    let give_up = last_deadline
        + chrono::Duration::from_std(w.settle_timeout).unwrap_or(chrono::Duration::seconds(60));
    // Nothing can be settled for good before the last deadline: until then
    // the bar counts time, not rows. Counting the open rows twice a second
    // from the start (~21,000 unpaid orders at 1,000/s with 31 s timeouts)
    // cost PostgreSQL ~1 s of a 60 s run, charged to the service.
    let wait = (last_deadline - Utc::now()).to_std().unwrap_or_default();
    if !wait.is_zero() {
        bar.set_message(format!(
            "the last deadline is in {:.0} s",
            wait.as_secs_f64()
        ));
        tokio::time::sleep(wait).await;
    }
    loop {
        // Only the open rows (index scans): the full counts read every row
        // of the tables, earlier runs' too, and twice a second that was
        // PostgreSQL work the bench charged to the service.
        let (unpaid, pending) = db.orders.unsettled(&prefix).await?;
        bar.set_position((created + errors).saturating_sub(unpaid.max(0) as u64));
        bar.set_message(format!("unpaid {unpaid}, outbox pending {pending}"));
        let now = Utc::now();
        if now > last_deadline && payer.is_finished() && unpaid == 0 && pending == 0 {
            break;
        }
        if now > give_up {
            bar.abandon_with_message(format!(
                "gave up waiting: {unpaid} unpaid, {pending} outbox pending"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bar.finish();
    let _ = payer.await;
    Ok(Settled {
        prefix,
        started,
        created,
        errors,
        create_seconds,
        paid: counters.paid.load(Ordering::Relaxed),
        pay_failures: counters.pay_failures.load(Ordering::Relaxed),
        late_payments: counters.late_payments.load(Ordering::Relaxed),
    })
}

/// A settled phase, ready to measure.
pub struct Settled {
    prefix: String,
    /// When the generator began: the clock of the per-second lateness.
    pub started: DateTime<Utc>,
    created: u64,
    errors: u64,
    create_seconds: f64,
    paid: u64,
    pay_failures: u64,
    late_payments: u64,
}

/// Measures a settled phase from the database. Also returns each
/// cancellation as `(seconds since start by deadline, lateness ms)` for
/// the plot.
pub async fn measure(
    db: &BenchDb,
    s: &Settled,
    route: Route,
    w: &Workload,
) -> Result<(PhaseReport, Vec<(f64, f64)>), BenchError> {
    let counts = match &db.orders {
        ShopDb::Postgres(pool) => measure_pg(pool, s).await?,
        ShopDb::MySql(pool) => measure_mysql(pool, db, s).await?,
    };
    let lateness: Vec<f64> = counts.points.iter().map(|p| p.1).collect();
    let stats = LatenessStats::from_ms(&lateness);
    let failures = failures(&counts, &stats, s, route);
    let Counts {
        points,
        orders,
        span,
        unpaid,
        paid_touched,
        releases,
        calls,
        pending,
        peak,
    } = counts;
    let report = PhaseReport {
        design: route.design().into(),
        target_rate: w.rate,
        orders: orders as u64,
        achieved_rate: match span {
            Some(sp) if sp > 0.0 => orders as f64 / sp,
            _ => 0.0,
        },
        create_seconds: s.create_seconds,
        create_errors: s.errors,
        paid: s.paid,
        pay_failures: s.pay_failures,
        late_payments: s.late_payments,
        cancelled: stats.count,
        not_cancelled: unpaid as u64,
        paid_touched: paid_touched as u64,
        outbox_pending: pending as u64,
        stock_releases: releases as u64,
        duplicate_release_calls: (calls - releases).max(0) as u64,
        peak_cancel_rate: peak.unwrap_or(0) as u64,
        lateness: stats,
        per_second: per_second(&points),
        failures,
        ..Default::default()
    };
    let _ = s.created;
    Ok((report, points))
}

/// What a phase got wrong (empty: every check passed). The seed releases
/// no stock and keeps no outbox: any there means the service settled its
/// orders, not the seed.
fn failures(c: &Counts, stats: &LatenessStats, s: &Settled, route: Route) -> Vec<String> {
    let cancelled = stats.count;
    let mut failures = Vec::new();
    if stats.early > 0 {
        failures.push(format!(
            "{} orders cancelled before their deadline",
            stats.early
        ));
    }
    if c.unpaid > 0 {
        failures.push(format!("{} unpaid orders not cancelled", c.unpaid));
    }
    if c.paid_touched > 0 {
        failures.push(format!("{} paid orders were touched", c.paid_touched));
    }
    if route == Route::Seed {
        if c.releases > 0 || c.pending > 0 {
            failures.push(format!(
                "{} seed orders were settled by the service, not the seed",
                c.releases.max(c.pending)
            ));
        }
        return failures_of_the_generator(failures, s);
    }
    if c.releases as u64 != cancelled {
        failures.push(format!(
            "stock released for {} orders but {cancelled} were cancelled",
            c.releases
        ));
    }
    if c.pending > 0 {
        failures.push(format!(
            "{} cancelled orders with outbox work pending",
            c.pending
        ));
    }
    failures_of_the_generator(failures, s)
}

/// [`failures`]: what the generator could not do.
fn failures_of_the_generator(mut failures: Vec<String>, s: &Settled) -> Vec<String> {
    if s.errors > 0 {
        failures.push(format!(
            "{} orders failed to be created/published",
            s.errors
        ));
    }
    if s.pay_failures > 0 {
        failures.push(format!(
            "{} payments made before the deadline found the order no longer unpaid",
            s.pay_failures
        ));
    }
    failures
}

/// What measuring a phase reads from the databases.
struct Counts {
    /// Per cancelled order: (seconds since the phase started, by deadline;
    /// lateness in ms).
    points: Vec<(f64, f64)>,
    orders: i64,
    span: Option<f64>,
    unpaid: i64,
    paid_touched: i64,
    releases: i64,
    calls: i64,
    pending: i64,
    peak: Option<i64>,
}

/// [`measure`]'s reads on PostgreSQL (orders and inventory in one database).
async fn measure_pg(pool: &PgPool, s: &Settled) -> Result<Counts, BenchError> {
    let points: Vec<(f64, f64)> = sqlx::query_as(
        r#"
        SELECT extract(epoch FROM expires_at - $2)::float8,
               extract(epoch FROM cancelled_at - expires_at)::float8 * 1000
          FROM orders
         WHERE status = 'CANCELLED' AND starts_with(id, $1)
         ORDER BY expires_at
        "#,
    )
    .bind(&s.prefix)
    .bind(s.started)
    .fetch_all(pool)
    .await?;
    // Uncorrelated `IN`s: PostgreSQL hashes each subquery once. (Correlated
    // `EXISTS`es under the `OR` ran once per paid order, and the outbox has
    // no index on `order_id` alone: 20 s for a 30,000-order run.)
    let (orders, span, unpaid, paid_touched): (i64, Option<f64>, i64, i64) = sqlx::query_as(
        r#"
        SELECT count(*),
               extract(epoch FROM max(created_at) - min(created_at))::float8,
               count(*) FILTER (WHERE status = 'UNPAID'),
               count(*) FILTER (WHERE status = 'PAID' AND (cancelled_at IS NOT NULL
                    OR id IN (SELECT order_id FROM order_timeout_cancel_outbox WHERE starts_with(order_id, $1))
                    OR id IN (SELECT order_id FROM inventory.releases WHERE starts_with(order_id, $1))))
          FROM orders WHERE starts_with(id, $1)
        "#,
    )
    .bind(&s.prefix)
    .fetch_one(pool)
    .await?;
    let (releases, calls, pending): (i64, i64, i64) = sqlx::query_as(
        r#"
        SELECT (SELECT count(*) FROM inventory.releases WHERE starts_with(order_id, $1)),
               (SELECT coalesce(sum(calls), 0)::bigint FROM inventory.releases WHERE starts_with(order_id, $1)),
               (SELECT count(*) FROM order_timeout_cancel_outbox WHERE starts_with(order_id, $1)
                   AND (stock_released_at IS NULL OR event_published_at IS NULL))
        "#,
    )
    .bind(&s.prefix)
    .fetch_one(pool)
    .await?;
    let peak = peak_pg(pool, &s.prefix).await?;
    Ok(Counts {
        points,
        orders,
        span,
        unpaid,
        paid_touched,
        releases,
        calls,
        pending,
        peak,
    })
}

/// The most orders cancelled within one wall-clock second (PostgreSQL).
async fn peak_pg(pool: &PgPool, prefix: &str) -> Result<Option<i64>, BenchError> {
    Ok(sqlx::query_scalar(
        r#"
        SELECT max(n) FROM (SELECT count(*) AS n FROM orders
          WHERE status = 'CANCELLED' AND starts_with(id, $1)
          GROUP BY date_trunc('second', cancelled_at)) t
        "#,
    )
    .bind(prefix)
    .fetch_one(pool)
    .await?)
}

/// [`measure`]'s reads with the orders on MySQL: the rows are read once and
/// counted here; the cancellation time is the outbox row's (the cancel
/// transaction's clock, in microseconds), or the row's `cancelled_at`
/// where there is none (the seed's); releases come from the reference
/// inventory's PostgreSQL. The outbox row is looked up by its key (the
/// default timer, the id's bytes: the outbox's `order_id` is `VARBINARY`):
/// joined on the id alone, the server scanned the outbox once per order
/// (a block nested loop: 64 s after a 30,000-order run, 30 s for 30,000
/// rows on either side; by the key, 0.04 s).
async fn measure_mysql(pool: &MySqlPool, db: &BenchDb, s: &Settled) -> Result<Counts, BenchError> {
    type Row = (String, String, i64, i64, Option<i64>, bool);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT o.id, o.status, \
                TIMESTAMPDIFF(MICROSECOND, ?, o.expires_at), \
                TIMESTAMPDIFF(MICROSECOND, ?, o.created_at), \
                TIMESTAMPDIFF(MICROSECOND, ?, COALESCE(b.created_at, o.cancelled_at)), \
                b.order_id IS NOT NULL AND (b.stock_released_at IS NULL OR b.event_published_at IS NULL) \
           FROM orders o LEFT JOIN order_timeout_cancel_outbox b \
             ON b.timer = ? AND b.order_id = CAST(o.id AS BINARY) \
          WHERE o.id LIKE CONCAT(?, '%') ORDER BY o.expires_at",
    )
    .bind(s.started)
    .bind(s.started)
    .bind(s.started)
    .bind(order_timeout::settings::DEFAULT_TIMER)
    .bind(&s.prefix)
    .fetch_all(pool)
    .await?;
    let mut points = Vec::new();
    let mut per_second: HashMap<i64, i64> = HashMap::new();
    let mut paid_ids = Vec::new();
    let mut paid_touched = 0;
    for (id, status, expires_us, _, cancelled_us, _) in &rows {
        match (status.as_str(), cancelled_us) {
            ("CANCELLED", Some(c)) => {
                points.push((*expires_us as f64 / 1e6, (c - expires_us) as f64 / 1000.0));
                *per_second.entry(c.div_euclid(1_000_000)).or_default() += 1;
            }
            ("PAID", touched) => {
                paid_touched += i64::from(touched.is_some());
                paid_ids.push(id.clone());
            }
            _ => {}
        }
    }
    let created = rows.iter().map(|r| r.3);
    let span = created
        .clone()
        .max()
        .zip(created.min())
        .map(|(max, min)| (max - min) as f64 / 1e6);
    let released_paid: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inventory.releases WHERE order_id = ANY($1)")
            .bind(&paid_ids)
            .fetch_one(&db.inventory)
            .await?;
    let (releases, calls) = releases_mysql(pool, db, &s.prefix).await?;
    Ok(Counts {
        points,
        orders: rows.len() as i64,
        span,
        unpaid: rows.iter().filter(|r| r.1 == "UNPAID").count() as i64,
        paid_touched: paid_touched + released_paid,
        releases,
        calls,
        pending: rows.iter().filter(|r| r.5).count() as i64,
        peak: per_second.values().max().copied(),
    })
}

/// `(releases, calls)` of a MySQL phase: from the reference inventory's
/// release log, or from the shop's own stock table with `--stock also`.
async fn releases_mysql(
    pool: &MySqlPool,
    db: &BenchDb,
    prefix: &str,
) -> Result<(i64, i64), BenchError> {
    if db.also_stock {
        return also_releases(pool, prefix).await;
    }
    Ok(sqlx::query_as(
        "SELECT count(*), coalesce(sum(calls), 0)::bigint FROM inventory.releases \
          WHERE starts_with(order_id, $1)",
    )
    .bind(prefix)
    .fetch_one(&db.inventory)
    .await?)
}

/// With `--stock also` there is no release log: the units given back to
/// `shop_stock` must equal the units of the cancelled orders' lines, which
/// holds only if every cancelled order gave its stock back exactly once.
/// Returns `(releases, calls)` as the gRPC path would count them:
/// `(cancelled, cancelled)` when the units match, `(0, 0)` when they do not
/// (so the release check fails and says so).
async fn also_releases(pool: &MySqlPool, prefix: &str) -> Result<(i64, i64), BenchError> {
    let (skus, available): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), CAST(COALESCE(SUM(available), 0) AS SIGNED) FROM shop_stock",
    )
    .fetch_one(pool)
    .await?;
    let (cancelled, units): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(DISTINCT o.id), CAST(COALESCE(SUM(i.quantity), 0) AS SIGNED) \
           FROM orders o JOIN order_items i ON i.order_id = o.id \
          WHERE o.status = 'CANCELLED' AND o.id LIKE CONCAT(?, '%')",
    )
    .bind(prefix)
    .fetch_one(pool)
    .await?;
    let returned = available - skus * super::INITIAL_STOCK;
    if returned == units {
        Ok((cancelled, cancelled))
    } else {
        tracing::error!(
            returned,
            expected = units,
            "stock given back by also does not match"
        );
        Ok((0, 0))
    }
}
