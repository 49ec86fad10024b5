//! Connecting an instance to its databases: the stores of every timer
//! ([`Stores`]), sharing a pool per session time zone, with the pools'
//! sizes and timeouts ([`PoolSettings`]); `migrate` and `contract`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::mysql::{self, MySqlStore};
use super::postgres::{self, PgStore};
use super::{Dialect, Expansion, Migrated, Store, StoreError};
use super::{OrderStore, bounded, sql};
use crate::settings::{SecretUrl, Settings, Timer, TimerName};

/// The default timer's mapping as the sections of the config file give
/// it: `[orders]`, `[items]` and whether stock is released over gRPC
/// (else the items are never read). A shorthand for
/// [`Timer::cancel_unpaid`], for code that knows only the default timer.
#[derive(Clone, Debug, Default)]
pub struct ShopSchema {
    /// `[orders]`.
    pub orders: crate::settings::OrdersMapping,
    /// `[items]`.
    pub items: crate::settings::ItemsMapping,
    /// `[inventory].release`.
    pub release: crate::settings::Release,
}

impl ShopSchema {
    /// The default timer this describes.
    pub fn timer(&self) -> Timer {
        Timer::cancel_unpaid(&self.orders, &self.items, self.release)
    }
}

/// The stores of every timer of an instance, the default one
/// (`cancel_unpaid`) first: one per timer, sharing a connection pool per
/// session time zone. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Stores {
    stores: Arc<[Store]>,
}

impl Stores {
    /// Stores of the timers `stores` (the default one first).
    pub(crate) fn new(stores: Vec<Store>) -> Self {
        Self {
            stores: stores.into(),
        }
    }

    /// The store of the timer named `name`, if the settings have one.
    pub(crate) fn get(&self, name: &TimerName) -> Option<&Store> {
        self.stores.iter().find(|s| &s.timer().name == name)
    }

    /// The default timer's store (`cancel_unpaid`), also the one the
    /// readiness probe pings.
    pub(crate) fn default_timer(&self) -> &Store {
        &self.stores[0]
    }

    /// Every timer's store, the default one first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Store> {
        self.stores.iter()
    }

    /// The timers' names, in order.
    pub(crate) fn names(&self) -> Vec<TimerName> {
        self.iter().map(|s| s.timer().name.clone()).collect()
    }
}

/// The connection pool's size and how long one of its statements may wait,
/// so that a row the shop holds, or a slow guard or deadline expression,
/// fails the statement with a transient error instead of hanging the
/// pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSettings {
    /// Most connections open at once.
    pub max_connections: u32,
    /// Longest wait for one lock (PostgreSQL `lock_timeout`, InnoDB
    /// `innodb_lock_wait_timeout`, in whole seconds rounded up).
    pub lock_timeout: Duration,
    /// Longest run of one statement (PostgreSQL `statement_timeout`,
    /// MariaDB `max_statement_time`, MySQL `max_execution_time`, which
    /// bounds only `SELECT`s).
    pub statement_timeout: Duration,
    /// Longest one store operation may take on the client's side, answered
    /// or not (`[liveness].database_timeout`, `bounded.rs`).
    pub client_timeout: Duration,
}

impl PoolSettings {
    /// A pool of at most `max_connections` with the default timeouts.
    pub fn new(max_connections: u32) -> Self {
        let defaults = Settings::default();
        Self {
            max_connections,
            lock_timeout: defaults.db_lock_timeout,
            statement_timeout: defaults.db_statement_timeout,
            client_timeout: defaults.liveness.database_timeout,
        }
    }

    /// The pool `settings` describe (`db_max_connections`,
    /// `db_lock_timeout`, `db_statement_timeout`).
    pub(crate) fn of(settings: &Settings) -> Self {
        Self {
            max_connections: settings.db_max_connections,
            lock_timeout: settings.db_lock_timeout,
            statement_timeout: settings.db_statement_timeout,
            client_timeout: settings.liveness.database_timeout,
        }
    }

    /// The same with at most `max_connections` (the CLI's commands need
    /// one or two).
    pub(crate) fn with_max_connections(self, max_connections: u32) -> Self {
        Self {
            max_connections,
            ..self
        }
    }
}

/// Connects the default timer's store to the database `url` names, with a
/// pool of at most `max_connections` and the default timeouts, lazily: the
/// first query opens the first connection, so start-up does not fail on a
/// database that is still booting.
pub fn connect_lazy(
    url: &SecretUrl,
    max_connections: u32,
    schema: &ShopSchema,
) -> Result<Store, StoreError> {
    connect_timer(url, PoolSettings::new(max_connections), &schema.timer())
}

/// The store of one timer, on a pool of its own (lazily, as
/// [`connect_lazy`]).
pub fn connect_timer(
    url: &SecretUrl,
    pool: PoolSettings,
    timer: &Timer,
) -> Result<Store, StoreError> {
    let store: Store = match Dialect::of(url)? {
        Dialect::Postgres => Arc::new(PgStore::connect_lazy(url, pool, timer)?),
        Dialect::MySql => Arc::new(MySqlStore::connect_lazy(url, pool, timer)?),
    };
    Ok(Arc::new(bounded::Bounded::new(store, pool.client_timeout)))
}

/// The stores of every timer of `settings` ([`Settings::timers`]), lazily:
/// one pool of `pool`'s size per session time zone the timers use (one,
/// unless a timer sets a `time_zone` of its own), shared by the timers of
/// that zone.
pub(crate) fn connect_timers(
    url: &SecretUrl,
    pool: PoolSettings,
    timers: &[Timer],
) -> Result<Stores, StoreError> {
    fn build<D: sql::SqlDialect>(
        url: &SecretUrl,
        pool: PoolSettings,
        timers: &[Timer],
    ) -> Result<Vec<Store>, StoreError>
    where
        sql::SqlStore<D>: OrderStore,
    {
        type Pools<D> = (
            sqlx::Pool<<D as sql::SqlDialect>::Db>,
            sqlx::Pool<<D as sql::SqlDialect>::Db>,
        );
        let mut pools: HashMap<Option<&str>, Pools<D>> = HashMap::new();
        let mut stores: Vec<Store> = Vec::with_capacity(timers.len());
        for timer in timers {
            let zone = timer.time_zone.as_deref();
            let (on, own) = match pools.get(&zone) {
                Some(p) => p.clone(),
                None => {
                    let p = sql::SqlStore::<D>::pools(url, pool, zone)?;
                    pools.insert(zone, p.clone());
                    p
                }
            };
            let store: Store = Arc::new(sql::SqlStore::<D>::on_pool(url, on, own, timer));
            stores.push(Arc::new(bounded::Bounded::new(store, pool.client_timeout)));
        }
        Ok(stores)
    }
    if timers.is_empty() {
        return Err(StoreError::Schema {
            key: "[orders]",
            problem: "no timers to run".into(),
        });
    }
    Ok(Stores::new(match Dialect::of(url)? {
        Dialect::Postgres => build::<postgres::Postgres>(url, pool, timers)?,
        Dialect::MySql => build::<mysql::MySql>(url, pool, timers)?,
    }))
}

/// Creates the database if it does not exist, then applies the service's
/// own migrations (the `order_timeout_*` tables; never the shop's). What
/// they keep for the previous release stays until `contract`, unless the
/// database had none of the service's tables.
pub async fn migrate(url: &SecretUrl) -> Result<Migrated, StoreError> {
    match Dialect::of(url)? {
        Dialect::Postgres => PgStore::migrate(url).await,
        Dialect::MySql => MySqlStore::migrate(url).await,
    }
}

/// Drops what the migrations keep for the previous release (`migrate
/// --contract`, once no replica of it runs); returns what was there.
pub(crate) async fn contract(url: &SecretUrl) -> Result<Vec<Expansion>, StoreError> {
    match Dialect::of(url)? {
        Dialect::Postgres => PgStore::contract(url).await,
        Dialect::MySql => MySqlStore::contract(url).await,
    }
}
