//! The web console on `HTTP_ADDR`, beside `/metrics`: what waits, what
//! happened in the last minutes, the parked queue with replay and purge,
//! and the rows set aside (`/console`, `/console/pending`,
//! `/console/parked`, `/console/set-aside`).
//!
//! Server-rendered HTML, no script, no external resource ([`html`]). Pages
//! read what the service already knows (its metrics, readiness and the
//! latest [`PendingReport`](super::pending::PendingReport)); the parked
//! pages read the parked store, and a replay talks to the broker on a
//! connection of its own, doing exactly what `order-timeout parked …` does
//! ([`super::parked`]). Read-only unless `ADMIN_TOKEN` is set; then the
//! write actions need a login and a CSRF token ([`auth`]).
//!
//! It lives with the operator tooling it calls; `app` hands its router to
//! the HTTP server (`observe::http`), which knows nothing about it.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use self::auth::{Access, Admin, Refusal};
use self::html::{Page, esc};
use super::pending::PendingBoard;
use crate::observe::http::Health;
use crate::observe::metrics::Metrics;
use crate::observe::recent::Recent;
use crate::settings::{SecretUrl, Settings};
use crate::store::{SetAsideRow, Stores};

mod auth;
mod charts;
mod html;
mod parked;
mod views;

/// What the console reads and acts on.
pub struct Console {
    amqp_url: SecretUrl,
    admin: Option<Admin>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    recent: Arc<Recent>,
    board: Arc<PendingBoard>,
    /// The timers' stores: the rows set aside are read from them.
    stores: Stores,
    /// The rows set aside per timer as last read, and when: one read per
    /// [`SET_ASIDE_FRESH`] whatever the traffic, so that page views cannot
    /// take the connections the service's own tables need.
    set_aside: tokio::sync::Mutex<SetAsideCache>,
    /// One replay at a time from this console (reads never wait for it).
    writes: tokio::sync::Mutex<()>,
    /// Turns for the reads of the parked store (`parked::READS_AT_ONCE`),
    /// which bound the memory parked pages take.
    parked_reads: tokio::sync::Semaphore,
}

impl Console {
    /// A console for the service of `settings`, reading its readiness,
    /// metrics, their recent history and the pending board.
    pub fn new(
        settings: &Settings,
        health: Arc<Health>,
        metrics: Arc<Metrics>,
        recent: Arc<Recent>,
        board: Arc<PendingBoard>,
    ) -> Self {
        Self {
            amqp_url: settings.amqp_url.clone(),
            admin: settings.admin_token.clone().map(Admin::new),
            health,
            metrics,
            recent,
            board,
            stores: Stores::new(Vec::new()),
            set_aside: tokio::sync::Mutex::new(None),
            writes: tokio::sync::Mutex::new(()),
            parked_reads: tokio::sync::Semaphore::new(parked::READS_AT_ONCE),
        }
    }

    /// This console, reading the rows set aside of the timers of `stores`.
    pub(crate) fn with_stores(mut self, stores: Stores) -> Self {
        self.stores = stores;
        self
    }

    /// The rows set aside of every timer (the oldest `limit` each), read
    /// at most once per [`SET_ASIDE_FRESH`].
    async fn set_aside_rows(&self, limit: u32) -> Vec<(String, Result<Vec<SetAsideRow>, String>)> {
        let mut cache = self.set_aside.lock().await;
        if let Some((at, rows)) = cache.as_ref()
            && at.elapsed() < SET_ASIDE_FRESH
        {
            return rows.clone();
        }
        let mut rows = Vec::new();
        for store in self.stores.iter() {
            let read = store.set_aside_rows(limit).await.map_err(|e| e.to_string());
            rows.push((store.timer().name.to_string(), read));
        }
        *cache = Some((std::time::Instant::now(), rows.clone()));
        rows
    }

    fn access(&self, headers: &HeaderMap) -> Access {
        auth::access(self.admin.as_ref(), headers)
    }

    /// A broker connection for one page view or action.
    async fn connect(&self) -> Result<lapin::Connection, String> {
        crate::broker::connect_amqp(&self.amqp_url, "order-timeout-console")
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.amqp_url))
    }

    /// Runs `work` (a replay) on a broker connection of its own, one at a
    /// time, and closes the connection afterwards.
    async fn parked_write<T, E: std::fmt::Display>(
        &self,
        work: impl AsyncFnOnce(&lapin::Connection) -> Result<T, E>,
    ) -> Result<T, String> {
        let _one_at_a_time = self.writes.lock().await;
        let conn = self.connect().await?;
        let result = work(&conn).await;
        crate::broker::close_quietly(&conn).await;
        result.map_err(|e| e.to_string())
    }
}

/// How long the console shows the rows set aside as read before reading
/// them again.
const SET_ASIDE_FRESH: Duration = Duration::from_secs(5);

/// The rows set aside per timer, and when they were read.
type SetAsideCache = Option<(
    std::time::Instant,
    Vec<(String, Result<Vec<SetAsideRow>, String>)>,
)>;

/// The console's routes, to merge into the HTTP server's.
pub fn router(console: Console) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/console") }))
        .route("/console", get(views::overview))
        .route("/console/pending", get(views::pending))
        .route("/console/parked", get(parked::page))
        .route("/console/parked/{id}", get(parked::message))
        .route("/console/parked/{id}/body", get(parked::download))
        .route("/console/set-aside", get(views::set_aside))
        .route("/console/parked/replay", post(parked::replay))
        .route("/console/parked/purge", post(parked::purge))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .with_state(Arc::new(console))
}

/// A POSTed `application/x-www-form-urlencoded` body.
struct Form(Vec<(String, String)>);

impl Form {
    fn parse(body: &[u8]) -> Self {
        Self(
            url::form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A refused write: 403 with the reason.
fn refused(access: &Access, refusal: Refusal) -> Response {
    Page {
        title: "Refused",
        access,
        refresh: false,
        body: format!("<p class=\"error\">{}</p>", esc(refusal.explain())),
    }
    .with_status(StatusCode::FORBIDDEN)
}

/// A failed action or page: the error, and where to go back to.
fn failed(access: &Access, status: StatusCode, what: &str, error: &str) -> Response {
    Page {
        title: what,
        access,
        refresh: false,
        body: format!(
            "<p class=\"error\">{}</p><p><a href=\"/console/parked\">Back to the parked queue</a></p>",
            esc(error)
        ),
    }
    .with_status(status)
}

async fn login_page(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let access = console.access(&headers);
    if access == Access::ReadOnly {
        return refused(&access, Refusal::ReadOnly);
    }
    Page {
        title: "Log in",
        access: &access,
        refresh: false,
        body: "<form method=\"post\" action=\"/console/login\">\
               <p><label>ADMIN_TOKEN <input type=\"password\" name=\"token\" autocomplete=\"current-password\" autofocus></label>\
               <button type=\"submit\">Log in</button></p></form>\
               <p class=\"muted\">Logging in enables replay and purge of parked messages for 8 hours.</p>"
            .into(),
    }
    .ok()
}

async fn login(State(console): State<Arc<Console>>, headers: HeaderMap, body: Bytes) -> Response {
    let access = console.access(&headers);
    let Some(admin) = console.admin.as_ref() else {
        return refused(&access, Refusal::ReadOnly);
    };
    if !auth::same_origin(&headers) {
        return refused(&access, Refusal::CrossSite);
    }
    let form = Form::parse(&body);
    if !admin.token_matches(form.get("token").unwrap_or_default()) {
        tracing::warn!("console login with a wrong ADMIN_TOKEN");
        // Slows guessing down; the token has at least 16 characters anyway.
        tokio::time::sleep(Duration::from_secs(1)).await;
        return failed(
            &access,
            StatusCode::FORBIDDEN,
            "Log in",
            "That is not ADMIN_TOKEN.",
        );
    }
    tracing::info!("console login");
    with_cookie(
        Redirect::to("/console/parked").into_response(),
        &auth::session_cookie(&admin.new_session()),
    )
}

async fn logout(State(console): State<Arc<Console>>, headers: HeaderMap, body: Bytes) -> Response {
    let access = console.access(&headers);
    let form = Form::parse(&body);
    if let Err(refusal) = auth::authorize_write(console.admin.as_ref(), &headers, form.get("csrf"))
    {
        return refused(&access, refusal);
    }
    with_cookie(
        Redirect::to("/console").into_response(),
        &auth::cleared_cookie(),
    )
}

fn with_cookie(mut response: Response, cookie: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}
