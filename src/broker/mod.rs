//! The broker side: connecting, settling deliveries in few frames
//! ([`acks`]), the objects the service declares
//! ([`topology`]) and **the delay cascade** they form ([`cascade`]), the
//! record of the layouts declared on the vhost ([`layouts`]), the
//! `x-*` headers ([`headers`]), confirmed publishing ([`publisher`]), the
//! parked-message format ([`parked`]), and `amqps://` ([`tls`]).

use std::time::Duration;

use lapin::{Connection, ConnectionProperties};

use crate::settings::SecretUrl;
pub(crate) use nodes::Dialer;

pub(crate) mod acks;
pub(crate) mod alarms;
pub(crate) mod cascade;
pub(crate) mod headers;
pub(crate) mod lanes;
pub(crate) mod layout;
pub(crate) mod layouts;
pub(crate) mod nodes;
pub(crate) mod parked;
pub(crate) mod publisher;
pub(crate) mod refusals;
pub(crate) mod tls;
pub(crate) mod topology;

/// Connects to RabbitMQ with this service's connection name, with the
/// default `[liveness]` heartbeat and per-node connect timeout
/// ([`Dialer`]). `url` may list several broker nodes separated by commas
/// (`amqp://u:p@n1/shop,amqp://u:p@n2/shop`): they are tried in turn, and
/// the first that accepts is used; the error is the last node's.
///
/// `amqps://` nodes connect over TLS with the CA file and client
/// certificate their query parameters name ([`tls`]); a node whose TLS
/// files cannot be used fails like a refusing one, with the parameter's name
/// in the error.
pub async fn connect_amqp(url: &SecretUrl, name: &str) -> Result<Connection, lapin::Error> {
    Ok(connect_amqp_with(url, name, &Dialer::default()).await?.0)
}

/// [`connect_amqp`] with `dialer`'s heartbeat, connect timeout and node
/// order (the node whose session failed last is tried last); also returns
/// the index of the node connected to, for [`Dialer::failed`].
#[tracing::instrument(skip_all, fields(url = %url))]
pub(crate) async fn connect_amqp_with(
    url: &SecretUrl,
    name: &str,
    dialer: &Dialer,
) -> Result<(Connection, usize), lapin::Error> {
    let nodes = broker_nodes(url.expose());
    let mut last = None;
    for index in dialer.order(nodes.len()) {
        let node = nodes[index];
        match connect_node(node, name, dialer).await {
            Ok(connection) => return Ok((connection, index)),
            Err(e) => {
                if nodes.len() > 1 {
                    tracing::warn!(node = %crate::settings::redact_url(node), error = %e, "broker node refused or silent; trying the next");
                }
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "AMQP_URL names no broker").into()
    }))
}

/// One node: its URL tuned by `dialer` (heartbeat, connect limit).
async fn connect_node(url: &str, name: &str, dialer: &Dialer) -> Result<Connection, lapin::Error> {
    let (uri, limit) = dialer.tune(parse_node(url)?).map_err(|reason| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "AMQP_URL node {}: {reason}",
                crate::settings::redact_url(url)
            ),
        )
    })?;
    connect_uri_within(url, uri, name, limit).await
}

/// The broker nodes of an `AMQP_URL`: its comma-separated URLs.
fn broker_nodes(urls: &str) -> Vec<&str> {
    urls.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// Parses one node URL for lapin, with an error that never repeats the URL
/// (the AMQP URI parser's own message quotes the whole text, password
/// included, for some malformed URLs).
fn parse_node(url: &str) -> Result<lapin::uri::AMQPUri, lapin::Error> {
    url.parse::<lapin::uri::AMQPUri>().map_err(|reason| {
        let reason = if reason.starts_with("Invalid URL:") {
            "it has no host part (expected amqp://user:password@host:port/vhost)".to_owned()
        } else {
            reason
        };
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "AMQP_URL node {} is not a valid AMQP URI: {reason}",
                crate::settings::redact_url(url)
            ),
        )
        .into()
    })
}

/// Opens a connection to `uri` (the node `url`, for its TLS files),
/// within `limit`.
async fn connect_uri_within(
    url: &str,
    uri: lapin::uri::AMQPUri,
    name: &str,
    limit: Duration,
) -> Result<Connection, lapin::Error> {
    let tls = tls::node_config(url)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let connect = lapin::Connect::connect_with_config(
        uri,
        ConnectionProperties::default().with_connection_name(name.into()),
        tls,
        lapin::runtime::default_runtime()?,
    );
    match tokio::time::timeout(limit, connect).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the broker did not complete the connection within {limit:?}"),
        )
        .into()),
    }
}

/// How long [`close_quietly`] waits for the broker to confirm a close.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Closes a connection the caller is done with, waiting at most
/// [`CLOSE_TIMEOUT`] for the broker's confirmation: the work is finished
/// (and confirmed) by then, and a close that is never confirmed must not
/// hold a command or a console page forever.
pub(crate) async fn close_quietly(connection: &Connection) {
    let close = connection.close(200, "done".into());
    if tokio::time::timeout(CLOSE_TIMEOUT, close).await.is_err() {
        tracing::debug!("the broker did not confirm closing the connection in time");
    }
}

/// [`close_quietly`] for a channel.
pub(crate) async fn close_channel_quietly(channel: &lapin::Channel) {
    let close = channel.close(200, "done".into());
    if tokio::time::timeout(CLOSE_TIMEOUT, close).await.is_err() {
        tracing::debug!("the broker did not confirm closing the channel in time");
    }
}

/// Looks at an existing queue without changing it (a passive declare): its
/// ready messages and consumers, or a channel-closing `NOT_FOUND` error if
/// it does not exist. What the operator commands, the parked passes and
/// the tools count queues with.
pub async fn peek_queue(
    channel: &lapin::Channel,
    queue: &str,
) -> Result<lapin::Queue, lapin::Error> {
    channel
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
}

/// Declares the topology on a fresh connection (for the demo and tests;
/// `serve` declares on every (re)connect).
pub async fn declare_topology(
    settings: &crate::settings::Settings,
) -> Result<(), topology::TopologyError> {
    let conn = connect_amqp(&settings.amqp_url, "order-timeout-setup")
        .await
        .map_err(topology::TopologyError::Connect)?;
    topology::declare(&conn, &topology::Layout::of(settings)).await?;
    let _ = conn.close(200, "setup done".into()).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amqp_url_may_list_several_nodes() {
        assert_eq!(
            broker_nodes("amqp://a/%2f, amqp://b/%2f,,"),
            ["amqp://a/%2f", "amqp://b/%2f"]
        );
        assert_eq!(broker_nodes("amqp://a/%2f"), ["amqp://a/%2f"]);
    }

    #[test]
    fn a_malformed_node_url_is_an_error_that_does_not_repeat_it() {
        for url in [
            "amqp:guest:S3cretPw@localhost",
            "amqp://guest:S3cretPw@localhost:notaport/%2f",
            "http://guest:S3cretPw@localhost/%2f",
            "amqp://guest:S3cretPw@localhost/%2f?heartbeat=ten",
        ] {
            let err = parse_node(url).unwrap_err().to_string();
            assert!(!err.contains("S3cretPw"), "{url}: {err}");
            assert!(err.contains("not a valid AMQP URI"), "{url}: {err}");
        }
        assert!(parse_node("amqp://guest:guest@localhost:5672/%2f").is_ok());
    }

    #[tokio::test]
    async fn a_refusing_node_is_skipped_for_the_next() {
        // Nothing listens on the first port; the second is a listener that
        // never answers the handshake: both fail, the error is the last one.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let url = SecretUrl::new(format!(
            "amqp://guest:guest@127.0.0.1:{closed_port}/%2f,amqp://guest:guest@127.0.0.1:1/%2f"
        ));
        let started = std::time::Instant::now();
        let err = connect_amqp(&url, "test").await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no wait on a refused node"
        );
        assert!(!err.to_string().is_empty());
    }

    #[tokio::test]
    async fn a_broker_that_never_answers_the_handshake_is_an_error_not_a_hang() {
        // Accepts TCP, then says nothing: what a wedged broker looks like.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(socket);
        });
        let started = std::time::Instant::now();
        let url = format!("amqp://guest:guest@{addr}/%2f");
        let err = connect_uri_within(
            &url,
            parse_node(&url).unwrap(),
            "test",
            Duration::from_millis(500),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("did not complete"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        silent.abort();
    }

    /// A listener that accepts TCP and never says a word: a wedged or
    /// cut-off broker as a client sees it.
    async fn silent_node() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        (addr, task)
    }

    #[tokio::test]
    async fn a_silent_node_costs_its_connect_timeout_then_the_next_is_used() {
        let (silent, task) = silent_node().await;
        let liveness = crate::settings::LivenessSettings {
            broker_connect_timeout: Duration::from_millis(700),
            ..Default::default()
        };
        let dialer = Dialer::of(&liveness);
        let url = SecretUrl::new(format!(
            "amqp://guest:guest@{silent}/%2f,{}",
            crate::settings::DEFAULT_AMQP_URL
        ));
        let started = std::time::Instant::now();
        let (connection, index) = connect_amqp_with(&url, "test", &dialer).await.unwrap();
        assert_eq!(index, 1);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the silent node took {:?}",
            started.elapsed()
        );
        assert_eq!(
            connection.configuration().heartbeat(),
            5,
            "the service asks for its own heartbeat, not the broker's 60 s"
        );
        close_quietly(&connection).await;
        // Its session failed: the silent node is now tried last, so the
        // next connect costs nothing.
        dialer.failed(0);
        let dialer_slow = Dialer::of(&crate::settings::LivenessSettings {
            broker_connect_timeout: Duration::from_secs(30),
            ..Default::default()
        });
        dialer_slow.failed(0);
        let started = std::time::Instant::now();
        let (connection, index) = connect_amqp_with(&url, "test", &dialer_slow).await.unwrap();
        assert_eq!(index, 1);
        assert!(started.elapsed() < Duration::from_secs(5));
        close_quietly(&connection).await;
        task.abort();
    }

    #[tokio::test]
    async fn a_node_url_s_heartbeat_and_connection_timeout_are_honoured() {
        let url = SecretUrl::new(format!("{}?heartbeat=7", crate::settings::DEFAULT_AMQP_URL));
        let connection = connect_amqp(&url, "test").await.unwrap();
        assert_eq!(connection.configuration().heartbeat(), 7);
        close_quietly(&connection).await;
        let (silent, task) = silent_node().await;
        let url = SecretUrl::new(format!(
            "amqp://guest:guest@{silent}/%2f?connection_timeout=400"
        ));
        let started = std::time::Instant::now();
        let err = connect_amqp(&url, "test").await.unwrap_err();
        assert!(err.to_string().contains("did not complete"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "connection_timeout=400 was not the limit: {:?}",
            started.elapsed()
        );
        task.abort();
    }
}
