//! `order-timeout topology check`: compares the broker's exchanges and
//! queues with what the service declares ([`crate::broker::topology`]), without the
//! management plugin and without creating anything.
//!
//! For each object, on a throwaway channel:
//! 1. a **passive** declare: `404 NOT_FOUND` means missing (and nothing
//!    more is tried, so nothing is created);
//! 2. if it exists, a **normal** declare with the expected type, flags and
//!    arguments. RabbitMQ treats an equivalent re-declare as a no-op and
//!    answers a different one with `406 PRECONDITION_FAILED` ("inequivalent
//!    arg 'x-message-ttl' for queue '…' in vhost '…': received … but current
//!    is …"), which is reported as is. The broker names the first differing
//!    argument only.
//!
//! Bindings cannot be listed over AMQP 0-9-1, and re-binding would create a
//! missing one, so they are not verified: the check only makes sure both
//! ends of every expected binding exist. `serve` re-declares every binding
//! on start; `rabbitmqctl list_bindings -p VHOST` shows the real ones.

use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::protocol::AMQPSoftError;
use lapin::types::FieldTable;
use lapin::{Channel, Connection};

use crate::broker::refusals::soft_error;
use crate::broker::topology::{
    self, BindingDestination, BindingSpec, Layout, exchange_options, exchange_specs, queue_options,
    queue_specs,
};
use crate::settings::QueueType;

/// Errors that stop the check (the broker cannot be asked at all).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Opening a channel failed, or the connection broke.
    #[error("talking to the broker: {0}")]
    Amqp(#[source] lapin::Error),
}

/// Queue or exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    /// An exchange.
    Exchange,
    /// A queue.
    Queue,
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Exchange => "exchange",
            Self::Queue => "queue",
        })
    }
}

/// What the check found for one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Exists with the expected type, flags and arguments.
    Ok,
    /// Does not exist.
    Missing,
    /// Exists with something different; the broker's explanation.
    Differs(String),
    /// Could not be checked (e.g. access refused, exclusive to another
    /// connection); the broker's explanation.
    Unchecked(String),
}

/// The result for one exchange or queue.
#[derive(Clone, Debug)]
pub struct ObjectReport {
    /// Queue or exchange.
    pub kind: ObjectKind,
    /// Its name.
    pub name: String,
    /// What was found.
    pub status: Status,
}

/// The result for one expected binding.
#[derive(Clone, Debug)]
pub struct BindingReport {
    /// The binding.
    pub spec: BindingSpec,
    /// Both ends exist (the binding itself cannot be seen over AMQP).
    pub endpoints_exist: bool,
}

/// Everything `topology check` found.
#[derive(Clone, Debug)]
pub struct TopologyReport {
    /// Queue type the check expected.
    pub queue_type: QueueType,
    /// Cascade shards the check expected.
    pub shards: u32,
    /// One entry per expected exchange and queue.
    pub objects: Vec<ObjectReport>,
    /// One entry per expected binding.
    pub bindings: Vec<BindingReport>,
}

impl TopologyReport {
    /// Objects that are not as expected.
    pub fn problems(&self) -> impl Iterator<Item = &ObjectReport> {
        self.objects.iter().filter(|o| o.status != Status::Ok)
    }

    /// Bindings with a missing end.
    pub fn broken_bindings(&self) -> impl Iterator<Item = &BindingReport> {
        self.bindings.iter().filter(|b| !b.endpoints_exist)
    }

    /// True when every object matches and every binding's ends exist.
    pub fn is_ok(&self) -> bool {
        self.problems().next().is_none() && self.broken_bindings().next().is_none()
    }
}

/// Maps a failed declare to a status; errors that are not about this
/// object (connection loss, hard errors) stop the check.
fn classify(error: lapin::Error, passive: bool) -> Result<Status, CheckError> {
    match soft_error(&error) {
        Some((AMQPSoftError::NOTFOUND, _)) if passive => Ok(Status::Missing),
        Some((AMQPSoftError::PRECONDITIONFAILED, text)) if !passive => Ok(Status::Differs(text)),
        Some((_, text)) => Ok(Status::Unchecked(text)),
        None => Err(CheckError::Amqp(error)),
    }
}

async fn fresh_channel(connection: &Connection) -> Result<Channel, CheckError> {
    connection.create_channel().await.map_err(CheckError::Amqp)
}

async fn close(channel: Channel) {
    if channel.status().connected() {
        let _ = channel.close(200, "checked".into()).await;
    }
}

#[tracing::instrument(skip(connection, spec), fields(exchange = %spec.name))]
async fn check_exchange(
    connection: &Connection,
    spec: &topology::ExchangeSpec,
) -> Result<Status, CheckError> {
    let declare = |channel: Channel, options: ExchangeDeclareOptions| {
        let spec = spec.clone();
        async move {
            let result = channel
                .exchange_declare(
                    spec.name.as_str().into(),
                    spec.kind,
                    options,
                    FieldTable::default(),
                )
                .await;
            close(channel).await;
            result
        }
    };
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..exchange_options()
    };
    if let Err(e) = declare(fresh_channel(connection).await?, passive).await {
        return classify(e, true);
    }
    match declare(fresh_channel(connection).await?, exchange_options()).await {
        Ok(()) => Ok(Status::Ok),
        Err(e) => classify(e, false),
    }
}

#[tracing::instrument(skip(connection, spec), fields(queue = %spec.name))]
async fn check_queue(
    connection: &Connection,
    spec: &topology::QueueSpec,
) -> Result<Status, CheckError> {
    let declare = |channel: Channel, options: QueueDeclareOptions, args: FieldTable| {
        let name = spec.name.clone();
        async move {
            let result = channel
                .queue_declare(name.as_str().into(), options, args)
                .await;
            close(channel).await;
            result.map(|_| ())
        }
    };
    let passive = QueueDeclareOptions {
        passive: true,
        ..queue_options()
    };
    if let Err(e) = declare(
        fresh_channel(connection).await?,
        passive,
        FieldTable::default(),
    )
    .await
    {
        return classify(e, true);
    }
    match declare(
        fresh_channel(connection).await?,
        queue_options(),
        spec.args.clone(),
    )
    .await
    {
        Ok(()) => Ok(Status::Ok),
        Err(e) => classify(e, false),
    }
}

/// Checks every exchange, queue and binding the service declares for
/// `layout` (queue type, cascade shards) against the broker (see the module docs). Creates nothing,
/// except in one race: an object deleted between its passive check and its
/// equivalence check would be re-created as expected.
#[tracing::instrument(skip(connection))]
pub async fn check(connection: &Connection, layout: &Layout) -> Result<TopologyReport, CheckError> {
    let mut objects = Vec::new();
    for spec in exchange_specs(layout) {
        let status = check_exchange(connection, &spec).await?;
        objects.push(ObjectReport {
            kind: ObjectKind::Exchange,
            name: spec.name,
            status,
        });
    }
    for spec in queue_specs(layout) {
        let status = check_queue(connection, &spec).await?;
        objects.push(ObjectReport {
            kind: ObjectKind::Queue,
            name: spec.name,
            status,
        });
    }
    let exists = |kind: ObjectKind, name: &str| {
        objects
            .iter()
            .any(|o| o.kind == kind && o.name == name && o.status != Status::Missing)
    };
    let bindings = topology::binding_specs(layout)
        .into_iter()
        .map(|spec| {
            let destination = match &spec.destination {
                BindingDestination::Queue(q) => exists(ObjectKind::Queue, q),
                BindingDestination::Exchange(e) => exists(ObjectKind::Exchange, e),
            };
            BindingReport {
                endpoints_exist: destination && exists(ObjectKind::Exchange, &spec.source),
                spec,
            }
        })
        .collect();
    Ok(TopologyReport {
        queue_type: layout.queue_type,
        shards: layout.shards.get(),
        objects,
        bindings,
    })
}
