//! The watched table of `bench-watch`: shaped like the reference `orders`
//! (text id, text status, a deadline column) plus the column the timers'
//! `set` writes the flip's time into, with the `(status, deadline)` index
//! the README tells a shop to give a watched timer's table; its fill with
//! a million rows; and the watch's scan statement as the store renders it,
//! for `EXPLAIN`.

use std::time::Instant;

use chrono::{DateTime, Utc};
use sqlx::{MySqlPool, PgPool, Row};

use super::super::BenchError;
use crate::shop::ShopDb;

/// The table the timers of `bench-watch` flip rows of.
pub const TABLE: &str = "watched_orders";

/// The index the docs/timers.md (`watch`) and the worked configs tell a
/// shop to create for a watched timer: `(status, deadline)`.
pub const INDEX: &str = "watched_orders_status_expires_at";

/// The from-status of the timer whose scan part (a) times.
pub const FILL_FROM: &str = "SHIPPED";

/// The status every timer of the bench flips rows to.
pub const TO: &str = "RECEIVED";

/// Rows of the dense block: 60 s of deadlines at 1,000 rows/s, one a
/// millisecond, a day ahead.
pub const BLOCK_ROWS: u64 = 60_000;

/// Rows per fill statement.
const FILL_BATCH: u64 = 100_000;

const CREATE_PG: &str = "CREATE TABLE IF NOT EXISTS watched_orders (\
     id TEXT PRIMARY KEY, \
     status TEXT NOT NULL, \
     created_at TIMESTAMPTZ NOT NULL DEFAULT now(), \
     expires_at TIMESTAMPTZ NOT NULL, \
     flipped_at TIMESTAMPTZ)";

const CREATE_MYSQL: &str = "CREATE TABLE IF NOT EXISTS watched_orders (\
     id VARCHAR(128) NOT NULL PRIMARY KEY, \
     status VARCHAR(32) NOT NULL, \
     created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
     expires_at DATETIME(6) NOT NULL, \
     flipped_at DATETIME(6) NULL) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4";

/// Creates the watched table (without its index: [`create_index`]).
pub async fn create(db: &ShopDb) -> Result<(), BenchError> {
    match db {
        ShopDb::Postgres(pool) => {
            sqlx::raw_sql(CREATE_PG).execute(pool).await?;
        }
        ShopDb::MySql(pool) => {
            sqlx::raw_sql(CREATE_MYSQL).execute(pool).await?;
        }
    }
    Ok(())
}

/// Creates the `(status, expires_at)` index and refreshes the planner's
/// statistics.
pub async fn create_index(db: &ShopDb) -> Result<(), BenchError> {
    match db {
        ShopDb::Postgres(pool) => {
            sqlx::raw_sql(
                "CREATE INDEX IF NOT EXISTS watched_orders_status_expires_at \
                   ON watched_orders (status, expires_at); \
                 ANALYZE watched_orders",
            )
            .execute(pool)
            .await?;
        }
        ShopDb::MySql(pool) => {
            sqlx::raw_sql(
                "CREATE INDEX watched_orders_status_expires_at \
                   ON watched_orders (status, expires_at)",
            )
            .execute(pool)
            .await?;
            // ANALYZE TABLE returns a result set: fetch it.
            sqlx::query("ANALYZE TABLE watched_orders")
                .fetch_all(pool)
                .await?;
        }
    }
    Ok(())
}

/// Where the fill put the rows part (a) scans.
#[derive(Clone, Copy, Debug)]
pub struct Filled {
    /// The database's clock at the fill, to the second.
    pub base: DateTime<Utc>,
    /// The first deadline of the dense block (`base` + 1 day); the block's
    /// row `k` is due `k` ms after it.
    pub block_start: DateTime<Utc>,
    /// Rows in the table.
    pub rows: u64,
    /// Rows in [`FILL_FROM`].
    pub in_from: u64,
    /// How long the fill took (rows, then index and statistics), s.
    pub seconds: f64,
}

/// The database's clock now, to the second (UTC).
async fn db_now(db: &ShopDb) -> Result<DateTime<Utc>, BenchError> {
    let now: DateTime<Utc> = match db {
        ShopDb::Postgres(pool) => {
            sqlx::query_scalar("SELECT date_trunc('second', now())")
                .fetch_one(pool)
                .await?
        }
        ShopDb::MySql(pool) => {
            let naive: chrono::NaiveDateTime = sqlx::query_scalar("SELECT UTC_TIMESTAMP()")
                .fetch_one(pool)
                .await?;
            naive.and_utc()
        }
    };
    Ok(now)
}

/// Fills the table with `rows` rows (ids `f00000001`…), deterministically
/// from the row number `g`:
///
/// - `g` ≤ [`BLOCK_ROWS`]: [`FILL_FROM`], due one a millisecond from
///   `base` + 1 day (the 1,000 rows/s stretch);
/// - else by `g * 7919 mod 100`: 15 % [`FILL_FROM`] due between 2 h and
///   14 days ahead; 2 % `UNPAID` due within ±30 min; 10 % `PAID` and 60 %
///   `RECEIVED` due between 30 days ago and 14 days ahead; 13 %
///   `CANCELLED` due in the last 30 days. Deadlines carry microseconds.
///
/// Then the index and the statistics ([`create_index`]).
pub async fn fill(db: &ShopDb, rows: u64) -> Result<Filled, BenchError> {
    let started = Instant::now();
    let base = db_now(db).await?;
    let block_start = base + chrono::Duration::days(1);
    if let ShopDb::MySql(pool) = db {
        create_mysql_seq(pool).await?;
    }
    let mut done = 0;
    while done < rows {
        let (lo, hi) = (done + 1, (done + FILL_BATCH).min(rows));
        match db {
            ShopDb::Postgres(pool) => fill_pg(pool, base, block_start, lo, hi).await?,
            ShopDb::MySql(pool) => fill_mysql(pool, base, block_start, lo, hi).await?,
        }
        done = hi;
        eprint!("\r   {done} of {rows} rows");
    }
    eprintln!();
    create_index(db).await?;
    let in_from: i64 = match db {
        ShopDb::Postgres(pool) => {
            sqlx::query_scalar("SELECT count(*) FROM watched_orders WHERE status = $1")
                .bind(FILL_FROM)
                .fetch_one(pool)
                .await?
        }
        ShopDb::MySql(pool) => {
            sqlx::query_scalar("SELECT COUNT(*) FROM watched_orders WHERE status = ?")
                .bind(FILL_FROM)
                .fetch_one(pool)
                .await?
        }
    };
    Ok(Filled {
        base,
        block_start,
        rows,
        in_from: u64::try_from(in_from).unwrap_or(0),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The status of row `g` (bound as `?`/`$n` for the block's size), the
/// same on both dialects.
const STATUS_CASE: &str = "CASE WHEN g <= {block} THEN 'SHIPPED' \
     WHEN b < 15 THEN 'SHIPPED' WHEN b < 17 THEN 'UNPAID' WHEN b < 27 THEN 'PAID' \
     WHEN b < 40 THEN 'CANCELLED' ELSE 'RECEIVED' END";

async fn fill_pg(
    pool: &PgPool,
    base: DateTime<Utc>,
    block_start: DateTime<Utc>,
    lo: u64,
    hi: u64,
) -> Result<(), BenchError> {
    let status = STATUS_CASE.replace("{block}", &BLOCK_ROWS.to_string());
    let sql = format!(
        "INSERT INTO watched_orders (id, status, expires_at) \
         SELECT 'f' || lpad(g::text, 8, '0'), {status}, \
                CASE WHEN g <= {BLOCK_ROWS} THEN $2 + (g - 1) * interval '1 millisecond' \
                     WHEN b < 15 THEN $1 + (7200 + s % 1202400) * interval '1 second' + j \
                     WHEN b < 17 THEN $1 + (s % 3600 - 1800) * interval '1 second' + j \
                     WHEN b >= 27 AND b < 40 THEN $1 - (s % 2592000) * interval '1 second' + j \
                     ELSE $1 + (s % 3801600 - 2592000) * interval '1 second' + j END \
           FROM (SELECT g, (g * 7919) % 100 AS b, g * 104729 AS s, \
                        ((g * 7) % 1000000) * interval '1 microsecond' AS j \
                   FROM generate_series($3::bigint, $4::bigint) AS g) AS x"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(base)
        .bind(block_start)
        .bind(lo as i64)
        .bind(hi as i64)
        .execute(pool)
        .await?;
    Ok(())
}

/// A numbers table `watched_orders_seq (n)` of 0..9999 for the MySQL fill
/// (no `generate_series`; MySQL has no sequence engine).
async fn create_mysql_seq(pool: &MySqlPool) -> Result<(), BenchError> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS watched_orders_seq (n INT NOT NULL PRIMARY KEY) ENGINE = InnoDB; \
         DELETE FROM watched_orders_seq; \
         INSERT INTO watched_orders_seq (n) \
         SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d \
           FROM (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                 UNION ALL SELECT 8 UNION ALL SELECT 9) AS a \
          CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                 UNION ALL SELECT 8 UNION ALL SELECT 9) AS b \
          CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                 UNION ALL SELECT 8 UNION ALL SELECT 9) AS c \
          CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                 UNION ALL SELECT 8 UNION ALL SELECT 9) AS e",
    )
    .execute(pool)
    .await?;
    Ok(())
}

async fn fill_mysql(
    pool: &MySqlPool,
    base: DateTime<Utc>,
    block_start: DateTime<Utc>,
    lo: u64,
    hi: u64,
) -> Result<(), BenchError> {
    let status = STATUS_CASE.replace("{block}", &BLOCK_ROWS.to_string());
    // Rows lo..=hi as g = 10000 * hi_part + lo_part + 1.
    let sql = format!(
        "INSERT INTO watched_orders (id, status, expires_at) \
         SELECT CONCAT('f', LPAD(g, 8, '0')), {status}, \
                CASE WHEN g <= {BLOCK_ROWS} THEN TIMESTAMPADD(MICROSECOND, (g - 1) * 1000, ?) \
                     WHEN b < 15 THEN TIMESTAMPADD(MICROSECOND, (7200 + MOD(s, 1202400)) * 1000000 + j, ?) \
                     WHEN b < 17 THEN TIMESTAMPADD(MICROSECOND, (MOD(s, 3600) - 1800) * 1000000 + j, ?) \
                     WHEN b >= 27 AND b < 40 THEN TIMESTAMPADD(MICROSECOND, j - MOD(s, 2592000) * 1000000, ?) \
                     ELSE TIMESTAMPADD(MICROSECOND, (MOD(s, 3801600) - 2592000) * 1000000 + j, ?) END \
           FROM (SELECT g, MOD(g * 7919, 100) AS b, g * 104729 AS s, MOD(g * 7, 1000000) AS j \
                   FROM (SELECT CAST(h.n AS SIGNED) * 10000 + l.n + 1 AS g \
                           FROM watched_orders_seq AS h CROSS JOIN watched_orders_seq AS l \
                          WHERE h.n BETWEEN ? AND ?) AS gs \
                  WHERE g BETWEEN ? AND ?) AS x"
    );
    let (b, s) = (base.naive_utc(), block_start.naive_utc());
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(s)
        .bind(b)
        .bind(b)
        .bind(b)
        .bind(b)
        .bind(((lo - 1) / 10_000) as i64)
        .bind(((hi - 1) / 10_000) as i64)
        .bind(lo as i64)
        .bind(hi as i64)
        .execute(pool)
        .await?;
    Ok(())
}

/// An instant as a PostgreSQL literal.
fn pg_time(t: DateTime<Utc>) -> String {
    format!("'{}'::timestamptz", t.format("%Y-%m-%d %H:%M:%S%.6f+00"))
}

/// An instant as a MySQL literal (UTC).
fn mysql_time(t: DateTime<Utc>) -> String {
    format!("'{}'", t.format("%Y-%m-%d %H:%M:%S%.6f"))
}

/// The watch's first page statement for the window (`after`, `until`] of
/// [`FILL_FROM`], exactly as `src/store/postgres/statements.rs` `due_statement` and
/// `src/store/mysql/statements.rs` `Sql::render` (`due`) render it for this table's
/// mapping (text id, text status, deadline column, no guard), with the
/// values the store binds written in as literals (the store runs custom
/// plans: PostgreSQL `plan_cache_mode = force_custom_plan`). The library
/// does not expose its rendered statements; `bench-watch` checks that
/// this one returns what the store's `due_between` returns
/// ([`literal_ids`]).
pub fn due_sql_literal(
    db: &ShopDb,
    after: DateTime<Utc>,
    after_id: Option<&str>,
    until: DateTime<Utc>,
    limit: u32,
) -> String {
    // Ids here are the bench's own (`f00000001`): no quoting needed, but
    // double any quote all the same.
    let id = after_id.map_or("NULL".to_owned(), |id| {
        format!("'{}'", id.replace('\'', "''"))
    });
    match db {
        ShopDb::Postgres(_) => format!(
            "SELECT o.\"id\"::text, (\"expires_at\")::timestamptz FROM \"watched_orders\" AS o \
              WHERE o.\"status\" = CAST('{from}'::text AS text) AND TRUE \
                AND \"expires_at\" >= {after}::timestamptz \
                AND \"expires_at\" <= {until}::timestamptz \
                AND (\"expires_at\" > {after}::timestamptz \
                     OR (\"expires_at\" = {after}::timestamptz AND {id}::text IS NOT NULL \
                         AND o.\"id\" > CAST({id}::text AS text))) \
              ORDER BY \"expires_at\", o.\"id\" LIMIT {limit}",
            from = FILL_FROM,
            until = pg_time(until),
            after = pg_time(after),
        ),
        ShopDb::MySql(_) => {
            let utc = |t| {
                format!(
                    "CONVERT_TZ({}, '+00:00', @@session.time_zone)",
                    mysql_time(t)
                )
            };
            format!(
                "SELECT CAST(`id` AS CHAR), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', \
                        CONVERT_TZ(`expires_at`, @@session.time_zone, '+00:00')) \
                   FROM `watched_orders` \
                  WHERE `status` = '{from}' AND TRUE AND `expires_at` <= {until} \
                    AND (`expires_at` > {after} \
                         OR (`expires_at` = {after} AND {id} IS NOT NULL AND `id` > {id})) \
                  ORDER BY `expires_at`, `id` LIMIT {limit}",
                from = FILL_FROM,
                until = utc(until),
                after = utc(after),
            )
        }
    }
}

/// The plan of [`due_sql_literal`]: its lines, and whether it reads
/// [`INDEX`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct Plan {
    /// `EXPLAIN`'s output, one line per plan node (MySQL: per table).
    pub lines: Vec<String>,
    /// Whether the plan scans [`INDEX`].
    pub uses_index: bool,
    /// PostgreSQL: whether the index condition bounds the deadline from
    /// below (else the scan reads every row of the from-status due before
    /// the window's end and filters); MySQL: not told by `EXPLAIN`.
    pub lower_bound: Option<bool>,
}

/// The plan of the watch's page statement for (`after`, `until`] from
/// the cursor (`after`, `after_id`): PostgreSQL `EXPLAIN (ANALYZE,
/// BUFFERS)` (it shows the rows an index scan read and threw away),
/// MySQL `EXPLAIN`.
pub async fn explain(
    db: &ShopDb,
    after: DateTime<Utc>,
    after_id: Option<&str>,
    until: DateTime<Utc>,
    limit: u32,
) -> Result<Plan, BenchError> {
    let statement = due_sql_literal(db, after, after_id, until, limit);
    let sql = match db {
        ShopDb::Postgres(_) => format!("EXPLAIN (ANALYZE, BUFFERS) {statement}"),
        ShopDb::MySql(_) => format!("EXPLAIN {statement}"),
    };
    let lines: Vec<String> = match db {
        ShopDb::Postgres(pool) => {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_all(pool)
                .await?
        }
        ShopDb::MySql(pool) => {
            let mut conn = pool.acquire().await?;
            sqlx::query("SET time_zone = '+00:00'")
                .execute(&mut *conn)
                .await?;
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_all(&mut *conn)
                .await?;
            rows.iter().map(mysql_explain_line).collect()
        }
    };
    let uses_index = lines.iter().any(|l| l.contains(INDEX));
    let lower_bound = match db {
        ShopDb::Postgres(_) => Some(
            lines
                .iter()
                .any(|l| l.contains("Index Cond") && l.contains("expires_at >")),
        ),
        ShopDb::MySql(_) => None,
    };
    Ok(Plan {
        lines,
        uses_index,
        lower_bound,
    })
}

/// One row of MySQL's `EXPLAIN` as `table type key rows Extra`.
fn mysql_explain_line(row: &sqlx::mysql::MySqlRow) -> String {
    let text = |name: &str| -> String {
        row.try_get::<Option<String>, _>(name)
            .ok()
            .flatten()
            .or_else(|| {
                row.try_get::<Option<Vec<u8>>, _>(name)
                    .ok()
                    .flatten()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
            })
            .unwrap_or_else(|| "NULL".into())
    };
    let rows = row
        .try_get::<Option<u64>, _>("rows")
        .ok()
        .flatten()
        .map(|n| n.to_string())
        .or_else(|| {
            row.try_get::<Option<i64>, _>("rows")
                .ok()
                .flatten()
                .map(|n| n.to_string())
        })
        .unwrap_or_else(|| text("rows"));
    format!(
        "table {} type {} key {} key_len {} rows {rows} Extra {}",
        text("table"),
        text("type"),
        text("key"),
        text("key_len"),
        text("Extra")
    )
}

/// The ids [`due_sql_literal`] returns for (`after`, `until`], for the
/// check against the store's own statement.
pub async fn literal_ids(
    db: &ShopDb,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<String>, BenchError> {
    let sql = due_sql_literal(db, after, None, until, limit);
    Ok(match db {
        ShopDb::Postgres(pool) => sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?,
        ShopDb::MySql(pool) => {
            let mut conn = pool.acquire().await?;
            sqlx::query("SET time_zone = '+00:00'")
                .execute(&mut *conn)
                .await?;
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_all(&mut *conn)
                .await?
                .iter()
                .map(|r| r.try_get::<String, _>(0))
                .collect::<Result<_, _>>()?
        }
    })
}
