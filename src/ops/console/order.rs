//! One order, explained (`/console/order?id=ID`): what
//! `order-timeout explain ID` prints ([`crate::ops::explain`]), read-only,
//! the same for every visitor (no bodies: the parked messages appear by
//! id and reason, linked to their own pages).

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::html::{Page, esc};
use super::{Console, failed};
use crate::ops::explain;
use crate::store::Store;

/// `GET /console/order?id=ID`: the search box's answer.
pub(super) async fn page(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let access = console.access(&headers);
    let id = url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "id")
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_default();
    let mut body = search_box(&id);
    if id.is_empty() {
        return Page {
            title: "Explain an order",
            access: &access,
            refresh: false,
            body,
        }
        .ok();
    }
    let stores: Vec<Store> = console.stores.iter().cloned().collect();
    let Some(parked_store) = stores.first().cloned() else {
        return failed(
            &access,
            StatusCode::SERVICE_UNAVAILABLE,
            "Order",
            "this console has no database to read orders from",
        );
    };
    let Ok(_turn) = console.parked_reads.acquire().await else {
        return failed(&access, StatusCode::SERVICE_UNAVAILABLE, "Order", "closing");
    };
    let explanation = match explain::explain(&stores, &parked_store, &console.sweeper, &id).await {
        Ok(explanation) => explanation,
        Err(e) => {
            return failed(&access, StatusCode::BAD_REQUEST, "Order", &e.to_string());
        }
    };
    let _ = write!(body, "<h2>Order {}</h2><table>", esc(&explanation.order_id));
    for (label, text) in explanation.lines() {
        let text = match label.trim().strip_prefix('#') {
            Some(n) => format!("<a href=\"/console/parked/{}\">{}</a>", esc(n), esc(&text)),
            None => esc(&text),
        };
        let _ = write!(
            body,
            "<tr><th>{}</th><td>{text}</td></tr>",
            esc(label.trim())
        );
    }
    body.push_str(
        "</table><p class=\"muted\">Read now, on the database's clock; nothing was changed.</p>",
    );
    Page {
        title: "Order",
        access: &access,
        refresh: false,
        body,
    }
    .ok()
}

/// The form that asks for an order id.
pub(super) fn search_box(id: &str) -> String {
    format!(
        "<form method=\"get\" action=\"/console/order\"><p><label>Explain order \
         <input name=\"id\" value=\"{}\"></label> <button type=\"submit\">Explain</button></p></form>",
        esc(id)
    )
}
