//! Standing in for PostgreSQL's autovacuum where the server has it off
//! (CI machines set `autovacuum = off`; every shop's server, by default,
//! has it on). Without it the bench measured a database no shop runs:
//!
//! - between runs, every earlier run's dead row versions stay
//!   ([`vacuum_between_runs`]);
//! - within a run, the tables new to it never get planner statistics
//!   ([`Analyzer`]). Without them PostgreSQL takes `timer = 'cancel_unpaid'`
//!   for a selective condition (it holds for every outbox row) and reads
//!   the whole outbox by it, three times in every cancel statement, and
//!   the unpaid-and-due orders by the `(status, expires_at)` index instead
//!   of the batch's ids by the primary key: work that grows with the
//!   table. At 1,000 orders/s, 31 s timeouts, the statement averaged 12.7
//!   ms and PostgreSQL spent 0.92–1.15 ms per order; with the tables
//!   analyzed as autovacuum would, 0.66–0.67 ms.
//!
//! What these run is charged to PostgreSQL's CPU per order, as
//! autovacuum's workers would be.

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::BenchError;
use super::checkpoints::Happened;
use super::load::BenchDb;
use crate::shop::ShopDb;

/// The tables a run writes, per pool: the reference inventory's, and the
/// orders' when they are in PostgreSQL.
fn tables(db: &BenchDb) -> Vec<(PgPool, &'static [&'static str])> {
    let mut out: Vec<(PgPool, &'static [&'static str])> = vec![(
        db.inventory.clone(),
        &[
            "inventory.stock",
            "inventory.releases",
            "inventory.reservations",
        ],
    )];
    if let ShopDb::Postgres(pool) = &db.orders {
        out.push((
            pool.clone(),
            &[
                "public.orders",
                "public.order_items",
                "public.order_timeout_cancel_outbox",
            ],
        ));
    }
    out
}

/// Whether the server behind `pool` runs autovacuum.
async fn autovacuum_on(pool: &PgPool) -> Result<bool, sqlx::Error> {
    let setting: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(pool)
        .await?;
    Ok(setting == "on")
}

/// Before a run on the tables earlier runs wrote, where the server has
/// autovacuum off: `VACUUM (ANALYZE)` of the tables the runs write. Without
/// it every run's dead rows stay (after three runs at 2,000/s: 180,650 dead
/// versions beside 196,363 live orders, one per outbox row, 250,000 updates
/// of the 1,000 stock rows never vacuumed), and a set's later runs measured
/// a database no shop runs (`ReleaseStock` 15 → 627 ms mean from the second
/// run to the third).
pub async fn vacuum_between_runs(db: &BenchDb) -> Result<(), BenchError> {
    for (pool, tables) in tables(db) {
        if autovacuum_on(&pool).await? {
            continue;
        }
        let tables = tables.join(", ");
        eprintln!(
            "== PostgreSQL's autovacuum is off on this server: VACUUM (ANALYZE) {tables}, as autovacuum would have"
        );
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM (ANALYZE) {tables}")))
            .execute(&pool)
            .await?;
    }
    Ok(())
}

/// How often the [`Analyzer`] looks at the tables' changes. Autovacuum's
/// default is once a minute per database, on tables a shop's server has
/// long had statistics for; the bench's tables are new at every run.
const ANALYZE_CHECK: Duration = Duration::from_secs(10);

/// Autovacuum's analyze rule: a table is analyzed once the rows changed
/// since its last analyze exceed 50 + 10 % of its rows
/// (`autovacuum_analyze_threshold`, `autovacuum_analyze_scale_factor`),
/// at most once a minute (`autovacuum_naptime`; a table new to the
/// bench, never analyzed, at the first look). Analyzing the growing tables
/// at every 10 % took PostgreSQL 1.3 s a time at 2,000 orders/s, on a
/// machine busy with the run.
const CHANGED_ROWS_SQL: &str = "\
    SELECT schemaname || '.' || relname FROM pg_stat_user_tables \
     WHERE schemaname || '.' || relname = ANY($1) \
       AND n_mod_since_analyze > 50 + 0.1 * n_live_tup \
       AND coalesce(greatest(last_analyze, last_autoanalyze), '-infinity') \
           < now() - interval '60 seconds'";

/// During a phase, on a server with autovacuum off: `ANALYZE` of each table
/// the run writes once its changes pass autovacuum's threshold, looked at
/// every [`ANALYZE_CHECK`]. Stopped with [`Analyzer::stop`], which says
/// when each ran: an `ANALYZE` of the grown tables takes a second of a busy
/// machine, and a phase's report places it beside its lateness.
pub struct Analyzer {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Vec<Happened>>,
}

impl Analyzer {
    /// Starts analyzing where the server has autovacuum off; `None` where
    /// every server has it on (autovacuum does it).
    pub async fn start(db: &BenchDb) -> Result<Option<Self>, BenchError> {
        let mut off = Vec::new();
        for (pool, tables) in tables(db) {
            if !autovacuum_on(&pool).await? {
                off.push((pool, tables));
            }
        }
        if off.is_empty() {
            return Ok(None);
        }
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut analyzed = Vec::new();
            loop {
                tokio::select! {
                    _ = &mut stopped => return analyzed,
                    _ = tokio::time::sleep(ANALYZE_CHECK) => {}
                }
                for (pool, tables) in &off {
                    match analyze_changed(pool, tables).await {
                        Ok(Some(done)) => analyzed.push(done),
                        Ok(None) => {}
                        Err(e) => tracing::warn!(error = %e, "analyzing the bench's tables failed"),
                    }
                }
            }
        });
        Ok(Some(Self { stop, task }))
    }

    /// Stops; returns each `ANALYZE` it ran: when, how long, of what.
    pub async fn stop(self) -> Vec<Happened> {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}

/// `ANALYZE` of those of `tables` past autovacuum's threshold, if any: when
/// it began, how long it took, the statement.
async fn analyze_changed(pool: &PgPool, tables: &[&str]) -> Result<Option<Happened>, sqlx::Error> {
    let changed: Vec<String> = sqlx::query_scalar(CHANGED_ROWS_SQL)
        .bind(tables)
        .fetch_all(pool)
        .await?;
    if changed.is_empty() {
        return Ok(None);
    }
    // Names from the fixed list above, matched by the catalog.
    let statement = format!("ANALYZE {}", changed.join(", "));
    let began = chrono::Utc::now();
    let clock = std::time::Instant::now();
    sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
        .execute(pool)
        .await?;
    Ok(Some((began, clock.elapsed(), statement)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{scratch, shop};

    async fn insert_orders(pool: &PgPool, from: i32, to: i32) {
        sqlx::query(
            "INSERT INTO orders (id, status, expires_at) \
             SELECT 'o-' || g, 'UNPAID', now() FROM generate_series($1::int, $2::int) g",
        )
        .bind(from)
        .bind(to)
        .execute(pool)
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_table_past_autovacuums_threshold_is_analyzed_at_most_once_a_minute() {
        let db = scratch::ScratchDatabase::on_test_server("ot_tools_autovacuum");
        let pool = shop::prepare_database(&db.url().unwrap(), 2)
            .await
            .expect("prepare the database");
        let tables = ["public.orders", "public.order_items"];
        // Under the threshold: nothing.
        insert_orders(&pool, 1, 40).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(analyze_changed(&pool, &tables).await.unwrap(), None);

        // Past it (the statistics reach pg_stat_user_tables within a second
        // or so): the orders table, and only it.
        insert_orders(&pool, 41, 300).await;
        let mut analyzed = None;
        for _ in 0..20 {
            analyzed = analyze_changed(&pool, &tables).await.unwrap();
            if analyzed.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let (_, _, statement) = analyzed.expect("orders analyzed");
        assert_eq!(statement, "ANALYZE public.orders");
        let last: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
            "SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'orders'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(last.is_some(), "orders was not analyzed");

        // Past it again within the minute: not yet.
        insert_orders(&pool, 301, 900).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(analyze_changed(&pool, &tables).await.unwrap(), None);
        pool.close().await;
    }
}
