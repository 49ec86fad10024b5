//! The world of one partition run: a broker, a database and an inventory
//! for a service, one of them (the peer) in network namespaces behind a
//! link the run cuts ([`crate::netns`]: the broker a 3-node cluster with a
//! namespace per node on one bridge); the others on this machine's
//! servers, in a vhost and a database of the run's own.

use std::time::Duration;

use order_timeout::settings::{SecretUrl, Settings, Shards};
use order_timeout::shutdown::Shutdown;
use sqlx::PgPool;

use super::Peer;
use crate::inventory::ReferenceInventory;
use crate::netns::{Bridge, Link, Namespace};
use crate::private_broker::{ClusterConfig, PrivateCluster};
use crate::private_pg::PrivatePostgres;
use crate::{scratch, shop};

/// What holds the peer behind its link (dropped with the world: nodes,
/// servers, namespaces and links removed).
enum Holder {
    /// A private 3-node RabbitMQ cluster, each node in a namespace of its
    /// own on one bridge: the service lists the three (`AMQP_URL`), node 1
    /// first; node 1's link is cut, which partitions it from the service
    /// and from the other two nodes alike. The order service publishes
    /// through node 2.
    Broker {
        // Declared first: stopped (in the namespaces) before they go.
        cluster: PrivateCluster,
        cut: Link,
        _links: Vec<Link>,
        _namespaces: Vec<Namespace>,
        _bridge: Bridge,
    },
    /// A private PostgreSQL server holding the orders and the stock.
    Database(PrivatePostgres),
    /// The reference inventory, served by this process on a listener in
    /// the namespace.
    Inventory { link: Link, _ns: Namespace },
}

/// A run's world.
pub(super) struct World {
    /// The service's settings.
    pub(super) settings: Settings,
    /// The orders and the stock.
    pub(super) shop: PgPool,
    /// Where the order service publishes (never through the cut link).
    pub(super) publish_url: SecretUrl,
    holder: Holder,
    stop_inventory: Shutdown,
    name: String,
    vhost: bool,
    database_base: SecretUrl,
}

impl World {
    /// Sets up the world for `peer`.
    #[tracing::instrument]
    pub(super) async fn build(peer: Peer, rabbitmq4: bool) -> anyhow::Result<Self> {
        let name = scratch::owned_name("ot_part");
        let (holder, amqp_url, publish_url, database_base) = match peer {
            Peer::Broker => {
                let (holder, url, publish) = broker(rabbitmq4).await?;
                (holder, url, publish, scratch::test_pg_server())
            }
            Peer::Database => {
                let pg = PrivatePostgres::start().await?;
                let base = pg.base_url();
                let (url, publish) = shared_vhost(&name)?;
                (Holder::Database(pg), url, publish, base)
            }
            Peer::Inventory => {
                let ns = Namespace::new()?;
                let link = ns.link()?;
                let (url, publish) = shared_vhost(&name)?;
                let holder = Holder::Inventory { link, _ns: ns };
                (holder, url, publish, scratch::test_pg_server())
            }
        };
        let database_url = scratch::with_path(&database_base, &name)?;
        let shop = shop::prepare_database(&database_url, 10).await?;
        if peer == Peer::Database {
            slow_updates(&shop).await?;
        }
        let (inventory_url, stop_inventory) = serve_inventory(&holder, shop.clone()).await?;
        let mut settings = Settings {
            amqp_url,
            database_url,
            inventory_url,
            http_addr: "127.0.0.1:0".parse()?,
            ..Settings::default()
        };
        settings.cascade_shards = Shards::try_from(2).expect("2 shards");
        settings.shutdown_timeout = Duration::from_secs(10);
        patiently("declaring the topology", || {
            order_timeout::testing::broker::declare_topology(&settings)
        })
        .await?;
        Ok(Self {
            settings,
            shop,
            publish_url,
            vhost: !matches!(holder, Holder::Broker { .. }),
            holder,
            stop_inventory,
            name,
            database_base,
        })
    }

    /// Cuts the peer off.
    pub(super) fn cut(&self) -> anyhow::Result<()> {
        Ok(self.link().cut()?)
    }

    /// Restores the peer's link.
    pub(super) fn heal(&self) -> anyhow::Result<()> {
        Ok(self.link().heal()?)
    }

    fn link(&self) -> &Link {
        match &self.holder {
            Holder::Broker { cut, .. } => cut,
            Holder::Database(pg) => &pg.link,
            Holder::Inventory { link, .. } => link,
        }
    }

    /// The private cluster's status, each node's own view, waited for at
    /// most `limit` per node (`None`: the peer is not the broker).
    pub(super) async fn cluster_view(&self, limit: Duration) -> Option<String> {
        match &self.holder {
            Holder::Broker { cluster, .. } => Some(cluster.status_within(limit).await),
            _ => None,
        }
    }

    /// The private broker node's status (for a failure message).
    pub(super) async fn broker_status(&self) -> String {
        match &self.holder {
            Holder::Broker { cluster, .. } => cluster.status().await,
            _ => "the machine's broker".into(),
        }
    }

    /// Removes the run's vhost and database (the namespaces and private
    /// servers go with the world).
    pub(super) async fn clean_up(self) {
        self.stop_inventory.trigger();
        self.shop.close().await;
        if self.vhost {
            let _ = scratch::delete_vhost(&self.name);
        }
        if matches!(
            self.holder,
            Holder::Broker { .. } | Holder::Inventory { .. }
        ) {
            let _ = scratch::drop_database(&self.database_base, &self.name).await;
        }
    }
}

/// Makes each order's status flip take 5 ms (a trigger, as shops have):
/// the cancel statement of the burst due just before the cut then runs for
/// half a second, so it is surely in flight when the link goes, and its
/// answer is lost in the cut.
async fn slow_updates(shop: &PgPool) -> anyhow::Result<()> {
    sqlx::raw_sql(
        "CREATE FUNCTION partition_slow_update() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.005); RETURN NEW; END $$; \
         CREATE TRIGGER partition_slow_update BEFORE UPDATE ON orders \
         FOR EACH ROW EXECUTE FUNCTION partition_slow_update();",
    )
    .execute(shop)
    .await?;
    Ok(())
}

/// A vhost of the run's own on the machine's broker: the service's URL
/// and the order service's (the same).
fn shared_vhost(name: &str) -> anyhow::Result<(SecretUrl, SecretUrl)> {
    let base = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| order_timeout::settings::DEFAULT_AMQP_URL.into());
    let url = scratch::create_vhost(&SecretUrl::new(base), name)?;
    Ok((url.clone(), url))
}

/// Erlang's `net_ticktime` on the cluster's nodes, seconds: a node that
/// hears nothing from another for about this long (0.75–1.25 of it) takes
/// it for down. RabbitMQ's default, 60 s, is longer than the cut: the cut
/// node would never see itself in the minority, and the majority's Mnesia
/// would wait up to 75 s on it. 10 s makes the cut a partition both sides
/// notice (pause_minority then pauses node 1); quorum queues elect new
/// leaders on their own failure detector (Ra's aten), independent of it.
pub const NET_TICKTIME_S: u32 = 10;

/// The shipped `advanced.config` with [`NET_TICKTIME_S`].
fn advanced_config() -> String {
    let shipped = include_str!("../../../deploy/rabbitmq/advanced.config");
    let kernel = format!("[\n  {{kernel, [{{net_ticktime, {NET_TICKTIME_S}}}]}},\n  {{rabbit,");
    shipped.replacen("[\n  {rabbit,", &kernel, 1)
}

/// A 3-node cluster (`pause_minority`, quorum queue leaders balanced as
/// `deploy/rabbitmq/cluster.conf` sets), each node in a namespace of its own
/// on one bridge; `AMQP_URL` lists the three, node 1 first.
async fn broker(rabbitmq4: bool) -> anyhow::Result<(Holder, SecretUrl, SecretUrl)> {
    let bridge = Bridge::new()?;
    let namespaces = (0..3)
        .map(|_| Namespace::new())
        .collect::<Result<Vec<_>, _>>()?;
    let links = namespaces
        .iter()
        .map(|ns| bridge.attach(ns))
        .collect::<Result<Vec<_>, _>>()?;
    let advanced = advanced_config();
    anyhow::ensure!(
        advanced.contains("net_ticktime"),
        "deploy/rabbitmq/advanced.config no longer starts with the rabbit section"
    );
    let cluster = PrivateCluster::start(ClusterConfig {
        advanced_config: Some(advanced),
        extra_conf: Some(include_str!("../../../deploy/rabbitmq/cluster.conf").into()),
        rabbitmq4,
        node_netns: namespaces
            .iter()
            .zip(&links)
            .map(|(ns, link)| (ns.name.clone(), link.ns_ip))
            .collect(),
        ..ClusterConfig::nodes(3)
    })
    .await?;
    let url = SecretUrl::new(cluster.urls_from(1));
    // The order service publishes through node 2, else 3, else 1: a node
    // just formed was seen, inside the suite, to leave its AMQP handshakes
    // unfinished for half a minute while the others answered.
    let publish = SecretUrl::new(cluster.urls_from(2));
    let mut links = links.into_iter();
    let cut = links.next().expect("three links");
    let holder = Holder::Broker {
        cluster,
        cut,
        _links: links.collect(),
        _namespaces: namespaces,
        _bridge: bridge,
    };
    Ok((holder, url, publish))
}

/// Serves the reference inventory over `shop`'s stock: in the namespace
/// when it is the peer, else on the loopback. Its URL and off switch.
async fn serve_inventory(holder: &Holder, shop: PgPool) -> anyhow::Result<(SecretUrl, Shutdown)> {
    let listener = match holder {
        Holder::Inventory { link, _ns: ns } => {
            tokio::net::TcpListener::from_std(ns.listener((link.ns_ip, 0).into())?)?
        }
        _ => tokio::net::TcpListener::bind("127.0.0.1:0").await?,
    };
    let url = SecretUrl::new(format!("http://{}", listener.local_addr()?));
    let stop = Shutdown::new();
    let stopped = stop.clone();
    tokio::spawn(
        ReferenceInventory::new(shop).serve(listener, async move { stopped.wait().await }),
    );
    Ok((url, stop))
}

/// `step`, tried four times 2 s apart: a node of a cluster just formed,
/// with the rest of a test suite on two cores, was seen to take more than
/// the service's 5 s to finish an AMQP handshake (its quorum queues'
/// members starting), and a run that gave up on its first try measured
/// nothing. What is measured (the service's own connections) never
/// retries this way.
pub(super) async fn patiently<T, E, F, Fut>(what: &str, step: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: Into<anyhow::Error> + std::fmt::Display,
{
    let again = backon::ConstantBuilder::default()
        .with_delay(Duration::from_secs(2))
        .with_max_times(3);
    backon::Retryable::retry(step, again)
        .notify(|e, pause| eprintln!("[partition] {what}: {e}; trying again in {pause:?}"))
        .await
        .map_err(Into::into)
}
