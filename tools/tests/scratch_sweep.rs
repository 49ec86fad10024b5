//! What killed test runs leave behind is removed, and nothing a running
//! process still uses: a vhost on the local RabbitMQ and databases on the
//! local PostgreSQL and MariaDB, named as if by a process that cannot exist,
//! are swept; the same kinds named by this process stay.

use order_timeout::settings::{DEFAULT_AMQP_URL, DEFAULT_DATABASE_URL, SecretUrl};
use order_timeout_tools::scratch;
use sqlx::Connection;

/// A pid above Linux's largest `pid_max` (2^22): never a running process.
const NO_PROCESS: u32 = 4_194_305;

fn bases() -> (SecretUrl, SecretUrl, SecretUrl) {
    let var = |name: &str, default: &str| {
        SecretUrl::new(std::env::var(name).unwrap_or_else(|_| default.into()))
    };
    (
        var("AMQP_URL", DEFAULT_AMQP_URL),
        var("DATABASE_URL", DEFAULT_DATABASE_URL),
        var("MYSQL_URL", "mysql://root@127.0.0.1:3306/mysql"),
    )
}

fn vhosts() -> Vec<String> {
    scratch::rabbitmqctl(&["list_vhosts", "name"])
        .unwrap()
        .lines()
        .map(|l| l.trim().to_owned())
        .collect()
}

async fn pg_admin(base: &SecretUrl) -> sqlx::PgConnection {
    let admin = scratch::with_path(base, "/postgres").unwrap();
    sqlx::PgConnection::connect_with(&order_timeout::testing::store::pg_options(&admin).unwrap())
        .await
        .unwrap()
}

async fn mysql_admin(base: &SecretUrl) -> sqlx::MySqlConnection {
    let admin = scratch::with_path(base, "/information_schema").unwrap();
    sqlx::MySqlConnection::connect_with(
        &order_timeout::testing::store::mysql_options(&admin).unwrap(),
    )
    .await
    .unwrap()
}

async fn create_databases(pg: &SecretUrl, my: &SecretUrl, name: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&mut pg_admin(pg).await)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
        .execute(&mut mysql_admin(my).await)
        .await
        .unwrap();
}

/// Whether database `name` exists on the PostgreSQL and on the MariaDB server.
async fn databases_exist(pg: &SecretUrl, my: &SecretUrl, name: &str) -> (bool, bool) {
    let on_pg: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut pg_admin(pg).await)
            .await
            .unwrap();
    let on_my: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?",
    )
    .bind(name)
    .fetch_one(&mut mysql_admin(my).await)
    .await
    .unwrap();
    (on_pg, on_my == 1)
}

#[tokio::test]
async fn the_sweep_removes_what_ended_processes_left_and_keeps_what_runs() {
    let (amqp, pg, my) = bases();
    let mine = scratch::owned_name("ot_tools_sweep");
    let left = mine.replacen(
        &format!("_p{}_", std::process::id()),
        &format!("_p{NO_PROCESS}_"),
        1,
    );
    assert!(scratch::abandoned(&left) && !scratch::abandoned(&mine));

    for name in [&mine, &left] {
        scratch::create_vhost(&amqp, name).unwrap();
        create_databases(&pg, &my, name).await;
    }
    // A bench's vhost (not an owned name) is never swept.
    let bench = format!("ot_bench_sweep_{}", std::process::id());
    scratch::create_vhost(&amqp, &bench).unwrap();

    let swept = scratch::sweep_abandoned(&[pg.clone(), my.clone()]).await;

    let vhosts = vhosts();
    let present = (
        vhosts.contains(&left),
        databases_exist(&pg, &my, &left).await,
    );
    let kept = (
        vhosts.contains(&mine),
        databases_exist(&pg, &my, &mine).await,
        vhosts.contains(&bench),
    );
    for name in [&mine, &left, &bench] {
        let _ = scratch::delete_vhost(name);
        let _ = scratch::drop_database(&pg, name).await;
        let _ = scratch::drop_database(&my, name).await;
    }
    assert_eq!(present, (false, (false, false)), "{swept:?}");
    assert_eq!(kept, (true, (true, true), true), "{swept:?}");
}
