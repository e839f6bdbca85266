//! The store's settings: [`SqliteOptions`] in Rust, and the options a `sqlite:` URL may set.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use idemgate_core::url::{duration_option, UrlQuery};
use idemgate_core::{Clock, StoreError, SystemClock};

use crate::Result;

/// How much a commit survives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// `PRAGMA synchronous = FULL`: a commit is on disk when it returns, even across a power cut.
    #[default]
    Full,
    /// `PRAGMA synchronous = NORMAL`: a commit survives a crash of the process, but a power cut or
    /// an operating-system crash may lose the last ones (the database stays consistent). A lost
    /// reservation lets a side effect run twice: choose it knowingly.
    Normal,
}

/// Settings of a [`SqliteStore`](crate::SqliteStore). See [`apply_pragmas`](crate::apply_pragmas) for the SQLite settings they lead to.
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// How far a commit must reach before it is answered (default [`Durability::Full`]).
    pub durability: Durability,
    /// How long an operation waits for another process's lock before failing with
    /// [`StoreError::Unavailable`] (default 5 s).
    pub busy_timeout: Duration,
    /// The clock that judges TTLs by its wall clock and leases by its reading of the host's boot
    /// clock (default [`SystemClock`]; tests pass a [`idemgate_core::ManualClock`]).
    pub clock: Arc<dyn Clock>,
    /// The most writes committed in one transaction (default 256; at least 1).
    pub max_batch: usize,
    /// About how large the write-ahead log may grow, in bytes ([`DEFAULT_WAL_LIMIT`], 4 MiB; at
    /// least 64 KiB). Commits checkpoint it once it holds that much (`wal_autocheckpoint`), a
    /// checkpoint cuts the file back to that size (`journal_size_limit`), and the writer empties
    /// it (`wal_checkpoint(TRUNCATE)`) when it is idle and the log holds more than a quarter of
    /// it. Without a bound the log of a busy store only grows, and on a small disk it takes the
    /// room the journal of unconfirmed outcomes needs. A smaller bound checkpoints more often:
    /// each checkpoint is two fsyncs, even at [`Durability::Normal`].
    pub wal_limit: u64,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            durability: Durability::Full,
            busy_timeout: Duration::from_secs(5),
            clock: Arc::new(SystemClock),
            max_batch: 256,
            wal_limit: DEFAULT_WAL_LIMIT,
        }
    }
}

/// The default [`SqliteOptions::wal_limit`]: SQLite's own checkpoint threshold (1,000 pages of
/// 4 KiB). At 1 MiB (the default before) fresh calls at [`Durability::Normal`] checkpointed about
/// four times as often, 92 fsyncs per 2,000 calls through the Python decorator against 22 at
/// 4 MiB (`clients/python/README.md`); the log still stays within about twice this, 8 MiB.
pub const DEFAULT_WAL_LIMIT: u64 = 4 << 20;
/// The smallest [`SqliteOptions::wal_limit`]: a few batches' worth of pages.
pub(crate) const MIN_WAL_LIMIT: u64 = 64 << 10;

/// The options a `sqlite:` URL may set.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct UrlOptions {
    pub(crate) busy_timeout: Option<Duration>,
    pub(crate) durability: Option<Durability>,
    pub(crate) wal_limit: Option<u64>,
}

impl UrlOptions {
    /// Sets in `opts` what the URL set; the rest stays as `opts` has it.
    pub(crate) fn set(self, opts: &mut SqliteOptions) {
        if let Some(busy) = self.busy_timeout {
            opts.busy_timeout = busy;
        }
        if let Some(durability) = self.durability {
            opts.durability = durability;
        }
        if let Some(wal_limit) = self.wal_limit {
            opts.wal_limit = wal_limit;
        }
    }
}

/// The file path named by a `sqlite:` URL, and its options.
pub(crate) fn parse_url(url: &str) -> Result<(PathBuf, UrlOptions)> {
    let bad = |why: &str| {
        StoreError::misconfigured(format!(
            "failed to parse the store url {url:?}: {why} (expected sqlite://PATH or sqlite:PATH)"
        ))
    };
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| bad("it does not start with sqlite:"))?;
    // The other settings are SqliteOptions fields only; an option this version does not know is
    // refused by name.
    let query = UrlQuery::parse(rest, "sqlite", &["busy_timeout", "durability", "wal_limit"])?;
    if query.base.is_empty() {
        return Err(bad("it names no file"));
    }
    let mut options = UrlOptions::default();
    for (name, value) in query.options {
        if name == "durability" {
            options.durability = Some(match value {
                "full" => Durability::Full,
                "normal" => Durability::Normal,
                _ => {
                    return Err(StoreError::misconfigured(format!(
                        "failed to read durability={value:?} in the sqlite URL: expected full \
                         (the default: a commit is on disk when it is answered) or normal (a power \
                         cut may lose the last commits, so a side effect may run twice)"
                    )))
                }
            });
        } else if name == "wal_limit" {
            options.wal_limit = Some(wal_limit_option(value)?);
        } else {
            options.busy_timeout = Some(duration_option("sqlite", name, value, MAX_BUSY_TIMEOUT)?);
        }
    }
    Ok((PathBuf::from(query.base), options))
}

/// The largest [`SqliteOptions::wal_limit`] a URL may set: the log may reach about twice it, and
/// beyond this it would rather fill a small disk than spare fsyncs (a checkpoint per 256 MiB of
/// log is already one per tens of thousands of calls).
pub(crate) const MAX_WAL_LIMIT: u64 = 256 << 20;

/// A `wal_limit=` value: bytes, or a whole number of `KiB` or `MiB`, between [`MIN_WAL_LIMIT`] and
/// [`MAX_WAL_LIMIT`].
fn wal_limit_option(value: &str) -> Result<u64> {
    let (number, unit) = if let Some(n) = value.strip_suffix("MiB") {
        (n, 1 << 20)
    } else if let Some(n) = value.strip_suffix("KiB") {
        (n, 1 << 10)
    } else {
        (value, 1)
    };
    match number.parse::<u64>().ok().and_then(|n| n.checked_mul(unit)) {
        Some(bytes) if (MIN_WAL_LIMIT..=MAX_WAL_LIMIT).contains(&bytes) => Ok(bytes),
        _ => Err(StoreError::misconfigured(format!(
            "failed to read wal_limit={value:?} in the sqlite URL: expected a size such as 4MiB, \
             512KiB or 1048576 (bytes), at least {}KiB and at most {}MiB",
            MIN_WAL_LIMIT >> 10,
            MAX_WAL_LIMIT >> 20
        ))),
    }
}

/// The longest `busy_timeout` a URL may set: a write that waits longer for another process's lock
/// holds its caller past any sensible lease.
const MAX_BUSY_TIMEOUT: Duration = Duration::from_secs(600);
