//! A transaction of the shop's held open on either dialect ([`ShopTx`]).

use super::*;

/// A transaction of the shop's held open, on either dialect: the row lock
/// of a slow payment callback ([`TestEnv::hold_row`]), the store suite's
/// concurrent session. One type so that each holder states only its SQL.
pub enum ShopTx {
    /// On PostgreSQL.
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    /// On MariaDB.
    MySql(sqlx::Transaction<'static, sqlx::MySql>),
}

impl ShopTx {
    /// Begins a transaction on a session of `shop`'s own.
    pub async fn begin(shop: &ShopDb) -> Self {
        match shop {
            ShopDb::Postgres(pool) => Self::Postgres(pool.begin().await.unwrap()),
            ShopDb::MySql(pool) => Self::MySql(pool.begin().await.unwrap()),
        }
    }

    /// Runs `pg` (PostgreSQL) or `my` (MariaDB) with `id` bound.
    pub async fn execute(&mut self, pg: &'static str, my: &'static str, id: &str) {
        match self {
            Self::Postgres(tx) => sqlx::query(pg).bind(id).execute(&mut **tx).await.map(drop),
            Self::MySql(tx) => sqlx::query(my).bind(id).execute(&mut **tx).await.map(drop),
        }
        .unwrap();
    }

    /// Runs `sql` (one or more statements, in the dialect).
    pub async fn raw(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        let text = || sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Self::Postgres(tx) => sqlx::raw_sql(text()).execute(&mut **tx).await.map(drop),
            Self::MySql(tx) => sqlx::raw_sql(text()).execute(&mut **tx).await.map(drop),
        }
    }

    /// The database's clock, read in the transaction with `pg` or `my`.
    pub async fn now(&mut self, pg: &'static str, my: &'static str) -> DateTime<Utc> {
        match self {
            Self::Postgres(tx) => sqlx::query_scalar(pg).fetch_one(&mut **tx).await,
            Self::MySql(tx) => sqlx::query_scalar(my).fetch_one(&mut **tx).await,
        }
        .unwrap()
    }

    /// Commits: the locks go.
    pub async fn commit(self) {
        match self {
            Self::Postgres(tx) => tx.commit().await,
            Self::MySql(tx) => tx.commit().await,
        }
        .unwrap();
    }

    /// Rolls back: the locks go, nothing it wrote stays.
    pub async fn rollback(self) {
        match self {
            Self::Postgres(tx) => tx.rollback().await,
            Self::MySql(tx) => tx.rollback().await,
        }
        .unwrap();
    }
}
