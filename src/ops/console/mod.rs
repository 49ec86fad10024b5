//! The web console on `HTTP_ADDR`, beside `/metrics`: what waits, what
//! happened in the last minutes, the parked queue with replay and purge,
//! the rows set aside, one order explained and the history of
//! cancellations (`/console`, `/console/pending`, `/console/parked`,
//! `/console/set-aside`, `/console/order`, `/console/history`).
//!
//! Server-rendered HTML, no script, no external resource ([`html`]). Pages
//! read what the service already knows (its metrics, readiness and the
//! latest [`PendingReport`](super::pending::PendingReport)); the parked
//! pages read the parked store, and a replay talks to the broker on a
//! connection of its own, doing exactly what `order-timeout parked …` does
//! ([`super::parked`]). Read-only unless `ADMIN_TOKEN` is set; then the
//! write actions need a login and a CSRF token ([`auth`]), and logins are
//! limited per client and in total ([`guard`]).
//!
//! What anonymous traffic costs is bounded: the console answers only the
//! host names `[http]` allows (a DNS-rebinding page is refused), handles
//! at most `console_concurrency` requests at once (503 past it, at once),
//! each within `request_timeout`, and computes its pages of figures at most
//! once per [`PAGE_FRESH`] whatever the number of viewers ([`cache`]).
//!
//! It lives with the operator tooling it calls; `app` hands its router to
//! the HTTP server (`observe::http`), which knows nothing about it.

use std::sync::Arc;
use std::time::Duration;

use std::net::SocketAddr;

use axum::Router;
use axum::body::Bytes;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use tower::ServiceBuilder;

use self::auth::{Access, Admin, Refusal};
use self::guard::{LoginGuard, VisitGuard};
use self::html::{Page, esc};
use super::pending::PendingBoard;
use crate::observe::fresh::Fresh;
use crate::observe::http::Health;
use crate::observe::metrics::Metrics;
use crate::observe::recent::Recent;
use crate::settings::{HttpSettings, SecretUrl, Settings, SweeperSettings};
use crate::shutdown::Shutdown;
use crate::store::{SetAsideRow, Store, Stores};

mod auth;
mod charts;
mod guard;
mod history;
mod html;
mod order;
mod parked;
mod views;

/// How long a page of figures (overview, pending) is served as computed
/// before it is computed again: the pages reload every 10 s, and a
/// thousand viewers cost one computation.
pub(crate) const PAGE_FRESH: Duration = Duration::from_secs(2);

/// Largest body of a console POST (a replay or purge of a thousand chosen
/// messages is about 50 KiB); the login form's is smaller still
/// ([`guard::LOGIN_BODY_LIMIT`]).
const BODY_LIMIT: usize = 256 * 1024;

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
    /// When the sweeper covers an order (the order page's "next").
    sweeper: SweeperSettings,
    /// The rows set aside per timer as last read, and when: one read per
    /// [`SET_ASIDE_FRESH`] whatever the traffic, so that page views cannot
    /// take the connections the service's own tables need.
    set_aside: tokio::sync::Mutex<SetAsideCache>,
    /// One replay at a time from this console (reads never wait for it).
    writes: tokio::sync::Mutex<()>,
    /// Turns for the reads of the parked store (`parked::READS_AT_ONCE`),
    /// which bound the memory parked pages take.
    parked_reads: tokio::sync::Semaphore,
    /// Host names, proxies, limits and the bodies opt-in (`[http]`).
    http: HttpSettings,
    /// The login limits.
    logins: LoginGuard,
    /// The requests per client and second.
    visits: VisitGuard,
    /// The overview's body as last computed.
    overview: Fresh,
    /// The pending page's body as last computed.
    pending: Fresh,
    /// The service's runtime, where admitted requests do their work (the
    /// HTTP side's own threads run at a lower priority, `observe::server`).
    runtime: tokio::runtime::Handle,
}

impl Console {
    /// A console for the service of `settings`, reading its readiness,
    /// metrics, their recent history and the pending board. Made on the
    /// service's runtime, where its requests will do their work.
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
            sweeper: settings.sweeper.clone(),
            set_aside: tokio::sync::Mutex::new(None),
            writes: tokio::sync::Mutex::new(()),
            parked_reads: tokio::sync::Semaphore::new(parked::READS_AT_ONCE),
            http: settings.http.clone(),
            logins: LoginGuard::new(
                settings.http.login_per_minute,
                settings.http.login_per_minute_total,
            ),
            visits: VisitGuard::new(settings.http.console_per_second),
            overview: Fresh::new(PAGE_FRESH),
            pending: Fresh::new(PAGE_FRESH),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// Whether the visitor of `access` may read parked messages' bodies
    /// ([`Access::may_see_bodies`] with `[http] public_bodies`): the parked
    /// page shows bodies only when this says so.
    fn may_see_bodies(&self, access: &Access) -> bool {
        access.may_see_bodies(self.http.public_bodies)
    }

    /// The store of the service's own tables (parked messages, logouts):
    /// any timer's, since every timer's store is on the one database.
    /// `None` for a console without a database.
    fn own_tables(&self) -> Option<&Store> {
        self.stores.iter().next()
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

/// How often a replica reads the logouts every replica recorded
/// (`order_timeout_logouts`): a session logged out on one replica is
/// refused by the others within this.
pub(crate) const LOGOUTS_FRESH: Duration = Duration::from_secs(2);

impl Console {
    /// Writes a logout (the session's MAC, its expiry in Unix seconds)
    /// where every replica reads it. When the database cannot take it, the
    /// session is refused here only, and the log says so.
    async fn record_logout(&self, mac: &str, expires: i64) {
        let Some(store) = self.own_tables() else {
            return;
        };
        let until = chrono::DateTime::from_timestamp(expires, 0).unwrap_or_default();
        if let Err(e) = store.record_logout(mac, until).await {
            tracing::warn!(
                error = %e,
                "console logout not recorded in the database: the session is refused by this \
                 replica only until it expires"
            );
        }
    }

    /// Every [`LOGOUTS_FRESH`] until `shutdown`, learns the logouts every
    /// replica recorded, so that a session logged out anywhere is refused
    /// here. Without `ADMIN_TOKEN` there are no sessions, and nothing to
    /// learn.
    pub(crate) async fn learn_logouts(self: Arc<Self>, shutdown: Shutdown) {
        let (Some(admin), Some(store)) = (self.admin.as_ref(), self.own_tables()) else {
            return;
        };
        let mut every = tokio::time::interval(LOGOUTS_FRESH);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = shutdown.wait() => return,
            }
            match store.logouts().await {
                Ok(logouts) => {
                    failing = false;
                    admin.learn(logouts.into_iter().map(|(mac, at)| (mac, at.timestamp())));
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(
                        error = %e,
                        "cannot read the console logouts of other replicas (order_timeout_logouts): \
                         sessions logged out elsewhere are refused here once it can"
                    );
                }
                Err(_) => {}
            }
        }
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

/// The console's routes, to merge into the HTTP server's: refused for a
/// host name `[http]` does not allow, at most `console_concurrency` at
/// once, each within `request_timeout`.
pub fn router(console: Arc<Console>) -> Router {
    let metrics = console.metrics.clone();
    let limits = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(move |error: tower::BoxError| {
            let metrics = metrics.clone();
            async move {
                tokio::time::sleep(REFUSAL_PAUSE).await;
                overloaded(&metrics, &error)
            }
        }))
        .load_shed()
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
            console.http.console_concurrency.max(1),
        ))
        .timeout(console.http.request_timeout);
    Router::new()
        .route("/", get(|| async { Redirect::to("/console") }))
        .route("/console", get(views::overview))
        .route("/console/pending", get(views::pending))
        .route("/console/parked", get(parked::page))
        .route("/console/parked/{id}", get(parked::message))
        .route("/console/parked/{id}/body", get(parked::download))
        .route("/console/set-aside", get(views::set_aside))
        .route("/console/order", get(order::page))
        .route("/console/history", get(history::page))
        .route("/console/parked/replay", post(parked::replay))
        .route("/console/parked/purge", post(parked::purge))
        .route(
            "/console/login",
            get(login_page)
                .post(login)
                .layer(DefaultBodyLimit::max(guard::LOGIN_BODY_LIMIT)),
        )
        .route("/console/logout", post(logout))
        .with_state(console.clone())
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(limits)
        .layer(axum::middleware::from_fn_with_state(console, admit))
}

/// A console request refused for load: 503 at once when
/// `console_concurrency` requests are in hand, 503 when one outlasts
/// `request_timeout`.
fn overloaded(metrics: &Metrics, error: &tower::BoxError) -> Response {
    let (reason, text) = if error.is::<tower::timeout::error::Elapsed>() {
        (
            "timeout",
            "The console took too long to answer; try again.\n",
        )
    } else {
        ("busy", "The console is busy; try again in a moment.\n")
    };
    metrics.http_refused(reason);
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, text).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// What a refused console request costs its sender: the answer comes
/// after this pause, so a client looping on refusals makes a few requests
/// a second, not thousands (each costs the service a connection).
const REFUSAL_PAUSE: Duration = Duration::from_millis(100);

/// Serves only requests naming a host `[http]` allows (`Host`): a page of
/// another site whose name was rebound to this address names its own host,
/// and is refused (421) before anything is read. Then at most
/// `console_per_second` requests per client (429 past it).
async fn admit(State(console): State<Arc<Console>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or_default();
    if !console.http.serves_host(host) {
        console.metrics.http_refused("host");
        tracing::debug!(host, "console request for a host name not in [http] hosts");
        tokio::time::sleep(REFUSAL_PAUSE).await;
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "This host name is not one the console answers to: add it to [http] hosts (HTTP_HOSTS).\n",
        )
            .into_response();
    }
    let client = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| {
            guard::client(*peer, request.headers(), &console.http.trusted_proxies)
        });
    if let Some(client) = client
        && !console.visits.admit(client)
    {
        console.metrics.http_refused("rate");
        tokio::time::sleep(REFUSAL_PAUSE).await;
        let mut response = (
            StatusCode::TOO_MANY_REQUESTS,
            "Too many console requests from this address; try again in a moment.\n",
        )
            .into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    }
    // The work of an admitted request (the store, the broker, rendering)
    // runs on the service's runtime: see `observe::server`.
    match console.runtime.spawn(next.run(request)).await {
        Ok(response) => response,
        Err(e) => {
            tracing::error!(error = %e, "a console request ended without an answer");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
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

async fn login(
    State(console): State<Arc<Console>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let access = console.access(&headers);
    let Some(admin) = console.admin.as_ref() else {
        return refused(&access, Refusal::ReadOnly);
    };
    if !auth::same_origin(&headers) {
        return refused(&access, Refusal::CrossSite);
    }
    let client = guard::client(peer, &headers, &console.http.trusted_proxies);
    if let Err(wait) = console.logins.admit(client) {
        console.metrics.http_refused("login_limited");
        tracing::debug!(%client, retry_in = ?wait, "console login refused: too many attempts");
        let mut response = failed(
            &access,
            StatusCode::TOO_MANY_REQUESTS,
            "Log in",
            &format!(
                "Too many login attempts from {client}: try again in {} s.",
                wait.as_secs() + 1
            ),
        );
        if let Ok(value) = HeaderValue::from_str(&(wait.as_secs() + 1).to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    let form = Form::parse(&body);
    if !admin.token_matches(form.get("token").unwrap_or_default()) {
        tracing::warn!(%client, "console login with a wrong ADMIN_TOKEN");
        // The attempt's cost to the guesser; the limits above bound how
        // many are compared at all.
        tokio::time::sleep(Duration::from_secs(1)).await;
        return failed(
            &access,
            StatusCode::FORBIDDEN,
            "Log in",
            "That is not ADMIN_TOKEN.",
        );
    }
    tracing::info!(%client, "console login");
    let secure = guard::over_https(peer, &headers, &console.http.trusted_proxies);
    with_cookie(
        Redirect::to("/console/parked").into_response(),
        &auth::session_cookie(&admin.new_session(), secure),
    )
}

/// `POST /console/logout`: the session is revoked here (its cookie and
/// CSRF token refused from now on), and the browser told to forget it.
async fn logout(
    State(console): State<Arc<Console>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let access = console.access(&headers);
    let form = Form::parse(&body);
    if let Err(refusal) = auth::authorize_write(console.admin.as_ref(), &headers, form.get("csrf"))
    {
        return refused(&access, refusal);
    }
    let client = guard::client(peer, &headers, &console.http.trusted_proxies);
    if let (Some(admin), Some(session)) =
        (console.admin.as_ref(), auth::cookie(&headers, auth::COOKIE))
        && let Some((mac, expires)) = admin.revoke(session)
    {
        console.record_logout(&mac, expires).await;
    }
    tracing::info!(%client, "console logout");
    let secure = guard::over_https(peer, &headers, &console.http.trusted_proxies);
    with_cookie(
        Redirect::to("/console").into_response(),
        &auth::cleared_cookie(secure),
    )
}

fn with_cookie(mut response: Response, cookie: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}
