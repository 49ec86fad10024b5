//! The bench's isolated world: its own RabbitMQ vhost (created with
//! `rabbitmqctl`, so the bench runs as root on the broker's machine), its
//! own PostgreSQL database, and the inventory server, the service instances
//! and the seed consumer as child processes of this binary (so their CPU
//! and memory are measured apart from the load generator's). Removed at the
//! end unless `--keep`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::BenchError;
use super::StockPath;
use super::load::BenchDb;
use crate::scratch;
use crate::shop::{OrdersDatabase, ShopDb};
use order_timeout::settings::{Lane, SecretUrl, Settings};
use order_timeout::testing::broker::connect_amqp;
use order_timeout::testing::topology::DUE_QUEUE;
use sqlx::postgres::PgPoolOptions;

/// Runs `rabbitmqctl` with `args`, returning stdout, or `None` on failure.
pub fn rabbitmqctl_opt(args: &[&str]) -> Option<String> {
    scratch::rabbitmqctl(args).ok()
}

/// A service or inventory child process.
pub struct ChildProc {
    /// Label.
    pub name: String,
    child: Child,
}

impl ChildProc {
    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM, then wait up to `grace`, then SIGKILL.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(name = %self.name, "child did not stop in time; killing it");
            let _ = self.child.kill().await;
        }
    }
}

/// The bench's vhost, database and child processes.
pub struct BenchEnv {
    /// vhost and database name.
    pub name: String,
    /// Settings pointing at the vhost and database (the inventory URL is
    /// the child inventory server's).
    pub settings: Settings,
    /// The bench's databases, for the load generator.
    pub db: BenchDb,
    /// The reference inventory's database (the orders' too on PostgreSQL).
    inventory_db: SecretUrl,
    /// The orders' MySQL database, when they live there.
    mysql_db: Option<SecretUrl>,
    /// Where the children write their logs.
    pub log_dir: PathBuf,
    config_file: Option<PathBuf>,
    base_db_url: SecretUrl,
    keep: bool,
    /// The inventory server child.
    pub inventory: Option<ChildProc>,
    /// The service children.
    pub services: Vec<ChildProc>,
    /// The seed consumer child (`--baseline seed`).
    pub seed: Option<ChildProc>,
    /// Their `/metrics` ports.
    pub metrics_ports: Vec<u16>,
}

/// This binary (`order-timeout-tools`), for the inventory server child.
fn tools_binary() -> Result<PathBuf, BenchError> {
    std::env::current_exe()
        .map_err(|e| BenchError::Setup(format!("cannot find own executable: {e}")))
}

/// The production binary the bench measures: `ORDER_TIMEOUT_BIN`, or
/// `order-timeout` beside this binary (both are built into the same
/// `target/<profile>/`).
fn service_binary() -> Result<PathBuf, BenchError> {
    if let Some(path) = std::env::var_os("ORDER_TIMEOUT_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = tools_binary()?.with_file_name("order-timeout");
    if exe.is_file() {
        Ok(exe)
    } else {
        Err(BenchError::Setup(format!(
            "{} not found: build it (cargo build --release -p order-timeout) or set ORDER_TIMEOUT_BIN",
            exe.display()
        )))
    }
}

fn free_port() -> Result<u16, BenchError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BenchError::Setup(format!("no free port: {e}")))?;
    Ok(l.local_addr()
        .map_err(|e| BenchError::Setup(e.to_string()))?
        .port())
}

impl BenchEnv {
    /// Creates the vhost and the database (migrated) and starts the
    /// inventory server.
    pub async fn create(
        base: &Settings,
        config_file: Option<&Path>,
        keep: bool,
        db_connections: u32,
        orders_in: OrdersDatabase,
        stock: StockPath,
        lanes: &[Lane],
    ) -> Result<Self, BenchError> {
        let name = format!("ot_bench_{}", chrono::Utc::now().format("%Y%m%d_%H%M%S"));
        let amqp_url = scratch::create_vhost(&base.amqp_url, &name)?;
        let database_url = scratch::with_path(&base.database_url, &name)?;
        let log_dir = std::env::temp_dir().join(&name);
        let _ = std::fs::create_dir_all(&log_dir);
        let inventory_pool = PgPoolOptions::new()
            .max_connections(db_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(
                order_timeout::testing::store::pg_options(&database_url)
                    .map_err(|e| BenchError::Setup(e.to_string()))?,
            );
        let mut env = Self {
            name: name.clone(),
            settings: Settings {
                amqp_url,
                database_url: database_url.clone(),
                ..base.clone()
            },
            db: BenchDb {
                orders: ShopDb::Postgres(inventory_pool.clone()),
                inventory: inventory_pool,
                also_stock: false,
            },
            inventory_db: database_url.clone(),
            mysql_db: None,
            log_dir,
            config_file: config_file.map(Path::to_path_buf),
            base_db_url: base.database_url.clone(),
            keep,
            inventory: None,
            services: Vec::new(),
            seed: None,
            metrics_ports: Vec::new(),
        };
        // From here on, `cleanup` removes what exists.
        crate::shop::prepare_database(&database_url, 1)
            .await
            .map_err(|e| BenchError::Setup(format!("preparing the bench database: {e:#}")))?;
        if orders_in == OrdersDatabase::Mysql {
            env.orders_on_mysql(db_connections).await?;
        }
        if stock.by_also() {
            env.stock_back_by_also(stock == StockPath::AlsoKeys)?;
        }
        if !lanes.is_empty() {
            env.add_lanes(lanes)?;
        }
        env.start_inventory()?;
        Ok(env)
    }

    /// The orders (and the service) on MySQL; the reference inventory
    /// keeps its stock in the PostgreSQL database.
    async fn orders_on_mysql(&mut self, db_connections: u32) -> Result<(), BenchError> {
        let url =
            crate::shop::mysql_url(&self.name).map_err(|e| BenchError::Setup(format!("{e:#}")))?;
        self.mysql_db = Some(url.clone());
        self.db.orders = ShopDb::prepare(&url, db_connections)
            .await
            .map_err(|e| BenchError::Setup(format!("preparing the MySQL bench database: {e:#}")))?;
        self.settings.database_url = url;
        Ok(())
    }

    /// The services give stock back in the cancel transaction: the mapping
    /// of the reference schema plus a stock table, no gRPC.
    fn stock_back_by_also(&mut self, keys: bool) -> Result<(), BenchError> {
        if self.config_file.is_some() {
            return Err(BenchError::Setup(
                "--stock also writes the services' config file itself: drop --config".into(),
            ));
        }
        let file = self.log_dir.join("also.toml");
        let keys = if keys {
            "also_keys = \"SELECT sku FROM order_items WHERE order_id = ?\"\n"
        } else {
            ""
        };
        std::fs::write(
            &file,
            format!(
                "[orders]\n\
                 also = [\"UPDATE shop_stock s JOIN order_items i ON i.sku = s.sku \
                 SET s.available = s.available + i.quantity WHERE i.order_id = ?\"]\n\
                 {keys}[inventory]\nrelease = \"none\"\n"
            ),
        )
        .map_err(|e| BenchError::Setup(format!("writing {}: {e}", file.display())))?;
        self.config_file = Some(file);
        self.db.also_stock = true;
        Ok(())
    }

    /// The services run with `lanes`: written on top of the config file
    /// they get (the user's `--config` or the bench's own), since a lane
    /// is a setting of the service, not of its environment.
    fn add_lanes(&mut self, lanes: &[Lane]) -> Result<(), BenchError> {
        if !self.settings.lanes.is_empty() {
            return Err(BenchError::Setup(
                "the config file sets lanes and so does --lanes: use --lanes none with it, or a config without lanes".into(),
            ));
        }
        let base = match &self.config_file {
            Some(file) => std::fs::read_to_string(file)
                .map_err(|e| BenchError::Setup(format!("reading {}: {e}", file.display())))?,
            None => String::new(),
        };
        let list: Vec<String> = lanes.iter().map(|l| format!("\"{l}\"")).collect();
        // Top-level keys first: the base may open tables ([orders] ...).
        let text = format!("lanes = [{}]\n{base}", list.join(", "));
        let file = self.log_dir.join("lanes.toml");
        std::fs::write(&file, text)
            .map_err(|e| BenchError::Setup(format!("writing {}: {e}", file.display())))?;
        self.config_file = Some(file);
        self.settings.lanes = lanes.to_vec();
        Ok(())
    }

    /// The reference inventory server, on a free port.
    fn start_inventory(&mut self) -> Result<(), BenchError> {
        let port = free_port()?;
        self.settings.inventory_url = SecretUrl::new(format!("http://127.0.0.1:{port}"));
        self.inventory = Some(self.spawn(
            "inventory",
            &tools_binary()?,
            &["inventory-server"],
            &[("INVENTORY_ADDR", format!("127.0.0.1:{port}"))],
        )?);
        Ok(())
    }

    fn spawn(
        &self,
        label: &str,
        exe: &Path,
        args: &[&str],
        extra_env: &[(&str, String)],
    ) -> Result<ChildProc, BenchError> {
        let log = std::fs::File::create(self.log_dir.join(format!("{label}.log")))
            .map_err(|e| BenchError::Setup(format!("cannot create log file: {e}")))?;
        let mut cmd = Command::new(exe);
        if let Some(cfg) = &self.config_file {
            cmd.arg("--config").arg(cfg);
        }
        // The inventory server keeps its stock in PostgreSQL, whatever the
        // orders' database.
        let database_url = if label == "inventory" {
            &self.inventory_db
        } else {
            &self.settings.database_url
        };
        cmd.args(args)
            .env("AMQP_URL", self.settings.amqp_url.expose())
            .env("DATABASE_URL", database_url.expose())
            .env("INVENTORY_URL", self.settings.inventory_url.expose())
            .env(
                "RUST_LOG",
                std::env::var("BENCH_CHILD_LOG").unwrap_or("warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .map_err(|e| BenchError::Setup(format!("cannot start {label}: {e}")))?;
        Ok(ChildProc {
            name: label.to_owned(),
            child,
        })
    }

    /// Starts `n` service instances (`serve`) and waits until all of them
    /// consume from `order-timeout.due`.
    pub async fn start_services(&mut self, n: usize) -> Result<(), BenchError> {
        for i in 0..n {
            let port = free_port()?;
            let child = self.spawn(
                &format!("service-{i}"),
                &service_binary()?,
                &["serve"],
                &[("HTTP_ADDR", format!("127.0.0.1:{port}"))],
            )?;
            self.services.push(child);
            self.metrics_ports.push(port);
        }
        self.wait_consumers(
            DUE_QUEUE,
            n,
            tokio::time::Instant::now() + Duration::from_secs(60),
        )
        .await
    }

    /// Declares the seed design's queues and starts its consumer
    /// (`seed-consumer`), waiting until it consumes.
    pub async fn start_seed(&mut self) -> Result<(), BenchError> {
        let conn = connect_amqp(&self.settings.amqp_url, "order-timeout-bench-seed-setup").await?;
        super::seed::declare(&conn).await?;
        let _ = conn.close(200, "ok".into()).await;
        self.seed = Some(self.spawn("seed", &tools_binary()?, &["seed-consumer"], &[])?);
        self.wait_consumers(
            super::seed::SEED_CANCEL_QUEUE,
            1,
            tokio::time::Instant::now() + Duration::from_secs(60),
        )
        .await
    }

    async fn wait_consumers(
        &self,
        queue: &str,
        n: usize,
        deadline: tokio::time::Instant,
    ) -> Result<(), BenchError> {
        loop {
            let conn = connect_amqp(&self.settings.amqp_url, "order-timeout-bench").await?;
            let channel = conn.create_channel().await?;
            let q = order_timeout::testing::broker::peek_queue(&channel, queue).await;
            let _ = conn.close(200, "ok".into()).await;
            if matches!(&q, Ok(q) if q.consumer_count() as usize >= n) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(BenchError::Setup(format!(
                    "nothing started consuming from {queue} within 60 s; see {}",
                    self.log_dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The services' counters (`/metrics`, summed over instances): stage
    /// durations (`_sum`, `_count`) and message outcomes. Empty where
    /// unreadable.
    pub async fn scrape(&self) -> std::collections::BTreeMap<String, f64> {
        let mut out = std::collections::BTreeMap::new();
        for port in &self.metrics_ports {
            let Ok(Ok(text)) =
                tokio::time::timeout(Duration::from_secs(3), http_get(*port, "/metrics")).await
            else {
                continue;
            };
            for line in text.lines() {
                if line.starts_with('#') {
                    continue;
                }
                let keep = line.starts_with("order_timeout_stage_duration_seconds_sum")
                    || line.starts_with("order_timeout_stage_duration_seconds_count")
                    || line.starts_with("order_timeout_messages_total")
                    || line.starts_with("order_timeout_sweeper_orders")
                    || line.starts_with("order_timeout_cancel_lateness_seconds_sum")
                    || line.starts_with("order_timeout_cancel_lateness_seconds_count");
                if !keep {
                    continue;
                }
                if let Some((name, value)) = line.rsplit_once(' ')
                    && let Ok(v) = value.parse::<f64>()
                {
                    *out.entry(name.to_owned()).or_default() += v;
                }
            }
        }
        out
    }

    /// Process ids of the service children.
    pub fn service_pids(&self) -> Vec<u32> {
        self.services.iter().filter_map(ChildProc::pid).collect()
    }

    /// Stops the services (gracefully).
    pub async fn stop_services(&mut self) {
        for s in self.services.drain(..) {
            s.stop(Duration::from_secs(30)).await;
        }
        self.metrics_ports.clear();
    }

    /// Stops every child, and removes the vhost and the database unless
    /// `--keep`. The children's logs go with them, unless `keep_logs` (the
    /// bench failed, or a run missed its target or failed a check: the logs
    /// are what tells why, and a rare miss may not come back).
    pub async fn cleanup(mut self, keep_logs: bool) {
        self.stop_services().await;
        if let Some(seed) = self.seed.take() {
            seed.stop(Duration::from_secs(5)).await;
        }
        if let Some(inv) = self.inventory.take() {
            inv.stop(Duration::from_secs(5)).await;
        }
        self.db.inventory.close().await;
        if let ShopDb::MySql(pool) = &self.db.orders {
            pool.close().await;
        }
        if self.keep {
            eprintln!(
                "== kept vhost and database {} (logs in {})",
                self.name,
                self.log_dir.display()
            );
            return;
        }
        if let Err(e) = scratch::delete_vhost(&self.name) {
            eprintln!("warning: could not delete vhost {}: {e}", self.name);
        }
        if let Err(e) = scratch::drop_database(&self.base_db_url, &self.name).await {
            eprintln!("warning: {e}");
        }
        if let Some(url) = &self.mysql_db
            && let Err(e) = scratch::drop_database(url, &self.name).await
        {
            eprintln!("warning: {e}");
        }
        if keep_logs {
            eprintln!(
                "== something failed or missed its target: kept the children's logs in {}",
                self.log_dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.log_dir);
        }
    }
}

/// The body of `GET path` from 127.0.0.1:`port` (a service's `/metrics`).
pub(crate) async fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Ok(text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}
