//! Server-rendered HTML: one layout, an escape function every value goes
//! through, and the formats of times, durations and rates. No script, no
//! external resource: the pages work offline and under a strict
//! Content-Security-Policy.

use std::fmt::Write as _;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};

use super::auth::Access;

/// `s` with the five HTML-special characters escaped, safe in text and in
/// quoted attribute values, and every invisible character that changes
/// how the text around it reads ([`hidden`]: bidi overrides such as
/// U+202E, zero-width characters, control characters) shown as its code
/// point, `[U+202E]`: an order id cannot display as another one.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if hidden(c) => {
                let _ = write!(out, "[U+{:04X}]", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// Characters that render as nothing yet change the text around them:
/// bidirectional embeddings, overrides, isolates and marks (the "Trojan
/// Source" characters), zero-width characters, line and paragraph
/// separators, and control characters other than tab and line breaks.
fn hidden(c: char) -> bool {
    matches!(c,
        '\u{061C}'
        | '\u{200B}'..='\u{200F}'
        | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{2069}'
        | '\u{FEFF}'
        | '\u{FFF9}'..='\u{FFFB}'
    ) || (c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
}

/// A time as `2026-11-22 01:53:58 UTC`, or `–`.
pub(super) fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "–".into(),
        |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

/// Whole seconds as `1h 8m 16s`.
pub(super) fn secs(s: u64) -> String {
    humantime::format_duration(Duration::from_secs(s)).to_string()
}

/// A per-minute rate with one decimal, or `–` when not known yet.
pub(super) fn rate(r: Option<f64>) -> String {
    r.map_or_else(|| "–".into(), |r| format!("{r:.1}"))
}

/// Seconds shown in milliseconds, or `–`.
pub(super) fn millis(s: Option<f64>) -> String {
    s.map_or_else(|| "–".into(), |s| format!("{:.1} ms", s * 1000.0))
}

/// A yes/no cell.
pub(super) fn up(ok: bool) -> &'static str {
    if ok {
        r#"<td class="ok">up</td>"#
    } else {
        r#"<td class="bad">down</td>"#
    }
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24}\
header{background:#24292f;color:#fff;padding:8px 16px;display:flex;gap:24px;align-items:center}\
header a{color:#fff;text-decoration:none;margin-right:16px}header .who{margin-left:auto}\
header form{display:inline}main{padding:8px 16px}table{border-collapse:collapse;margin:8px 0 16px}\
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}\
th{background:#f6f8fa}.num{text-align:right}.ok{color:#1a7f37}.bad{color:#cf222e;font-weight:bold}\
.notice{background:#dafbe1;border:1px solid #1a7f37;padding:8px}.error{background:#ffebe9;border:1px solid #cf222e;padding:8px}\
pre{white-space:pre-wrap;word-break:break-all;margin:0;max-width:60em}summary{cursor:pointer}\
.muted{color:#57606a}button{margin:2px}svg.chart{display:block;max-width:100%;height:auto;margin:8px 0}";

/// What a page is.
pub(super) struct Page<'a> {
    /// Title (escaped here).
    pub(super) title: &'a str,
    /// Who is looking (for the header's login/logout).
    pub(super) access: &'a Access,
    /// Reload every 10 s (pages of figures, not of actions).
    pub(super) refresh: bool,
    /// The page's HTML, already escaped where it holds values.
    pub(super) body: String,
}

impl Page<'_> {
    /// The full document with status 200.
    pub(super) fn ok(self) -> Response {
        self.with_status(StatusCode::OK)
    }

    /// The full document with `status`.
    pub(super) fn with_status(self, status: StatusCode) -> Response {
        let mut html = String::with_capacity(self.body.len() + 2048);
        let _ = write!(
            html,
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width\">\
             <title>{} · order-timeout</title>{}<style>{STYLE}</style></head><body>\
             <header><b>order-timeout</b><nav><a href=\"/console\">Overview</a>\
             <a href=\"/console/pending\">Pending</a><a href=\"/console/parked\">Parked</a>\
             <a href=\"/console/set-aside\">Set aside</a><a href=\"/console/history\">History</a></nav>\
             <span class=\"who\">{}</span></header><main><h1>{}</h1>{}</main></body></html>",
            esc(self.title),
            if self.refresh {
                "<meta http-equiv=\"refresh\" content=\"10\">"
            } else {
                ""
            },
            who(self.access),
            esc(self.title),
            self.body,
        );
        respond(status, html)
    }
}

/// The header's right side: read-only, a login link, or who is logged in.
fn who(access: &Access) -> String {
    match access {
        Access::ReadOnly => "read-only (ADMIN_TOKEN not set)".into(),
        Access::LoggedOut => "<a href=\"/console/login\">Log in</a>".into(),
        Access::Admin { csrf } => format!(
            "admin <form method=\"post\" action=\"/console/logout\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\"><button>Log out</button></form>",
            esc(csrf)
        ),
    }
}

/// An HTML response with the console's security headers: no script, no
/// framing, nothing cached, no referrer leaving the site.
pub(super) fn respond(status: StatusCode, html: String) -> Response {
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_special_character_is_escaped() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
        assert_eq!(esc("plain"), "plain");
    }

    #[test]
    fn invisible_characters_that_reorder_text_are_shown_as_code_points() {
        assert_eq!(
            esc("order-\u{202E}gnp.exe"),
            "order-[U+202E]gnp.exe",
            "a right-to-left override"
        );
        for c in [
            '\u{200F}', '\u{2066}', '\u{2069}', '\u{200B}', '\u{FEFF}', '\u{0007}', '\u{009B}',
        ] {
            let shown = esc(&format!("a{c}b"));
            assert!(!shown.contains(c), "{c:?}: {shown}");
            assert!(shown.contains("[U+"), "{shown}");
        }
        assert_eq!(esc("tab\tline\n 注文 é"), "tab\tline\n 注文 é");
    }

    #[test]
    fn formats() {
        assert_eq!(secs(4096), "1h 8m 16s");
        assert_eq!(rate(Some(2.25)), "2.2");
        assert_eq!(rate(None), "–");
        assert_eq!(millis(Some(0.0123)), "12.3 ms");
    }
}
