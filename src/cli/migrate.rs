//! `order-timeout migrate [--contract]`.

use std::process::ExitCode;

use clap::Args;

use crate::broker::topology::DUE_QUEUE;
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
    /// With `--contract`: contract even when a replica of an earlier
    /// release may still be running (the check needs `AMQP_URL`).
    #[arg(long, requires = "contract")]
    pub force: bool,
}

/// How recently a replica must have recorded itself to count as running.
const LIVE_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Creates the database if missing and applies the service's migrations;
/// with `--contract`, then drops what they keep for the previous release.
pub(super) async fn run(settings: Settings, args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let migrated = store::migrate(&settings.database_url).await?;
    println!("migrations applied to {}", settings.database_url);
    if migrated.fresh {
        println!("a new database: nothing kept for an earlier release");
    }
    if args.contract {
        if migrated.kept.is_empty() {
            // Nothing to contract: no check needed.
        } else if args.force {
            eprintln!("--force: contracting without checking for replicas of an earlier release");
        } else {
            refuse_while_an_earlier_release_runs(&settings).await?;
        }
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

/// Fails while a replica of an earlier release may still run: how it
/// knows is the consumers of `order-timeout.due` (a passive declare) against
/// the replicas of this release that recorded themselves in
/// `order_timeout_replicas` within [`LIVE_WITHIN`] (each consumes with one
/// consumer; earlier releases record nothing). More consumers than
/// records: something else consumes, an earlier release's replica; its
/// outbox statements need what the contraction drops.
async fn refuse_while_an_earlier_release_runs(settings: &Settings) -> anyhow::Result<()> {
    let unknown = |why: String| {
        anyhow::anyhow!(
            "cannot tell whether a replica of an earlier release still runs ({why}): \
             make sure none does, then run `migrate --contract --force`"
        )
    };
    let conn = super::connect(settings, "order-timeout-migrate")
        .await
        .map_err(|e| unknown(format!("{e:#}")))?;
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| unknown(e.to_string()))?;
    let consumers = match crate::broker::peek_queue(&channel, DUE_QUEUE).await {
        Ok(queue) => queue.consumer_count(),
        Err(e) if crate::broker::refusals::is_not_found(&e) => 0,
        Err(e) => return Err(unknown(e.to_string())),
    };
    let _ = conn.close(200, "bye".into()).await;
    let pool = store::PoolSettings::of(settings).with_max_connections(1);
    let stores = store::connect_timers(&settings.database_url, pool, &settings.timers()?)?;
    let live = stores.default_timer().live_replicas(LIVE_WITHIN).await?;
    let this = live
        .iter()
        .filter(|(_, version)| version == crate::observe::metrics::VERSION)
        .count();
    let others: Vec<String> = live
        .iter()
        .filter(|(_, version)| version != crate::observe::metrics::VERSION)
        .map(|(instance, version)| format!("{instance} ({version})"))
        .collect();
    if !others.is_empty() {
        anyhow::bail!(
            "replicas of another release recorded themselves in the last {}s: {}; \
             stop them, then contract again (or --force)",
            LIVE_WITHIN.as_secs(),
            others.join(", ")
        );
    }
    if u64::from(consumers) > this as u64 {
        anyhow::bail!(
            "{DUE_QUEUE} has {consumers} consumer(s), but only {this} replica(s) of {} \
             recorded themselves in the last {}s (order_timeout_replicas): a replica of an \
             earlier release, which records nothing, is still consuming, and the \
             contraction drops what it needs. Stop it, then contract again (or --force)",
            crate::observe::metrics::VERSION,
            LIVE_WITHIN.as_secs()
        );
    }
    Ok(())
}
