//! What the load generator's orders look like: the named workloads
//! (`--workload shop`, `--workload mix`) and the timeout distributions
//! behind them: a fixed timeout (`5s`), a uniform range (`1s..10s`), or a
//! weighted list (`500ms:1,1s:1,5s:1,10s:1`, weights are relative; a weight
//! may be left out and counts as 1).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use order_timeout::settings::Lane;
use rand::Rng;

/// Why a `--timeouts` value does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    /// Empty input.
    #[error("empty timeout distribution")]
    Empty,
    /// A duration did not parse.
    #[error("invalid duration {0:?} (examples: 500ms, 1s, 3h)")]
    Duration(String),
    /// A weight did not parse or is not positive.
    #[error("invalid weight {0:?} (a positive number)")]
    Weight(String),
    /// A range whose end is before its start.
    #[error("range {0:?} ends before it starts")]
    Range(String),
    /// A timeout below the smallest the bench accepts.
    #[error("timeout {0:?} is below 1ms")]
    TooShort(String),
    /// `--timeout` given for a workload other than `shop`.
    #[error(
        "--timeout sets the shared payment window of --workload shop; --workload mix has its own timeouts"
    )]
    TimeoutWithMix,
}

/// The named workloads of `bench --workload`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Named {
    /// What real shops have: every order the same payment window
    /// (`--timeout`, default [`SHOP_TIMEOUT`]; mall 60 and 120 min,
    /// litemall 30 min, Magento 8 h).
    Shop,
    /// Mixed timeouts, [`MIX`]: 0.5, 1, 5 and 10 s in equal shares (half of
    /// them short enough to be held in-process, the rest one hop).
    Mix,
}

/// The shop workload's default timeout: 31 s takes as many cascade hops as
/// a 30-minute payment window (4); `--timeout 8s` is the one-hop,
/// one-level case.
pub const SHOP_TIMEOUT: Duration = Duration::from_secs(31);

/// The mix workload's timeouts.
pub const MIX: &str = "500ms:1,1s:1,5s:1,10s:1";

/// `bench --lanes`: the lanes the services run with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LaneChoice {
    /// `auto`: with `--workload shop`, its payment window, as the README
    /// tells a shop to configure; none for other workloads.
    Auto,
    /// `none`: every delay through the cascade.
    None,
    /// A list such as `30m,2h`.
    List(Vec<Lane>),
}

impl FromStr for LaneChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(Self::Auto),
            "none" => Ok(Self::None),
            list => list
                .split(',')
                .map(|l| Lane::try_from(l.trim().to_owned()))
                .collect::<Result<Vec<_>, _>>()
                .map(Self::List),
        }
    }
}

impl LaneChoice {
    /// The lanes for a run of `chosen`.
    pub fn lanes(&self, chosen: &Chosen) -> Vec<Lane> {
        match (self, chosen.name, &chosen.timeouts) {
            (Self::List(lanes), _, _) => lanes.clone(),
            (Self::Auto, "shop", TimeoutDist::Fixed(d)) if d.subsec_nanos() == 0 => {
                Lane::try_from(format!("{}s", d.as_secs()))
                    .into_iter()
                    .collect()
            }
            _ => Vec::new(),
        }
    }
}

/// The workload a run generates: what to call it and the timeouts it draws.
#[derive(Clone, Debug, PartialEq)]
pub struct Chosen {
    /// `shop`, `mix` or `custom` (`--timeouts`).
    pub name: &'static str,
    /// The payment windows.
    pub timeouts: TimeoutDist,
}

impl Default for Chosen {
    /// The default workload: `shop` with [`SHOP_TIMEOUT`].
    fn default() -> Self {
        Self {
            name: "shop",
            timeouts: TimeoutDist::Fixed(SHOP_TIMEOUT),
        }
    }
}

impl fmt::Display for Chosen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.name, &self.timeouts) {
            ("shop", TimeoutDist::Fixed(d)) => {
                write!(f, "shop (every order {})", humantime::format_duration(*d))
            }
            (name, t) => write!(f, "{name} ({t})"),
        }
    }
}

/// The workload of `--workload named [--timeout T]`, or of an explicit
/// `--timeouts` distribution (`custom`), which takes precedence.
pub fn choose(
    named: Named,
    timeout: Option<Duration>,
    timeouts: Option<&TimeoutDist>,
) -> Result<Chosen, WorkloadError> {
    if let Some(t) = timeouts {
        return Ok(Chosen {
            name: "custom",
            timeouts: t.clone(),
        });
    }
    match named {
        Named::Shop => {
            let d = timeout.unwrap_or(SHOP_TIMEOUT);
            if d < Duration::from_millis(1) {
                return Err(WorkloadError::TooShort(
                    humantime::format_duration(d).to_string(),
                ));
            }
            Ok(Chosen {
                name: "shop",
                timeouts: TimeoutDist::Fixed(d),
            })
        }
        Named::Mix if timeout.is_some() => Err(WorkloadError::TimeoutWithMix),
        Named::Mix => Ok(Chosen {
            name: "mix",
            timeouts: MIX.parse()?,
        }),
    }
}

/// How the payment window (the timeout) of each order is drawn.
#[derive(Debug, Clone, PartialEq)]
pub enum TimeoutDist {
    /// Every order gets the same timeout.
    Fixed(Duration),
    /// Uniform between the two bounds (inclusive, millisecond steps).
    Uniform(Duration, Duration),
    /// One of the listed timeouts, with relative weights.
    Weighted(Vec<(Duration, f64)>),
}

fn parse_duration(s: &str) -> Result<Duration, WorkloadError> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|_| WorkloadError::Duration(s.trim().to_owned()))?;
    if d < Duration::from_millis(1) {
        return Err(WorkloadError::TooShort(s.trim().to_owned()));
    }
    Ok(d)
}

impl FromStr for TimeoutDist {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(WorkloadError::Empty);
        }
        if let Some((lo, hi)) = s.split_once("..") {
            let (lo, hi) = (parse_duration(lo)?, parse_duration(hi)?);
            if hi < lo {
                return Err(WorkloadError::Range(s.to_owned()));
            }
            return Ok(Self::Uniform(lo, hi));
        }
        if !s.contains(',') && !s.contains(':') {
            return Ok(Self::Fixed(parse_duration(s)?));
        }
        let mut items = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (d, w) = match part.split_once(':') {
                Some((d, w)) => {
                    let w: f64 = w
                        .trim()
                        .parse()
                        .map_err(|_| WorkloadError::Weight(w.trim().to_owned()))?;
                    if !(w.is_finite() && w > 0.0) {
                        return Err(WorkloadError::Weight(part.to_owned()));
                    }
                    (parse_duration(d)?, w)
                }
                None => (parse_duration(part)?, 1.0),
            };
            items.push((d, w));
        }
        match items.len() {
            0 => Err(WorkloadError::Empty),
            1 => Ok(Self::Fixed(items[0].0)),
            _ => Ok(Self::Weighted(items)),
        }
    }
}

impl fmt::Display for TimeoutDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = |d: &Duration| humantime::format_duration(*d).to_string();
        match self {
            Self::Fixed(d) => write!(f, "{}", h(d)),
            Self::Uniform(lo, hi) => write!(f, "{}..{}", h(lo), h(hi)),
            Self::Weighted(items) => {
                let parts: Vec<String> = items
                    .iter()
                    .map(|(d, w)| format!("{}:{}", h(d), w))
                    .collect();
                write!(f, "{}", parts.join(","))
            }
        }
    }
}

impl TimeoutDist {
    /// Draws one timeout.
    pub fn sample(&self, rng: &mut impl Rng) -> Duration {
        match self {
            Self::Fixed(d) => *d,
            Self::Uniform(lo, hi) => {
                let (lo, hi) = (lo.as_millis() as u64, hi.as_millis() as u64);
                Duration::from_millis(rng.random_range(lo..=hi))
            }
            Self::Weighted(items) => {
                let total: f64 = items.iter().map(|(_, w)| w).sum();
                let mut x = rng.random_range(0.0..total);
                for (d, w) in items {
                    if x < *w {
                        return *d;
                    }
                    x -= w;
                }
                items.last().map(|(d, _)| *d).unwrap_or_default()
            }
        }
    }

    /// The shortest timeout it can draw.
    pub fn min(&self) -> Duration {
        match self {
            Self::Fixed(d) | Self::Uniform(d, _) => *d,
            Self::Weighted(items) => items.iter().map(|(d, _)| *d).min().unwrap_or_default(),
        }
    }

    /// The longest timeout it can draw.
    pub fn max(&self) -> Duration {
        match self {
            Self::Fixed(d) | Self::Uniform(_, d) => *d,
            Self::Weighted(items) => items.iter().map(|(d, _)| *d).max().unwrap_or_default(),
        }
    }
}

/// Clap value parser for `--timeouts`.
pub fn parse_timeouts(s: &str) -> Result<TimeoutDist, String> {
    s.parse().map_err(|e: WorkloadError| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_lanes_are_the_shop_window() {
        let shop = |t: u64| choose(Named::Shop, Some(Duration::from_secs(t)), None).unwrap();
        let auto: LaneChoice = "auto".parse().unwrap();
        assert_eq!(auto.lanes(&shop(31))[0].secs(), 31);
        assert!(auto.lanes(&shop(2)).is_empty(), "too short for a lane");
        let mix = choose(Named::Mix, None, None).unwrap();
        assert!(auto.lanes(&mix).is_empty());
        let none: LaneChoice = "none".parse().unwrap();
        assert!(none.lanes(&shop(31)).is_empty());
        let list: LaneChoice = "30m, 2h".parse().unwrap();
        let secs: Vec<u64> = list.lanes(&mix).iter().map(|l| l.secs()).collect();
        assert_eq!(secs, [1800, 7200]);
        assert!("soon".parse::<LaneChoice>().is_err());
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_the_three_forms() {
        assert_eq!("5s".parse(), Ok(TimeoutDist::Fixed(ms(5000))));
        assert_eq!("3h".parse(), Ok(TimeoutDist::Fixed(ms(3 * 3600 * 1000))));
        assert_eq!(
            "1s..10s".parse(),
            Ok(TimeoutDist::Uniform(ms(1000), ms(10_000)))
        );
        assert_eq!(
            "500ms:1,1s:1,5s:2,10s".parse(),
            Ok(TimeoutDist::Weighted(vec![
                (ms(500), 1.0),
                (ms(1000), 1.0),
                (ms(5000), 2.0),
                (ms(10_000), 1.0)
            ]))
        );
        assert_eq!("2s:3".parse(), Ok(TimeoutDist::Fixed(ms(2000))));
    }

    #[test]
    fn rejects_bad_input_without_panicking() {
        for bad in [
            "",
            " ",
            "x",
            "5",
            "1s..",
            "..1s",
            "10s..1s",
            "1s:0",
            "1s:-1",
            "1s:abc",
            "1s:nan",
            ",",
            "0s",
            "1s:1,,nope",
        ] {
            assert!(bad.parse::<TimeoutDist>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn samples_stay_in_range_and_follow_weights() {
        let mut rng = rand::rng();
        let u: TimeoutDist = "1s..2s".parse().unwrap();
        for _ in 0..1000 {
            let d = u.sample(&mut rng);
            assert!(d >= ms(1000) && d <= ms(2000));
        }
        let w: TimeoutDist = "1s:3,2s:1".parse().unwrap();
        let ones = (0..10_000)
            .filter(|_| w.sample(&mut rng) == ms(1000))
            .count();
        assert!((7000..8000).contains(&ones), "{ones}");
        assert_eq!((w.min(), w.max()), (ms(1000), ms(2000)));
    }

    #[test]
    fn names_the_workloads() {
        let shop = choose(Named::Shop, None, None).unwrap();
        assert_eq!(shop, Chosen::default());
        assert_eq!(shop.timeouts, TimeoutDist::Fixed(ms(31_000)));
        assert_eq!(shop.to_string(), "shop (every order 31s)");
        let eight = choose(Named::Shop, Some(ms(8000)), None).unwrap();
        assert_eq!(eight.timeouts, TimeoutDist::Fixed(ms(8000)));
        let mix = choose(Named::Mix, None, None).unwrap();
        assert_eq!(mix.timeouts.to_string(), "500ms:1,1s:1,5s:1,10s:1");
        assert_eq!(mix.to_string(), "mix (500ms:1,1s:1,5s:1,10s:1)");
        assert_eq!(
            choose(Named::Mix, Some(ms(8000)), None),
            Err(WorkloadError::TimeoutWithMix)
        );
        assert!(choose(Named::Shop, Some(Duration::ZERO), None).is_err());
        let custom: TimeoutDist = "3h".parse().unwrap();
        let c = choose(Named::Shop, None, Some(&custom)).unwrap();
        assert_eq!((c.name, c.timeouts), ("custom", custom));
    }

    #[test]
    fn displays_what_it_parses() {
        let w: TimeoutDist = "500ms:1,10s:2".parse().unwrap();
        assert_eq!(w.to_string(), "500ms:1,10s:2");
        assert_eq!(w.to_string().parse::<TimeoutDist>().unwrap(), w);
    }
}
