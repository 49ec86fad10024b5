//! The broker side: connecting, the objects the service declares
//! ([`topology`]) and **the delay cascade** they form ([`cascade`]), the
//! `x-*` headers ([`headers`]), confirmed publishing ([`publisher`]), and
//! `amqps://` ([`tls`]).

use std::time::Duration;

use lapin::{Connection, ConnectionProperties};

use crate::settings::{SecretUrl, Settings};

pub mod cascade;
pub mod headers;
pub mod publisher;
pub mod tls;
pub mod topology;

/// How long opening a broker connection (TCP, AMQP handshake, vhost) may
/// take. A broker that accepts TCP but never answers the handshake would
/// otherwise hold a (re)connect forever; with this it is an error, which the
/// reconnect loop retries with backoff (and readiness stays red).
pub const AMQP_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects to RabbitMQ with this service's connection name, each attempt
/// within [`AMQP_CONNECT_TIMEOUT`]. `url` may list several broker nodes
/// separated by commas (`amqp://u:p@n1/shop,amqp://u:p@n2/shop`): they are
/// tried in turn, and the first that accepts is used; the error is the last
/// node's.
///
/// `amqps://` nodes connect over TLS with the CA file and client
/// certificate their query parameters name ([`tls`]); a node whose TLS
/// files cannot be used fails like a refusing one, with the parameter's name
/// in the error.
#[tracing::instrument(skip_all, fields(url = %url))]
pub async fn connect_amqp(url: &SecretUrl, name: &str) -> Result<Connection, lapin::Error> {
    let nodes = broker_nodes(url.expose());
    let mut last = None;
    for node in &nodes {
        match connect_amqp_within(node, name, AMQP_CONNECT_TIMEOUT).await {
            Ok(connection) => return Ok(connection),
            Err(e) => {
                if nodes.len() > 1 {
                    tracing::warn!(node = %crate::settings::redact_url(node), error = %e, "broker node refused; trying the next");
                }
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "AMQP_URL names no broker").into()
    }))
}

/// The broker nodes of an `AMQP_URL`: its comma-separated URLs.
fn broker_nodes(urls: &str) -> Vec<&str> {
    urls.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

async fn connect_amqp_within(
    url: &str,
    name: &str,
    limit: Duration,
) -> Result<Connection, lapin::Error> {
    let tls = tls::node_config(url)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let connect = Connection::connect_with_config(
        url,
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

/// Declares the topology on a fresh connection (for the demo and tests;
/// `serve` declares on every (re)connect).
pub async fn declare_topology(settings: &Settings) -> Result<(), topology::TopologyError> {
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
        let err = connect_amqp_within(
            &format!("amqp://guest:guest@{addr}/%2f"),
            "test",
            Duration::from_millis(500),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("did not complete"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        silent.abort();
    }
}
