//! Logging: `tracing` with an `RUST_LOG` filter (default `info`), as text or
//! as JSON lines (`LOG_FORMAT=json`). URLs are logged through
//! [`crate::settings::SecretUrl`], so passwords never reach the logs.

use std::ffi::OsStr;
use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

/// Installs the global subscriber. Call once, first thing in `main`.
/// `default_filter` applies when `RUST_LOG` is unset.
pub(crate) fn init(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let json = std::env::var("LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let ansi = use_ansi(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(FmtSpan::NONE)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let result = if json {
        builder.json().with_current_span(true).try_init()
    } else {
        builder.try_init()
    };
    // A subscriber already installed (tests) is fine.
    let _ = result;
}

/// Whether the text logs are coloured: only when they go to a terminal
/// (`stderr_is_terminal`), so that a log file or a collector never gets
/// escape codes, and not when `NO_COLOR` is set to anything but the empty
/// string (<https://no-color.org>).
fn use_ansi(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_and_without_no_color() {
        assert!(use_ansi(true, None));
        assert!(!use_ansi(false, None), "a file or a pipe gets no colour");
        assert!(!use_ansi(true, Some(OsStr::new("1"))));
        assert!(!use_ansi(false, Some(OsStr::new("1"))));
        // no-color.org: an empty NO_COLOR is as good as unset.
        assert!(use_ansi(true, Some(OsStr::new(""))));
        assert!(!use_ansi(false, Some(OsStr::new(""))));
    }
}
