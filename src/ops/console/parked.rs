//! The parked messages in the console: the listing and one message's page,
//! read from the parked store (reading delivers nothing, however often),
//! and replay and purge of one message or a selection, through the same
//! functions as `parked replay|purge`: a replayed message is deleted from
//! the store only after its republish is confirmed; a purge deletes the
//! messages chosen that are still there, after asking with their count.
//!
//! Memory is bounded per request: a listing shows at most [`MAX_LIMIT`]
//! messages with the first [`EXCERPT_BYTES`] of each body, a message's
//! page the first [`PAGE_BODY_BYTES`] (the whole body is a download, at
//! most the store's 4 MiB), and at most [`READS_AT_ONCE`] such reads run at
//! once; more wait briefly, then get 503.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;

use super::auth::{self, Access};
use super::html::{Page, esc, secs, time};
use super::{Console, Form, failed, refused};
use crate::broker::parked::ParkedMessage;
use crate::ops::parked::{self, Listing, PurgePlan, Selection};
use crate::store::Store;

/// Messages shown by default.
const DEFAULT_LIMIT: u32 = 50;
/// Most messages one page shows.
const MAX_LIMIT: u32 = 200;
/// Body bytes a listing shows of each message.
pub(super) const EXCERPT_BYTES: usize = 1024;
/// Body bytes a message's page shows; the rest is a download.
pub(super) const PAGE_BODY_BYTES: usize = 64 * 1024;
/// Parked reads (listings, message pages, downloads) served at once.
pub(super) const READS_AT_ONCE: usize = 4;
/// How long a read waits for its turn before it is refused with 503.
const READ_WAIT: Duration = Duration::from_secs(5);

/// A value of the page's query string.
fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
}

/// The store the parked messages are kept in (the default timer's
/// database), or why there is none.
fn store_of(console: &Console) -> Result<Store, String> {
    console
        .own_tables()
        .cloned()
        .ok_or_else(|| "this console has no database to read parked messages from".to_owned())
}

/// A turn to read the parked store: one of the [`READS_AT_ONCE`], if one
/// is free within [`READ_WAIT`], and the store.
pub(super) async fn read_turn(
    console: &Console,
) -> Result<(tokio::sync::SemaphorePermit<'_>, Store), (StatusCode, String)> {
    let store = store_of(console).map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e))?;
    match tokio::time::timeout(READ_WAIT, console.parked_reads.acquire()).await {
        Ok(Ok(turn)) => Ok((turn, store)),
        _ => Err((
            StatusCode::SERVICE_UNAVAILABLE,
            "busy: too many parked reads at once; try again".to_owned(),
        )),
    }
}

/// The parked message `id`, read in a turn.
async fn read_one(
    console: &Console,
    id: i64,
) -> Result<Option<ParkedMessage>, (StatusCode, String)> {
    let (_turn, store) = read_turn(console).await?;
    parked::show(&store, id)
        .await
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
}

/// `GET /console/parked`: `after` (a message id: the next page), `limit`,
/// `reason`, `order_id`.
pub(super) async fn page(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let access = console.access(&headers);
    let q = query.as_deref();
    let limit = query_value(q, "limit")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_LIMIT)
        .clamp(1, MAX_LIMIT);
    let after = query_value(q, "after")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let selection = match (query_value(q, "order_id"), query_value(q, "reason")) {
        (Some(id), _) => Selection::OrderId(id),
        (None, Some(kind)) => Selection::Reason(kind),
        (None, None) => Selection::All,
    };
    let request = parked::Page {
        selection: selection.clone(),
        after,
        limit,
        excerpt: Some(EXCERPT_BYTES),
    };
    let listing = match read_turn(&console).await {
        Ok((_turn, store)) => parked::list(&store, &request)
            .await
            .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
        Err(e) => Err(e),
    };
    let listing = match listing {
        Ok(listing) => listing,
        Err((status, e)) => return failed(&access, status, "Parked messages", &e),
    };
    let mut body = String::new();
    summary(&mut body, &listing, &selection);
    body.push_str(&write_hint(&access));
    let bodies = console.may_see_bodies(&access);
    if !bodies {
        body.push_str(HIDDEN);
    }
    messages_table(&mut body, &listing.messages, &access, bodies);
    body.push_str(&next_link(&listing, limit, &selection));
    Page {
        title: "Parked messages",
        access: &access,
        refresh: false,
        body,
    }
    .ok()
}

/// The link to the next page, when this one is full.
fn next_link(listing: &Listing, limit: u32, selection: &Selection) -> String {
    let Some(last) = listing.messages.last().and_then(|m| m.id) else {
        return String::new();
    };
    if listing.messages.len() < limit as usize {
        return String::new();
    }
    let mut next = url::form_urlencoded::Serializer::new(String::new());
    next.append_pair("after", &last.to_string());
    next.append_pair("limit", &limit.to_string());
    match selection {
        Selection::OrderId(id) => drop(next.append_pair("order_id", id)),
        Selection::Reason(kind) => drop(next.append_pair("reason", kind)),
        _ => {}
    }
    format!(
        "<p><a href=\"/console/parked?{}\">Next {limit} →</a></p>",
        esc(&next.finish())
    )
}

/// How many are parked, by reason, and the search box.
fn summary(body: &mut String, listing: &Listing, selection: &Selection) {
    let _ = write!(
        body,
        "<p>{} parked message{} kept (oldest first; reading them changes nothing).</p>",
        listing.total,
        if listing.total == 1 { "" } else { "s" },
    );
    if !listing.by_reason.is_empty() {
        body.push_str("<table><tr><th>reason</th><th>messages</th></tr>");
        for (reason, n) in &listing.by_reason {
            let mut link = url::form_urlencoded::Serializer::new(String::new());
            link.append_pair("reason", reason);
            let _ = write!(
                body,
                "<tr><td><a href=\"/console/parked?{}\">{}</a></td><td class=\"num\">{n}</td></tr>",
                esc(&link.finish()),
                esc(reason)
            );
        }
        body.push_str("</table>");
    }
    let shown = match selection {
        Selection::OrderId(id) => id.clone(),
        _ => String::new(),
    };
    body.push_str(&super::order::search_box(""));
    let _ = write!(
        body,
        "<form method=\"get\" action=\"/console/parked\"><p><label>Order id \
         <input name=\"order_id\" value=\"{}\"></label> <button type=\"submit\">Find</button> \
         <a href=\"/console/parked\">All</a></p></form>",
        esc(&shown)
    );
}

fn write_hint(access: &Access) -> String {
    match access {
        Access::ReadOnly => "<p class=\"muted\">Read-only: ADMIN_TOKEN is not set. \
             <code>order-timeout parked replay|purge</code> work as always.</p>"
            .into(),
        Access::LoggedOut => "<p class=\"muted\"><a href=\"/console/login\">Log in</a> \
             to replay or purge.</p>"
            .into(),
        Access::Admin { .. } => "<p class=\"muted\">Replay republishes to order-timeout/schedule \
             with a fresh attempt budget (fix the cause first); purge deletes, after asking.</p>"
            .into(),
    }
}

/// What a visitor who may not read bodies is told.
const HIDDEN: &str = "<p class=\"muted\">Message bodies are shown to a logged-in operator \
     (or to everyone with <code>[http] public_bodies = true</code>).</p>";

fn messages_table(body: &mut String, messages: &[ParkedMessage], access: &Access, bodies: bool) {
    let admin = match access {
        Access::Admin { csrf } => Some(csrf.as_str()),
        _ => None,
    };
    if let Some(csrf) = admin {
        let _ = write!(
            body,
            "<form method=\"post\" action=\"/console/parked/replay\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <p><button type=\"submit\" formaction=\"/console/parked/replay\">Replay selected</button>\
             <button type=\"submit\" formaction=\"/console/parked/purge\">Purge selected…</button></p>",
            esc(csrf)
        );
    }
    body.push_str("<table><tr>");
    if admin.is_some() {
        body.push_str("<th></th>");
    }
    body.push_str(
        "<th>id</th><th>order id</th><th>reason</th><th>attempts</th><th>first failure</th>\
         <th>last failure</th><th>parked</th><th>body</th>",
    );
    if admin.is_some() {
        body.push_str("<th></th>");
    }
    body.push_str("</tr>");
    let now = Utc::now();
    for m in messages {
        row(body, m, admin.is_some(), bodies, now);
    }
    body.push_str("</table>");
    if admin.is_some() {
        body.push_str("</form>");
    }
}

/// The body as text, or base64 with a note when it is not UTF-8; the first
/// `max` bytes of it and whether more follow.
fn body_text(m: &ParkedMessage, max: usize) -> (String, &'static str, bool) {
    let shown = &m.body[..m.body.len().min(max)];
    let more = shown.len() as u64 > 0 && (shown.len() as u64) < m.body_size;
    match std::str::from_utf8(shown) {
        Ok(text) => (text.to_owned(), "", more),
        // Cut inside a character: the valid part.
        Err(e) if e.error_len().is_none() => (
            String::from_utf8_lossy(&shown[..e.valid_up_to()]).into_owned(),
            "",
            true,
        ),
        Err(_) => {
            use base64::Engine as _;
            (
                base64::engine::general_purpose::STANDARD.encode(shown),
                " (base64: not UTF-8)",
                more,
            )
        }
    }
}

fn row(
    body: &mut String,
    m: &ParkedMessage,
    admin: bool,
    bodies: bool,
    now: chrono::DateTime<Utc>,
) {
    let id = m.id.unwrap_or_default();
    body.push_str("<tr>");
    if admin {
        let _ = write!(
            body,
            "<td><input type=\"checkbox\" name=\"id\" value=\"{id}\" aria-label=\"select\"></td>"
        );
    }
    let (text, note, more) = if bodies {
        body_text(m, EXCERPT_BYTES)
    } else {
        (format!("({} bytes)", m.body_size), "", false)
    };
    let more = if bodies && (more || m.body_size > EXCERPT_BYTES as u64) {
        format!(
            " <a href=\"/console/parked/{id}\">… all {} bytes</a>",
            m.body_size
        )
    } else {
        String::new()
    };
    let _ = write!(
        body,
        "<td><a href=\"/console/parked/{id}\">{id}</a></td><td>{}</td><td><b>{}</b><br>{}</td>\
         <td class=\"num\">{}</td><td>{}</td><td>{}</td>\
         <td>{}<br><span class=\"muted\">{} ago</span></td><td><pre>{}</pre>{note}{more}</td>",
        timer_note(m),
        esc(m.error_kind.as_deref().unwrap_or("–")),
        esc(m.error.as_deref().unwrap_or("")),
        m.attempts.map_or("–".into(), |a| a.to_string()),
        time(m.first_failure),
        time(m.last_failure),
        time(m.parked_at),
        m.age(now).map_or("–".into(), |d| secs(d.as_secs())),
        esc(&text),
    );
    if admin {
        let _ = write!(
            body,
            "<td><button type=\"submit\" name=\"only\" value=\"{id}\" formaction=\"/console/parked/replay\">Replay</button>\
             <button type=\"submit\" name=\"only\" value=\"{id}\" formaction=\"/console/parked/purge\">Purge…</button></td>"
        );
    }
    body.push_str("</tr>");
}

/// `GET /console/parked/{id}`: one message, with the first
/// [`PAGE_BODY_BYTES`] of its body and a link to download all of it.
pub(super) async fn message(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Response {
    let access = console.access(&headers);
    let m = match read_one(&console, id).await {
        Ok(Some(m)) => m,
        Ok(None) => {
            return failed(
                &access,
                StatusCode::NOT_FOUND,
                "Parked message",
                &format!("no parked message {id} (replayed or purged?)"),
            );
        }
        Err((status, e)) => return failed(&access, status, "Parked message", &e),
    };
    let mut body = fields_table(&m);
    if !console.may_see_bodies(&access) {
        body.push_str(HIDDEN);
        body.push_str("<p><a href=\"/console/parked\">Back to the parked messages</a></p>");
        return Page {
            title: "Parked message",
            access: &access,
            refresh: false,
            body,
        }
        .ok();
    }
    let (text, note, _) = body_text(&m, PAGE_BODY_BYTES);
    let _ = write!(body, "<h2>Body{note}</h2><pre>{}</pre>", esc(&text));
    let kept = m.body.len();
    let _ = write!(
        body,
        "<p>{} of {} bytes shown{}. <a href=\"/console/parked/{id}/body\">Download the body as kept ({kept} bytes)</a>.</p>\
         <p><a href=\"/console/parked\">Back to the parked messages</a></p>",
        text.len().min(kept),
        m.body_size,
        if m.body_is_whole() {
            ""
        } else {
            "; the store keeps only the first 4 MiB of this body"
        },
    );
    Page {
        title: "Parked message",
        access: &access,
        refresh: false,
        body,
    }
    .ok()
}

/// Every field of a message but its body, as a table.
fn fields_table(m: &ParkedMessage) -> String {
    let mut table = String::from("<table>");
    let json = serde_json::to_value(m.to_json(Utc::now())).unwrap_or_default();
    if let serde_json::Value::Object(fields) = json {
        for (name, value) in fields {
            if matches!(name.as_str(), "body" | "body_base64") || value.is_null() {
                continue;
            }
            let text = match value {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            let _ = write!(
                table,
                "<tr><th>{}</th><td>{}</td></tr>",
                esc(&name),
                esc(&text)
            );
        }
    }
    table.push_str("</table>");
    table
}

/// `GET /console/parked/{id}/body`: the body as kept, as a download (never
/// rendered by the browser).
pub(super) async fn download(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Response {
    let access = console.access(&headers);
    if !console.may_see_bodies(&access) {
        return failed(
            &access,
            StatusCode::FORBIDDEN,
            "Parked message",
            "message bodies are shown to a logged-in operator (or to everyone with [http] public_bodies = true)",
        );
    }
    match read_one(&console, id).await {
        Ok(Some(m)) => {
            let mut response = m.body.into_response();
            let h = response.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            if let Ok(v) =
                HeaderValue::from_str(&format!("attachment; filename=\"parked-{id}.body\""))
            {
                h.insert(header::CONTENT_DISPOSITION, v);
            }
            response
        }
        Ok(None) => failed(
            &access,
            StatusCode::NOT_FOUND,
            "Parked message",
            &format!("no parked message {id}"),
        ),
        Err((status, e)) => failed(&access, status, "Parked message", &e),
    }
}

/// The messages a write form names: the row's button (`only`), else the
/// ticked boxes (`id`). Anything that is not a message id is ignored.
fn chosen(form: &Form) -> Vec<i64> {
    let mut ids: Vec<i64> = match form.get("only") {
        Some(one) => one.parse().into_iter().collect(),
        None => form.all("id").filter_map(|v| v.parse().ok()).collect(),
    };
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// What a write action did, on a page of its own (not in the address, so a
/// link cannot show a made-up outcome).
fn outcome(access: &Access, title: &str, text: String) -> Response {
    Page {
        title,
        access,
        refresh: false,
        body: format!(
            "<p class=\"notice\">{}</p><p><a href=\"/console/parked\">Back to the parked messages</a></p>",
            esc(&text)
        ),
    }
    .ok()
}

/// `POST /console/parked/replay`.
pub(super) async fn replay(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let access = console.access(&headers);
    let form = Form::parse(&body);
    if let Err(refusal) = auth::authorize_write(console.admin.as_ref(), &headers, form.get("csrf"))
    {
        return refused(&access, refusal);
    }
    let ids = chosen(&form);
    if ids.is_empty() {
        return outcome(&access, "Replay", "Nothing was selected.".into());
    }
    let store = match store_of(&console) {
        Ok(store) => store,
        Err(e) => {
            return failed(
                &access,
                StatusCode::SERVICE_UNAVAILABLE,
                "Replay failed",
                &e,
            );
        }
    };
    let selected = ids.len();
    let result = console
        .parked_write(async |conn| parked::replay(conn, &store, &Selection::Ids(ids)).await)
        .await;
    match result {
        Ok(report) => {
            tracing::info!(
                selected,
                replayed = report.replayed,
                kept = report.kept,
                "console: replayed parked messages"
            );
            let plural = if report.replayed == 1 { "" } else { "s" };
            let cut = if report.cut > 0 {
                format!(
                    " {} kept parked: the store keeps only the first bytes of their body.",
                    report.cut
                )
            } else {
                String::new()
            };
            outcome(
                &access,
                "Replay",
                format!(
                    "Replayed {} parked message{plural} to order-timeout/schedule ({} left parked).{cut}",
                    report.replayed, report.kept
                ),
            )
        }
        Err(e) => failed(&access, StatusCode::BAD_GATEWAY, "Replay failed", &e),
    }
}

/// `POST /console/parked/purge`: without `confirm=yes`, the question with
/// the number of chosen messages still parked; with it, the deletion.
pub(super) async fn purge(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let access = console.access(&headers);
    let form = Form::parse(&body);
    if let Err(refusal) = auth::authorize_write(console.admin.as_ref(), &headers, form.get("csrf"))
    {
        return refused(&access, refusal);
    }
    let ids = chosen(&form);
    if ids.is_empty() {
        return outcome(&access, "Purge", "Nothing was selected.".into());
    }
    let store = match store_of(&console) {
        Ok(store) => store,
        Err(e) => return failed(&access, StatusCode::SERVICE_UNAVAILABLE, "Purge failed", &e),
    };
    let plan = match PurgePlan::prepare(&store, &Selection::Ids(ids)).await {
        Ok(plan) => plan,
        Err(e) => {
            return failed(
                &access,
                StatusCode::BAD_GATEWAY,
                "Purge failed",
                &e.to_string(),
            );
        }
    };
    if form.get("confirm") != Some("yes") {
        return confirm_purge(&access, &plan);
    }
    let selected = plan.selected();
    match plan.commit().await {
        Ok(report) => {
            tracing::info!(
                selected,
                deleted = report.deleted,
                kept = report.kept,
                "console: purged parked messages"
            );
            let plural = if report.deleted == 1 { "" } else { "s" };
            outcome(
                &access,
                "Purge",
                format!(
                    "Deleted {} parked message{plural} ({} kept).",
                    report.deleted, report.kept
                ),
            )
        }
        Err(e) => failed(
            &access,
            StatusCode::BAD_GATEWAY,
            "Purge failed",
            &e.to_string(),
        ),
    }
}

fn confirm_purge(access: &Access, plan: &PurgePlan) -> Response {
    let Access::Admin { csrf } = access else {
        return refused(access, auth::Refusal::NotLoggedIn);
    };
    let mut body = format!(
        "<form method=\"post\" action=\"/console/parked/purge\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"confirm\" value=\"yes\">",
        esc(csrf)
    );
    for id in plan.ids() {
        let _ = write!(body, "<input type=\"hidden\" name=\"id\" value=\"{id}\">");
    }
    let n = plan.selected();
    if n == 0 {
        body =
            "<p>None of the chosen messages is parked any more (replayed or purged meanwhile).</p>\
                <p><a href=\"/console/parked\">Back to the parked messages</a></p>"
                .into();
    } else {
        let _ = write!(
            body,
            "<p>Delete {n} parked message{} for good?</p>\
             <p><button type=\"submit\">Delete</button> <a href=\"/console/parked\">Cancel</a></p></form>",
            if n == 1 { "" } else { "s" }
        );
    }
    Page {
        title: "Purge parked messages",
        access,
        refresh: false,
        body,
    }
    .ok()
}

/// The order id, and the timer under it when it is not the default one.
fn timer_note(m: &ParkedMessage) -> String {
    let id = match m.order_id.as_deref() {
        Some(id) => {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            query.append_pair("id", id);
            format!(
                "<a href=\"/console/order?{}\">{}</a>",
                esc(&query.finish()),
                esc(id)
            )
        }
        None => "–".to_owned(),
    };
    match m.timer.as_deref() {
        Some(timer) if timer != crate::settings::DEFAULT_TIMER => {
            format!("{id}<br><span class=\"muted\">timer {}</span>", esc(timer))
        }
        _ => id,
    }
}
