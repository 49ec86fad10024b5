//! `[liveness]`: how soon a peer that stops answering is noticed. A peer
//! cut off by the network (a switch port, a security group, a stuck VM)
//! sends no reset and no error: every packet is dropped, and a client that
//! waits for an answer waits as long as TCP retransmits (minutes). Each
//! knob here bounds one such wait; past it the wait is an error, handled
//! like a refused connection (docs/limits.md, "Silent peers").

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;

/// The bounds on waits for the broker, the database and the inventory.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct LivenessSettings {
    /// The AMQP heartbeat the service asks for (a node URL's own
    /// `?heartbeat=N` wins): a broker silent for twice this is declared
    /// dead and the session ends. The broker proposes 60 s, which noticed
    /// a silent node only after two minutes.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Longest a connect to one broker node may take (TCP, AMQP handshake,
    /// vhost) before the next node is tried (a node URL's own
    /// `?connection_timeout=MS` wins).
    #[serde(with = "humantime_serde")]
    pub broker_connect_timeout: Duration,
    /// Longest wait for the broker's confirm of one publish (a memory
    /// alarm blocks the connection; a dead channel never answers): past
    /// it the publish failed and the work is retried.
    #[serde(with = "humantime_serde")]
    pub confirm_timeout: Duration,
    /// Longest one database operation (a statement, or a transaction with
    /// its statements) may take on the client's side, whatever the server
    /// does: a server cut off cannot apply its `statement_timeout`, and its
    /// answer never comes. A connection whose operation ran out is closed,
    /// never reused.
    #[serde(with = "humantime_serde")]
    pub database_timeout: Duration,
    /// HTTP/2 keep-alive ping interval of the inventory connection (and
    /// how long a ping may go unanswered): a silent inventory is dropped
    /// and reconnected to within about twice this.
    #[serde(with = "humantime_serde")]
    pub inventory_keepalive: Duration,
}

impl Default for LivenessSettings {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(5),
            broker_connect_timeout: Duration::from_secs(5),
            confirm_timeout: Duration::from_secs(15),
            database_timeout: Duration::from_secs(10),
            inventory_keepalive: Duration::from_secs(5),
        }
    }
}

/// The longest heartbeat AMQP can carry (an unsigned 16-bit count of
/// seconds).
const MAX_HEARTBEAT: Duration = Duration::from_secs(u16::MAX as u64);

impl LivenessSettings {
    /// The heartbeat in the whole seconds AMQP negotiates (at least 1).
    pub fn heartbeat_secs(&self) -> u16 {
        u16::try_from(self.heartbeat.as_secs().max(1)).unwrap_or(u16::MAX)
    }

    /// Every bound longer than zero (a zero would fail every wait at
    /// once) and the heartbeat within what AMQP carries.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let every = [
            ("[liveness].heartbeat", self.heartbeat),
            (
                "[liveness].broker_connect_timeout",
                self.broker_connect_timeout,
            ),
            ("[liveness].confirm_timeout", self.confirm_timeout),
            ("[liveness].database_timeout", self.database_timeout),
            ("[liveness].inventory_keepalive", self.inventory_keepalive),
        ];
        for (key, value) in every {
            if value < Duration::from_millis(1) {
                return Err(ConfigError::Invalid {
                    key,
                    problem: "must be longer than 0s".into(),
                });
            }
            if value > super::MAX_DURATION {
                return Err(ConfigError::Invalid {
                    key,
                    problem: format!(
                        "at most {}",
                        humantime::format_duration(super::MAX_DURATION)
                    ),
                });
            }
        }
        if self.heartbeat > MAX_HEARTBEAT {
            return Err(ConfigError::Invalid {
                key: "[liveness].heartbeat",
                problem: format!("at most {} s (AMQP carries 16 bits)", u16::MAX),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_notice_a_silent_peer_in_seconds() {
        let l = LivenessSettings::default();
        assert_eq!(l.heartbeat_secs(), 5);
        assert!(l.check().is_ok());
    }

    #[test]
    fn a_zero_or_an_oversized_bound_is_refused() {
        let zero = LivenessSettings {
            database_timeout: Duration::ZERO,
            ..LivenessSettings::default()
        };
        let err = zero.check().unwrap_err().to_string();
        assert!(err.contains("[liveness].database_timeout"), "{err}");
        let huge = LivenessSettings {
            heartbeat: Duration::from_secs(70_000),
            ..LivenessSettings::default()
        };
        let err = huge.check().unwrap_err().to_string();
        assert!(err.contains("[liveness].heartbeat"), "{err}");
    }

    #[test]
    fn a_sub_second_heartbeat_asks_for_one_second() {
        let l = LivenessSettings {
            heartbeat: Duration::from_millis(300),
            ..LivenessSettings::default()
        };
        assert_eq!(l.heartbeat_secs(), 1);
    }
}
