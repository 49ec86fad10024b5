//! The parked queue in the console: the listing (one pass per page view,
//! as `parked list` does), and replay and purge of one message or a
//! selection, through the same functions as `parked replay|purge`: a
//! replayed message is acked from the parked queue only after its
//! republish is confirmed; a purge deletes exactly the messages chosen, and
//! asks first.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;

use super::auth::{self, Access};
use super::html::{Page, esc, secs, time};
use super::{Console, Form, failed, refused};
use crate::broker::parked::ParkedMessage;
use crate::ops::parked::{self, PurgePlan, Selection};

/// Messages shown by default (the pass still counts all of them).
const DEFAULT_LIMIT: usize = 100;
/// Most messages one page shows.
const MAX_LIMIT: usize = 1000;
/// Body characters shown before "more".
const BODY_PREVIEW: usize = 120;

/// The query of `GET /console/parked`: `limit`, and the outcome of the
/// action that redirected here (`replayed`/`deleted`, `kept`).
fn query_number(query: Option<&str>, name: &str) -> Option<usize> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
}

/// `GET /console/parked`.
pub(super) async fn page(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let access = console.access(&headers);
    let q = query.as_deref();
    let limit = query_number(q, "limit")
        .unwrap_or(DEFAULT_LIMIT)
        .min(MAX_LIMIT);
    let listing = console
        .parked_pass(async |conn| parked::list(conn, Some(limit)).await)
        .await;
    let listing = match listing {
        Ok(listing) => listing,
        Err(e) => {
            return failed(
                &access,
                StatusCode::SERVICE_UNAVAILABLE,
                "Parked messages",
                &e,
            );
        }
    };
    let mut body = notice(q);
    let _ = write!(
        body,
        "<p>{} parked message{} in order-timeout.parked{}.</p>",
        listing.total,
        if listing.total == 1 { "" } else { "s" },
        if listing.messages.len() < listing.total {
            format!(", the oldest {} shown", listing.messages.len())
        } else {
            String::new()
        }
    );
    if !listing.by_reason.is_empty() {
        body.push_str("<table><tr><th>reason</th><th>messages</th></tr>");
        for (reason, n) in &listing.by_reason {
            let _ = write!(
                body,
                "<tr><td>{}</td><td class=\"num\">{n}</td></tr>",
                esc(reason)
            );
        }
        body.push_str("</table>");
    }
    body.push_str(&write_hint(&access));
    messages_table(&mut body, &listing.messages, &access);
    Page {
        title: "Parked messages",
        access: &access,
        refresh: false,
        body,
    }
    .ok()
}

/// The result of the action that redirected here.
fn notice(query: Option<&str>) -> String {
    let kept = query_number(query, "kept").unwrap_or(0);
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    if let Some(n) = query_number(query, "replayed") {
        format!(
            "<p class=\"notice\">Replayed {n} parked message{} to order-timeout/schedule ({kept} left parked).</p>",
            plural(n)
        )
    } else if let Some(n) = query_number(query, "deleted") {
        format!(
            "<p class=\"notice\">Deleted {n} parked message{} ({kept} kept).</p>",
            plural(n)
        )
    } else if query_number(query, "none").is_some() {
        "<p class=\"notice\">Nothing was selected.</p>".into()
    } else {
        String::new()
    }
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

fn messages_table(body: &mut String, messages: &[ParkedMessage], access: &Access) {
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
        "<th>order id</th><th>reason</th><th>attempts</th><th>first failure</th>\
         <th>last failure</th><th>parked</th><th>body</th>",
    );
    if admin.is_some() {
        body.push_str("<th></th>");
    }
    body.push_str("</tr>");
    let now = Utc::now();
    for m in messages {
        row(body, m, admin.is_some(), now);
    }
    body.push_str("</table>");
    if admin.is_some() {
        body.push_str("</form>");
    }
}

fn row(body: &mut String, m: &ParkedMessage, admin: bool, now: chrono::DateTime<Utc>) {
    let key = esc(&m.key());
    body.push_str("<tr>");
    if admin {
        let _ = write!(
            body,
            "<td><input type=\"checkbox\" name=\"key\" value=\"{key}\" aria-label=\"select\"></td>"
        );
    }
    let (text, note) = match m.body_text() {
        Some(text) => (text.to_owned(), ""),
        None => (m.body_base64(), " (base64: not UTF-8)"),
    };
    let preview: String = text.chars().take(BODY_PREVIEW).collect();
    let body_cell = if preview.len() < text.len() {
        format!(
            "<details><summary><code>{}</code>…{note}</summary><pre>{}</pre></details>",
            esc(&preview),
            esc(&text)
        )
    } else {
        format!("<pre>{}</pre>{note}", esc(&text))
    };
    let _ = write!(
        body,
        "<td>{}</td><td><b>{}</b><br>{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td>\
         <td>{}<br><span class=\"muted\">{} ago</span></td><td>{body_cell}</td>",
        timer_note(m),
        esc(m.error_kind.as_deref().unwrap_or("–")),
        esc(m.error.as_deref().unwrap_or("")),
        m.attempts.map_or("–".into(), |a| a.to_string()),
        time(m.first_failure),
        time(m.last_failure),
        time(m.parked_at),
        m.age(now).map_or("–".into(), |d| secs(d.as_secs())),
    );
    if admin {
        let _ = write!(
            body,
            "<td><button type=\"submit\" name=\"only\" value=\"{key}\" formaction=\"/console/parked/replay\">Replay</button>\
             <button type=\"submit\" name=\"only\" value=\"{key}\" formaction=\"/console/parked/purge\">Purge…</button></td>"
        );
    }
    body.push_str("</tr>");
}

/// The messages a write form names: the row's button (`only`), else the
/// ticked boxes (`key`).
fn chosen(form: &Form) -> BTreeSet<String> {
    match form.get("only") {
        Some(one) => [one.to_owned()].into(),
        None => form.all("key").map(str::to_owned).collect(),
    }
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
    let keys = chosen(&form);
    if keys.is_empty() {
        return Redirect::to("/console/parked?none=1").into_response();
    }
    let selected = keys.len();
    let result = console
        .parked_pass(async |conn| parked::replay(conn, &Selection::Keys(keys)).await)
        .await;
    match result {
        Ok(report) => {
            tracing::info!(
                selected,
                replayed = report.replayed,
                kept = report.kept,
                "console: replayed parked messages"
            );
            Redirect::to(&format!(
                "/console/parked?replayed={}&kept={}",
                report.replayed, report.kept
            ))
            .into_response()
        }
        Err(e) => failed(&access, StatusCode::BAD_GATEWAY, "Replay failed", &e),
    }
}

/// `POST /console/parked/purge`: without `confirm=yes`, the question;
/// with it, the deletion.
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
    let keys = chosen(&form);
    if keys.is_empty() {
        return Redirect::to("/console/parked?none=1").into_response();
    }
    if form.get("confirm") != Some("yes") {
        return confirm_purge(&access, &keys);
    }
    let selected = keys.len();
    let result = console
        .parked_pass(async |conn| {
            PurgePlan::prepare(conn, &Selection::Keys(keys))
                .await?
                .commit()
                .await
        })
        .await;
    match result {
        Ok(report) => {
            tracing::info!(
                selected,
                deleted = report.deleted,
                kept = report.kept,
                "console: purged parked messages"
            );
            Redirect::to(&format!(
                "/console/parked?deleted={}&kept={}",
                report.deleted, report.kept
            ))
            .into_response()
        }
        Err(e) => failed(&access, StatusCode::BAD_GATEWAY, "Purge failed", &e),
    }
}

fn confirm_purge(access: &Access, keys: &BTreeSet<String>) -> Response {
    let Access::Admin { csrf } = access else {
        return refused(access, auth::Refusal::NotLoggedIn);
    };
    let mut body = format!(
        "<form method=\"post\" action=\"/console/parked/purge\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"confirm\" value=\"yes\">",
        esc(csrf)
    );
    for key in keys {
        let _ = write!(
            body,
            "<input type=\"hidden\" name=\"key\" value=\"{}\">",
            esc(key)
        );
    }
    let n = keys.len();
    let _ = write!(
        body,
        "<p>Delete {n} parked message{} for good? Messages parked since the page was shown are never deleted.</p>\
         <p><button type=\"submit\">Delete</button> <a href=\"/console/parked\">Cancel</a></p></form>",
        if n == 1 { "" } else { "s" }
    );
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
    let id = esc(m.order_id.as_deref().unwrap_or("–"));
    match m.timer.as_deref() {
        Some(timer) if timer != crate::settings::DEFAULT_TIMER => {
            format!("{id}<br><span class=\"muted\">timer {}</span>", esc(timer))
        }
        _ => id,
    }
}
