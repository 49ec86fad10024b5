//! Looking at the broker and the HTTP endpoints from a test: a tap queue,
//! a queue's depth, readiness, a GET.

use super::*;

/// A server-named queue of `channel`'s own, gone with it: where a test
/// binds what it wants to look at.
pub async fn exclusive_queue(channel: &Channel) -> lapin::Queue {
    channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap()
}

/// Declares a durable queue `name` of `queue_type` (`quorum`, `classic`)
/// with `args` besides, as a test's own or in place of one the service
/// declared.
pub async fn declare_durable_queue(
    channel: &Channel,
    name: &str,
    queue_type: &str,
    mut args: FieldTable,
) {
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(queue_type.into()),
    );
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await
        .unwrap();
}

/// Whether the service at `addr` is ready (`/readyz` answers 200): its
/// topology declared, so what tests then bind, unbind or publish with a
/// lane entry key meets the service's queues.
pub async fn ready(addr: std::net::SocketAddr) -> bool {
    http_get(addr, "/readyz").await.0 == 200
}

/// A bare-bones HTTP/1.1 GET: `(status, body)`; status 0 (and the error
/// as the body) when the connection failed or was closed before an answer
/// (a server at its connection cap closes new ones at once).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = match tokio::net::TcpStream::connect(addr).await {
        Ok(stream) => stream,
        Err(e) => return (0, format!("connect: {e}")),
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if let Err(e) = stream.write_all(request.as_bytes()).await {
        return (0, format!("sending the request: {e}"));
    }
    let mut raw = Vec::new();
    if let Err(e) = stream.read_to_end(&mut raw).await {
        return (0, format!("reading the answer: {e}"));
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Messages ready in `queue`, by a passive declare on `channel` (one
/// already open, where nothing may stand between an action and the count).
pub async fn depth_on(channel: &Channel, queue: &str) -> u32 {
    order_timeout::testing::broker::peek_queue(channel, queue)
        .await
        .unwrap()
        .message_count()
}

/// One HTTP/1.1 request with `Host: host` (`Connection: close`):
/// `(status, head, body)`; status 0 when the connection failed.
pub async fn http_send(
    addr: std::net::SocketAddr,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return (0, String::new(), String::new());
    };
    let mut text = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if method == "POST" {
        text.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    for (k, v) in headers {
        text.push_str(&format!("{k}: {v}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    if stream.write_all(text.as_bytes()).await.is_err() {
        return (0, String::new(), String::new());
    }
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

/// The `csrf` value in a page's forms.
pub fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no csrf field in {page}"));
    let rest = &page[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}
