#![doc = include_str!("../README.md")]

mod error;
mod foreign;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod row;
mod schema;
mod writer;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use idemgate_core::transition::{self, Change, StoredRecord};
use idemgate_core::url::{duration_option, UrlQuery};
use idemgate_core::{
    ChangeMark, Changes, Claim, Clock, Completion, Fence, Keep, Key, Lease, ListFilter, Outcome,
    Record, Reopened, Reservation, State, Store, StoreError, SystemClock, Timestamp,
};
use rusqlite::types::Value;
use rusqlite::Connection;
use tokio::sync::mpsc;

use crate::error::{Context, Stage};
use crate::writer::{
    Core, Counters, Op, Readers, Shared, Task, WakeForCheckpoint, WalWatch, Writer,
};

pub use crate::schema::{apply_pragmas, APPLICATION_ID, SCHEMA_VERSION};
/// The rusqlite this crate is built with, so that a benchmark baseline opens its connection with
/// the same SQLite.
pub use rusqlite;

type Result<T, E = StoreError> = std::result::Result<T, E>;

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

/// Settings of a [`SqliteStore`]. See [`apply_pragmas`] for the SQLite settings they lead to.
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// How far a commit must reach before it is answered (default [`Durability::Full`]).
    pub durability: Durability,
    /// How long an operation waits for another process's lock before failing with
    /// [`StoreError::Unavailable`] (default 5 s).
    pub busy_timeout: Duration,
    /// The clock that judges leases and TTLs (default [`SystemClock`]; tests pass a
    /// [`idemgate_core::ManualClock`]).
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

/// What the writer has committed so far, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Committed transactions (each one fsync of the WAL at [`Durability::Full`]).
    pub batches: u64,
    /// Write operations in those transactions.
    pub operations: u64,
}

/// Write operations waiting for the writer before callers wait for room in the queue.
const QUEUE: usize = 4096;
/// Read connections kept open between reads.
const IDLE_READERS: usize = 4;
/// Row ids per transaction of [`SqliteStore::purge_expired`]: a few milliseconds of writing.
const PURGE_RANGE: i64 = 4096;
/// The default [`SqliteOptions::wal_limit`]: SQLite's own checkpoint threshold (1,000 pages of
/// 4 KiB). At 1 MiB (the default before) fresh calls at [`Durability::Normal`] checkpointed about
/// four times as often, 92 fsyncs per 2,000 calls through the Python decorator against 22 at
/// 4 MiB (`clients/python/README.md`); the log still stays within about twice this, 8 MiB.
pub const DEFAULT_WAL_LIMIT: u64 = 4 << 20;
/// The smallest [`SqliteOptions::wal_limit`]: a few batches' worth of pages.
const MIN_WAL_LIMIT: u64 = 64 << 10;

/// Idempotency records in one SQLite file, shared by every process that opens it. Clones share one
/// writer thread and its connections; dropping the last clone ends the thread, after waiting for
/// the batch it is running (at most about `busy_timeout` when another process holds the lock).
///
/// # Concurrent calls on the same key
/// Writes are serialized by SQLite's write lock (one `BEGIN IMMEDIATE` transaction at a time
/// across all processes) and, within a process, by the writer thread, so exactly one of racing
/// reservations acquires, in this process or any other.
///
/// # Cancellation
/// A write is queued when its future is first polled. Dropping the future before that writes
/// nothing; dropping it afterwards lets the write commit fully in its batch, unseen by the caller.
///
/// # Errors
/// [`StoreError::Unavailable`] when the write certainly did not commit (the lock stayed busy past
/// `busy_timeout`, the file cannot be opened, an error inside the transaction),
/// [`StoreError::Indeterminate`] when `COMMIT` itself failed (disk full, I/O error), and
/// [`StoreError::Corrupt`] when a stored row cannot be read.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    opts: SqliteOptions,
    /// `None` only while dropping, so that the writer sees the queue close.
    tx: Option<mpsc::Sender<Box<dyn Task>>>,
    writer: Option<JoinHandle<()>>,
    /// The write connection, which callers use directly when the writer thread is idle.
    shared: Arc<Shared>,
    readers: Arc<Readers>,
    changes: Arc<Changes>,
    /// Hears of other processes' commits while anyone waits.
    foreign: Option<foreign::ForeignWatch>,
    counters: Arc<Counters>,
    #[cfg(test)]
    hooks: Arc<writer::TestHooks>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("durability", &self.inner.opts.durability)
            .field("busy_timeout", &self.inner.opts.busy_timeout)
            .field("max_batch", &self.inner.opts.max_batch)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue ends the writer after its current batch; joining it means the write
        // connection is closed (and its batch answered) once the last clone is gone.
        drop(self.tx.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, migrating its schema to
    /// [`SCHEMA_VERSION`], and starts its writer thread.
    ///
    /// # Errors
    /// [`StoreError::Misconfigured`] when the directory of `path` does not exist (it is not
    /// created), when the file is another program's database or was written by a newer version
    /// of idemgate, or when WAL cannot be used there; [`StoreError::Unavailable`] when the file
    /// cannot be opened or stays locked past `busy_timeout`; [`StoreError::Corrupt`] when it is
    /// not a database.
    pub fn open(path: impl AsRef<Path>, opts: SqliteOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" {
            return Err(StoreError::Misconfigured(format!(
                "failed to open the sqlite store {:?}: it needs a file path, since the writer and \
                 the readers (and other processes) must share the database",
                path.display()
            )));
        }
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            return Err(StoreError::Misconfigured(format!(
                "failed to open the sqlite store {}: directory {} does not exist (create it first)",
                path.display(),
                dir.display()
            )));
        }
        let mut opts = opts;
        opts.max_batch = opts.max_batch.max(1);
        opts.wal_limit = opts.wal_limit.max(MIN_WAL_LIMIT);

        let mut conn = schema::connect(&path, &opts, false)?;
        schema::migrate(&conn, &path)?;
        let wal_watch = WalWatch::of(&conn)
            .and_then(|watch| watch.install(&mut conn).map(|()| watch))
            .during(Stage::Open, || {
                format!("watch the log of {}", path.display())
            })?;
        // One reader now, so that a file that cannot be read fails here rather than at first use.
        let reader = schema::connect(&path, &opts, true)?;
        let readers = Arc::new(Readers::new(reader));

        let (tx, rx) = mpsc::channel(QUEUE);
        let changes = Arc::new(Changes::new());
        let counters = Arc::new(Counters::default());
        #[cfg(test)]
        let hooks = Arc::new(writer::TestHooks::default());
        let shared = Arc::new(Shared::new(Core {
            conn: Ok(conn),
            read_only: false,
            readers: readers.clone(),
            clock: opts.clock.clone(),
            path: path.clone(),
            opts: opts.clone(),
            wal: wal_path(&path),
            wal_watch,
            last_checkpoint: None,
            changes: changes.clone(),
            counters: counters.clone(),
        }));
        let writer = Writer {
            shared: shared.clone(),
            rx,
            max_batch: opts.max_batch,
            #[cfg(test)]
            hooks: hooks.clone(),
        };
        let writer = std::thread::Builder::new()
            .name("idemgate-sqlite-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| {
                StoreError::Unavailable(format!(
                    "failed to start the writer thread of the sqlite store {}: {e}",
                    path.display()
                ))
            })?;
        // Without it, waiters still hear of other processes' commits at their polls.
        let foreign =
            foreign::ForeignWatch::start(wal_path(&path), changes.clone(), counters.clone()).ok();
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                opts,
                tx: Some(tx),
                writer: Some(writer),
                shared,
                readers,
                changes,
                foreign,
                counters,
                #[cfg(test)]
                hooks,
            }),
        })
    }

    /// Opens the store named by `url` with default options.
    ///
    /// Accepted forms, the rest of the URL taken literally as a file path (no percent-decoding). The
    /// query options are `busy_timeout` (`?busy_timeout=500ms`, overriding
    /// [`SqliteOptions::busy_timeout`]), `durability` (`full` or `normal`, overriding
    /// [`SqliteOptions::durability`]) and `wal_limit` (`?wal_limit=4MiB`, overriding
    /// [`SqliteOptions::wal_limit`]); any other is refused (`docs/STORES.md`):
    /// - `sqlite:///var/lib/idemgate.db` and `sqlite:/var/lib/idemgate.db`: absolute paths;
    /// - `sqlite://idemgate.db` and `sqlite:data/idemgate.db`: relative to the working directory.
    ///
    /// # Errors
    /// [`StoreError::Misconfigured`] for any other URL, and as [`SqliteStore::open`].
    pub fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, SqliteOptions::default())
    }

    /// Opens the store named by `url` (see [`SqliteStore::connect`]) with `opts`.
    ///
    /// # Errors
    /// As [`SqliteStore::connect`].
    pub fn connect_with(url: &str, mut opts: SqliteOptions) -> Result<Self> {
        let (path, options) = parse_url(url)?;
        if let Some(busy) = options.busy_timeout {
            opts.busy_timeout = busy;
        }
        if let Some(durability) = options.durability {
            opts.durability = durability;
        }
        if let Some(wal_limit) = options.wal_limit {
            opts.wal_limit = wal_limit;
        }
        Self::open(path, opts)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The options the store runs with.
    pub fn options(&self) -> &SqliteOptions {
        &self.inner.opts
    }

    /// What the writer has committed so far; `operations / batches` is how many writes shared
    /// each commit.
    pub fn writer_stats(&self) -> WriterStats {
        WriterStats {
            batches: self.inner.counters.batches.load(Ordering::Relaxed),
            operations: self.inner.counters.operations.load(Ordering::Relaxed),
        }
    }

    /// Runs `work` at once if the writer is idle, else queues it for the writer thread; either
    /// way answers after its batch committed.
    async fn write<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Timestamp) -> Result<(T, bool)> + Send + 'static,
    {
        self.write_record(None, work).await
    }

    /// [`SqliteStore::write`] of a write to the record under `key` (when `Some`), whose waiters
    /// its commit wakes.
    async fn write_record<T, F>(&self, key: Option<Key>, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Timestamp) -> Result<(T, bool)> + Send + 'static,
    {
        let (task, answer) = Op::queue(key, work);
        let stopped = || {
            StoreError::Unavailable(format!(
                "failed to reach the writer of the sqlite store {}: it has stopped",
                self.inner.path.display()
            ))
        };
        let tx = self.inner.tx.as_ref().ok_or_else(stopped)?;
        let queued = tx.capacity() < tx.max_capacity();
        match self.inner.shared.run_inline(task, queued) {
            // A full queue means a busy thread, which checkpoints when it is idle anyway.
            Ok(true) => drop(tx.try_send(Box::new(WakeForCheckpoint))),
            Ok(false) => {}
            Err(task) => {
                tx.send(task).await.map_err(|_| stopped())?;
                self.inner.shared.task_queued();
            }
        }
        answer.await.unwrap_or_else(|_| {
            // The writer went away between taking the task and answering it (it panicked).
            Err(StoreError::Indeterminate(format!(
                "failed to hear back from the writer of the sqlite store {}: it stopped during \
                 the batch",
                self.inner.path.display()
            )))
        })
    }

    /// Applies one transition to the stored record under `key`, in the writer's transaction.
    async fn transition<T, F>(&self, key: &Key, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Option<&StoredRecord>, Timestamp) -> Result<(T, Change)> + Send + 'static,
    {
        let key = key.clone();
        self.write_record(Some(key.clone()), move |conn, now| {
            let cur = row::load(conn, &key, Stage::Write)?;
            let (out, change) = f(cur.as_ref(), now)?;
            let wrote = row::apply(conn, &key, cur.as_ref(), change)?;
            Ok((out, wrote))
        })
        .await
    }

    /// Runs `f` on a read connection on the blocking pool.
    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &dyn Clock) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            // Held until the connection is back among the idle ones (see `Readers`).
            let readers = inner.readers.shared();
            let conn = match Readers::idle(&readers).pop() {
                Some(conn) => conn,
                None => schema::connect(&inner.path, &inner.opts, true)?,
            };
            let out = f(&conn, inner.opts.clock.as_ref());
            let mut idle = Readers::idle(&readers);
            if idle.len() < IDLE_READERS {
                idle.push(conn);
            }
            out
        })
        .await
        .unwrap_or_else(|e| {
            Err(StoreError::Unavailable(format!(
                "failed to read the sqlite store: the read task ended early: {e}"
            )))
        })
    }
}

/// The write-ahead log of the database at `path`, as SQLite names it.
fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// The options a `sqlite:` URL may set.
#[derive(Debug, Default, PartialEq, Eq)]
struct UrlOptions {
    busy_timeout: Option<Duration>,
    durability: Option<Durability>,
    wal_limit: Option<u64>,
}

/// The file path named by a `sqlite:` URL, and its options.
fn parse_url(url: &str) -> Result<(PathBuf, UrlOptions)> {
    let bad = |why: &str| {
        StoreError::Misconfigured(format!(
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
                    return Err(StoreError::Misconfigured(format!(
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
const MAX_WAL_LIMIT: u64 = 256 << 20;

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
        _ => Err(StoreError::Misconfigured(format!(
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

/// The SQL condition and parameters that select the rows whose view at `now` is in `state`, or
/// `None` for a state this version cannot express in SQL (then Rust filters).
fn state_condition(state: Option<State>, now: i64) -> Option<(String, Vec<Value>)> {
    use row::{COMPLETED, IN_FLIGHT, UNKNOWN};
    // Mirrors StoredRecord::view: a completed row past its tombstone counts as absent, one past
    // its ttl but within its tombstone as expired, an in-flight row past its lease as unknown.
    // A row completed before schema version 4 has no `retain_until` and kept no tombstone: it
    // counts until `expires_at` (as row::decode reads it).
    const RETAIN: &str = "coalesce(retain_until, expires_at)";
    let (sql, times) = match state {
        None => (format!("NOT (state = {COMPLETED} AND {RETAIN} <= ?)"), 1),
        Some(State::InFlight) => (format!("state = {IN_FLIGHT} AND lease_until > ?"), 1),
        Some(State::Completed) => (format!("state = {COMPLETED} AND expires_at > ?"), 1),
        Some(State::Expired) => (
            format!("state = {COMPLETED} AND expires_at <= ? AND {RETAIN} > ?"),
            2,
        ),
        Some(State::Unknown) => (
            format!("(state = {UNKNOWN} OR (state = {IN_FLIGHT} AND lease_until <= ?))"),
            1,
        ),
        Some(_) => return None,
    };
    Some((sql, vec![Value::Integer(now); times]))
}

fn list_rows(conn: &Connection, filter: &ListFilter, now: Timestamp) -> Result<Vec<Record>> {
    let mut conditions = Vec::new();
    let mut params = Vec::new();
    if let Some(tenant) = &filter.tenant {
        conditions.push("tenant = ?".to_owned());
        params.push(Value::Text(tenant.as_str().to_owned()));
    }
    if let Some(tool) = &filter.tool {
        conditions.push("tool = ?".to_owned());
        params.push(Value::Text(tool.as_str().to_owned()));
    }
    if let Some(scope) = &filter.scope {
        conditions.push("scope = ?".to_owned());
        params.push(Value::Text(scope.to_string()));
    }
    let by_state = state_condition(filter.state, now.as_millis());
    let limit_in_sql = by_state.is_some() && filter.limit > 0;
    let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
    if let Some((sql, values)) = by_state {
        conditions.push(sql);
        params.extend(values);
    }
    let mut sql = format!("SELECT {} FROM idemgate_record", row::columns!());
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    // The memory store's order: (created_at, key), keys compared byte-wise as SQLite's BINARY
    // collation does.
    sql.push_str(" ORDER BY created_at, tenant, tool, key");
    if limit_in_sql {
        sql.push_str(" LIMIT ?");
        params.push(Value::Integer(limit));
    }
    let what = || "list records";
    let mut stmt = conn.prepare_cached(&sql).during(Stage::Read, what)?;
    let mut rows = stmt
        .query(rusqlite::params_from_iter(params))
        .during(Stage::Read, what)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().during(Stage::Read, what)? {
        let stored = row::decode(r)?;
        if let Some(rec) = stored.view(now).filter(|rec| filter.matches(rec)) {
            out.push(rec);
            if filter.limit > 0 && out.len() == filter.limit {
                break;
            }
        }
    }
    Ok(out)
}

impl Store for SqliteStore {
    async fn reserve(&self, r: &Reservation) -> Result<Claim> {
        let owned = r.clone();
        self.transition(&r.key, move |cur, now| {
            Ok(transition::reserve(cur, &owned, now))
        })
        .await
    }

    async fn takeover(&self, r: &Reservation, stale: Fence) -> Result<Claim> {
        let owned = r.clone();
        self.transition(&r.key, move |cur, now| {
            Ok(transition::takeover(cur, &owned, stale, now))
        })
        .await
    }

    async fn heartbeat(&self, key: &Key, lease: Lease, lease_for: Duration) -> Result<Timestamp> {
        self.transition(key, move |cur, now| {
            transition::heartbeat(cur, lease, lease_for, now)
        })
        .await
    }

    async fn complete_at(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        keep: Keep,
        executed_at: Option<Timestamp>,
    ) -> Result<Completion> {
        let outcome = outcome.clone();
        self.transition(key, move |cur, now| {
            transition::complete(cur, lease, &outcome, keep, executed_at, now)
        })
        .await
    }

    async fn release(&self, key: &Key, lease: Lease) -> Result<()> {
        self.transition(key, move |cur, _| {
            Ok(((), transition::release(cur, lease)?))
        })
        .await
    }

    async fn mark_unknown(&self, key: &Key, lease: Lease) -> Result<()> {
        self.transition(key, move |cur, now| {
            Ok(((), transition::mark_unknown(cur, lease, now)?))
        })
        .await
    }

    async fn reopen(&self, key: &Key, fence: Fence) -> Result<Reopened> {
        self.transition(key, move |cur, now| Ok(transition::reopen(cur, fence, now)))
            .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let key = key.clone();
        self.read(move |conn, clock| {
            let stored = row::load(conn, &key, Stage::Read)?;
            // Judged after the read: the snapshot is no newer than this instant.
            let now = clock.now();
            Ok(stored.and_then(|s| s.view(now)))
        })
        .await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let filter = filter.clone();
        self.read(move |conn, clock| list_rows(conn, &filter, clock.now()))
            .await
    }

    async fn purge_expired(&self) -> Result<u64> {
        // Without an index on the state (see schema_v2.sql) one DELETE would scan the whole table
        // while it holds the write lock, and every write would wait for it. Ranges of row ids
        // keep each transaction short; rows added meanwhile are past the last range, and too new
        // to have expired.
        //
        // Mirrors transition::purge, range by range: completed rows past their tombstone go
        // (a row completed before schema version 4 has no `retain_until` and goes at its
        // `expires_at`, see row::decode); completed rows past their ttl that stay as tombstones
        // lose their outcome's body, which nothing reads again (they are reported expired,
        // without an outcome), so that a long tombstone costs its key and a few numbers rather
        // than a whole result. Only deletions are counted. Unknown rows stay.
        let last: i64 = self
            .read(|conn, _| {
                conn.query_row(
                    "SELECT coalesce(max(rowid), 0) FROM idemgate_record",
                    [],
                    |r| r.get(0),
                )
                .during(Stage::Read, || "find the last record to purge")
            })
            .await?;
        let mut purged = 0;
        let mut from = 0;
        while from < last {
            let to = from.saturating_add(PURGE_RANGE);
            purged += self
                .write(move |conn, now| {
                    let args = (from, to, row::COMPLETED, now.as_millis());
                    let deleted = conn
                        .prepare_cached(
                            "DELETE FROM idemgate_record WHERE rowid > ?1 AND rowid <= ?2 \
                             AND state = ?3 AND coalesce(retain_until, expires_at) <= ?4",
                        )
                        .and_then(|mut stmt| stmt.execute(args))
                        .during(Stage::Write, || "purge expired records")?;
                    // After the DELETE in the same transaction, every completed row of the range
                    // past its ttl is a tombstone that stays. Bodies already empty are left
                    // alone, so that purging again rewrites no page.
                    let compacted = conn
                        .prepare_cached(
                            "UPDATE idemgate_record SET outcome_body = x'' \
                             WHERE rowid > ?1 AND rowid <= ?2 AND state = ?3 \
                             AND expires_at <= ?4 AND length(outcome_body) > 0",
                        )
                        .and_then(|mut stmt| stmt.execute(args))
                        .during(Stage::Write, || "drop the outcomes of tombstones")?;
                    Ok((deleted as u64, deleted + compacted > 0))
                })
                .await?;
            from = to;
        }
        Ok(purged)
    }

    fn change_mark(&self, key: &Key) -> ChangeMark {
        self.inner.changes.mark(key)
    }

    async fn wait_changed(&self, key: &Key, since: ChangeMark, timeout: Duration) {
        if let Some(foreign) = &self.inner.foreign {
            foreign.waiting();
        }
        // Woken by the commits of this store that wrote the record (or another of its slot),
        // at once by one that landed since the caller took its mark, and within a tick or two
        // by another process's commit ([`foreign`]). The engine's poll (`Settings::max_poll`)
        // stays the backstop, e.g. for the first commit of another process, which the watcher
        // may not yet tell from this store's own.
        self.inner.changes.wait(key, since, timeout).await;
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use idemgate_core::{
        Fingerprint, IdempotencyKey, ManualClock, OutcomeKind, RecordState, TenantId, ToolName,
    };
    use rusqlite::OptionalExtension;

    use super::*;

    fn key(name: &str) -> Key {
        Key::new(
            TenantId::new("acme").unwrap(),
            ToolName::new("send_invoice").unwrap(),
            IdempotencyKey::new(name).unwrap(),
        )
    }

    fn reservation(key: &Key) -> Reservation {
        Reservation::new(
            key.clone(),
            Fingerprint::of_bytes(b"args"),
            Duration::from_secs(60),
        )
    }

    fn manual() -> SqliteOptions {
        SqliteOptions {
            clock: Arc::new(ManualClock::new(Timestamp::from_millis(1_800_000_000_000))),
            ..SqliteOptions::default()
        }
    }

    fn raw(path: &Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn
    }

    async fn acquire(store: &SqliteStore, key: &Key) -> Lease {
        match store.reserve(&reservation(key)).await.unwrap() {
            Claim::Acquired(lease) => lease,
            Claim::Existing(rec) => panic!("expected to acquire {key}, found {rec:?}"),
        }
    }

    /// The writer held after it takes its next task (see [`Held::release_as_one_batch`]).
    struct Held<'a> {
        store: &'a SqliteStore,
        guard: tokio::sync::MutexGuard<'a, ()>,
        arrived: u64,
    }

    async fn hold(store: &SqliteStore) -> Held<'_> {
        // Every write goes through the thread from now on, so that the held batch can form.
        store.inner.shared.inline_off.store(true, Ordering::SeqCst);
        let guard = store.inner.hooks.gate.lock().await;
        let arrived = store.inner.hooks.arrived.load(Ordering::SeqCst);
        Held {
            store,
            guard,
            arrived,
        }
    }

    impl Held<'_> {
        /// Waits until the writer took one task and `queued` more wait behind it, then lets them
        /// all go as one batch.
        async fn release_as_one_batch(self, queued: usize) {
            let hooks = &self.store.inner.hooks;
            let tx = self.store.inner.tx.as_ref().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let waiting = tx.max_capacity() - tx.capacity();
                if hooks.arrived.load(Ordering::SeqCst) > self.arrived && waiting == queued {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the batch never formed: {waiting} queued"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            drop(self.guard);
        }
    }

    #[test]
    fn urls_name_files() {
        let p = |u: &str| parse_url(u).unwrap().0;
        assert_eq!(
            p("sqlite:///var/lib/idemgate.db"),
            Path::new("/var/lib/idemgate.db")
        );
        assert_eq!(
            p("sqlite:/var/lib/idemgate.db"),
            Path::new("/var/lib/idemgate.db")
        );
        assert_eq!(p("sqlite://idemgate.db"), Path::new("idemgate.db"));
        assert_eq!(p("sqlite:data/idemgate.db"), Path::new("data/idemgate.db"));
        assert_eq!(
            parse_url("sqlite:///x.db?busy_timeout=250ms&durability=normal").unwrap(),
            (
                PathBuf::from("/x.db"),
                UrlOptions {
                    busy_timeout: Some(Duration::from_millis(250)),
                    durability: Some(Durability::Normal),
                    wal_limit: None,
                }
            )
        );
        assert_eq!(
            parse_url("sqlite:///x.db").unwrap().1,
            UrlOptions::default()
        );
        let e = parse_url("sqlite:///x.db?durability=off").unwrap_err();
        assert!(e.to_string().contains("durability=\"off\""), "{e}");
        for bad in [
            "postgres://x",
            "sqlite:",
            "sqlite://",
            "sqlite://x.db?mode=ro",
            "x.db",
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(
                matches!(&e, StoreError::Misconfigured(m) if m.starts_with("failed to parse")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn url_options_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("opts.db");
        let url = format!("sqlite://{}?synchronous=off", path.display());
        let e = SqliteStore::connect(&url).unwrap_err();
        assert!(
            matches!(&e, StoreError::Misconfigured(m)
                if m.contains("\"synchronous\"")
                    && m.contains("the options are busy_timeout, durability, wal_limit")),
            "{e}"
        );
        assert!(!path.exists(), "a refused URL must not create its file");
    }

    #[test]
    fn wal_limit_is_read_from_the_url_in_bytes_kib_or_mib() {
        let limit = |u: &str| parse_url(u).map(|(_, o)| o.wal_limit);
        assert_eq!(
            limit("sqlite:///x.db?wal_limit=4MiB").unwrap(),
            Some(4 << 20)
        );
        assert_eq!(
            limit("sqlite:///x.db?wal_limit=512KiB").unwrap(),
            Some(512 << 10)
        );
        assert_eq!(
            limit("sqlite:///x.db?wal_limit=1048576").unwrap(),
            Some(1 << 20)
        );
        assert_eq!(
            limit("sqlite:///x.db?wal_limit=64KiB").unwrap(),
            Some(MIN_WAL_LIMIT)
        );
        assert_eq!(
            limit("sqlite:///x.db?wal_limit=256MiB").unwrap(),
            Some(MAX_WAL_LIMIT)
        );
        for bad in [
            "",
            "4MB",
            "4 MiB",
            "-1",
            "1.5MiB",
            "63KiB",
            "257MiB",
            "99999999999999999999MiB",
        ] {
            let e = limit(&format!("sqlite:///x.db?wal_limit={bad}")).unwrap_err();
            assert!(
                matches!(&e, StoreError::Misconfigured(m)
                    if m.contains(&format!("wal_limit={bad:?}")) && m.contains("at least 64KiB")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn connect_opens_the_named_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("via-url.db");
        let store = SqliteStore::connect(&format!("sqlite://{}", path.display())).unwrap();
        assert_eq!(store.path(), path);
        assert!(path.exists());
        assert!(format!("{store:?}").contains("via-url.db"));
    }

    #[test]
    fn missing_directory_is_refused_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("idemgate.db");
        let e = SqliteStore::open(&path, SqliteOptions::default()).unwrap_err();
        assert!(
            matches!(&e, StoreError::Misconfigured(m) if m.contains("does not exist")),
            "{e}"
        );
        assert!(!dir.path().join("missing").exists());
        let e = SqliteStore::open(":memory:", SqliteOptions::default()).unwrap_err();
        assert!(matches!(e, StoreError::Misconfigured(_)), "{e}");
    }

    /// Node's thread polls a call's future once, inside the runtime's context but on no worker,
    /// before handing it to the runtime: a lone write that would run inline there (a commit
    /// waiting on the disk) is queued for the writer's thread instead.
    #[test]
    fn a_caller_that_must_not_block_never_writes_inline() {
        use std::task::{Context, Poll, Waker};
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = rt
            .block_on(async { SqliteStore::open(dir.path().join("db"), SqliteOptions::default()) })
            .unwrap();
        let _in_runtime = rt.enter();
        let first_poll = |name: &str, must_not_block: bool| {
            let r = reservation(&key(name));
            let mut reserve = Box::pin(store.reserve(&r));
            let mut poll = || {
                reserve
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
            };
            let ready = if must_not_block {
                idemgate_core::caller::without_blocking(poll)
            } else {
                poll()
            };
            let claim = match ready {
                Poll::Ready(claim) => Some(claim),
                Poll::Pending => None,
            };
            let done = claim.is_some();
            let claim = claim.unwrap_or_else(|| rt.block_on(reserve));
            assert!(matches!(claim, Ok(Claim::Acquired(_))), "{claim:?}");
            done
        };
        // Unmarked, an idle writer's write runs on the caller's thread in its first poll (the
        // writer's thread may be busy a moment after opening: tried until it is idle).
        assert!(
            (0..200).any(|i| first_poll(&format!("inline-{i}"), false)),
            "an idle writer never ran a write inline"
        );
        for i in 0..20 {
            assert!(
                !first_poll(&format!("queued-{i}"), true),
                "a caller that must not block wrote inline"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn purge_deletes_expired_completions_across_many_ranges_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = SqliteStore::open(&path, manual()).unwrap();
        let now = 1_800_000_000_000_i64;
        // Rows straight into the table, three ranges' worth: completed and past its tombstone
        // (every fourth row; every other one of them written before schema version 4, without
        // `retain_until`, so gone at its `expires_at`), completed and not yet expired, unknown
        // (kept whatever its age), and completed past its ttl within its tombstone (kept, with
        // its outcome's body dropped).
        let rows = 3 * PURGE_RANGE + 17;
        let conn = raw(&path);
        conn.execute_batch("BEGIN").unwrap();
        let (mut expired, mut tombstones) = (0, 0);
        for i in 0..rows {
            let completed = |expires_at: i64, retain_until: Option<i64>| {
                (
                    row::COMPLETED,
                    Some(expires_at),
                    retain_until,
                    Some(now - 10),
                    None,
                    Some(0),
                    Some(b"x".to_vec()),
                )
            };
            let (state, expires_at, retain_until, completed_at, since, kind, body) = match i % 4 {
                0 if i % 8 == 0 => completed(now - 1, None),
                0 => completed(now - 60_000, Some(now - 1)),
                1 => completed(now + 60_000, Some(now + 60_000)),
                2 => (
                    row::UNKNOWN,
                    None,
                    None,
                    None,
                    Some(now - 86_400_000),
                    None,
                    None,
                ),
                _ => completed(now - 1, Some(now + 60_000)),
            };
            expired += u64::from(i % 4 == 0);
            tombstones += i64::from(i % 4 == 3);
            conn.execute(
                "INSERT INTO idemgate_record (tenant, tool, key, fingerprint, fence, token, \
                 created_at, state, lease_until, since, completed_at, expires_at, outcome_kind, \
                 outcome_body, retain_until) \
                 VALUES ('t', 'tool', ?1, ?2, 1, ?3, ?4, ?5, NULL, ?6, ?7, ?8, ?9, ?10, ?11)",
                rusqlite::params![
                    format!("k{i}"),
                    [0u8; 32].as_slice(),
                    [0u8; 16].as_slice(),
                    now - 100,
                    state,
                    since,
                    completed_at,
                    expires_at,
                    kind,
                    body,
                    retain_until
                ],
            )
            .unwrap();
        }
        conn.execute_batch("COMMIT").unwrap();
        let batches = store.writer_stats().batches;
        assert_eq!(store.purge_expired().await.unwrap(), expired);
        // One write transaction per range of row ids, not one for the whole table.
        assert!(store.writer_stats().batches - batches >= 4);
        // Rows of the table where `condition` holds (of `?1`, a completed row's state, and
        // `?2`, now).
        let count = |condition: &str| -> i64 {
            conn.query_row(
                &format!(
                    "SELECT count(*) FROM idemgate_record \
                     WHERE (?1 IS NOT NULL AND ?2 IS NOT NULL) AND {condition}"
                ),
                (row::COMPLETED, now),
                |r| r.get(0),
            )
            .unwrap()
        };
        assert_eq!(count("1") as u64, rows as u64 - expired);
        // Past the ttl, only the tombstones are left, every one of them without its body.
        let past_ttl = "state = ?1 AND expires_at <= ?2";
        assert_eq!(count(past_ttl), tombstones);
        assert_eq!(
            count(&format!(
                "{past_ttl} AND retain_until > ?2 AND outcome_body = x''"
            )),
            tombstones
        );
        // The rest keep theirs.
        assert_eq!(
            count("state = ?1 AND expires_at > ?2 AND outcome_body = x'78'"),
            (rows + 2) / 4
        );
        assert_eq!(store.purge_expired().await.unwrap(), 0);
        assert_eq!(
            store
                .list(&ListFilter {
                    state: Some(State::Expired),
                    ..ListFilter::default()
                })
                .await
                .unwrap()
                .len() as i64,
            tombstones
        );
    }

    #[tokio::test]
    async fn purge_drops_the_outcome_of_a_tombstone_and_deletes_it_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let start = Timestamp::from_millis(1_800_000_000_000);
        let clock = Arc::new(ManualClock::new(start));
        let opts = SqliteOptions {
            clock: clock.clone(),
            ..SqliteOptions::default()
        };
        let store = SqliteStore::open(&path, opts).unwrap();
        let (ttl, tombstone) = (Duration::from_secs(60), Duration::from_secs(3600));
        let k = key("kept");
        let lease = acquire(&store, &k).await;
        let keep = Keep { ttl, tombstone };
        let done = store
            .complete_at(&k, lease, &Outcome::failed(b"result".to_vec()), keep, None)
            .await
            .unwrap();
        assert_eq!(done.expires_at, start.plus(ttl));
        // Another completed at once, without a tombstone.
        let plain = key("plain");
        let plain_lease = acquire(&store, &plain).await;
        store
            .complete(&plain, plain_lease, &Outcome::success(b"p".to_vec()), ttl)
            .await
            .unwrap();
        let conn = raw(&path);
        let stored = |name: &str| {
            conn.query_row(
                "SELECT state, expires_at, retain_until, outcome_kind, outcome_body \
                 FROM idemgate_record WHERE key = ?1",
                [name],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, Option<i64>>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, Vec<u8>>(4)?,
                    ))
                },
            )
            .optional()
            .unwrap()
        };
        let expires = start.plus(ttl).as_millis();
        let retain = start.plus(tombstone).as_millis();
        let row_with = |body: &[u8]| (row::COMPLETED, expires, Some(retain), 1, body.to_vec());
        assert_eq!(stored("kept"), Some(row_with(b"result")));
        // Without a tombstone, retain_until is written too, equal to expires_at.
        assert_eq!(stored("plain").unwrap().2, Some(expires));
        // Within the ttl, purging leaves both as they are.
        assert_eq!(store.purge_expired().await.unwrap(), 0);
        assert_eq!(stored("kept"), Some(row_with(b"result")));

        clock.advance(ttl);
        let tombstone_view = RecordState::Expired {
            completed_at: done.completed_at,
            expired_at: done.expires_at,
            retain_until: Timestamp::from_millis(retain),
        };
        let state = |rec: Option<Record>| rec.map(|r| r.state);
        assert_eq!(
            state(store.get(&k).await.unwrap()),
            Some(tombstone_view.clone())
        );
        // Past the ttl, the record without a tombstone goes (the only one counted), and the
        // tombstone stays without its body; what callers see of it does not change.
        assert_eq!(store.purge_expired().await.unwrap(), 1);
        assert_eq!(stored("plain"), None);
        assert_eq!(stored("kept"), Some(row_with(b"")));
        assert_eq!(state(store.get(&k).await.unwrap()), Some(tombstone_view));
        assert!(matches!(
            store.reserve(&reservation(&k)).await.unwrap(),
            Claim::Existing(rec) if rec.state_name() == State::Expired && rec.fence == lease.fence
        ));
        assert_eq!(store.purge_expired().await.unwrap(), 0);
        assert_eq!(stored("kept"), Some(row_with(b"")));

        // Past the tombstone, it goes too, and the key is free at the next fence.
        clock.set(Timestamp::from_millis(retain));
        assert_eq!(store.get(&k).await.unwrap(), None);
        assert_eq!(store.purge_expired().await.unwrap(), 1);
        assert_eq!(stored("kept"), None);
        assert!(matches!(
            store.reserve(&reservation(&k)).await.unwrap(),
            Claim::Acquired(_)
        ));
    }

    #[tokio::test]
    async fn records_carry_no_index_besides_their_key() {
        // Each index is written by every reservation and completion (see schema_v2.sql).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let _store = SqliteStore::open(&path, manual()).unwrap();
        let indexes: Vec<String> = raw(&path)
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(indexes, ["sqlite_autoindex_idemgate_record_1"]);
    }

    #[tokio::test]
    async fn reopening_keeps_records_and_the_schema_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idemgate.db");
        let k = key("order-1");
        let store = SqliteStore::open(&path, manual()).unwrap();
        let lease = acquire(&store, &k).await;
        // An empty body must come back empty, not missing.
        store
            .complete(
                &k,
                lease,
                &Outcome::failed(Vec::new()),
                Duration::from_secs(3600),
            )
            .await
            .unwrap();
        drop(store);

        let store = SqliteStore::open(&path, manual()).unwrap();
        let rec = store
            .get(&k)
            .await
            .unwrap()
            .expect("the record survives reopening");
        match rec.state {
            RecordState::Completed { outcome, .. } => {
                assert_eq!(outcome.kind, OutcomeKind::Failed);
                assert!(outcome.body.is_empty());
            }
            other => panic!("expected completed, found {other:?}"),
        }
        let conn = raw(&path);
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'idemgate_record'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 1);
    }

    #[tokio::test]
    async fn a_version_2_database_opens_upgraded_with_its_records_and_keeps_scopes_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idemgate.db");
        // The file as version 2 left it, with one completed record.
        let conn = raw(&path);
        conn.execute_batch(include_str!("schema.sql")).unwrap();
        conn.execute_batch(include_str!("schema_v2.sql")).unwrap();
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        conn.pragma_update(None, "user_version", 2).unwrap();
        conn.execute(
            "INSERT INTO idemgate_record (tenant, tool, key, fingerprint, fence, token, created_at, \
             state, completed_at, expires_at, outcome_kind, outcome_body) \
             VALUES ('acme', 'send_invoice', 'old', zeroblob(32), 3, zeroblob(16), 1000, 1, 2000, ?1, 0, x'6f6b')",
            [i64::MAX],
        )
        .unwrap();
        drop(conn);

        let store = SqliteStore::open(&path, manual()).unwrap();
        let old = store
            .get(&key("old"))
            .await
            .unwrap()
            .expect("the old record");
        assert_eq!((old.fence, old.scope), (3, None));
        let new = key("new");
        let r = reservation(&new).with_scope(Some("conversation:7".into()));
        assert!(matches!(
            store.reserve(&r).await.unwrap(),
            Claim::Acquired(_)
        ));
        let rec = store.get(&new).await.unwrap().unwrap();
        assert_eq!(rec.scope.as_deref(), Some("conversation:7"));
        let version: i64 = raw(&path)
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }

    #[tokio::test]
    async fn a_version_3_database_opens_upgraded_and_its_completions_keep_no_tombstone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idemgate.db");
        let now = 1_800_000_000_000_i64;
        // The file as version 3 left it: one completion still replayed, one past its ttl.
        let conn = raw(&path);
        for sql in [
            include_str!("schema.sql"),
            include_str!("schema_v2.sql"),
            include_str!("schema_v3.sql"),
        ] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        conn.pragma_update(None, "user_version", 3).unwrap();
        for (name, fence, expires_at) in [("live", 3, now + 60_000), ("gone", 5, now - 1)] {
            conn.execute(
                "INSERT INTO idemgate_record (tenant, tool, key, fingerprint, fence, token, \
                 created_at, state, completed_at, expires_at, outcome_kind, outcome_body, scope) \
                 VALUES ('acme', 'send_invoice', ?1, zeroblob(32), ?2, zeroblob(16), 1000, 1, \
                 2000, ?3, 0, x'6f6b', 'conversation:1')",
                rusqlite::params![name, fence, expires_at],
            )
            .unwrap();
        }
        drop(conn);

        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(now)));
        let opts = SqliteOptions {
            clock: clock.clone(),
            ..SqliteOptions::default()
        };
        let store = SqliteStore::open(&path, opts).unwrap();
        let conn = raw(&path);
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        // The upgrade rewrote no row: the old ones have no retain_until.
        let unset: i64 = conn
            .query_row(
                "SELECT count(*) FROM idemgate_record WHERE retain_until IS NULL",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(unset, 2);
        // Read as kept until expires_at, as they were: the live one is replayed, the other
        // counts as absent and is neither listed nor reported expired.
        let live = store
            .get(&key("live"))
            .await
            .unwrap()
            .expect("the live record");
        assert_eq!(
            (live.fence, live.scope.as_deref(), live.state),
            (
                3,
                Some("conversation:1"),
                RecordState::Completed {
                    outcome: Outcome::success(b"ok".to_vec()),
                    completed_at: Timestamp::from_millis(2000),
                    expires_at: Timestamp::from_millis(now + 60_000),
                    retain_until: Timestamp::from_millis(now + 60_000),
                }
            )
        );
        assert_eq!(store.get(&key("gone")).await.unwrap(), None);
        let listed = |state| {
            let store = store.clone();
            async move {
                let filter = ListFilter {
                    state,
                    ..ListFilter::default()
                };
                let recs = store.list(&filter).await.unwrap();
                recs.into_iter()
                    .map(|r| r.key.key.as_str().to_owned())
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(listed(None).await, ["live"]);
        assert_eq!(listed(Some(State::Completed)).await, ["live"]);
        assert!(listed(Some(State::Expired)).await.is_empty());
        match store.reserve(&reservation(&key("gone"))).await.unwrap() {
            Claim::Acquired(lease) => assert_eq!(lease.fence, 6),
            other => panic!("expected to acquire the expired key, found {other:?}"),
        }
        // Past its ttl the live one is gone at once, without a tombstone, and purging deletes it.
        clock.advance(Duration::from_secs(60));
        assert_eq!(store.get(&key("live")).await.unwrap(), None);
        assert!(listed(Some(State::Expired)).await.is_empty());
        assert_eq!(store.purge_expired().await.unwrap(), 1);
        let left: i64 = conn
            .query_row("SELECT count(*) FROM idemgate_record", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 1, "the new reservation of the other key");
    }

    #[tokio::test]
    async fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idemgate.db");
        drop(SqliteStore::open(&path, manual()).unwrap());
        raw(&path)
            .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let e = SqliteStore::open(&path, manual()).unwrap_err();
        assert!(
            matches!(&e, StoreError::Misconfigured(m) if m.contains("newer than this version")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn durability_is_set_on_the_write_connection() {
        let dir = tempfile::tempdir().unwrap();
        for (durability, expected) in [(Durability::Full, 2), (Durability::Normal, 1)] {
            let opts = SqliteOptions {
                durability,
                ..manual()
            };
            let store =
                SqliteStore::open(dir.path().join(format!("{durability:?}.db")), opts).unwrap();
            let (synchronous, mode) = store
                .write(|conn, _| {
                    let s: i64 = conn
                        .pragma_query_value(None, "synchronous", |r| r.get(0))
                        .unwrap();
                    let m: String = conn
                        .pragma_query_value(None, "journal_mode", |r| r.get(0))
                        .unwrap();
                    Ok(((s, m), false))
                })
                .await
                .unwrap();
            assert_eq!(synchronous, expected, "{durability:?}");
            assert_eq!(mode, "wal");
        }
        assert_eq!(SqliteOptions::default().durability, Durability::Full);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_stores_on_one_file_race_and_one_acquires() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared.db");
        // Two stores, two writer threads and two write connections: as two processes would be.
        let stores = [
            SqliteStore::open(&path, SqliteOptions::default()).unwrap(),
            SqliteStore::open(&path, SqliteOptions::default()).unwrap(),
        ];
        let k = key("shared");
        let mut tasks = Vec::new();
        for i in 0..32 {
            let store = stores[i % 2].clone();
            let r = reservation(&k);
            tasks.push(tokio::spawn(async move { store.reserve(&r).await }));
        }
        let mut acquired = 0;
        for t in tasks {
            match t.await.unwrap().unwrap() {
                Claim::Acquired(_) => acquired += 1,
                Claim::Existing(rec) => assert_eq!(rec.state_name(), State::InFlight),
            }
        }
        assert_eq!(acquired, 1);
        for store in &stores {
            assert!(store.get(&k).await.unwrap().is_some());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_writes_share_one_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
        let before = store.writer_stats();
        let held = hold(&store).await;
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(
                    async move { store.reserve(&reservation(&key(&format!("k{i}")))).await },
                )
            })
            .collect();
        held.release_as_one_batch(63).await;
        for t in tasks {
            assert!(matches!(t.await.unwrap().unwrap(), Claim::Acquired(_)));
        }
        let after = store.writer_stats();
        assert_eq!(after.batches - before.batches, 1, "{after:?}");
        assert_eq!(after.operations - before.operations, 64);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_group_on_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(
                    async move { store.reserve(&reservation(&key(&format!("k{i}")))).await },
                )
            })
            .collect();
        for t in tasks {
            assert!(matches!(t.await.unwrap().unwrap(), Claim::Acquired(_)));
        }
        let stats = store.writer_stats();
        assert_eq!(stats.operations, 64);
        assert!(
            stats.batches < 32,
            "64 concurrent writes took {} commits",
            stats.batches
        );
    }

    /// Writes a record, then fails at the SQL level: the record must go with it.
    fn write_then_break(conn: &Connection, now: Timestamp) -> Result<((), bool), StoreError> {
        let rec = StoredRecord {
            key: key("phantom"),
            fingerprint: Fingerprint::of_bytes(b"x"),
            fence: 1,
            token: idemgate_core::LeaseToken(7),
            created_at: now,
            scope: None,
            state: RecordState::Unknown { since: now },
        };
        row::apply(conn, &rec.key.clone(), None, Change::Put(rec))?;
        conn.execute(
            "UPDATE idemgate_record SET token = x'00' WHERE key = 'phantom'",
            [],
        )
        .during(Stage::Write, || "break a check constraint")?;
        Ok(((), true))
    }

    /// The name of the thread a write runs on.
    async fn writing_thread(store: &SqliteStore) -> Option<String> {
        store
            .write(|_, _| Ok((std::thread::current().name().map(str::to_owned), false)))
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_writer_lets_the_caller_write_on_its_own_thread() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
        let before = store.writer_stats();
        let thread = writing_thread(&store).await;
        assert_ne!(thread.as_deref(), Some("idemgate-sqlite-writer"));
        assert_eq!(store.writer_stats().batches - before.batches, 1);
        // Held, the thread is busy with a batch: callers queue behind it.
        store.inner.shared.inline_off.store(true, Ordering::SeqCst);
        let thread = writing_thread(&store).await;
        assert_eq!(thread.as_deref(), Some("idemgate-sqlite-writer"));
    }

    #[tokio::test]
    async fn a_current_thread_runtime_leaves_writes_to_the_writer_thread() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
        let thread = writing_thread(&store).await;
        assert_eq!(thread.as_deref(), Some("idemgate-sqlite-writer"));
    }

    #[tokio::test]
    async fn a_failing_write_alone_keeps_its_error_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
        let before = store.writer_stats();
        let e = store.write(write_then_break).await.unwrap_err();
        assert!(
            matches!(&e, StoreError::Unavailable(m) if m.contains("check constraint")),
            "{e}"
        );
        assert!(store.get(&key("phantom")).await.unwrap().is_none());
        // The transaction was closed: the next write commits on its own.
        assert!(matches!(
            store.reserve(&reservation(&key("a"))).await.unwrap(),
            Claim::Acquired(_)
        ));
        assert!(store.get(&key("a")).await.unwrap().is_some());
        assert_eq!(store.writer_stats().batches - before.batches, 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_write_does_not_fail_its_batch() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
        let held_key = key("held");
        let lease = acquire(&store, &held_key).await;
        let stolen = Lease {
            fence: lease.fence + 1,
            ..lease
        };
        let before = store.writer_stats();

        let held = hold(&store).await;
        let s = store.clone();
        let good_a = tokio::spawn(async move { s.reserve(&reservation(&key("a"))).await });
        let s = store.clone();
        let broken = tokio::spawn(async move { s.write(write_then_break).await });
        let s = store.clone();
        let hk = held_key.clone();
        let lost = tokio::spawn(async move {
            s.complete(
                &hk,
                stolen,
                &Outcome::success(b"x".to_vec()),
                Duration::from_secs(60),
            )
            .await
        });
        let s = store.clone();
        let good_b = tokio::spawn(async move { s.reserve(&reservation(&key("b"))).await });
        held.release_as_one_batch(3).await;

        assert!(matches!(good_a.await.unwrap().unwrap(), Claim::Acquired(_)));
        assert!(matches!(good_b.await.unwrap().unwrap(), Claim::Acquired(_)));
        let e = broken.await.unwrap().unwrap_err();
        assert!(
            matches!(&e, StoreError::Unavailable(m) if m.contains("check constraint")),
            "{e}"
        );
        assert!(matches!(lost.await.unwrap(), Err(StoreError::LeaseLost)));
        let after = store.writer_stats();
        assert_eq!(
            after.batches - before.batches,
            1,
            "one batch held all four writes"
        );
        assert!(store.get(&key("a")).await.unwrap().is_some());
        assert!(store.get(&key("b")).await.unwrap().is_some());
        assert!(store.get(&key("phantom")).await.unwrap().is_none());
        let rec = store.get(&held_key).await.unwrap().unwrap();
        assert_eq!(rec.state_name(), State::InFlight);
    }

    #[tokio::test]
    async fn unreadable_rows_are_corrupt_and_only_for_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = SqliteStore::open(&path, manual()).unwrap();
        let conn = raw(&path);
        conn.pragma_update(None, "ignore_check_constraints", true)
            .unwrap();
        conn.execute(
            "INSERT INTO idemgate_record (tenant, tool, key, fingerprint, fence, token, created_at, state) \
             VALUES ('acme', 'send_invoice', 'bad', zeroblob(32), 1, zeroblob(16), 0, 7)",
            [],
        )
        .unwrap();
        let bad = key("bad");
        assert!(matches!(store.get(&bad).await, Err(StoreError::Corrupt(_))));
        let e = store.reserve(&reservation(&bad)).await.unwrap_err();
        assert!(
            matches!(&e, StoreError::Corrupt(m) if m.contains("state 7")),
            "{e}"
        );
        assert!(matches!(
            store.list(&ListFilter::default()).await,
            Err(StoreError::Corrupt(_))
        ));
        acquire(&store, &key("good")).await;
    }

    #[tokio::test]
    async fn a_lock_held_past_busy_timeout_is_unavailable_and_reads_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let opts = SqliteOptions {
            busy_timeout: Duration::from_millis(100),
            ..manual()
        };
        let store = SqliteStore::open(&path, opts).unwrap();
        let k = key("locked");
        acquire(&store, &k).await;

        // Another "process" holds the write lock.
        let other = raw(&path);
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let started = Instant::now();
        let e = store.reserve(&reservation(&key("next"))).await.unwrap_err();
        assert!(
            matches!(&e, StoreError::Unavailable(m) if m.contains("locked")),
            "{e}"
        );
        assert!(started.elapsed() >= Duration::from_millis(90));
        // WAL: readers do not wait for the writer.
        assert!(store.get(&k).await.unwrap().is_some());
        other.execute_batch("ROLLBACK").unwrap();
        acquire(&store, &key("next")).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_wake_waiters_early() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
        let k = key("watched");
        let started = Instant::now();
        let mark = store.change_mark(&k);
        let mut waiter = std::pin::pin!(store.wait_changed(&k, mark, Duration::from_secs(30)));
        // The first poll registers the waiter, so the commit cannot run ahead of it. (A spawned
        // waiter and a sleep before the commit lost that race on a loaded machine, and the
        // waiter then slept the whole 30 s.)
        std::future::poll_fn(|cx| {
            assert!(
                waiter.as_mut().poll(cx).is_pending(),
                "woke before any commit"
            );
            std::task::Poll::Ready(())
        })
        .await;
        acquire(&store, &k).await;
        // Notified while not being polled: it is ready at once.
        waiter.await;
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(10), "waited {waited:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_between_a_waiters_look_and_its_wait_wakes_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
        let k = key("watched");
        let lease = acquire(&store, &k).await;
        // The waiter's mark, then its look: in flight.
        let mark = store.change_mark(&k);
        let seen = store.get(&k).await.unwrap().unwrap();
        assert!(matches!(seen.state, RecordState::InFlight { .. }));
        // The completion commits before the waiter starts waiting.
        let outcome = Outcome::success(b"done".to_vec());
        store
            .complete(&k, lease, &outcome, Duration::from_secs(60))
            .await
            .unwrap();
        // Woken by the commit, not by the end of its 30 s.
        let started = Instant::now();
        store.wait_changed(&k, mark, Duration::from_secs(30)).await;
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(10), "waited {waited:?}");
        // Without a commit since its mark, a wait lasts its whole timeout.
        let mark = store.change_mark(&k);
        let started = Instant::now();
        store
            .wait_changed(&k, mark, Duration::from_millis(50))
            .await;
        assert!(started.elapsed() >= Duration::from_millis(50));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_hears_of_another_processes_commits_without_its_poll() {
        // Two stores on one file stand for two processes: neither hears the other's writer.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let other = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
        let this = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
        // Far longer than the test may take: a waiter woken only by its timeout fails it.
        let long = Duration::from_secs(30);
        let wait_on = |k: Key| {
            let this = this.clone();
            let mark = this.change_mark(&k);
            tokio::spawn(async move {
                this.wait_changed(&k, mark, long).await;
                Instant::now()
            })
        };

        // The first change of the log that this store can tell is not its own: the other store
        // commits until it does (its first commits may land while the watcher has yet to take a
        // quiet look). Pacing only: the test waits for the waiter, however long that takes.
        let k = key("first");
        let lease = acquire(&other, &k).await;
        let waiter = wait_on(k.clone());
        let started = Instant::now();
        let outcome = Outcome::success(b"done".to_vec());
        other.complete(&k, lease, &outcome, long).await.unwrap();
        let mut n = 0;
        while !waiter.is_finished() {
            assert!(started.elapsed() < Duration::from_secs(10), "never woken");
            acquire(&other, &key(&format!("pace-{n}"))).await;
            n += 1;
            tokio::time::sleep(foreign::TICK * 2).await;
        }

        // From then on, the other process's next commit wakes a waiter by itself.
        let k = key("second");
        let lease = acquire(&other, &k).await;
        // A waiter under way (one woken early by the tail of the pacing commits is replaced).
        let waiter = loop {
            let waiter = wait_on(k.clone());
            while !this.inner.changes.waiting() && !waiter.is_finished() {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "the waiter never waited"
                );
                tokio::task::yield_now().await;
            }
            if !waiter.is_finished() {
                break waiter;
            }
        };
        let completed = Instant::now();
        other.complete(&k, lease, &outcome, long).await.unwrap();
        let woken = waiter.await.unwrap().duration_since(completed);
        assert!(
            woken < Duration::from_secs(10),
            "woken {woken:?} after the commit"
        );
    }

    /// The size of the write-ahead log of the database at `path` (0 while there is none).
    fn wal_bytes(path: &Path) -> u64 {
        std::fs::metadata(wal_path(path)).map_or(0, |m| m.len())
    }

    /// Reserves and completes `count` records with bodies of `body` bytes, one after the other,
    /// and returns the largest the log of the database at `path` was after any of them.
    async fn largest_wal_while_writing(
        store: &SqliteStore,
        path: &Path,
        count: usize,
        body: usize,
    ) -> u64 {
        let mut largest = 0;
        for i in 0..count {
            let k = key(&format!("k{i}"));
            let lease = acquire(store, &k).await;
            store
                .complete(
                    &k,
                    lease,
                    &Outcome::success(vec![b'x'; body]),
                    Duration::from_secs(3600),
                )
                .await
                .unwrap();
            largest = largest.max(wal_bytes(path));
        }
        largest
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wal_stays_bounded_under_many_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        // NORMAL only spares the fsyncs; the log is written and checkpointed the same way.
        let opts = SqliteOptions {
            durability: Durability::Normal,
            ..manual()
        };
        let limit = opts.wal_limit;
        let store = SqliteStore::open(&path, opts).unwrap();
        let wal_size = || wal_bytes(&path);
        // A reader that keeps taking snapshots, as duplicates and `keys list` do.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    store.list(&ListFilter::default()).await.unwrap();
                }
            })
        };
        let largest = largest_wal_while_writing(&store, &path, 2000, 1024).await;
        stop.store(true, Ordering::Relaxed);
        reader.await.unwrap();
        eprintln!("the largest WAL was {largest} bytes (limit {limit})");
        // Before the bound, the log grew without end while the reader kept taking snapshots
        // (40 MB in this test), and SQLite's default alone let it reach 1000 pages (4 MiB).
        assert!(
            largest <= 3 * limit,
            "the WAL reached {largest} bytes (limit {limit})"
        );
        // Idle, the writer empties it.
        let deadline = Instant::now() + Duration::from_secs(30);
        acquire(&store, &key("last")).await;
        while wal_size() > limit / 4 {
            assert!(
                Instant::now() < deadline,
                "the WAL kept {} bytes while idle",
                wal_size()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_checkpoint_the_log_themselves_once_it_reaches_the_limit() {
        // The writer's WAL hook replaces SQLite's own, so it must run the commits' checkpoint
        // itself. Without it the log would reach the limit and then grow until the writer's
        // rarer RESTART, up to half again past it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let opts = SqliteOptions {
            durability: Durability::Normal,
            wal_limit: MIN_WAL_LIMIT,
            ..manual()
        };
        let limit = opts.wal_limit;
        let store = SqliteStore::open(&path, opts).unwrap();
        let largest = largest_wal_while_writing(&store, &path, 400, 512).await;
        eprintln!("the largest WAL was {largest} bytes (limit {limit})");
        assert!(
            largest <= limit + limit / 4,
            "the WAL reached {largest} bytes (limit {limit})"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wal_limit_set_in_the_url_bounds_the_log() {
        // Far below the default, so that the log would outgrow it many times over if the URL's
        // limit did not reach the store.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let url = format!(
            "sqlite://{}?durability=normal&wal_limit=128KiB",
            path.display()
        );
        let store = SqliteStore::connect_with(&url, manual()).unwrap();
        let limit = store.options().wal_limit;
        assert_eq!(limit, 128 << 10);
        let largest = largest_wal_while_writing(&store, &path, 400, 1024).await;
        eprintln!("the largest WAL was {largest} bytes (limit {limit})");
        assert!(
            largest > limit / 2,
            "the writes never came near the limit ({largest} bytes), so it was not tested"
        );
        assert!(
            largest <= limit + limit / 4,
            "the WAL reached {largest} bytes (limit {limit})"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_writer_empties_the_log_once_a_reader_that_kept_it_lets_go() {
        // A reader in the log when the writer falls idle makes its checkpoint fail. The writer
        // must try again rather than sleep until the next write, which may never come.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let opts = SqliteOptions {
            durability: Durability::Normal,
            wal_limit: MIN_WAL_LIMIT,
            ..manual()
        };
        let quarter = opts.wal_limit / 4;
        let store = SqliteStore::open(&path, opts).unwrap();
        // Every write through the thread, which then checkpoints once idle.
        store.inner.shared.inline_off.store(true, Ordering::SeqCst);
        let reader = raw(&path);
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM idemgate_record", [], |r| r.get(0))
            .unwrap();
        // Past a quarter of the limit, short of what makes a busy writer wait for the reader.
        largest_wal_while_writing(&store, &path, 2, 1024).await;
        let grown = wal_bytes(&path);
        assert!(
            grown > quarter && grown < 2 * MIN_WAL_LIMIT,
            "the log holds {grown} bytes"
        );
        // The writer has tried, after the last batch, while the reader was in the log.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !store
            .inner
            .hooks
            .idle_checkpoint_tried
            .load(Ordering::SeqCst)
        {
            assert!(Instant::now() < deadline, "the writer never fell idle");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(wal_bytes(&path) > quarter, "emptied with a reader in it");
        reader.execute_batch("COMMIT").unwrap();
        while wal_bytes(&path) > quarter {
            assert!(
                Instant::now() < deadline,
                "the log kept {} bytes after the reader let go",
                wal_bytes(&path)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn read_only_files_refuse_writes_and_recover_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idemgate.db");
        let k = key("kept");
        let store = SqliteStore::open(&path, manual()).unwrap();
        acquire(&store, &k).await;
        drop(store);
        // Read-only for root too; the directory stays writable, as for a file of another owner.
        let read_only = idemgate_conformance::tmpfs::Immutable::set(&path);
        let store = SqliteStore::open(&path, manual()).unwrap();
        assert_eq!(
            store.get(&k).await.unwrap().unwrap().state_name(),
            State::InFlight
        );
        let e = store.reserve(&reservation(&key("new"))).await.unwrap_err();
        assert!(
            matches!(&e, StoreError::Unavailable(m) if m.contains("readonly")),
            "{e}"
        );
        let e = store.probe_write().await.unwrap_err();
        assert!(matches!(e, StoreError::Unavailable(_)), "{e}");

        // Fixed by an operator while the store runs: the next write goes through.
        read_only.lift();
        store.probe_write().await.unwrap();
        acquire(&store, &key("new")).await;
    }

    #[tokio::test]
    async fn dropping_the_last_clone_stops_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let store = SqliteStore::open(&path, manual()).unwrap();
        let clone = store.clone();
        acquire(&clone, &key("k")).await;
        drop(store);
        drop(clone);
        // The writer closed its connection: the last close checkpoints and removes the WAL.
        assert!(!dir.path().join("db-wal").exists());
    }

    /// Many processes (here: threads, each with its own connections) opening one new file at
    /// once: each open waits for the others' locks instead of failing with "database is locked".
    #[test]
    fn sixteen_stores_opening_one_new_file_at_once_all_open() {
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(format!("race-{round}.db"));
            let barrier = Arc::new(std::sync::Barrier::new(16));
            let opened: Vec<_> = (0..16)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        SqliteStore::open(&path, SqliteOptions::default()).map(drop)
                    })
                })
                .collect();
            for t in opened {
                if let Err(e) = t.join().unwrap() {
                    panic!("round {round}: {e}");
                }
            }
        }
    }
}
