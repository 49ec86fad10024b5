//! A private MariaDB server in a network namespace of its own, behind a
//! link a test cuts ([`crate::netns`]), and with the time zone a test
//! gives it: `mariadb-install-db` into a temporary directory, `mariadbd`
//! started in the namespace on its link's address, as the `mysql` user;
//! killed by its pid and deleted on drop. The machine's own MariaDB is
//! never touched (its global `time_zone` is shared by every test).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use order_timeout::settings::SecretUrl;

use crate::netns::{Link, Namespace, NetnsError};

/// The port the private server listens on, inside its namespace.
pub const PORT: u16 = 3306;

/// The zone a private server keeps.
#[derive(Clone, Debug, Default)]
pub struct Zone {
    /// `TZ` in the server's environment: its `SYSTEM` zone (`@@system_time_zone`),
    /// as a machine on local time has it (`America/New_York`, or a POSIX
    /// rule such as `XST5XDT,M3.1.0/0,J336/13:00:00`).
    pub tz: Option<String>,
    /// `--default-time-zone`: the server's `time_zone` (`-05:00`), where
    /// new sessions start; `SYSTEM` when not given.
    pub default_time_zone: Option<String>,
}

/// A private MariaDB server behind a cuttable link.
pub struct PrivateMariaDb {
    /// The link to it: [`Link::cut`] makes the server silent.
    pub link: Link,
    dir: PathBuf,
    // Dropped after `drop` ran: its processes are killed there first.
    ns: Namespace,
}

fn failed(command: &str, e: impl ToString) -> NetnsError {
    NetnsError::Command {
        command: command.into(),
        stderr: e.to_string(),
    }
}

impl PrivateMariaDb {
    /// Creates a namespace with one link, installs the system tables into
    /// a temporary directory and starts the server there with `zone`;
    /// waits (up to 60 s) until it answers over the link.
    #[tracing::instrument]
    pub async fn start(zone: Zone) -> Result<Self, NetnsError> {
        let ns = Namespace::new()?;
        let link = ns.link()?;
        let dir = std::env::temp_dir().join(format!("{}-mariadb", ns.name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| failed("mkdir", e))?;
        let server = Self { link, dir, ns };
        server.init()?;
        server.spawn(&zone)?;
        server.wait_ready(Duration::from_secs(60)).await?;
        Ok(server)
    }

    /// `mariadb-install-db` as the `mysql` user; `root` without a password
    /// from anywhere (the server is reachable over its link only).
    fn init(&self) -> Result<(), NetnsError> {
        let out = std::process::Command::new("chown")
            .args(["-R", "mysql:mysql"])
            .arg(&self.dir)
            .output()
            .map_err(|e| failed("chown mysql", e))?;
        if !out.status.success() {
            return Err(failed("chown mysql", String::from_utf8_lossy(&out.stderr)));
        }
        let out = std::process::Command::new("timeout")
            .args(["60", "mariadb-install-db", "--no-defaults", "--user=mysql"])
            .arg(format!("--datadir={}", self.dir.join("data").display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .output()
            .map_err(|e| failed("mariadb-install-db", e))?;
        if !out.status.success() {
            return Err(failed(
                "mariadb-install-db",
                String::from_utf8_lossy(&out.stderr),
            ));
        }
        Ok(())
    }

    /// The server, in the namespace, listening on its link's address only,
    /// in `zone`.
    fn spawn(&self, zone: &Zone) -> Result<(), NetnsError> {
        let mut command = self.ns.command("/usr/sbin/mariadbd");
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.dir.join("data").display()))
            .arg(format!("--socket={}", self.dir.join("sock").display()))
            .arg(format!("--pid-file={}", self.dir.join("pid").display()))
            .arg(format!("--bind-address={}", self.link.ns_ip))
            .arg(format!("--port={PORT}"))
            .args([
                "--user=mysql",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
                "--innodb-flush-log-at-trx-commit=0",
                "--skip-name-resolve",
            ]);
        if let Some(default) = &zone.default_time_zone {
            command.arg(format!("--default-time-zone={default}"));
        }
        match &zone.tz {
            Some(tz) => command.env("TZ", tz),
            None => command.env("TZ", "UTC"),
        };
        command.stdout(std::process::Stdio::null()).stderr(
            std::fs::File::create(self.dir.join("server.log"))
                .map_err(|e| failed("create server.log", e))?,
        );
        self.ns.spawn(command).map(drop)
    }

    /// Waits until the server answers on its socket, lets `root` in over
    /// the link (`mariadb-install-db` makes `root@localhost` only), then
    /// until it answers over the link.
    async fn wait_ready(&self, limit: Duration) -> Result<(), NetnsError> {
        let url = self.base_url();
        let started = std::time::Instant::now();
        let mut granted = false;
        loop {
            if !granted {
                let out = tokio::process::Command::new("mariadb")
                    .arg("--no-defaults")
                    .arg(format!("--socket={}", self.dir.join("sock").display()))
                    .args([
                        "-uroot",
                        "-e",
                        "CREATE USER IF NOT EXISTS 'root'@'%'; \
                         GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION",
                    ])
                    .output()
                    .await
                    .map_err(|e| failed("mariadb", e))?;
                granted = out.status.success();
            }
            let options: Result<sqlx::mysql::MySqlConnectOptions, _> = url.expose().parse();
            let options = options.map_err(|e| failed("parse the private MariaDB's URL", e))?;
            let attempt = match granted {
                true => {
                    tokio::time::timeout(
                        Duration::from_secs(2),
                        sqlx::ConnectOptions::connect(&options),
                    )
                    .await
                }
                false => Ok(Err(sqlx::Error::PoolClosed)),
            };
            if let (true, Ok(Ok(conn))) = (granted, attempt) {
                let _ = sqlx::Connection::close(conn).await;
                return Ok(());
            }
            if started.elapsed() > limit {
                let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(10).collect();
                return Err(failed(
                    "wait for the private MariaDB",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The server's address as the host reaches it.
    pub fn ip(&self) -> Ipv4Addr {
        self.link.ns_ip
    }

    /// `mysql://root@IP:PORT/mysql`: the server, for [`crate::scratch`]'s
    /// database helpers.
    pub fn base_url(&self) -> SecretUrl {
        SecretUrl::new(format!("mysql://root@{}:{PORT}/mysql", self.link.ns_ip))
    }

    /// Where its files and log are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        let _ = self.link.heal();
        self.ns.kill_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
