//! Real database errors, PostgreSQL's and MariaDB's, are filed permanent
//! (parked at once) or transient (retried) as each kind must be.

use super::*;

/// How a real database error must be filed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Filed {
    /// About the row's values: permanent, and the row's fault (its order
    /// is parked and set aside).
    Row,
    /// About the statement or the schema, whatever the row: permanent
    /// (a mapping mistake at `schema check`), but the world's (retried,
    /// never parked).
    World,
    /// Waiting fixes it.
    Transient,
}

/// Asserts how [`StoreError::is_permanent`] and
/// [`StoreError::is_row_fault`] file a real database error.
fn assert_filed(result: Result<impl std::fmt::Debug, sqlx::Error>, expected: Filed, what: &str) {
    let error = StoreError::from(result.expect_err(what));
    let filed = match (error.is_permanent(), error.is_row_fault()) {
        (true, true) => Filed::Row,
        (true, false) => Filed::World,
        (false, false) => Filed::Transient,
        (false, true) => panic!("{what}: {error} is the row's but not permanent"),
    };
    assert_eq!(filed, expected, "{what}: {error}");
}

/// A pool of one connection and that connection, held: the next acquire
/// times out (in 500 ms). The connection is opened with as many tries as a
/// loaded machine needs: one that takes longer than the pool's short
/// acquire timeout to open is not what the tests check.
async fn one_connection_held<DB: sqlx::Database>(
    url: &str,
) -> (sqlx::Pool<DB>, sqlx::pool::PoolConnection<DB>) {
    let one = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy(url)
        .unwrap();
    let mut tries = 0;
    loop {
        tries += 1;
        match one.acquire().await {
            Ok(held) => return (one, held),
            Err(e) if tries < 60 => {
                eprintln!("opening the pool's one connection, try {tries}: {e}")
            }
            Err(e) => panic!("the pool's one connection did not open in {tries} tries: {e}"),
        }
    }
}

// PostgreSQL's errors; MariaDB's are `mysql_errors_are_filed_permanent_or_transient`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_errors_are_filed_permanent_or_transient() {
    let env = TestEnv::new().await;
    let pool = &env.pool;
    let run = |sql: &'static str| sqlx::query(sql).execute(pool);
    run("CREATE TABLE filed (id int PRIMARY KEY, n int NOT NULL)")
        .await
        .unwrap();
    run("INSERT INTO filed VALUES (1, 1)").await.unwrap();
    for (sql, what) in [
        ("SELEC 1", "syntax error"),
        ("SELECT * FROM no_such_table", "undefined table"),
        ("SELECT no_such_column FROM filed", "undefined column"),
        (
            "SELECT no_such_function(n) FROM filed",
            "undefined function",
        ),
    ] {
        assert_filed(run(sql).await, Filed::World, what);
    }
    for (sql, what) in [
        ("SELECT 1 / (n - 1) FROM filed", "division by zero"),
        ("SELECT '3000000000'::int4", "out of range"),
        ("SELECT 'abc'::int", "invalid text"),
        ("INSERT INTO filed VALUES (1, 2)", "unique violation"),
        ("INSERT INTO filed VALUES (2, NULL)", "not null violation"),
        (
            "SELECT (SELECT n FROM filed UNION ALL SELECT 2)",
            "more than one row",
        ),
    ] {
        assert_filed(run(sql).await, Filed::Row, what);
    }
    let decode: Result<i32, sqlx::Error> = sqlx::query_scalar("SELECT 'text'::text")
        .fetch_one(pool)
        .await;
    assert_filed(decode, Filed::Row, "a value that does not decode");

    // A statement that runs too long, and a lock held by another session.
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET statement_timeout = 100")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_filed(
        sqlx::query("SELECT pg_sleep(2)").execute(&mut *conn).await,
        Filed::Transient,
        "statement timeout",
    );
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT * FROM filed WHERE id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    sqlx::query("SET statement_timeout = 0")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SET lock_timeout = 100")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_filed(
        sqlx::query("UPDATE filed SET n = 3 WHERE id = 1")
            .execute(&mut *conn)
            .await,
        Filed::Transient,
        "lock wait",
    );
    holder.rollback().await.unwrap();

    // No server, and no free connection.
    let nowhere = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect("postgres://postgres@127.0.0.1:1/none")
        .await;
    assert_filed(nowhere.map(|_| ()), Filed::Transient, "connection refused");
    let (one, held) =
        one_connection_held::<sqlx::Postgres>(env.settings.database_url.expose()).await;
    assert_filed(
        sqlx::query("SELECT 1").execute(&one).await,
        Filed::Transient,
        "pool timed out",
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_errors_are_filed_permanent_or_transient() {
    let base = mysql_base();
    let name = scratch::owned_name("ot_filed");
    let url = scratch::with_path(&base, &name).unwrap();
    let pool = order_timeout_tools::shop::prepare_mysql_database(&url, 5)
        .await
        .expect("a MySQL test database");
    let result = mysql_cases(&pool, &url).await;
    pool.close().await;
    let _ = scratch::drop_database(&base, &name).await;
    result
}

async fn mysql_cases(pool: &sqlx::MySqlPool, url: &SecretUrl) {
    let run = |sql: &'static str| sqlx::query(sql).execute(pool);
    run("CREATE TABLE filed (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB")
        .await
        .unwrap();
    run("INSERT INTO filed VALUES (1, 1)").await.unwrap();
    for (sql, what) in [
        ("SELEC 1", "1064 syntax error"),
        ("SELECT * FROM no_such_table", "1146 no such table"),
        ("SELECT no_such_column FROM filed", "1054 unknown column"),
        (
            "SELECT no_such_function(n) FROM filed",
            "1305 no such function",
        ),
    ] {
        assert_filed(run(sql).await, Filed::World, what);
    }
    for (sql, what) in [
        (
            "INSERT INTO filed VALUES (2, 3000000000)",
            "1264 out of range",
        ),
        (
            "INSERT INTO filed VALUES (3, 'abc')",
            "1366 incorrect value",
        ),
        (
            "INSERT INTO filed VALUES (4, 1 / 0)",
            "1365 division by zero",
        ),
        ("INSERT INTO filed VALUES (1, 2)", "1062 duplicate entry"),
        ("INSERT INTO filed VALUES (5, NULL)", "1048 cannot be null"),
        (
            "SELECT (SELECT n FROM filed UNION ALL SELECT 2)",
            "1242 more than one row",
        ),
    ] {
        assert_filed(run(sql).await, Filed::Row, what);
    }

    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET max_statement_time = 0.2")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_filed(
        sqlx::query("SELECT SLEEP(2)").fetch_all(&mut *conn).await,
        Filed::Transient,
        "1969 statement time",
    );
    sqlx::query("SET max_statement_time = 0")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT * FROM filed WHERE id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    sqlx::query("SET innodb_lock_wait_timeout = 1")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_filed(
        sqlx::query("UPDATE filed SET n = 3 WHERE id = 1")
            .execute(&mut *conn)
            .await,
        Filed::Transient,
        "1205 lock wait",
    );
    holder.rollback().await.unwrap();

    let nowhere = sqlx::mysql::MySqlPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect("mysql://root@127.0.0.1:1/none")
        .await;
    assert_filed(nowhere.map(|_| ()), Filed::Transient, "connection refused");
    let (one, held) = one_connection_held::<sqlx::MySql>(url.expose()).await;
    assert_filed(
        sqlx::query("SELECT 1").execute(&one).await,
        Filed::Transient,
        "pool timed out",
    );
    drop(held);
}
