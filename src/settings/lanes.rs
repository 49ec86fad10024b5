//! `lanes`: the payment windows a shop gives (nearly) every order, each a
//! fixed-TTL queue of its own.
//!
//! Why: real shops give every order the same payment window (mall 60 min,
//! litemall 30 min, Magento 8 h). Through the binary cascade a 30-minute
//! timeout crosses 3–5 delay queues, and every order of the shop crosses the
//! same ones; a lane is one queue (sharded) whose TTL is the window, so the
//! common case is one hop. How a delay picks a lane is
//! `broker::lanes` (the broker side); this module only parses the setting.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::Shards;

/// Default `lane_shards`: four. One lane shard carried 2,000 orders/s on
/// the 2-core test machine (p99 lateness 10 ms, docs/benchmarks-log.md
/// "Headline: the shared-timeout workload, with lanes"); four leave headroom for faster machines and spread a lane's
/// queue leaders over a cluster's nodes.
pub const DEFAULT_LANE_SHARDS: Shards = Shards(4);

/// One lane: a payment window in whole seconds, from [`Lane::MIN_SECS`]
/// to [`Lane::MAX_SECS`], written as in the rest of the config (`"30m"`,
/// `"2h"`, `"31s"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct Lane(u64);

impl Lane {
    /// Shortest lane: a lane's queue holds a message for its window less
    /// the 2 s the consumer may hold in-process (as after the cascade), and
    /// a queue TTL under a second is no faster than holding.
    pub const MIN_SECS: u64 = 3;
    /// Longest lane, 49 days: RabbitMQ documents `x-message-ttl` as a 32-bit
    /// count of milliseconds (2^32 - 1 ms is 49.7 days).
    pub const MAX_SECS: u64 = 49 * 24 * 3600;

    /// The window in seconds.
    pub fn secs(self) -> u64 {
        self.0
    }

    /// The window as a duration.
    pub fn duration(self) -> Duration {
        Duration::from_secs(self.0)
    }
}

impl TryFrom<String> for Lane {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        let d = humantime::parse_duration(&text)
            .map_err(|e| format!("lane {text:?} is not a duration such as \"30m\": {e}"))?;
        if d.subsec_nanos() != 0 {
            return Err(format!("lane {text:?} must be whole seconds"));
        }
        let secs = d.as_secs();
        if !(Self::MIN_SECS..=Self::MAX_SECS).contains(&secs) {
            return Err(format!(
                "lane {text:?} must be between {}s and 49 days",
                Self::MIN_SECS
            ));
        }
        Ok(Self(secs))
    }
}

impl fmt::Display for Lane {
    /// `1800s`: the form queue names and metrics use.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}s", self.0)
    }
}

/// Most lanes accepted: each is `lane_shards` queues.
pub(super) const MAX_LANES: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;

    #[test]
    fn lanes_parse_as_durations_in_whole_seconds() {
        let s: Settings = toml::from_str(r#"lanes = ["30m", "2h", "31s"]"#).unwrap();
        let secs: Vec<u64> = s.lanes.iter().map(|l| l.secs()).collect();
        assert_eq!(secs, [1800, 7200, 31]);
        assert_eq!(s.lanes[0].to_string(), "1800s");
        assert_eq!(s.lane_shards, DEFAULT_LANE_SHARDS);
        assert!(Settings::default().lanes.is_empty(), "no lane by default");

        for (bad, says) in [
            (r#"lanes = ["2s"]"#, "between 3s"),
            (r#"lanes = ["50days"]"#, "49 days"),
            (r#"lanes = ["1500ms"]"#, "whole seconds"),
            (r#"lanes = ["soon"]"#, "not a duration"),
            ("lane_shards = 0", "between 1 and 16"),
        ] {
            let err = toml::from_str::<Settings>(bad).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn duplicate_or_too_many_lanes_are_refused() {
        let s: Settings = toml::from_str(r#"lanes = ["30m", "1800s"]"#).unwrap();
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("lanes") && err.contains("twice"), "{err}");
        let many: Vec<String> = (3..3 + MAX_LANES as u64 + 1)
            .map(|n| format!("\"{n}s\""))
            .collect();
        let s: Settings = toml::from_str(&format!("lanes = [{}]", many.join(", "))).unwrap();
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("at most 8"), "{err}");
    }
}
