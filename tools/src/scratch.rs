//! Scratch environments for the bench and the tests: a fresh RabbitMQ vhost
//! and a fresh database per run, so runs never see each other's queues and
//! rows, and their removal afterwards.
//!
//! Vhosts are made with `rabbitmqctl` (so on the broker's machine, as root);
//! databases through the server named by the base `DATABASE_URL`.

use std::process::Command;

use order_timeout::settings::SecretUrl;

/// A scratch environment could not be made or removed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ScratchError(String);

/// `url` with its path replaced by `path` (the vhost of an AMQP URL, the
/// database of a database URL).
pub fn with_path(url: &SecretUrl, path: &str) -> Result<SecretUrl, ScratchError> {
    let mut u =
        url::Url::parse(url.expose()).map_err(|e| ScratchError(format!("bad URL {url}: {e}")))?;
    u.set_path(path);
    Ok(SecretUrl::new(u.to_string()))
}

/// Runs `rabbitmqctl -q ARGS`, returning its standard output.
pub fn rabbitmqctl(args: &[&str]) -> Result<String, ScratchError> {
    let out = Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .map_err(|e| {
            ScratchError(format!(
                "cannot run rabbitmqctl (needed for a scratch vhost; run as root on the broker's machine): {e}"
            ))
        })?;
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

/// Creates vhost `name`, gives the user of `amqp_base` (default `guest`)
/// full permissions on it, and returns `amqp_base` pointed at it.
pub fn create_vhost(amqp_base: &SecretUrl, name: &str) -> Result<SecretUrl, ScratchError> {
    let user = url::Url::parse(amqp_base.expose())
        .ok()
        .map(|u| u.username().to_owned())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "guest".into());
    rabbitmqctl(&["add_vhost", name])?;
    rabbitmqctl(&["set_permissions", "-p", name, &user, ".*", ".*", ".*"])?;
    with_path(amqp_base, &format!("/{name}"))
}

/// Deletes vhost `name` with everything in it.
pub fn delete_vhost(name: &str) -> Result<(), ScratchError> {
    rabbitmqctl(&["delete_vhost", name]).map(drop)
}

/// Drops database `name` on the server of `database_base` (PostgreSQL:
/// closing its connections first; MySQL/MariaDB).
pub async fn drop_database(database_base: &SecretUrl, name: &str) -> Result<(), ScratchError> {
    use sqlx::{Connection, Executor};
    let fail = |e: sqlx::Error| ScratchError(format!("dropping database {name}: {e}"));
    if database_base.expose().starts_with("mysql://") {
        let admin = with_path(database_base, "/information_schema")?;
        let options = order_timeout::store::mysql_options(&admin)
            .map_err(|e| ScratchError(format!("dropping database {name}: {e}")))?;
        let mut conn = sqlx::MySqlConnection::connect_with(&options)
            .await
            .map_err(fail)?;
        conn.execute(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS `{}`",
            name.replace('`', "``")
        )))
        .await
        .map_err(fail)?;
        return Ok(());
    }
    let admin = with_path(database_base, "/postgres")?;
    let options = order_timeout::store::pg_options(&admin)
        .map_err(|e| ScratchError(format!("dropping database {name}: {e}")))?;
    let mut conn = sqlx::PgConnection::connect_with(&options)
        .await
        .map_err(fail)?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
        name.replace('"', "\"\"")
    )))
    .await
    .map_err(fail)?;
    Ok(())
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

/// A scratch database that is dropped however its holder ends (a test's
/// panic included): hold it for as long as the database is used.
#[derive(Debug)]
pub struct ScratchDatabase {
    base: SecretUrl,
    name: String,
}

impl ScratchDatabase {
    /// A database named `<prefix>_<pid>_<nanos>` on the server of
    /// `database_base` (created by whoever connects first, e.g. the
    /// service's migrations), to be dropped with this guard.
    pub fn new(database_base: &SecretUrl, prefix: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Self {
            base: database_base.clone(),
            name: format!("{prefix}_{}_{nanos}", std::process::id()),
        }
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
