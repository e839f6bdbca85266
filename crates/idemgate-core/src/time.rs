//! Time as the stores judge it.
//!
//! Leases and TTLs are judged by the store's clock. The memory and SQLite stores take a [`Clock`] so
//! that tests move time by hand instead of sleeping; the server stores use the server's own clock.
//!
//! Every reading has the wall clock, and where the host has one also a [`HostInstant`]: a clock
//! that no wall-clock step moves (an NTP step, a VM resumed, an operator's `date -s`) and that every
//! process on the host shares. SQLite judges leases by it, since its processes share no server
//! whose clock could judge them; a lease is a "still running" promise, and a wall-clock step must
//! not break it.

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

/// A reading of the host's steady clock: milliseconds since the host booted (counting time spent
/// suspended), and which boot. Two readings compare only within one boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostInstant {
    /// The boot the reading belongs to (Linux's `boot_id`), so that a deadline kept across a
    /// reboot is not read against a clock that started again from zero.
    pub boot: u128,
    /// Milliseconds on the boot clock.
    pub millis: i64,
}

/// One reading of a [`Clock`]: the wall clock, and the host's steady clock where there is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// The wall clock: what records show and TTLs are judged by.
    pub wall: Timestamp,
    /// The host's steady clock, `None` where the host has none this code can read.
    pub steady: Option<HostInstant>,
}

impl Now {
    /// A reading of the wall clock alone.
    pub const fn wall(wall: Timestamp) -> Self {
        Now { wall, steady: None }
    }

    /// Where a lease that ends at `lease_until` on the wall clock ends on the steady clock, when
    /// there is one.
    pub fn steady_deadline(&self, lease_until: Timestamp) -> Option<HostInstant> {
        self.steady.map(|s| HostInstant {
            boot: s.boot,
            millis: s
                .millis
                .saturating_add(lease_until.0.saturating_sub(self.wall.0)),
        })
    }

    /// The wall-clock time at which `deadline` comes, seen from this reading: as far ahead of (or
    /// behind) the wall clock as the deadline is on the steady clock. `None` when the deadline
    /// belongs to another boot (or this reading has no steady clock): then only the wall-clock
    /// time kept beside it can judge it.
    pub fn wall_deadline(&self, deadline: HostInstant) -> Option<Timestamp> {
        let steady = self.steady.filter(|s| s.boot == deadline.boot)?;
        Some(Timestamp(self.wall.0.saturating_add(
            deadline.millis.saturating_sub(steady.millis),
        )))
    }
}

/// A source of time for the stores that judge time themselves.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current wall-clock time.
    fn now(&self) -> Timestamp;

    /// The wall clock and the host's steady clock, read together. The default has no steady
    /// clock.
    fn read(&self) -> Now {
        Now::wall(self.now())
    }
}

/// The operating system's clocks: the wall clock, and on Linux `CLOCK_BOOTTIME` with the boot id.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    fn read(&self) -> Now {
        Now {
            wall: Timestamp::now(),
            steady: host::steady(),
        }
    }
}

#[cfg(target_os = "linux")]
mod host {
    use std::sync::OnceLock;

    use rustix::time::{clock_gettime, ClockId};

    use super::HostInstant;

    /// `CLOCK_BOOTTIME` with the boot id, or `None` when the boot id cannot be read.
    ///
    /// Read through the vDSO by rustix, not through libc: a per-process shim such as libfaketime
    /// moves a process's view of the libc clocks, and every process on the host must see one
    /// steady clock for a lease one of them holds to mean the same to all.
    pub(super) fn steady() -> Option<HostInstant> {
        let boot = boot_id()?;
        let t = clock_gettime(ClockId::Boottime);
        let millis = t
            .tv_sec
            .saturating_mul(1000)
            .saturating_add(t.tv_nsec / 1_000_000);
        Some(HostInstant { boot, millis })
    }

    /// The kernel's id of this boot, read once per process.
    fn boot_id() -> Option<u128> {
        static BOOT: OnceLock<Option<u128>> = OnceLock::new();
        *BOOT.get_or_init(|| {
            let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
            let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
            (hex.len() == 32)
                .then(|| u128::from_str_radix(&hex, 16).ok())
                .flatten()
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod host {
    use super::HostInstant;

    /// No steady clock shared by the host's processes is read here yet: leases fall back to the
    /// wall clock.
    pub(super) fn steady() -> Option<HostInstant> {
        None
    }
}

/// A clock that only moves when told to; clones share one time. Tests use it instead of sleeping.
///
/// It has a steady clock as the system's does: [`ManualClock::advance`] and [`ManualClock::set`]
/// move both (time passes), [`ManualClock::step_wall`] moves the wall clock alone (as an NTP step
/// does) and [`ManualClock::reboot`] starts another boot.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<ManualTime>);

#[derive(Debug, Default)]
struct ManualTime {
    wall: AtomicI64,
    steady: AtomicI64,
    boot: AtomicI64,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        let time = ManualTime::default();
        time.wall.store(start.as_millis(), Ordering::SeqCst);
        ManualClock(Arc::new(time))
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.wall.fetch_add(duration_millis(d), Ordering::SeqCst);
        self.0
            .steady
            .fetch_add(duration_millis(d), Ordering::SeqCst);
    }

    /// Sets the clock to `t`, the steady clock moving by as much (it may go backwards: a test
    /// winds time back for everyone).
    pub fn set(&self, t: Timestamp) {
        let was = self.0.wall.swap(t.as_millis(), Ordering::SeqCst);
        self.0
            .steady
            .fetch_add(t.as_millis().saturating_sub(was), Ordering::SeqCst);
    }

    /// Steps the wall clock by `millis` (negative: back) while the steady clock stays.
    pub fn step_wall(&self, millis: i64) {
        self.0.wall.fetch_add(millis, Ordering::SeqCst);
    }

    /// Starts another boot: the steady clock starts again from zero.
    pub fn reboot(&self) {
        self.0.boot.fetch_add(1, Ordering::SeqCst);
        self.0.steady.store(0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.wall.load(Ordering::SeqCst))
    }

    fn read(&self) -> Now {
        Now {
            wall: self.now(),
            steady: Some(HostInstant {
                boot: self.0.boot.load(Ordering::SeqCst) as u128,
                millis: self.0.steady.load(Ordering::SeqCst),
            }),
        }
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
    fn a_wall_step_moves_no_steady_deadline() {
        let clock = ManualClock::new(Timestamp::from_millis(10_000));
        let at_reserve = clock.read();
        let deadline = at_reserve
            .steady_deadline(Timestamp::from_millis(40_000))
            .unwrap();
        clock.step_wall(600_000);
        clock.advance(Duration::from_millis(5_000));
        // 25 s of the lease are left, whatever the wall clock says.
        let later = clock.read();
        assert_eq!(later.wall.as_millis(), 615_000);
        assert_eq!(later.wall_deadline(deadline).unwrap().as_millis(), 640_000);
        clock.step_wall(-1_200_000);
        let back = clock.read();
        assert_eq!(
            back.wall
                .until(back.wall_deadline(deadline).unwrap())
                .as_millis(),
            25_000
        );
        // Another boot cannot read the deadline; a reading without a steady clock neither.
        clock.reboot();
        assert_eq!(clock.read().wall_deadline(deadline), None);
        assert_eq!(Now::wall(back.wall).wall_deadline(deadline), None);
    }

    #[test]
    fn the_system_clock_reads_the_boot_clock_on_linux() {
        let a = SystemClock.read();
        let b = SystemClock.read();
        if cfg!(target_os = "linux") {
            let (a, b) = (a.steady.unwrap(), b.steady.unwrap());
            assert_eq!(a.boot, b.boot);
            assert!(a.millis > 0 && a.millis <= b.millis);
        } else {
            assert_eq!(a.steady, None);
        }
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
