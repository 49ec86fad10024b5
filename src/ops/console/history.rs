//! The history of cancellations (`/console/history`): what the timers
//! flipped, newest first, read from what the service already records, the
//! outbox (`order_timeout_cancel_outbox`: one row per flip, with when, the
//! stock release and the event), so the history keeps what the outbox
//! keeps: finished rows for `[sweeper] outbox_retention`, rows whose work
//! is pending or given up until they are done.
//!
//! A page is at most [`MAX_LIMIT`] rows: per timer shown, one range of the
//! history index `(timer, created_at, order_id)` of at most that many rows
//! after the last row of the page before (keyset paging: `at`, `at_timer`,
//! `at_id` in the next link), merged newest first; then each shown row's
//! deadline is read from its order row, for its lateness. Never a scan of
//! the outbox, however long the retention. Page views take a turn of the
//! parked reads ([`super::parked::READS_AT_ONCE`]), so a flood of them
//! cannot take the database connections the service needs. Read-only, the
//! same for every visitor (ids, times and states; no bodies).

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::{DateTime, SecondsFormat, Utc};

use super::html::{Page, esc, time};
use super::{Console, failed};
use crate::settings::Release;
use crate::store::{HistoryCursor, HistoryRow, Store};

/// Rows shown by default.
const DEFAULT_LIMIT: u32 = 50;
/// Most rows one page shows.
const MAX_LIMIT: u32 = 200;

/// One row as the page shows it: its timer, the outbox row, and whether
/// the timer releases stock.
#[derive(Clone, Debug)]
struct Shown {
    timer: String,
    release: Release,
    row: HistoryRow,
}

/// What a history request asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Request {
    /// Only this timer's rows (`None`: every timer's).
    timer: Option<String>,
    /// Rows per page.
    limit: u32,
    /// After this row (`None`: the newest).
    cursor: Option<HistoryCursor>,
}

impl Request {
    /// The request in `query` (`timer`, `limit`, `at`, `at_timer`, `at_id`),
    /// or what is wrong with it.
    fn parse(query: Option<&str>) -> Result<Self, String> {
        let pairs: Vec<(String, String)> =
            url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let limit = get("limit")
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_LIMIT)
            .clamp(1, MAX_LIMIT);
        let cursor = match (get("at"), get("at_timer"), get("at_id")) {
            (Some(at), Some(timer), Some(order_id)) => Some(HistoryCursor {
                at: DateTime::parse_from_rfc3339(&at)
                    .map_err(|e| format!("at={at}: {e}"))?
                    .with_timezone(&Utc),
                timer,
                order_id,
            }),
            (None, None, None) => None,
            _ => return Err("a page's start needs at, at_timer and at_id together".into()),
        };
        Ok(Self {
            timer: get("timer"),
            limit,
            cursor,
        })
    }

    /// The query string of the page after `last`.
    fn next(&self, last: &Shown) -> String {
        let mut next = url::form_urlencoded::Serializer::new(String::new());
        if let Some(timer) = &self.timer {
            next.append_pair("timer", timer);
        }
        next.append_pair("limit", &self.limit.to_string());
        next.append_pair(
            "at",
            &last
                .row
                .outbox
                .created_at
                .to_rfc3339_opts(SecondsFormat::Micros, true),
        );
        next.append_pair("at_timer", &last.timer);
        next.append_pair("at_id", &last.row.order_id);
        next.finish()
    }
}

/// The history's order: newest first, then by timer and order id, each
/// descending (what the cursor and the statements assume).
fn newest_first(a: &Shown, b: &Shown) -> std::cmp::Ordering {
    (b.row.outbox.created_at, &b.timer, &b.row.order_id).cmp(&(
        a.row.outbox.created_at,
        &a.timer,
        &a.row.order_id,
    ))
}

/// Reads a page: `limit` rows after the cursor from each store, merged and
/// cut to `limit`; `true` when more may follow.
async fn read(stores: &[Store], request: &Request) -> Result<(Vec<Shown>, bool), String> {
    let mut rows = Vec::new();
    let mut more = false;
    for store in stores {
        let timer = store.timer();
        let read = store
            .history(request.cursor.as_ref(), request.limit)
            .await
            .map_err(|e| format!("timer {}: {e}", timer.name))?;
        more |= read.len() >= request.limit as usize;
        rows.extend(read.into_iter().map(|row| Shown {
            timer: timer.name.to_string(),
            release: timer.release,
            row,
        }));
    }
    rows.sort_by(newest_first);
    if rows.len() > request.limit as usize {
        rows.truncate(request.limit as usize);
        more = true;
    }
    Ok((rows, more))
}

/// `GET /console/history`: `timer`, `limit`, and the page's start (`at`,
/// `at_timer`, `at_id`, from the Next link).
pub(super) async fn page(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let access = console.access(&headers);
    let title = "History";
    let request = match Request::parse(query.as_deref()) {
        Ok(request) => request,
        Err(e) => return failed(&access, StatusCode::BAD_REQUEST, title, &e),
    };
    let stores: Vec<Store> = console
        .stores
        .iter()
        .filter(|s| {
            request
                .timer
                .as_deref()
                .is_none_or(|t| s.timer().name.as_str() == t)
        })
        .cloned()
        .collect();
    if let (Some(timer), true) = (&request.timer, stores.is_empty()) {
        let e = format!("no timer named {timer:?} in this service's settings");
        return failed(&access, StatusCode::NOT_FOUND, title, &e);
    }
    let read = match super::parked::read_turn(&console).await {
        Ok((_turn, _)) => read(&stores, &request).await,
        Err((_, e)) => Err(e),
    };
    let (rows, more) = match read {
        Ok(read) => read,
        Err(e) => return failed(&access, StatusCode::SERVICE_UNAVAILABLE, title, &e),
    };
    let mut body = String::new();
    intro(&mut body, &console, &request);
    rows_table(&mut body, &rows);
    if let (Some(last), true) = (rows.last(), more) {
        let _ = write!(
            body,
            "<p><a id=\"next\" href=\"/console/history?{}\">Next {} →</a></p>",
            esc(&request.next(last)),
            request.limit
        );
    }
    Page {
        title,
        access: &access,
        refresh: false,
        body,
    }
    .ok()
}

/// What the page shows and how long it is kept, and the timer filter.
fn intro(body: &mut String, console: &Console, request: &Request) {
    let sweeper = &console.sweeper;
    let kept = if sweeper.enabled {
        format!(
            "finished ones (stock released and event published) for <b>{}</b> after the flip \
             (<code>[sweeper] outbox_retention</code>: the sweeper deletes older outbox rows)",
            esc(&humantime::format_duration(sweeper.outbox_retention).to_string())
        )
    } else {
        "finished ones until the sweeper, which deletes them after \
         <code>[sweeper] outbox_retention</code>, runs (it is off here: they are kept)"
            .to_owned()
    };
    let _ = write!(
        body,
        "<p>What the timers flipped, newest first, from the outbox (one row per flip). \
         Kept as long as the outbox keeps them: {kept}; those whose stock release or event \
         is pending or given up are kept until done. Lateness is the flip's time minus the \
         deadline the order's row gives now.</p>"
    );
    body.push_str("<p>Timer: ");
    let chosen = request.timer.as_deref();
    let all = if chosen.is_none() {
        "<b>all</b>".to_owned()
    } else {
        "<a href=\"/console/history\">all</a>".to_owned()
    };
    body.push_str(&all);
    for store in console.stores.iter() {
        let name = store.timer().name.to_string();
        let mut link = url::form_urlencoded::Serializer::new(String::new());
        link.append_pair("timer", &name);
        if chosen == Some(name.as_str()) {
            let _ = write!(body, " · <b>{}</b>", esc(&name));
        } else {
            let _ = write!(
                body,
                " · <a href=\"/console/history?{}\">{}</a>",
                esc(&link.finish()),
                esc(&name)
            );
        }
    }
    body.push_str("</p>");
}

/// The rows, one per flip.
fn rows_table(body: &mut String, rows: &[Shown]) {
    if rows.is_empty() {
        body.push_str("<p class=\"muted\">Nothing flipped (or kept) here.</p>");
        return;
    }
    body.push_str(
        "<table id=\"history\"><tr><th>flipped at</th><th>order</th><th>timer</th>\
         <th>deadline</th><th>lateness</th><th>stock release</th><th>event</th></tr>",
    );
    for shown in rows {
        let row = &shown.row;
        let mut link = url::form_urlencoded::Serializer::new(String::new());
        link.append_pair("id", &row.order_id);
        let _ = write!(
            body,
            "<tr><td><time datetime=\"{}\">{}</time></td><td><a href=\"/console/order?{}\">{}</a></td><td>{}</td><td>{}</td>\
             <td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
            row.outbox
                .created_at
                .to_rfc3339_opts(SecondsFormat::Micros, true),
            time(Some(row.outbox.created_at)),
            esc(&link.finish()),
            esc(&row.order_id),
            esc(&shown.timer),
            time(row.deadline),
            lateness(row),
            esc(&release_state(row, shown.release)),
            if row.outbox.event_published_at.is_some() {
                "published"
            } else {
                "pending"
            },
        );
    }
    body.push_str("</table>");
}

/// The flip's lateness, in milliseconds (`–`: the deadline is unknown).
fn lateness(row: &HistoryRow) -> String {
    row.deadline.map_or_else(
        || "–".into(),
        |due| format!("{} ms", (row.outbox.created_at - due).num_milliseconds()),
    )
}

/// Where the row's stock release stands, in words.
fn release_state(row: &HistoryRow, release: Release) -> String {
    if release == Release::None {
        return "none (release = \"none\")".into();
    }
    let error = row
        .outbox
        .last_error
        .as_deref()
        .map(|e| format!(": {e}"))
        .unwrap_or_default();
    match (row.outbox.stock_released_at, row.outbox.gave_up_at) {
        (Some(at), _) => format!("released {}", time(Some(at))),
        (None, Some(at)) => format!("given up {}{error}", time(Some(at))),
        (None, None) if row.outbox.attempts == 0 => "pending".into(),
        (None, None) => format!(
            "pending, {} failed attempt{}{error}",
            row.outbox.attempts,
            if row.outbox.attempts == 1 { "" } else { "s" }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::OutboxFacts;

    fn row(id: &str, secs: i64) -> HistoryRow {
        HistoryRow {
            order_id: id.into(),
            outbox: OutboxFacts {
                created_at: DateTime::from_timestamp(secs, 0).unwrap(),
                stock_released_at: None,
                event_published_at: None,
                attempts: 0,
                last_error: None,
                next_attempt_at: None,
                gave_up_at: None,
            },
            deadline: None,
        }
    }

    fn shown(timer: &str, id: &str, secs: i64) -> Shown {
        Shown {
            timer: timer.into(),
            release: Release::Grpc,
            row: row(id, secs),
        }
    }

    #[test]
    fn rows_sort_newest_first_then_by_timer_and_id_descending() {
        let mut rows = [
            shown("a", "1", 10),
            shown("b", "1", 10),
            shown("a", "2", 10),
            shown("a", "9", 5),
            shown("a", "0", 20),
        ];
        rows.sort_by(newest_first);
        let order: Vec<(String, String)> = rows
            .iter()
            .map(|s| (s.timer.clone(), s.row.order_id.clone()))
            .collect();
        let want = [("a", "0"), ("b", "1"), ("a", "2"), ("a", "1"), ("a", "9")];
        assert_eq!(
            order,
            want.map(|(t, i)| (t.to_owned(), i.to_owned())).to_vec()
        );
    }

    #[test]
    fn the_next_link_starts_after_the_last_row_and_keeps_the_filter() {
        let request = Request {
            timer: Some("cancel_unpaid".into()),
            limit: 2,
            cursor: None,
        };
        let mut last = shown("cancel_unpaid", "a&b=c", 1_700_000_000);
        last.row.outbox.created_at += chrono::Duration::microseconds(123_456);
        let next = Request::parse(Some(&request.next(&last))).unwrap();
        assert_eq!(next.timer.as_deref(), Some("cancel_unpaid"));
        assert_eq!(next.limit, 2);
        let cursor = next.cursor.unwrap();
        assert_eq!(cursor.at, last.row.outbox.created_at, "to the microsecond");
        assert_eq!(cursor.order_id, "a&b=c");
        assert!(Request::parse(Some("at=2026-11-28T10:00:00Z")).is_err());
        assert_eq!(
            Request::parse(Some("limit=100000")).unwrap().limit,
            MAX_LIMIT
        );
    }

    #[test]
    fn release_states_in_words() {
        let mut r = row("1", 0);
        assert_eq!(release_state(&r, Release::Grpc), "pending");
        r.outbox.attempts = 2;
        r.outbox.last_error = Some("inventory down".into());
        assert_eq!(
            release_state(&r, Release::Grpc),
            "pending, 2 failed attempts: inventory down"
        );
        r.outbox.gave_up_at = Some(DateTime::from_timestamp(60, 0).unwrap());
        assert!(release_state(&r, Release::Grpc).starts_with("given up 1970-01-01 00:01:00 UTC"));
        r.outbox.stock_released_at = Some(DateTime::from_timestamp(0, 0).unwrap());
        assert_eq!(
            release_state(&r, Release::Grpc),
            "released 1970-01-01 00:00:00 UTC"
        );
        assert_eq!(
            release_state(&r, Release::None),
            "none (release = \"none\")"
        );
        r.deadline =
            Some(DateTime::from_timestamp(0, 0).unwrap() - chrono::Duration::milliseconds(25));
        assert_eq!(lateness(&r), "25 ms");
    }
}
