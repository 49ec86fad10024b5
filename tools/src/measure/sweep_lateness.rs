//! `order-timeout-tools sweep-lateness`: how late the sweeper cancels an
//! order whose timeout was never published, with the **default** sweeper
//! settings, while rows the flip leaves alone sit at the head of its timer:
//! a poison row (its `also` statement fails for it alone, for good) or 600
//! re-opened rows (flipped earlier, unpaid again, a finished outbox row
//! each), all overdue by an hour. Per run, on PostgreSQL or MariaDB: a fresh
//! [`World`] (a vhost of its own on the machine's broker; on MariaDB the
//! orders in a database of their own there), the service started with an
//! `also` statement logging each flip in a table `released` (a primary key)
//! and no gRPC release, then 20 unpublished orders due 5 s later (inside
//! the catch-up window: swept every second, 1 s grace) and 20 due 330 s
//! later (past it: every 30 s, 60 s grace). Every order is waited for (at
//! most 480 s); the figures are the lateness (`cancelled_at − expires_at`,
//! p50 and max) of each group. The runs go side by side: about 7 minutes
//! for all four.
//!
//! `tests/e2e/safety_net.rs` checks, on this module's [`Shop`], that such
//! rows never hide the orders behind them; docs/guarantees.md records the
//! figures.

use std::process::ExitCode;
use std::time::Duration;

use order_timeout::RunningService;
use order_timeout::settings::{DEFAULT_TIMER, Release, SecretUrl, Settings};
use order_timeout::testing::store::Dialect;

use super::{World, poll};
use crate::scratch::ScratchDatabase;
use crate::shop::{OrdersDatabase, ShopDb};

/// What sits at the head of the timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Head {
    /// One row whose flip fails for good (its `also` statement hits a
    /// unique key), overdue by an hour.
    Poison,
    /// 600 rows flipped earlier and re-opened by the shop (unpaid, a
    /// finished outbox row each), overdue by an hour.
    Reopened,
}

impl Head {
    fn name(self) -> &'static str {
        match self {
            Head::Poison => "poison",
            Head::Reopened => "reopened",
        }
    }
}

/// `sweep-lateness`' arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct SweepLatenessArgs {
    /// Where the shop's orders live, one run or more (comma-separated).
    #[arg(
        long = "database",
        value_enum,
        value_delimiter = ',',
        default_value = "postgres,mysql"
    )]
    pub databases: Vec<OrdersDatabase>,
    /// What sits at the head of the timer, one run or more per database
    /// (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "poison,reopened"
    )]
    pub head: Vec<Head>,
}

/// Runs `sweep-lateness` (the command): every run side by side, then a line
/// each.
pub async fn command(args: SweepLatenessArgs) -> anyhow::Result<ExitCode> {
    let runs: Vec<(Dialect, Head)> = args
        .databases
        .iter()
        .flat_map(|db| {
            let dialect = match db {
                OrdersDatabase::Postgres => Dialect::Postgres,
                OrdersDatabase::Mysql => Dialect::MySql,
            };
            args.head.iter().map(move |head| (dialect, *head))
        })
        .collect();
    let results =
        futures_util::future::join_all(runs.into_iter().map(|(dialect, head)| async move {
            (dialect, head, lateness_behind(dialect, head).await)
        }))
        .await;
    let mut code = ExitCode::SUCCESS;
    for (dialect, head, lateness) in results {
        let head = head.name();
        match lateness {
            Ok([early, late]) => println!(
                "{dialect:?}, {head} at the head: due in the catch-up window: lateness {early}; due after it: {late}"
            ),
            Err(e) => {
                println!("{dialect:?}, {head} at the head: failed: {e:#}");
                code = ExitCode::FAILURE;
            }
        }
    }
    Ok(code)
}

/// One run: the lateness (p50 / max, seconds) of the orders due in the
/// catch-up window, and of those due after it.
async fn lateness_behind(dialect: Dialect, head: Head) -> anyhow::Result<[String; 2]> {
    let world = World::build(true).await?;
    let shop = Shop::new(dialect, &world.settings.database_url, "ot_measure").await?;
    shop.exec("CREATE TABLE released (order_id VARCHAR(128) NOT NULL PRIMARY KEY)")
        .await?;
    match head {
        Head::Poison => {
            shop.exec("INSERT INTO released (order_id) VALUES ('m-poison')")
                .await?;
            shop.unpaid(&["m-poison".to_owned()], 3_600).await?;
        }
        Head::Reopened => shop.reopened(&ids("m-reopened", 600), 3_600).await?,
    }
    let service = RunningService::start(shop.settings(&world.settings)).await?;
    shop.unpaid(&ids("m-early", 20), -5).await?;
    shop.unpaid(&ids("m-late", 20), -330).await?;
    let all = poll(Duration::from_secs(480), || async {
        Ok(shop.with_status("m-early", "CANCELLED").await?
            + shop.with_status("m-late", "CANCELLED").await?
            == 40)
    })
    .await?;
    anyhow::ensure!(all, "not every unpublished order cancelled within 480 s");
    service.stop().await?;
    let mut out = [String::new(), String::new()];
    for (n, prefix) in ["m-early", "m-late"].iter().enumerate() {
        let ms = shop.lateness_ms(prefix).await?;
        anyhow::ensure!(ms.iter().all(|ms| *ms >= 0), "cancelled early: {ms:?}");
        out[n] = format!(
            "p50 {:.1} s, max {:.1} s",
            ms[ms.len() / 2] as f64 / 1000.0,
            ms[ms.len() - 1] as f64 / 1000.0
        );
    }
    Ok(out)
}

/// Order ids `{prefix}-000` .. for `n` orders.
pub fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
}

/// The shop's orders database for one dialect, on the reference schema,
/// and the rows the safety-net runs put there: `sweep-lateness` and
/// `tests/e2e/safety_net.rs` both use it. Its SQL is built from the run's
/// own ids and prefixes.
pub struct Shop {
    dialect: Dialect,
    url: SecretUrl,
    db: ShopDb,
    _scratch: Option<ScratchDatabase>,
}

impl Shop {
    /// The shop on `postgres` (a PostgreSQL database of the run's own), or
    /// on a fresh MariaDB database named after `prefix` (on `MYSQL_URL`'s
    /// server, dropped with the shop).
    ///
    /// # Errors
    ///
    /// The database not created or its schema not prepared.
    pub async fn new(dialect: Dialect, postgres: &SecretUrl, prefix: &str) -> anyhow::Result<Self> {
        let (url, scratch) = match dialect {
            Dialect::Postgres => (postgres.clone(), None),
            Dialect::MySql => {
                let scratch = ScratchDatabase::new(&crate::shop::mysql_url("mysql")?, prefix);
                (scratch.url()?, Some(scratch))
            }
        };
        let db = ShopDb::prepare(&url, 4).await?;
        Ok(Self {
            dialect,
            url,
            db,
            _scratch: scratch,
        })
    }

    /// `base` on this shop: its database, stock given back by an `also`
    /// statement logging each flip in a table `released` (which the run
    /// creates; a primary key: a second release of one order fails), no
    /// gRPC release.
    pub fn settings(&self, base: &Settings) -> Settings {
        let mut settings = base.clone();
        settings.database_url = self.url.clone();
        settings.orders.also = vec![format!(
            "INSERT INTO released (order_id) VALUES ({})",
            self.mark()
        )];
        settings.inventory.release = Release::None;
        settings
    }

    /// Runs `sql` (one statement or more).
    ///
    /// # Errors
    ///
    /// The database's.
    pub async fn exec(&self, sql: &str) -> anyhow::Result<()> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match &self.db {
            ShopDb::Postgres(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
            ShopDb::MySql(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
        }?;
        Ok(())
    }

    /// The one number `sql` selects.
    ///
    /// # Errors
    ///
    /// The database's.
    pub async fn count(&self, sql: &str) -> anyhow::Result<i64> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        Ok(match &self.db {
            ShopDb::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            ShopDb::MySql(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }?)
    }

    /// The `also` statement's placeholder.
    fn mark(&self) -> &'static str {
        match self.dialect {
            Dialect::Postgres => "$1",
            Dialect::MySql => "?",
        }
    }

    /// An instant `secs` seconds ago, in the dialect.
    pub fn ago(&self, secs: i64) -> String {
        match self.dialect {
            Dialect::Postgres => format!("now() - interval '{secs} seconds'"),
            Dialect::MySql => format!("UTC_TIMESTAMP(6) - INTERVAL {secs} SECOND"),
        }
    }

    /// Unpaid orders `ids`, overdue by `secs` seconds (negative: due in
    /// `-secs`), one statement each.
    ///
    /// # Errors
    ///
    /// The database's.
    pub async fn unpaid(&self, ids: &[String], secs: i64) -> anyhow::Result<()> {
        for id in ids {
            let at = self.ago(secs);
            self.exec(&format!(
                "INSERT INTO orders (id, status, expires_at) VALUES ('{id}', 'UNPAID', {at})"
            ))
            .await?;
        }
        Ok(())
    }

    /// Orders `ids` the default timer flipped earlier and the shop
    /// re-opened: unpaid, overdue by `secs` seconds, each with a finished
    /// outbox row.
    ///
    /// # Errors
    ///
    /// The database's.
    pub async fn reopened(&self, ids: &[String], secs: i64) -> anyhow::Result<()> {
        self.unpaid(ids, secs).await?;
        let at = self.ago(secs - 60);
        let outbox: Vec<String> = ids
            .iter()
            .map(|id| format!("('{DEFAULT_TIMER}', '{id}', {at}, {at}, {at})"))
            .collect();
        self.exec(&format!(
            "INSERT INTO order_timeout_cancel_outbox \
                    (timer, order_id, created_at, stock_released_at, event_published_at) VALUES {}",
            outbox.join(", ")
        ))
        .await
    }

    /// How many of `prefix`'s orders are in `status`.
    ///
    /// # Errors
    ///
    /// The database's.
    pub async fn with_status(&self, prefix: &str, status: &str) -> anyhow::Result<i64> {
        self.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE id LIKE '{prefix}%' AND status = '{status}'"
        ))
        .await
    }

    /// The lateness of `prefix`'s orders, ms, in order (the database's
    /// clock on both ends).
    async fn lateness_ms(&self, prefix: &str) -> anyhow::Result<Vec<i64>> {
        let sql = sqlx::AssertSqlSafe(match self.dialect {
            Dialect::Postgres => format!(
                "SELECT CAST(EXTRACT(EPOCH FROM cancelled_at - expires_at) * 1000 AS BIGINT) \
                   FROM orders WHERE id LIKE '{prefix}%' ORDER BY 1"
            ),
            Dialect::MySql => format!(
                "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, expires_at, cancelled_at) / 1000 AS SIGNED) \
                   FROM orders WHERE id LIKE '{prefix}%' ORDER BY 1"
            ),
        });
        Ok(match &self.db {
            ShopDb::Postgres(pool) => sqlx::query_scalar(sql).fetch_all(pool).await,
            ShopDb::MySql(pool) => sqlx::query_scalar(sql).fetch_all(pool).await,
        }?)
    }
}
