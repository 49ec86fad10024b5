//! `order-timeout backfill`: on adoption day, schedule a timeout for every
//! unpaid order already in the shop's table, so that orders created before
//! the switch are cancelled on time rather than by the sweeper's grace.
//!
//! Each order gets the message the order service would have published
//! (`{"order_id", "cancel_at"}` with the row's deadline), confirmed, through
//! the entry exchange and so the same delay store. Safe to run twice: the
//! cancel path absorbs duplicate messages.

use std::process::ExitCode;

use clap::Args;
use futures_util::{StreamExt, TryStreamExt, stream};
use indicatif::{ProgressBar, ProgressStyle};

use super::connect;
use crate::broker::publisher::Publisher;
use crate::broker::topology::{self, Layout};
use crate::message::{Deadline, TimeoutRequest};
use crate::settings::Settings;
use crate::store::{self, ShopSchema};

/// Arguments of `backfill`.
#[derive(Debug, Args)]
pub struct BackfillArgs {
    /// Orders read per query.
    #[arg(long, default_value_t = 500)]
    pub batch: u32,
    /// Confirmed publishes in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
}

/// Schedules every unpaid order, page by page in id order.
pub(super) async fn run(settings: Settings, args: BackfillArgs) -> anyhow::Result<ExitCode> {
    let pool = store::PoolSettings::of(&settings).with_max_connections(2);
    let store = store::connect_lazy_with(&settings.database_url, pool, &ShopSchema::of(&settings))?;
    let report = store.prepare().await?;
    let conn = connect(&settings, "order-timeout-backfill").await?;
    let publisher = Publisher::new(&conn).await?;
    topology::declare(&conn, &Layout::of(&settings)).await?;
    let bar = ProgressBar::new(u64::try_from(report.unpaid.0).unwrap_or(0)).with_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} unpaid orders scheduled ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut after = None;
    let mut scheduled = 0u64;
    loop {
        let page = store.unpaid_page(after.as_ref(), args.batch.max(1)).await?;
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        let n = page.len() as u64;
        stream::iter(page)
            .map(|(order_id, deadline)| {
                let publisher = &publisher;
                async move {
                    let request = TimeoutRequest {
                        order_id,
                        deadline: Deadline::At(deadline),
                    };
                    publisher.schedule(&request).await
                }
            })
            .buffer_unordered(args.concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        scheduled += n;
        bar.inc(n);
    }
    bar.finish_and_clear();
    let _ = conn.close(200, "done".into()).await;
    println!(
        "scheduled {scheduled} unpaid orders of {} ({} overdue when checked: cancelled at once)",
        report.table, report.unpaid.1
    );
    Ok(ExitCode::SUCCESS)
}
