//! `order-timeout migrate`.

use std::process::ExitCode;

use crate::settings::Settings;
use crate::store;

/// Creates the database if missing and applies the service's migrations.
pub(super) async fn run(settings: Settings) -> anyhow::Result<ExitCode> {
    store::migrate(&settings.database_url).await?;
    println!("migrations applied to {}", settings.database_url);
    Ok(ExitCode::SUCCESS)
}
