//! The broker's channel-level refusals (`404 NOT_FOUND`, `403
//! ACCESS_REFUSED`, `406 PRECONDITION_FAILED`, …), told apart: a refused
//! declare or consume is an answer to act on, not a failure of the
//! connection.

use lapin::ErrorKind;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};

/// A broker's soft (channel-level) error: its kind and its text.
pub(crate) fn soft_error(error: &lapin::Error) -> Option<(AMQPSoftError, String)> {
    match error.kind() {
        ErrorKind::ProtocolError(e) => match e.kind() {
            AMQPErrorKind::Soft(kind) => Some((kind.clone(), e.get_message().to_string())),
            AMQPErrorKind::Hard(_) => None,
        },
        _ => None,
    }
}

/// True for a channel closed with `404 NOT_FOUND`.
pub(crate) fn is_not_found(error: &lapin::Error) -> bool {
    soft_error(error).is_some_and(|(kind, _)| kind == AMQPSoftError::NOTFOUND)
}
