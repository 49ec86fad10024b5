//! Scratch environments for the bench and the tests: a fresh RabbitMQ vhost
//! and a fresh database per run, so runs never see each other's queues and
//! rows, and their removal afterwards.
//!
//! Vhosts are made with `rabbitmqctl` (so on the broker's machine, as root);
//! databases through the server named by the base `DATABASE_URL`.
//!
//! A run killed before its cleanup (Ctrl-C on `cargo test`, a CI timeout)
//! leaves its vhosts and databases behind. Names made by [`owned_name`]
//! carry the pid of the process that made them, so [`sweep_abandoned`] can
//! remove what dead processes left without touching what a running one
//! still uses.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use crate::broker_admin::{AdminError, Node};

use order_timeout::settings::SecretUrl;

/// A scratch environment could not be made or removed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ScratchError(String);

impl ScratchError {
    /// An error saying `what`.
    pub fn new(what: impl Into<String>) -> Self {
        Self(what.into())
    }
}

/// `url` with its path replaced by `path` (the vhost of an AMQP URL, the
/// database of a database URL).
pub fn with_path(url: &SecretUrl, path: &str) -> Result<SecretUrl, ScratchError> {
    let mut u =
        url::Url::parse(url.expose()).map_err(|e| ScratchError(format!("bad URL {url}: {e}")))?;
    u.set_path(path);
    Ok(SecretUrl::new(u.to_string()))
}

/// How long one `rabbitmqctl` call may take. A broker that has run out of
/// file handles makes `add_vhost` and `delete_vhost` hang with its listener
/// still open; a test should fail with the command's name instead of
/// waiting for ever.
pub const RABBITMQCTL_TIMEOUT_SECS: u32 = 120;

/// Runs `rabbitmqctl -q ARGS`, returning its standard output. The command
/// is asked to give up after [`RABBITMQCTL_TIMEOUT_SECS`] (`--timeout`,
/// which it honours for the calls it makes to the broker) and is stopped
/// 30 s later if it has not (coreutils `timeout`: Debian's wrapper switches
/// user with `su`, so the Erlang process it starts may outlive that kill;
/// its own timeout is what ends it).
pub fn rabbitmqctl(args: &[&str]) -> Result<String, ScratchError> {
    let limit = RABBITMQCTL_TIMEOUT_SECS.to_string();
    let outer = (RABBITMQCTL_TIMEOUT_SECS + 30).to_string();
    let out = Command::new("timeout")
        .args(["--kill-after=10", &outer, "rabbitmqctl", "-q", "--timeout", &limit])
        .args(args)
        .output()
        .map_err(|e| {
            ScratchError(format!(
                "cannot run rabbitmqctl (needed for a scratch vhost; run as root on the broker's machine): {e}"
            ))
        })?;
    if out.status.code() == Some(124) || out.status.code() == Some(137) {
        return Err(ScratchError(format!(
            "rabbitmqctl {} did not finish within {outer} s",
            args.join(" ")
        )));
    }
    if !out.status.success() {
        return Err(ScratchError(format!(
            "rabbitmqctl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates broker user `name` (no tags) with `password`. Name it with
/// [`owned_name`] so [`sweep_abandoned`] removes it if its run is killed.
pub fn create_user(name: &str, password: &str) -> Result<(), ScratchError> {
    rabbitmqctl(&["add_user", name, password]).map(drop)
}

/// Gives broker user `user` the `configure`, `write` and `read` patterns
/// on `vhost`, and nothing elsewhere.
pub fn set_permissions(
    vhost: &str,
    user: &str,
    [configure, write, read]: [&str; 3],
) -> Result<(), ScratchError> {
    rabbitmqctl(&["set_permissions", "-p", vhost, user, configure, write, read]).map(drop)
}

/// Deletes broker user `name`.
pub fn delete_user(name: &str) -> Result<(), ScratchError> {
    rabbitmqctl(&["delete_user", name]).map(drop)
}

/// Creates vhost `name`, gives the user of `amqp_base` (default `guest`)
/// full permissions on it, and returns `amqp_base` pointed at it.
pub fn create_vhost(amqp_base: &SecretUrl, name: &str) -> Result<SecretUrl, ScratchError> {
    let user = url::Url::parse(amqp_base.expose())
        .ok()
        .map(|u| u.username().to_owned())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "guest".into());
    create_vhost_on(&Node::machine(), name, &user, rabbitmqctl)?;
    with_path(amqp_base, &format!("/{name}"))
}

/// Deletes vhost `name` with everything in it.
pub fn delete_vhost(name: &str) -> Result<(), ScratchError> {
    delete_vhost_on(&Node::machine(), name, rabbitmqctl)
}

/// The names of the vhosts of the machine's broker.
pub fn list_vhosts() -> Result<Vec<String>, ScratchError> {
    list_vhosts_on(&Node::machine(), rabbitmqctl)
}

/// Creates vhost `name` on `node` with full permissions for `user`: in one
/// short Erlang call ([`crate::broker_admin`]), or with `ctl` (the node's
/// `rabbitmqctl -q ARGS`) where that cannot reach the node.
pub fn create_vhost_on(
    node: &Node,
    name: &str,
    user: &str,
    ctl: impl Fn(&[&str]) -> Result<String, ScratchError>,
) -> Result<(), ScratchError> {
    via_erl(node, |n| n.create_vhost(name, user), "adding vhost").unwrap_or_else(|| {
        ctl(&["add_vhost", name])?;
        ctl(&["set_permissions", "-p", name, user, ".*", ".*", ".*"]).map(drop)
    })
}

/// Deletes vhost `name` from `node`, reached as [`create_vhost_on`] does.
pub fn delete_vhost_on(
    node: &Node,
    name: &str,
    ctl: impl Fn(&[&str]) -> Result<String, ScratchError>,
) -> Result<(), ScratchError> {
    via_erl(node, |n| n.delete_vhost(name), "deleting vhost")
        .unwrap_or_else(|| ctl(&["delete_vhost", name]).map(drop))
}

/// The names of `node`'s vhosts, reached as [`create_vhost_on`] does.
pub fn list_vhosts_on(
    node: &Node,
    ctl: impl Fn(&[&str]) -> Result<String, ScratchError>,
) -> Result<Vec<String>, ScratchError> {
    via_erl(node, Node::list_vhosts, "listing vhosts").unwrap_or_else(|| {
        Ok(ctl(&["list_vhosts", "name"])?
            .lines()
            .map(|l| l.trim().to_owned())
            .collect())
    })
}

/// `call` on `node` through `erl`, or `None` when `erl` cannot reach it
/// (then, and for the rest of this process, the caller uses `rabbitmqctl`).
fn via_erl<T>(
    node: &Node,
    call: impl FnOnce(&Node) -> Result<T, AdminError>,
    doing: &str,
) -> Option<Result<T, ScratchError>> {
    static UNREACHABLE: Mutex<Vec<Node>> = Mutex::new(Vec::new());
    let known = |n: &Node| {
        UNREACHABLE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(n)
    };
    if known(node) {
        return None;
    }
    match call(node) {
        Ok(value) => Some(Ok(value)),
        Err(AdminError::Refused(e)) => Some(Err(ScratchError(format!("{doing}: {e}")))),
        Err(AdminError::Unreachable(e)) => {
            eprintln!("note: {e}; using rabbitmqctl for {} instead", node.name);
            UNREACHABLE
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(node.clone());
            None
        }
    }
}

/// An administrative connection to the server of a database URL: its
/// `information_schema` (MySQL/MariaDB) or its `postgres` database.
enum Admin {
    MySql(sqlx::MySqlConnection),
    Postgres(sqlx::PgConnection),
}

impl Admin {
    /// Connects to the server of `database_base`; `doing` names the task in
    /// errors.
    async fn connect(database_base: &SecretUrl, doing: &str) -> Result<Self, ScratchError> {
        use sqlx::Connection;
        let fail = |e: &dyn std::fmt::Display| ScratchError(format!("{doing}: {e}"));
        if database_base.expose().starts_with("mysql://") {
            let admin = with_path(database_base, "/information_schema")?;
            let options =
                order_timeout::testing::store::mysql_options(&admin).map_err(|e| fail(&e))?;
            let conn = sqlx::MySqlConnection::connect_with(&options)
                .await
                .map_err(|e| fail(&e))?;
            return Ok(Self::MySql(conn));
        }
        let admin = with_path(database_base, "/postgres")?;
        let options = order_timeout::testing::store::pg_options(&admin).map_err(|e| fail(&e))?;
        let conn = sqlx::PgConnection::connect_with(&options)
            .await
            .map_err(|e| fail(&e))?;
        Ok(Self::Postgres(conn))
    }
}

/// Creates the empty database `name` on the server of `database_base`,
/// for a scratch database nothing migrates (the service's migrations
/// create theirs themselves): the reference inventory's own PostgreSQL
/// database beside a test shop on MariaDB. Name it with [`owned_name`] so
/// [`sweep_abandoned`] removes it if its run is killed.
pub async fn create_database(database_base: &SecretUrl, name: &str) -> Result<(), ScratchError> {
    use sqlx::Executor;
    let doing = format!("creating database {name}");
    let fail = |e: sqlx::Error| ScratchError(format!("{doing}: {e}"));
    match Admin::connect(database_base, &doing).await? {
        Admin::MySql(mut conn) => conn
            .execute(sqlx::AssertSqlSafe(format!(
                "CREATE DATABASE `{}` CHARACTER SET utf8mb4",
                name.replace('`', "``")
            )))
            .await
            .map(drop),
        Admin::Postgres(mut conn) => conn
            .execute(sqlx::AssertSqlSafe(format!(
                "CREATE DATABASE \"{}\"",
                name.replace('"', "\"\"")
            )))
            .await
            .map(drop),
    }
    .map_err(fail)
}

/// Drops database `name` on the server of `database_base` (PostgreSQL:
/// closing its connections first; MySQL/MariaDB).
pub async fn drop_database(database_base: &SecretUrl, name: &str) -> Result<(), ScratchError> {
    use sqlx::Executor;
    let doing = format!("dropping database {name}");
    let fail = |e: sqlx::Error| ScratchError(format!("{doing}: {e}"));
    match Admin::connect(database_base, &doing).await? {
        Admin::MySql(mut conn) => conn
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS `{}`",
                name.replace('`', "``")
            )))
            .await
            .map(drop),
        Admin::Postgres(mut conn) => conn
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                name.replace('"', "\"\"")
            )))
            .await
            .map(drop),
    }
    .map_err(fail)
}

/// [`drop_database`] from synchronous code that may itself run inside a
/// runtime (a `Drop` of a test fixture): on a thread with its own runtime.
pub fn drop_database_blocking(database_base: &SecretUrl, name: &str) -> Result<(), ScratchError> {
    let (base, name) = (database_base.clone(), name.to_owned());
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ScratchError(format!("runtime: {e}")))?
            .block_on(drop_database(&base, &name))
    })
    .join()
    .map_err(|_| ScratchError("the drop thread panicked".into()))?
}

/// A name for a scratch vhost or database: `<prefix>_p<pid>_<random>`,
/// unique, and naming the process that owns it (see [`sweep_abandoned`]).
/// `prefix` starts with `ot_`.
pub fn owned_name(prefix: &str) -> String {
    format!(
        "{prefix}_p{}_{:016x}",
        std::process::id(),
        rand::random::<u64>()
    )
}

/// The pid of the process that made `name`, when [`owned_name`] made it.
fn owner(name: &str) -> Option<u32> {
    let (head, random) = name.rsplit_once('_')?;
    let (prefix, pid) = head.rsplit_once('_')?;
    let random_ok = !random.is_empty() && random.bytes().all(|b| b.is_ascii_hexdigit());
    let pid = pid.strip_prefix('p')?;
    let pid_ok = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    (prefix.starts_with("ot_") && prefix.len() > 3 && random_ok && pid_ok)
        .then(|| pid.parse().ok())
        .flatten()
}

/// Whether process `pid` runs on this machine. Where `/proc` cannot tell,
/// every process counts as running, so nothing is swept.
fn running(pid: u32) -> bool {
    !Path::new("/proc/self").exists() || Path::new("/proc").join(pid.to_string()).exists()
}

/// Whether `name` was made by [`owned_name`] in a process that has ended.
pub fn abandoned(name: &str) -> bool {
    owner(name).is_some_and(|pid| !running(pid))
}

/// What [`sweep_abandoned`] removed, and what it could not.
#[derive(Debug, Default)]
pub struct Swept {
    /// Vhosts and databases removed.
    pub removed: Vec<String>,
    /// What could not be listed or removed, and why.
    pub failed: Vec<String>,
}

/// Removes the scratch vhosts and users of the local broker (through
/// `rabbitmqctl`), and the scratch databases and users (roles) on the
/// servers of `database_bases`, that processes which have ended left behind
/// (names by [`owned_name`]).
///
/// Why it matters: a test's vhost holds dozens of quorum queues, each
/// holding files open, and RabbitMQ budgets its file handles from its
/// `ulimit -n` (927 of 1,024 by default). A dozen vhosts left by killed runs
/// exhausted it on the shared broker: every later `add_vhost` and
/// `delete_vhost` hung, and so did the next test run.
///
/// Only names whose process has ended on this machine are removed, so runs
/// at the same time leave each other alone. (Runs in another pid namespace
/// against the same broker, a container's, would look ended: give those a
/// broker of their own.) Nothing here fails: what cannot be removed is
/// reported in [`Swept::failed`].
pub async fn sweep_abandoned(database_bases: &[SecretUrl]) -> Swept {
    let mut swept = Swept::default();
    match list_vhosts() {
        Ok(names) => {
            for vhost in names.iter().filter(|v| abandoned(v)) {
                match delete_vhost(vhost) {
                    Ok(()) => swept.removed.push(format!("vhost {vhost}")),
                    Err(e) => swept.failed.push(format!("vhost {vhost}: {e}")),
                }
            }
        }
        Err(e) => swept.failed.push(format!("listing vhosts: {e}")),
    }
    match rabbitmqctl(&["list_users"]) {
        Ok(out) => {
            let users = out.lines().filter_map(|l| l.split_whitespace().next());
            for user in users.filter(|u| abandoned(u)) {
                match delete_user(user) {
                    Ok(()) => swept.removed.push(format!("broker user {user}")),
                    Err(e) => swept.failed.push(format!("broker user {user}: {e}")),
                }
            }
        }
        Err(e) => swept.failed.push(format!("listing broker users: {e}")),
    }
    for base in database_bases {
        match databases(base).await {
            Ok(names) => {
                for name in names.iter().filter(|n| abandoned(n)) {
                    match drop_database(base, name).await {
                        Ok(()) => swept.removed.push(format!("database {name}")),
                        Err(e) => swept.failed.push(e.to_string()),
                    }
                }
            }
            Err(e) => swept.failed.push(e.to_string()),
        }
        // After the databases: a role cannot be dropped while it owns
        // objects in one.
        match database_users(base).await {
            Ok(users) => {
                for user in users.iter().filter(|u| abandoned(u)) {
                    match drop_database_user(base, user).await {
                        Ok(()) => swept.removed.push(format!("database user {user}")),
                        Err(e) => swept.failed.push(e.to_string()),
                    }
                }
            }
            Err(e) => swept.failed.push(e.to_string()),
        }
    }
    swept
}

/// The users (MySQL/MariaDB) or login roles (PostgreSQL) named `ot_*` on
/// the server of `database_base`.
async fn database_users(database_base: &SecretUrl) -> Result<Vec<String>, ScratchError> {
    let doing = format!("listing database users on {database_base}");
    let fail = |e: sqlx::Error| ScratchError(format!("{doing}: {e}"));
    match Admin::connect(database_base, &doing).await? {
        Admin::MySql(mut conn) => {
            sqlx::query_scalar(
                "SELECT DISTINCT CAST(User AS CHAR) FROM mysql.user WHERE User LIKE 'ot\\_%'",
            )
            .fetch_all(&mut conn)
            .await
        }
        Admin::Postgres(mut conn) => {
            sqlx::query_scalar("SELECT rolname::text FROM pg_roles WHERE rolname LIKE 'ot\\_%'")
                .fetch_all(&mut conn)
                .await
        }
    }
    .map_err(fail)
}

/// Drops database user (MySQL/MariaDB, every host) or role (PostgreSQL)
/// `name` on the server of `database_base`. A PostgreSQL role that still
/// owns objects or holds grants in a database that exists cannot be
/// dropped: drop the databases it was used in first.
pub async fn drop_database_user(database_base: &SecretUrl, name: &str) -> Result<(), ScratchError> {
    use sqlx::Executor;
    let doing = format!("dropping database user {name}");
    let fail = |e: sqlx::Error| ScratchError(format!("{doing}: {e}"));
    match Admin::connect(database_base, &doing).await? {
        Admin::MySql(mut conn) => {
            let hosts: Vec<String> =
                sqlx::query_scalar("SELECT CAST(Host AS CHAR) FROM mysql.user WHERE User = ?")
                    .bind(name)
                    .fetch_all(&mut conn)
                    .await
                    .map_err(fail)?;
            for host in hosts {
                conn.execute(sqlx::AssertSqlSafe(format!(
                    "DROP USER IF EXISTS '{}'@'{}'",
                    name.replace('\'', "''"),
                    host.replace('\'', "''")
                )))
                .await
                .map_err(fail)?;
            }
            Ok(())
        }
        Admin::Postgres(mut conn) => conn
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP ROLE IF EXISTS \"{}\"",
                name.replace('"', "\"\"")
            )))
            .await
            .map(drop)
            .map_err(fail),
    }
}

/// The databases named `ot_*` on the server of `database_base`.
async fn databases(database_base: &SecretUrl) -> Result<Vec<String>, ScratchError> {
    let doing = format!("listing databases on {database_base}");
    let fail = |e: sqlx::Error| ScratchError(format!("{doing}: {e}"));
    match Admin::connect(database_base, &doing).await? {
        Admin::MySql(mut conn) => {
            sqlx::query_scalar(
                "SELECT CAST(schema_name AS CHAR) FROM information_schema.schemata \
              WHERE schema_name LIKE 'ot\\_%'",
            )
            .fetch_all(&mut conn)
            .await
        }
        Admin::Postgres(mut conn) => {
            sqlx::query_scalar("SELECT datname::text FROM pg_database WHERE datname LIKE 'ot\\_%'")
                .fetch_all(&mut conn)
                .await
        }
    }
    .map_err(fail)
}

/// The PostgreSQL server the tests use: `DATABASE_URL`, or the service's
/// default (a scratch database's name replaces its database part).
pub fn test_pg_server() -> SecretUrl {
    SecretUrl::new(
        std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| order_timeout::settings::DEFAULT_DATABASE_URL.into()),
    )
}

/// A scratch database that is dropped however its holder ends (a test's
/// panic included): hold it for as long as the database is used.
#[derive(Debug)]
pub struct ScratchDatabase {
    base: SecretUrl,
    name: String,
}

impl ScratchDatabase {
    /// A database named by [`owned_name`] on the server of
    /// `database_base` (created by whoever connects first, e.g. the
    /// service's migrations), to be dropped with this guard.
    pub fn new(database_base: &SecretUrl, prefix: &str) -> Self {
        Self {
            base: database_base.clone(),
            name: owned_name(prefix),
        }
    }

    /// A [`ScratchDatabase::new`] on [`test_pg_server`].
    pub fn on_test_server(prefix: &str) -> Self {
        Self::new(&test_pg_server(), prefix)
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database's URL.
    pub fn url(&self) -> Result<SecretUrl, ScratchError> {
        with_path(&self.base, &format!("/{}", self.name))
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        if let Err(e) = drop_database_blocking(&self.base, &self.name) {
            eprintln!("{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_names_carry_their_pid() {
        let name = owned_name("ot_test");
        assert!(
            name.starts_with(&format!("ot_test_p{}_", std::process::id())),
            "{name}"
        );
        assert_eq!(owner(&name), Some(std::process::id()));
        assert!(!abandoned(&name), "this process runs");
    }

    #[test]
    fn only_owned_names_of_ended_processes_are_abandoned() {
        // Above Linux's largest pid_max (2^22): no such process can run.
        let dead = "ot_store_p4194305_00ff00ff00ff00ff";
        assert_eq!(owner(dead), Some(4_194_305));
        assert!(abandoned(dead) || !Path::new("/proc/self").exists());
        for other in [
            "ot_bench_20261126_195800",
            "ot_test_9f1c2b7e4d8a4c6f9e0d1c2b3a4f5e6d",
            "shop_p4194305_00ff",
            "ot_p4194305_00ff",
            "ot_test_4194305_00ff",
            "ot_test_p_00ff",
            "ot_test_p4194305_",
            "ot_test_p4194305_zz",
            "postgres",
            "/",
        ] {
            assert_eq!(owner(other), None, "{other}");
            assert!(!abandoned(other), "{other}");
        }
    }
}
