//! Logging: `tracing` with an `RUST_LOG` filter (default `info`), as text or
//! as JSON lines (`LOG_FORMAT=json`). URLs are logged through
//! [`crate::settings::SecretUrl`], so passwords never reach the logs.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

/// Installs the global subscriber. Call once, first thing in `main`.
/// `default_filter` applies when `RUST_LOG` is unset.
#[cfg_attr(feature = "testing", visibility::make(pub))]
pub(crate) fn init(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let json = std::env::var("LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(FmtSpan::NONE)
        .with_writer(std::io::stderr);
    let result = if json {
        builder.json().with_current_span(true).try_init()
    } else {
        builder.try_init()
    };
    // A subscriber already installed (tests) is fine.
    let _ = result;
}
