//! What a partition run measured ([`Figures`]), from the orders' rows (the
//! database's clock), the inventory's release records and the service's
//! `/readyz` polled through the run.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Peer;

/// The prefix of the run's order ids.
const PREFIX: &str = "PART";

/// Order `i`'s id.
pub(super) fn order_id(i: usize) -> String {
    format!("{PREFIX}{i:05}")
}

/// When the peer was cut and healed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    pub(super) peer: Peer,
    pub(super) cut_at: DateTime<Utc>,
    pub(super) healed_at: DateTime<Utc>,
}

/// Lateness of a group of orders.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Group {
    /// Orders in the group.
    pub orders: usize,
    /// 99th percentile lateness, seconds.
    pub p99_s: f64,
    /// Worst lateness, seconds.
    pub max_s: f64,
}

impl Group {
    fn of(mut late_s: Vec<f64>) -> Self {
        late_s.sort_by(f64::total_cmp);
        let p99 = late_s
            .get(((late_s.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0.0);
        Self {
            orders: late_s.len(),
            p99_s: p99,
            max_s: late_s.last().copied().unwrap_or(0.0),
        }
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} orders, p99 {:.2} s, max {:.2} s late",
            self.orders, self.p99_s, self.max_s
        )
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Figures {
    /// The peer cut off.
    pub peer: Peer,
    /// How long it was cut off, seconds.
    pub cut_s: f64,
    /// Orders in the run.
    pub orders: usize,
    /// Orders not cancelled (must be 0).
    pub lost: usize,
    /// Orders cancelled before their deadline (must be 0).
    pub early: usize,
    /// Stock released too much (+) or too little (-), in units (must be 0:
    /// every release done exactly once in effect).
    pub stock_off: i64,
    /// Orders due before the cut.
    pub before: Group,
    /// Orders due while the peer was cut off.
    pub during: Group,
    /// Orders due after the heal.
    pub after: Group,
    /// Broker sessions the service re-established during the run.
    pub reconnects: u64,
    /// Seconds from the cut until `/readyz` said not ready (`None`: it
    /// never did).
    pub unready_after_cut_s: Option<f64>,
    /// Seconds from the heal until `/readyz` said ready again after it
    /// had gone red (negative: ready again before the heal, on another
    /// broker node).
    pub ready_after_heal_s: Option<f64>,
    /// Seconds from the heal until the first cancellation after it.
    pub cancelling_after_heal_s: Option<f64>,
    /// Seconds from the heal until the last stock release (of the orders
    /// cancelled before the heal); negative when all were done before.
    pub last_release_after_heal_s: Option<f64>,
    /// The broker run: each node's own view a few seconds before the heal
    /// (`scripts/rabbitmq-cluster.sh status` lines).
    pub cluster_view: Option<String>,
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |v: Option<f64>| v.map_or("never".to_owned(), |v| format!("{v:.1} s"));
        writeln!(
            f,
            "partition of the {:?}, cut {:.1} s: {} orders, {} lost, {} early, stock off by {}",
            self.peer, self.cut_s, self.orders, self.lost, self.early, self.stock_off
        )?;
        writeln!(f, "  due before the cut: {}", self.before)?;
        writeln!(f, "  due during the cut: {}", self.during)?;
        writeln!(f, "  due after the heal: {}", self.after)?;
        writeln!(
            f,
            "  readiness: red {} after the cut, green {} after the heal; {} broker reconnects",
            s(self.unready_after_cut_s),
            s(self.ready_after_heal_s),
            self.reconnects
        )?;
        write!(
            f,
            "  first cancellation {} after the heal; last stock release {} after the heal",
            s(self.cancelling_after_heal_s),
            s(self.last_release_after_heal_s)
        )?;
        if let Some(view) = &self.cluster_view {
            write!(f, "\n  the nodes' views before the heal:")?;
            for line in view.lines() {
                write!(f, "\n    {line}")?;
            }
        }
        Ok(())
    }
}

/// Orders cancelled whose stock release is recorded.
pub(super) async fn settled(shop: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM orders o JOIN inventory.releases r ON r.order_id = o.id \
         WHERE starts_with(o.id, $1) AND o.status = 'CANCELLED'",
    )
    .bind(PREFIX)
    .fetch_one(shop)
    .await
}

fn seconds(d: chrono::Duration) -> f64 {
    d.num_milliseconds() as f64 / 1000.0
}

impl Figures {
    /// Reads the figures of the run's orders.
    pub(super) async fn measure(
        shop: &PgPool,
        window: Window,
        orders: usize,
        readiness: Changes,
        reconnects: u64,
    ) -> anyhow::Result<Self> {
        type Row = (DateTime<Utc>, Option<DateTime<Utc>>, Option<DateTime<Utc>>);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT o.expires_at, o.cancelled_at, r.released_at FROM orders o \
             LEFT JOIN inventory.releases r ON r.order_id = o.id \
             WHERE starts_with(o.id, $1) AND o.status = 'CANCELLED'",
        )
        .bind(PREFIX)
        .fetch_all(shop)
        .await?;
        let (cut, heal) = (window.cut_at, window.healed_at);
        let late = |lo: Option<DateTime<Utc>>, hi: Option<DateTime<Utc>>| {
            Group::of(
                rows.iter()
                    .filter(|(due, _, _)| {
                        lo.is_none_or(|lo| *due >= lo) && hi.is_none_or(|hi| *due < hi)
                    })
                    .filter_map(|(due, done, _)| done.map(|done| seconds(done - *due)))
                    .collect(),
            )
        };
        let after_heal = |t: &DateTime<Utc>| (*t >= heal).then(|| seconds(*t - heal));
        let red = readiness
            .iter()
            .find(|(t, up)| !up && *t >= cut)
            .map(|(t, _)| *t);
        Ok(Self {
            peer: window.peer,
            cut_s: seconds(heal - cut),
            orders,
            reconnects,
            lost: orders.saturating_sub(rows.len()),
            early: rows
                .iter()
                .filter(|(due, done, _)| done.is_some_and(|d| d < *due))
                .count(),
            stock_off: stock_off(shop).await?,
            before: late(None, Some(cut)),
            during: late(Some(cut), Some(heal)),
            after: late(Some(heal), None),
            unready_after_cut_s: red.map(|t| seconds(t - cut)),
            ready_after_heal_s: red
                .and_then(|red| readiness.iter().find(|(t, up)| *up && *t > red))
                .map(|(t, _)| seconds(*t - heal)),
            cancelling_after_heal_s: rows
                .iter()
                .filter_map(|(_, done, _)| done.as_ref().and_then(after_heal))
                .min_by(f64::total_cmp),
            last_release_after_heal_s: rows
                .iter()
                .filter(|(_, done, _)| done.is_some_and(|d| d < heal))
                .filter_map(|(_, _, released)| released.map(|r| seconds(r - heal)))
                .max_by(f64::total_cmp),
            cluster_view: None,
        })
    }
}

/// The stock now less what it would be with every cancelled order's
/// items released exactly once.
async fn stock_off(shop: &PgPool) -> Result<i64, sqlx::Error> {
    let (now, expected): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT coalesce(sum(available), 0)::bigint FROM inventory.stock WHERE starts_with(sku, 'PART-SKU-')), \
                $2 + (SELECT coalesce(sum(i.quantity), 0)::bigint FROM order_items i JOIN orders o ON o.id = i.order_id \
                       WHERE starts_with(o.id, $1) AND o.status = 'CANCELLED')",
    )
    .bind(PREFIX)
    .bind(super::STOCK * super::SKUS as i64)
    .fetch_one(shop)
    .await?;
    Ok(now - expected)
}

/// `/readyz`'s answers as they changed: when, and ready or not.
type Changes = Vec<(DateTime<Utc>, bool)>;

/// `/readyz` polled every 250 ms through a run: its answers as they
/// changed.
pub(super) struct Readiness {
    seen: Arc<Mutex<Changes>>,
    task: tokio::task::JoinHandle<()>,
}

impl Readiness {
    /// Starts polling the service at `addr`.
    pub(super) fn watch(addr: std::net::SocketAddr) -> Self {
        let seen: Arc<Mutex<Changes>> = Arc::default();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let url = format!("http://{addr}/readyz");
            loop {
                let up = http_status(&url).await == Some(200);
                let now = Utc::now();
                {
                    let mut seen = record.lock().unwrap();
                    if seen.last().is_none_or(|(_, last)| *last != up) {
                        seen.push((now, up));
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Self { seen, task }
    }

    /// Stops polling; the changes seen.
    pub(super) fn stop(self) -> Changes {
        self.task.abort();
        self.seen.lock().unwrap().clone()
    }
}

/// The status of a bare HTTP/1.1 GET of `url` (`http://host:port/path`),
/// within 10 s; `None` when there was no answer.
pub(super) async fn http_status(url: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/')?;
    let get = async {
        let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
        let request =
            format!("GET /{path} HTTP/1.1\r\nHost: partition\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        String::from_utf8_lossy(&raw)
            .split(' ')
            .nth(1)?
            .parse()
            .ok()
    };
    tokio::time::timeout(Duration::from_secs(10), get)
        .await
        .ok()
        .flatten()
}
