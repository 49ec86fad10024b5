//! A private PostgreSQL server in a network namespace of its own, behind a
//! link a test cuts ([`crate::netns`]): `initdb` into a temporary
//! directory, the server started in the namespace on its own port and
//! address, as the `postgres` user; killed by its pid and deleted on drop.
//! The machine's own PostgreSQL is never touched.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use order_timeout::settings::SecretUrl;

use crate::netns::{Link, Namespace, NetnsError};

/// The port the private server listens on, inside its namespace.
pub const PORT: u16 = 5433;

/// A private PostgreSQL server behind a cuttable link.
pub struct PrivatePostgres {
    /// The link to it: [`Link::cut`] makes the server silent.
    pub link: Link,
    dir: PathBuf,
    // Dropped after `drop` ran: its processes are killed there first.
    ns: Namespace,
}

/// The newest installed PostgreSQL's `bin` directory.
fn bin_dir() -> Result<PathBuf, NetnsError> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| NetnsError::Unavailable(format!("no PostgreSQL in /usr/lib/postgresql: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("postgres").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .ok_or_else(|| NetnsError::Unavailable("no postgres binary in /usr/lib/postgresql".into()))
}

fn check(what: &str, status: std::io::Result<std::process::Output>) -> Result<(), NetnsError> {
    match status {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(NetnsError::Command {
            command: what.into(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }),
        Err(e) => Err(NetnsError::Command {
            command: what.into(),
            stderr: e.to_string(),
        }),
    }
}

impl PrivatePostgres {
    /// Creates a namespace with one link, initialises a cluster in a
    /// temporary directory and starts the server there; waits (up to 60 s)
    /// until it answers over the link.
    #[tracing::instrument]
    pub async fn start() -> Result<Self, NetnsError> {
        let ns = Namespace::new()?;
        let link = ns.link()?;
        let dir = std::env::temp_dir().join(format!("{}-pg", ns.name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| NetnsError::Command {
            command: format!("mkdir {}", dir.display()),
            stderr: e.to_string(),
        })?;
        let server = Self { link, dir, ns };
        server.init()?;
        server.spawn()?;
        server.wait_ready(Duration::from_secs(60)).await?;
        Ok(server)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `initdb` as the `postgres` user (the server refuses to run as root),
    /// trusting connections over the link.
    fn init(&self) -> Result<(), NetnsError> {
        let bin = bin_dir()?;
        check(
            "chown postgres",
            std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&self.dir)
                .output(),
        )?;
        check(
            "initdb",
            std::process::Command::new("timeout")
                .args(["60", "runuser", "-u", "postgres", "--"])
                .arg(bin.join("initdb"))
                .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
                .arg(self.data())
                .output(),
        )?;
        let hba = self.data().join("pg_hba.conf");
        let trust = format!("host all all {}/24 trust\n", self.link.host_ip);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&hba)
            .and_then(|mut f| std::io::Write::write_all(&mut f, trust.as_bytes()))
            .map_err(|e| NetnsError::Command {
                command: format!("append to {}", hba.display()),
                stderr: e.to_string(),
            })
    }

    /// The server, in the namespace, listening on its link's address only.
    fn spawn(&self) -> Result<(), NetnsError> {
        let bin = bin_dir()?;
        let mut command = self.ns.command("setpriv");
        command
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .arg(bin.join("postgres"))
            .arg("-D")
            .arg(self.data())
            .args(["-p", &PORT.to_string(), "-k"])
            .arg(&self.dir)
            .args([
                "-c",
                &format!("listen_addresses={}", self.link.ns_ip),
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "max_connections=100",
                "-c",
                "shared_buffers=32MB",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.join("server.log")).map_err(|e| {
                    NetnsError::Command {
                        command: "create server.log".into(),
                        stderr: e.to_string(),
                    }
                })?,
            );
        self.ns.spawn(command).map(drop)
    }

    async fn wait_ready(&self, limit: Duration) -> Result<(), NetnsError> {
        let url = self.base_url();
        let started = std::time::Instant::now();
        loop {
            let options = order_timeout::testing::store::pg_options(&url).expect("a valid URL");
            let attempt = tokio::time::timeout(
                Duration::from_secs(2),
                sqlx::ConnectOptions::connect(&options),
            )
            .await;
            if let Ok(Ok(conn)) = attempt {
                let _ = sqlx::Connection::close(conn).await;
                return Ok(());
            }
            if started.elapsed() > limit {
                let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(10).collect();
                return Err(NetnsError::Command {
                    command: "wait for the private PostgreSQL".into(),
                    stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The server's address as the host reaches it.
    pub fn ip(&self) -> Ipv4Addr {
        self.link.ns_ip
    }

    /// `postgres://postgres@IP:PORT/postgres`: the server, for
    /// [`crate::scratch`]'s database helpers.
    pub fn base_url(&self) -> SecretUrl {
        SecretUrl::new(format!(
            "postgres://postgres@{}:{PORT}/postgres",
            self.link.ns_ip
        ))
    }

    /// Where its files and log are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.link.heal();
        self.ns.kill_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
