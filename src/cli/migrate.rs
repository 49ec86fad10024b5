//! `order-timeout migrate [--contract]`.

use std::process::ExitCode;

use clap::Args;

use crate::settings::Settings;
use crate::store;

/// Options of `migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// After migrating, drop what the migrations keep for the previous
    /// release: run it once every replica runs this release (rolling back
    /// to the previous release is no longer possible afterwards).
    #[arg(long)]
    pub contract: bool,
}

/// Creates the database if missing and applies the service's migrations;
/// with `--contract`, then drops what they keep for the previous release.
pub(super) async fn run(settings: Settings, args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let migrated = store::migrate(&settings.database_url).await?;
    println!("migrations applied to {}", settings.database_url);
    if migrated.fresh {
        println!("a new database: nothing kept for an earlier release");
    }
    if args.contract {
        let dropped = store::contract(&settings.database_url).await?;
        if dropped.is_empty() {
            println!("contracted: nothing was kept for an earlier release");
        }
        for e in dropped {
            println!("contracted: dropped {} (kept for {})", e.object, e.kept_for);
        }
    } else {
        for e in migrated.kept {
            println!(
                "kept for {} replicas: {} (blocks {}); `migrate --contract` drops it once none runs",
                e.kept_for, e.object, e.blocks
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
