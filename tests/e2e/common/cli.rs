//! The real `order-timeout` binary run against a test's world
//! ([`TestEnv::cli`]), for the operator commands.

use super::*;
use order_timeout::testing::topology::PARKED_QUEUE;

/// Output of one run of the real `order-timeout` binary.
#[derive(Debug)]
pub struct CliOutput {
    /// Exit code (None: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl TestEnv {
    /// Runs the real binary against this test's vhost and database with
    /// empty standard input, and waits for it (on a blocking thread, so the
    /// test's runtime keeps serving the in-process service).
    pub async fn cli(&self, args: &[&str]) -> CliOutput {
        self.cli_stdin(args, "").await
    }

    /// [`TestEnv::cli`] with `stdin` as the binary's standard input.
    pub async fn cli_stdin(&self, args: &[&str], stdin: &str) -> CliOutput {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let stdin = stdin.to_owned();
        let env = EnvForCli {
            amqp_url: self.settings.amqp_url.expose().to_owned(),
            database_url: self.settings.database_url.expose().to_owned(),
            inventory_url: self.settings.inventory_url.expose().to_owned(),
            config: std::env::temp_dir().join(format!("{}-cli.toml", self.name)),
            config_toml: self.config_toml(),
        };
        tokio::task::spawn_blocking(move || env.run(&args, &stdin))
            .await
            .unwrap()
    }

    /// The config file's text for the settings the environment variables
    /// cannot carry: the cascade shards and lanes this test's vhost was
    /// declared with and, in a MariaDB world, `[orders].set` with
    /// [`MYSQL_CANCELLED_AT`] (written only there: a PostgreSQL world's
    /// processes keep the defaults, whatever a test changed in its
    /// settings).
    fn config_toml(&self) -> String {
        let lanes: Vec<String> = self.settings.lanes.iter().map(|l| l.to_string()).collect();
        let mut toml = format!(
            "cascade_shards = {}\nlanes = {lanes:?}\nlane_shards = {}\n",
            self.settings.cascade_shards.get(),
            self.settings.lane_shards.get(),
        );
        if self.dialect == Dialect::MySql {
            let set: Vec<String> = mysql_orders_set()
                .iter()
                .map(|(column, value)| format!("{column:?} = {value:?}"))
                .collect();
            toml.push_str(&format!("[orders]\nset = {{ {} }}\n", set.join(", ")));
        }
        toml
    }

    /// The real binary with this world's environment variables and a
    /// config file of what they cannot carry ([`TestEnv::config_toml`]),
    /// for a test that runs `serve` as a process of its own (to kill it):
    /// configured as the in-process services and [`TestEnv::cli`] are.
    pub fn command(&self) -> Command {
        let config = std::env::temp_dir().join(format!("{}-serve.toml", self.name));
        std::fs::write(&config, self.config_toml()).expect("write the config file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_order-timeout"));
        command
            .env("AMQP_URL", self.settings.amqp_url.expose())
            .env("DATABASE_URL", self.settings.database_url.expose())
            .env("INVENTORY_URL", self.settings.inventory_url.expose())
            .env("RUST_LOG", "warn")
            .env("ORDER_TIMEOUT_CONFIG", config);
        command
    }

    /// Parked messages: those kept in the parked store and those still
    /// waiting in the parked queue to be moved there. Before this
    /// release's migrations ran (the upgrade test), the store does not
    /// exist and counts none.
    pub async fn parked_count(&self) -> u32 {
        let kept = order_timeout::ops::parked::count(&self.parked_store())
            .await
            .unwrap_or(0);
        self.queue_depth(PARKED_QUEUE).await + u32::try_from(kept).unwrap()
    }

    /// Parked messages kept in the parked store (moved out of the queue).
    pub async fn parked_kept(&self) -> u64 {
        order_timeout::ops::parked::count(&self.parked_store())
            .await
            .unwrap()
    }

    /// Messages ready in `queue` (passive declare; the queue must exist).
    pub async fn queue_depth(&self, queue: &str) -> u32 {
        let channel = self.amqp.create_channel().await.unwrap();
        let depth = depth_on(&channel, queue).await;
        let _ = channel.close(200, "".into()).await;
        depth
    }

    /// Publishes a message straight into the parked queue with these
    /// string headers, as the service's `park` would, and waits for the
    /// confirm.
    pub async fn park_raw(&self, body: &[u8], headers: &[(&str, String)]) {
        let mut table = FieldTable::default();
        for (k, v) in headers {
            table.insert(
                (*k).into(),
                lapin::types::AMQPValue::LongString(v.as_str().into()),
            );
        }
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                PARKED_QUEUE.into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_headers(table),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }
}

/// What a CLI run needs from a [`TestEnv`], movable to a blocking thread.
struct EnvForCli {
    amqp_url: String,
    database_url: String,
    inventory_url: String,
    /// Config file for the settings the environment variables cannot
    /// carry, and its text ([`TestEnv::config_toml`]).
    config: std::path::PathBuf,
    config_toml: String,
}

impl EnvForCli {
    fn run(&self, args: &[String], stdin: &str) -> CliOutput {
        std::fs::write(&self.config, &self.config_toml).expect("write the CLI's config file");
        let out = crate::bounds::output_with_input(
            Command::new(env!("CARGO_BIN_EXE_order-timeout"))
                .args(args)
                .env("AMQP_URL", &self.amqp_url)
                .env("DATABASE_URL", &self.database_url)
                .env("INVENTORY_URL", &self.inventory_url)
                .env("RUST_LOG", "warn")
                .env("ORDER_TIMEOUT_CONFIG", &self.config),
            Some(stdin.as_bytes()),
            Duration::from_secs(180),
            &format!("order-timeout {}", args.join(" ")),
        );
        let _ = std::fs::remove_file(&self.config);
        CliOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}
