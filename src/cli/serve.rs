//! `order-timeout serve`.

use std::process::ExitCode;

use crate::app;
use crate::settings::Settings;
use crate::shutdown::Shutdown;

/// Runs the service until SIGTERM or SIGINT.
pub(super) async fn run(settings: Settings) -> anyhow::Result<ExitCode> {
    let shutdown = Shutdown::new();
    shutdown.trigger_on_signals();
    app::run(settings, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
