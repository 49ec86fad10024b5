//! Finishing cancelled orders from the outbox, in named steps:
//!
//! 1. [`load_items`]: the items of every order whose stock release is
//!    pending;
//! 2. [`do_outbox_work`]: per order, concurrently across orders,
//!    [`release_stock`] (`ReleaseStock`, idempotent by order id) and
//!    [`publish_event`] (the timer's event: `order.cancelled` for the
//!    default one);
//! 3. [`record_done`]: the outbox rows marked, the failures of failed
//!    orders recorded on their rows ([`record_failures`]: the next attempt
//!    put off with backoff, or a release that can never succeed given up),
//!    their leases given back;
//! 4. [`settle`]: the deliveries acked, last, or retried; an order the
//!    sweeper gave up parked as `release_failed`.
//!
//! Used by the cancel path for every batch and by the sweeper, which
//! finishes work that no delivery will come back for; always for the orders
//! (rows) of one timer, whose store holds their outbox rows.

use std::collections::HashMap;

use backon::Retryable;
use futures_util::{StreamExt, stream};

use super::context::Context;
use super::ending::{Ending, Endings, Worker, park_given_up};
use super::failure::Failure;
use super::job::Job;
use super::verdict::{Origin, Seen, Verdict, verdict};
use crate::broker::publisher::TimerEvent;
use crate::message::OrderId;
use crate::observe::metrics::{Outcome, Stage};
use crate::store::{Cancellation, NextAttempt, OrderItem, OutboxFailure, Store};

/// A cancelled order with outbox work to do, and the deliveries (none, for
/// the sweeper) waiting for it.
pub(crate) struct Pending {
    /// The order.
    pub(crate) id: OrderId,
    /// What the cancel transaction reported.
    pub(crate) cancellation: Cancellation,
    /// Its deliveries, acked once the work is done.
    pub(crate) jobs: Vec<Job>,
}

/// A [`Pending`] order after its outbox work was tried.
struct Finished {
    order: Pending,
    released: bool,
    published: bool,
    failures: Vec<Failure>,
}

/// Items per order id.
type Items = HashMap<String, Vec<OrderItem>>;

/// Orders whose stock release the sweeper gave up, with the reason: a
/// message is parked for each ([`park_given_up`]).
type ToPark = Vec<(OrderId, Cancellation, String)>;

/// Releases stock, publishes the events, marks the outbox and settles the
/// deliveries of `orders`, all of `store`'s timer, found by `origin`.
#[tracing::instrument(skip_all, fields(orders = orders.len(), timer = %store.timer().name))]
pub(crate) async fn finish(worker: &Worker, store: &Store, orders: Vec<Pending>, origin: Origin) {
    if orders.is_empty() {
        return;
    }
    let ctx = &worker.ctx;
    let kept = KeptLeases::start(store, &orders, ctx.settings.outbox_lease);
    let mut endings = Vec::new();
    let (orders, items) = load_items(store, orders, &mut endings).await;
    let done = do_outbox_work(ctx, store, orders, &items).await;
    let (marked, given_up) = record_done(ctx, store, &done).await;
    drop(kept);
    let to_park = settle(ctx, store, done, marked, given_up, origin, &mut endings);
    worker.end_all(endings).await;
    for (id, cancellation, reason) in to_park {
        park_given_up(ctx, store, &id, &cancellation, &reason).await;
    }
}

/// The outbox leases of the orders being finished, renewed every third of
/// the lease for as long as the work runs (until dropped): a statement, a
/// release or a publish slower than the lease (the shop's database at its
/// statement timeout, an inventory at its deadline) never lets another
/// worker take the same work over while it is in progress. A worker that
/// stops renewing (a crash, a frozen process) loses the leases as before,
/// within `outbox_lease`.
struct KeptLeases {
    _stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl KeptLeases {
    /// Starts renewing the leases `orders` hold in `store`.
    fn start(store: &Store, orders: &[Pending], lease: std::time::Duration) -> Self {
        let ids: Vec<String> = orders
            .iter()
            .filter(|o| o.cancellation.leased)
            .map(|o| o.id.as_str().to_owned())
            .collect();
        if ids.is_empty() || lease.is_zero() {
            return Self { _stop: None };
        }
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let store = store.clone();
        tokio::spawn(async move {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(lease / 3) => {}
                }
                // Not cut short when the work ends: a statement is never
                // dropped half-sent.
                if let Err(e) = store.renew_leases(&ids, lease).await {
                    tracing::warn!(orders = ids.len(), error = %e, "cannot renew the outbox leases of orders still being finished; another worker may take their work over once the leases run out");
                }
            }
        });
        Self { _stop: Some(stop) }
    }
}

/// Step 1: the items of the orders whose release is pending, with the
/// orders that can go on. When the items cannot be read, the orders are
/// retried later (their endings added to `endings`) — except that a
/// failure waiting cannot fix (a row that does not decode, say) is looked
/// for order by order, so that only the orders it belongs to are parked.
async fn load_items(
    store: &Store,
    orders: Vec<Pending>,
    endings: &mut Endings,
) -> (Vec<Pending>, Items) {
    let need: Vec<&OrderId> = orders
        .iter()
        .filter(|o| o.cancellation.release_pending)
        .map(|o| &o.id)
        .collect();
    if need.is_empty() {
        return (orders, Items::new());
    }
    let failure = match store.items(&need).await {
        Ok(items) => return (orders, items),
        Err(e) => Failure::from(e),
    };
    if !failure.is_permanent() || need.len() == 1 {
        let failed = orders
            .into_iter()
            .map(|order| (order.jobs, Ending::Fail(failure.clone())));
        endings.extend(failed);
        return (Vec::new(), Items::new());
    }
    tracing::warn!(orders = need.len(), error = %failure, "reading the items failed in a way waiting cannot fix; reading them order by order");
    let mut items = Items::new();
    let mut ok = Vec::new();
    for order in orders {
        if !order.cancellation.release_pending {
            ok.push(order);
            continue;
        }
        match store.items(&[&order.id]).await {
            Ok(found) => {
                items.extend(found);
                ok.push(order);
            }
            Err(e) => endings.push((order.jobs, Ending::Fail(e.into()))),
        }
    }
    (ok, items)
}

/// Step 2: every order's pending release and event, up to
/// `inventory_concurrency` orders at a time.
async fn do_outbox_work(
    ctx: &Context,
    store: &Store,
    orders: Vec<Pending>,
    items: &Items,
) -> Vec<Finished> {
    stream::iter(orders)
        .map(|order| {
            // The message's span, or (the sweeper has no message) a new one.
            let span = order
                .jobs
                .first()
                .map(|j| j.span.clone())
                .unwrap_or_else(|| tracing::info_span!("order", order_id = %order.id));
            let order_items = items
                .get(order.id.as_str())
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            tracing::Instrument::instrument(outbox_work(ctx, store, order, order_items), span)
        })
        .buffer_unordered(ctx.settings.inventory_concurrency.max(1))
        .collect()
        .await
}

/// One order's pending release and event.
async fn outbox_work(
    ctx: &Context,
    store: &Store,
    order: Pending,
    items: &[OrderItem],
) -> Finished {
    let mut failures = Vec::new();
    let mut released = false;
    if order.cancellation.release_pending {
        match release_stock(ctx, &order.id, items).await {
            Ok(()) => released = true,
            Err(e) => failures.push(e),
        }
    }
    let mut published = false;
    if order.cancellation.event_pending {
        match publish_event(ctx, store, &order.id, &order.cancellation).await {
            Ok(()) => published = true,
            Err(e) => failures.push(e),
        }
    }
    Finished {
        order,
        released,
        published,
        failures,
    }
}

/// `ReleaseStock` with the short in-process backoff of the retry policy
/// (not for an answer that waiting cannot fix).
async fn release_stock(ctx: &Context, id: &OrderId, items: &[OrderItem]) -> Result<(), Failure> {
    let call = || async {
        let started = std::time::Instant::now();
        let result = ctx.inventory.release(id.as_str(), items).await;
        ctx.metrics.stage(Stage::Inventory, started.elapsed());
        result
    };
    let retried = call
        .retry(ctx.retry.quick_backoff())
        .when(|e| !super::failure::inventory_is_permanent(e))
        .await;
    match retried {
        Ok(first_time) => {
            if !first_time {
                tracing::info!(order_id = %id, "stock was already released (a retried release)");
            }
            Ok(())
        }
        Err(e) => {
            ctx.metrics.release_failed();
            Err(e.into())
        }
    }
}

/// The timer's event (`order.cancelled` for the default one), confirmed by
/// the broker.
async fn publish_event(
    ctx: &Context,
    store: &Store,
    id: &OrderId,
    c: &Cancellation,
) -> Result<(), Failure> {
    let timer = store.timer();
    let event = TimerEvent {
        order_id: id.as_str().to_owned(),
        expires_at: c.expires_at,
        cancelled_at: c.cancelled_at,
        lateness_ms: lateness_ms(c),
        timer: timer.name.to_string(),
    };
    let started = std::time::Instant::now();
    let sent = ctx.publisher.event(&timer.event, &event).await;
    ctx.metrics.stage(Stage::Publish, started.elapsed());
    Ok(sent?)
}

/// How late a cancellation was, in milliseconds: never negative (a
/// cancellation is never early; a clock that says otherwise is off by that
/// much, and consumers of the event must not see a negative lateness).
fn lateness_ms(c: &Cancellation) -> i64 {
    (c.cancelled_at - c.expires_at).num_milliseconds().max(0)
}

/// Outbox rows given up in this batch, with the reason.
type GivenUp = HashMap<String, String>;

/// Step 3: marks what was done in the outbox, records the failures of
/// orders whose work failed ([`record_failures`]) and gives back their
/// leases, so their retries can take them at once. The error, if marking
/// failed, is every order's error: its work will be redone (idempotently).
async fn record_done(
    ctx: &Context,
    store: &Store,
    done: &[Finished],
) -> (Result<(), Failure>, GivenUp) {
    let released: Vec<&str> = done
        .iter()
        .filter(|f| f.released)
        .map(|f| f.order.id.as_str())
        .collect();
    let published: Vec<&str> = done
        .iter()
        .filter(|f| f.published)
        .map(|f| f.order.id.as_str())
        .collect();
    let marked = store
        .mark_done(&released, &published)
        .await
        .map_err(Failure::from);
    if let Err(e) = &marked {
        tracing::warn!(error = %e, "cannot mark outbox rows done; the work will be redone (idempotently)");
    }
    let given_up = if marked.is_ok() {
        record_failures(ctx, store, done).await
    } else {
        GivenUp::new()
    };
    let failed: Vec<&str> = done
        .iter()
        .filter(|f| f.order.cancellation.leased && (marked.is_err() || !f.failures.is_empty()))
        .map(|f| f.order.id.as_str())
        .collect();
    if let Err(e) = store.release_leases(&failed).await {
        tracing::warn!(error = %e, "cannot give back outbox leases; they will run out");
    }
    (marked, given_up)
}

/// Records a failed attempt on the outbox row of every order whose work
/// failed, and plans its next one: after the outbox backoff of the retry
/// policy ([`super::retry::RetryPolicy::outbox_delay`]), so that the
/// sweeper takes newer rows first — or, for a stock release the inventory
/// refused for good or one that failed
/// [`OUTBOX_MAX_ATTEMPTS`](super::retry::OUTBOX_MAX_ATTEMPTS) times, never:
/// the row is given up (counted, logged with the order and the reason).
/// Returns the rows given up. Before the leases are given back, so that no
/// sweep takes a row before its next attempt is planned.
async fn record_failures(ctx: &Context, store: &Store, done: &[Finished]) -> GivenUp {
    let errors: Vec<(String, bool, bool)> = done
        .iter()
        .filter(|f| !f.failures.is_empty())
        .map(|f| {
            let text = Failure::all(f.failures.clone())
                .map(|e| e.to_string())
                .unwrap_or_default();
            let release = f.order.cancellation.release_pending && !f.released;
            let permanent = f.failures.iter().any(Failure::is_release_refused);
            (text, release, permanent)
        })
        .collect();
    let failures: Vec<OutboxFailure<'_>> = done
        .iter()
        .filter(|f| !f.failures.is_empty())
        .zip(&errors)
        .map(|(f, (error, release, permanent))| OutboxFailure {
            id: f.order.id.as_str(),
            error,
            release: *release,
            permanent: *permanent,
        })
        .collect();
    let plan = |f: &OutboxFailure<'_>, attempts: u32| ctx.retry.outbox_next(f, attempts);
    let planned = match store.record_failures(&failures, &plan).await {
        Ok(planned) => planned,
        Err(e) => {
            tracing::warn!(error = %e, orders = failures.len(), "cannot record failed outbox work; the sweeper retries it without backoff");
            return GivenUp::new();
        }
    };
    let mut given_up = GivenUp::new();
    for (id, attempts, next) in planned {
        match next {
            NextAttempt::GiveUp(reason) => {
                tracing::error!(order_id = %id, attempts, %reason, "giving up the stock release of a cancelled order: the sweeper no longer retries it; replaying its parked message does");
                ctx.metrics.outbox_given_up();
                given_up.insert(id, reason);
            }
            NextAttempt::After(delay) => {
                tracing::debug!(order_id = %id, attempts, retry_in = ?delay, "outbox work failed; next attempt put off");
            }
        }
    }
    given_up
}

/// Logs and counts an order cancelled just now for a message whose
/// deadline was later than the row's by more than a second (a `cancel_at`
/// the application computed from another clock or field): the service
/// obeyed the message, and the order was late by the difference. A second
/// of slack: a `DATETIME(0)` column stores a deadline truncated (or
/// rounded) to its second.
fn note_late_message_deadline(ctx: &Context, timer: &str, f: &Finished) {
    let row = f.order.cancellation.expires_at;
    let Some(message) = f.order.jobs.iter().filter_map(Job::deadline).min() else {
        return;
    };
    if message - row > chrono::TimeDelta::seconds(1) {
        ctx.metrics.late_message_deadline(timer);
        tracing::warn!(order_id = %f.order.id, %timer, row_deadline = %row, message_deadline = %message, "the message's deadline is later than the row's: the order was cancelled late by the difference (publish the bare id, or the row's own deadline)");
    }
}

/// Step 4: records the lateness of orders cancelled just now, then decides
/// how every order ends by its verdict on its work: the deliveries of
/// finished orders acked (the first as `cancelled` if this batch cancelled
/// it), those of orders whose work failed retried (added to `endings`);
/// returns the orders the sweeper gave up, to park.
fn settle(
    ctx: &Context,
    store: &Store,
    done: Vec<Finished>,
    marked: Result<(), Failure>,
    mut given_up: GivenUp,
    origin: Origin,
    endings: &mut Endings,
) -> ToPark {
    let timer = store.timer().name.as_str();
    for f in &done {
        let c = &f.order.cancellation;
        if c.just_now {
            let lateness = c.cancelled_at - c.expires_at;
            ctx.metrics
                .lateness(timer, lateness.max(chrono::TimeDelta::zero()));
            note_late_message_deadline(ctx, timer, f);
        }
    }
    let mut to_park = ToPark::new();
    for f in done {
        let failure = match &marked {
            Err(e) => Some(e.clone()),
            Ok(()) => Failure::all(f.failures),
        };
        let Pending {
            id,
            cancellation: c,
            jobs,
        } = f.order;
        let reason = failure.as_ref().and_then(|_| given_up.remove(id.as_str()));
        let seen = match &failure {
            None => Seen::WorkDone {
                just_now: c.just_now,
            },
            Some(failure) => Seen::WorkFailed {
                failure,
                given_up: reason.is_some(),
            },
        };
        let ending = match verdict(origin, seen, ctx.settings.unknown_order) {
            Verdict::Ack { first, duplicates } => {
                if first == Outcome::Cancelled {
                    let lateness_ms = lateness_ms(&c);
                    tracing::debug!(order_id = %id, timer, lateness_ms, "cancelled (flipped) on time");
                }
                Ending::Ack { first, duplicates }
            }
            Verdict::Retry(failure) => Ending::Fail(failure),
            Verdict::GiveUp => {
                // The sweeper's: no delivery will bring it back.
                to_park.push((id, c, reason.unwrap_or_default()));
                continue;
            }
            // Done (the sweeper's: no delivery), or its next attempt is
            // planned on its outbox row.
            Verdict::Skip => continue,
            // Never given on finished work: a delivery goes back to the
            // queue rather than be lost.
            _ => Ending::Requeue,
        };
        endings.push((jobs, ending));
    }
    to_park
}
