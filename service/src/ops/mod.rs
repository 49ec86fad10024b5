//! Operator tooling behind the `parked` and `topology` commands: the
//! failure queue ([`parked`]: list, replay, purge) and the broker objects
//! compared with what the service expects ([`topology_check`]).

pub mod parked;
pub mod topology_check;
