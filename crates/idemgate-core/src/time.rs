//! Wall-clock time as the stores judge it.
//!
//! Leases and TTLs are judged by the store's clock. The memory and SQLite stores take a [`Clock`] so
//! that tests move time by hand instead of sleeping; the server stores use the server's own clock.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch, as judged by a store's clock. Serialized as RFC 3339 text
/// (`2026-12-02T15:06:21.123Z`); integers of milliseconds are read too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Millis(i64),
            Text(String),
        }
        match Wire::deserialize(d)? {
            Wire::Millis(m) => Ok(Timestamp(m)),
            Wire::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl std::str::FromStr for Timestamp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = humantime::parse_rfc3339_weak(s)
            .map_err(|e| format!("failed to read timestamp {s:?}: {e}"))?;
        let since = t
            .duration_since(UNIX_EPOCH)
            .map_err(|_| format!("failed to read timestamp {s:?}: before 1970"))?;
        Ok(Timestamp(duration_millis(since)))
    }
}

impl Timestamp {
    /// The epoch itself; useful as "long ago" in tests.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// A timestamp from milliseconds since the Unix epoch.
    pub const fn from_millis(millis: i64) -> Self {
        Timestamp(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// This instant plus `d`, saturating instead of overflowing.
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_millis(d)))
    }

    /// How long from `self` until `later`; zero when `later` is not later.
    pub fn until(self, later: Timestamp) -> Duration {
        Duration::from_millis(later.0.saturating_sub(self.0).max(0) as u64)
    }

    /// The current system time.
    pub fn now() -> Self {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(duration_millis(since))
    }

    fn as_system_time(self) -> SystemTime {
        if self.0 >= 0 {
            UNIX_EPOCH + Duration::from_millis(self.0 as u64)
        } else {
            UNIX_EPOCH - Duration::from_millis(self.0.unsigned_abs())
        }
    }
}

/// Formats as RFC 3339 in UTC with milliseconds, e.g. `2026-12-02T15:06:21.123Z`.
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 < 0 {
            return write!(f, "{}ms-before-epoch", self.0.unsigned_abs());
        }
        fmt::Display::fmt(&humantime::format_rfc3339_millis(self.as_system_time()), f)
    }
}

/// Whole milliseconds of a duration, saturating at `i64::MAX`.
pub fn duration_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A source of wall-clock time for the stores that judge time themselves.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The operating system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that only moves when told to; clones share one time. Tests use it instead of sleeping.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicI64::new(start.as_millis())))
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(duration_millis(d), Ordering::SeqCst);
    }

    /// Sets the clock to `t` (it may go backwards, as real clocks do).
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.as_millis(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339_utc() {
        let t = Timestamp::from_millis(1_796_223_981_123);
        assert_eq!(t.to_string(), "2026-12-02T15:06:21.123Z");
    }

    #[test]
    fn serializes_as_text_and_reads_both_forms() {
        let t = Timestamp::from_millis(1_796_223_981_123);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, "\"2026-12-02T15:06:21.123Z\"");
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), t);
        assert_eq!(
            serde_json::from_str::<Timestamp>("1796223981123").unwrap(),
            t
        );
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Timestamp::from_millis(1000));
        let shared = clock.clone();
        assert_eq!(clock.now().as_millis(), 1000);
        shared.advance(Duration::from_millis(250));
        assert_eq!(clock.now().as_millis(), 1250);
        assert_eq!(
            Timestamp::from_millis(1000).until(clock.now()),
            Duration::from_millis(250)
        );
        assert_eq!(clock.now().until(Timestamp::EPOCH), Duration::ZERO);
    }
}
