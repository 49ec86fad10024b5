//! Operator tooling: one order explained ([`explain`]), the parked messages
//! ([`parked`]: list, show, replay, purge),
//! what waits in the delay cascade ([`pending`]), the queues earlier
//! layouts left ([`leftovers`]), the broker objects
//! compared with what the service expects ([`topology_check`]), and the web
//! console that shows all of it ([`console`]).

pub mod console;
pub mod explain;
pub mod leftovers;
pub mod parked;
pub mod pending;
pub mod topology_check;
pub mod topology_fds;
