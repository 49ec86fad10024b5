//! Why a job could not be finished this time ([`Failure`]), and whether
//! waiting can fix it ([`Failure::is_permanent`]).
//!
//! The retry policy ([`super::retry`]) retries a transient failure with
//! backoff and parks a permanent one at once, with the reason
//! `permanent_failure` (`release_failed` when the inventory refused the
//! stock release: [`Failure::is_release_refused`]), instead of spending
//! `retry.max_attempts` on work that will fail the same way every time.

use std::fmt;
use std::sync::Arc;

use tonic::Code;

use crate::broker::publisher::PublishError;
use crate::inventory::InventoryError;
use crate::message::OrderId;
use crate::store::StoreError;

/// A failed step of a job: a store, inventory or publish error, or one of
/// the pipeline's own cases. Cheap to clone (one failure of a batch is every
/// order's failure).
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// The database ([`StoreError::is_permanent`] classifies it).
    Store(Arc<StoreError>),
    /// The inventory service (classified by its gRPC code:
    /// [`inventory_is_permanent`]).
    Inventory(Arc<InventoryError>),
    /// A confirmed publish (an event): always transient.
    Publish(Arc<PublishError>),
    /// The cancel statement's answer left this order out.
    NoState(OrderId),
    /// Another transaction kept changing the order's row while a batch
    /// asked about it.
    KeptChanging,
    /// Several steps of one order failed (its stock release and its event).
    Several(Vec<Failure>),
}

impl Failure {
    /// Whether waiting cannot fix it and it is the order's own: retrying
    /// later would fail the same way, so the message is parked at once. A
    /// database failure counts only when it is about the row's values
    /// ([`StoreError::is_row_fault`]); one of the environment (a privilege,
    /// a missing table, a syntax error) is [`Failure::is_environment`].
    pub(crate) fn is_permanent(&self) -> bool {
        match self {
            Self::Store(e) => e.is_row_fault(),
            Self::Inventory(e) => inventory_is_permanent(e),
            Self::Publish(_) | Self::NoState(_) | Self::KeptChanging => false,
            Self::Several(all) => all.iter().any(Self::is_permanent),
        }
    }

    /// Whether it is a database failure that is not the order's own (the
    /// connection, a privilege, a missing table or column, a statement the
    /// server refuses whatever the row): it would meet any order, so it is
    /// retried with backoff for as long as it lasts, without counting
    /// towards `retry.max_attempts`: it never parks an order.
    pub(crate) fn is_environment(&self) -> bool {
        match self {
            Self::Store(e) => !e.is_row_fault(),
            Self::Several(all) => {
                !all.iter().any(Self::is_permanent) && all.iter().any(Self::is_environment)
            }
            _ => false,
        }
    }

    /// Whether it holds an inventory answer that waiting cannot fix: the
    /// stock release itself is refused for good (parked as
    /// `release_failed`, and the outbox row given up).
    pub(crate) fn is_release_refused(&self) -> bool {
        match self {
            Self::Inventory(e) => inventory_is_permanent(e),
            Self::Several(all) => all.iter().any(Self::is_release_refused),
            _ => false,
        }
    }

    /// One failure for all of `failures` (none: `None`; one: itself).
    pub(crate) fn all(mut failures: Vec<Failure>) -> Option<Failure> {
        match failures.len() {
            0 => None,
            1 => failures.pop(),
            _ => Some(Self::Several(failures)),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Store(e) => e.fmt(f),
            Self::Inventory(e) => e.fmt(f),
            Self::Publish(e) => e.fmt(f),
            Self::NoState(id) => write!(f, "the store reported no state for order {id}"),
            Self::KeptChanging => f.write_str("order row kept changing under us"),
            Self::Several(all) => {
                for (i, failure) in all.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    failure.fmt(f)?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Failure {}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Self::Store(Arc::new(e))
    }
}

impl From<InventoryError> for Failure {
    fn from(e: InventoryError) -> Self {
        Self::Inventory(Arc::new(e))
    }
}

impl From<PublishError> for Failure {
    fn from(e: PublishError) -> Self {
        Self::Publish(Arc::new(e))
    }
}

/// Whether the inventory's answer says that calling again cannot help,
/// decided per gRPC code (the codes' documented retry advice):
///
/// - permanent: `INVALID_ARGUMENT` and `OUT_OF_RANGE` (the request itself
///   is refused: an item with a quantity of 0, say), `FAILED_PRECONDITION`
///   ("do not retry until the system state has been explicitly fixed"),
///   `NOT_FOUND` (an order or SKU the inventory does not know will not
///   appear by itself), `ALREADY_EXISTS`, `UNIMPLEMENTED` (not an
///   inventory service, or another version of it), `PERMISSION_DENIED`
///   (the server knows the caller and refuses it: someone must grant it),
///   `DATA_LOSS`; and an invalid `INVENTORY_URL`;
/// - transient: `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`,
///   `ABORTED`, `CANCELLED`, `INTERNAL`, `UNKNOWN` (a proxy or a crashing
///   server says these about itself, not about the request), and
///   `UNAUTHENTICATED` (the service sends no credentials of its own; what
///   a mesh or proxy checks is a certificate or token it renews).
pub(crate) fn inventory_is_permanent(e: &InventoryError) -> bool {
    match e {
        InventoryError::Url { .. } => true,
        InventoryError::Call { code, .. } => matches!(
            code,
            Code::InvalidArgument
                | Code::OutOfRange
                | Code::FailedPrecondition
                | Code::NotFound
                | Code::AlreadyExists
                | Code::Unimplemented
                | Code::PermissionDenied
                | Code::DataLoss
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(code: Code) -> Failure {
        InventoryError::Call {
            call: "ReleaseStock",
            code,
            message: "test".into(),
        }
        .into()
    }

    #[test]
    fn inventory_codes_are_classified_as_documented() {
        for code in [
            Code::InvalidArgument,
            Code::OutOfRange,
            Code::FailedPrecondition,
            Code::NotFound,
            Code::AlreadyExists,
            Code::Unimplemented,
            Code::PermissionDenied,
            Code::DataLoss,
        ] {
            assert!(call(code).is_permanent(), "{code:?}");
        }
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
            Code::Aborted,
            Code::Cancelled,
            Code::Internal,
            Code::Unknown,
            Code::Unauthenticated,
        ] {
            assert!(!call(code).is_permanent(), "{code:?}");
        }
    }

    #[test]
    fn store_errors_follow_the_store_and_the_pipelines_own_cases_are_transient() {
        let schema = Failure::from(StoreError::Schema {
            key: "[orders].also",
            problem: "no such table".into(),
        });
        assert!(
            !schema.is_permanent() && schema.is_environment(),
            "the mapping is the world's, not the row's"
        );
        let pool = Failure::from(StoreError::Sql(sqlx::Error::PoolTimedOut));
        assert!(!pool.is_permanent() && pool.is_environment());
        let io = Failure::from(StoreError::Sql(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        ))));
        assert!(!io.is_permanent());
        let decode = Failure::from(StoreError::Sql(sqlx::Error::Decode("bad".into())));
        assert!(decode.is_permanent() && !decode.is_environment());
        assert!(!Failure::KeptChanging.is_permanent());
        assert!(!Failure::KeptChanging.is_environment());
        assert!(!Failure::NoState(OrderId::parse("a").unwrap()).is_permanent());
    }

    #[test]
    fn several_failures_are_permanent_if_one_is_and_say_every_one() {
        let both = Failure::all(vec![
            call(Code::Unavailable),
            call(Code::FailedPrecondition),
        ])
        .unwrap();
        assert!(both.is_permanent());
        let text = both.to_string();
        assert!(
            text.contains("Unavailable")
                && text.contains("FailedPrecondition")
                && text.contains("; "),
            "{text}"
        );
        assert!(
            !Failure::all(vec![call(Code::Unavailable), call(Code::Internal)])
                .unwrap()
                .is_permanent()
        );
        assert!(Failure::all(Vec::new()).is_none());
        assert!(matches!(
            Failure::all(vec![Failure::KeptChanging]),
            Some(Failure::KeptChanging)
        ));
    }
}
