#![doc = include_str!("../README.md")]

mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod options;
mod row;
mod schema;
mod upkeep;
mod wake;
mod writer;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use idemgate_core::transition::{self, Change, StoredRecord};
use idemgate_core::{
    Cause, ChangeMark, Changes, Claim, Clock, Completion, Fence, HistoryEntry, Keep, Key, Lease,
    ListFilter, Now, Outcome, Record, Reopened, Reservation, State, Store, StoreError, Timestamp,
};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension as _};
use tokio::sync::mpsc;

use crate::error::{Context, Stage};
use crate::options::{parse_url, MIN_WAL_LIMIT};
use crate::writer::{
    Core, Counters, Op, Readers, Shared, Task, WakeForCheckpoint, WalWatch, Writer,
};

pub use crate::options::{Durability, SqliteOptions, DEFAULT_WAL_LIMIT};
pub use crate::schema::{apply_pragmas, APPLICATION_ID, SCHEMA_VERSION};
/// The rusqlite this crate is built with, so that a benchmark baseline opens its connection with
/// the same SQLite.
pub use rusqlite;

pub(crate) type Result<T, E = StoreError> = std::result::Result<T, E>;

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
/// Records per transaction of [`SqliteStore::purge_expired`]: a few milliseconds of writing.
const PURGE_BATCH: i64 = 4096;

/// Where a purge's pass is, carried from one of its write transactions to the next.
#[derive(Clone)]
struct PurgePass {
    /// The pass's id while it owns the pending horizon (`upkeep::purge_begin`).
    owner: Option<Vec<u8>>,
    /// Whether no batch has run yet.
    first: bool,
    /// The last row id read.
    after: i64,
    /// The earliest due time among the completed rows left in the ranges read.
    earliest: i64,
}
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
    foreign: Option<wake::ForeignWatch>,
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
            return Err(StoreError::misconfigured(format!(
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
            return Err(StoreError::misconfigured(format!(
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
            writes_since_settle: 0,
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
                let message = format!(
                    "failed to start the writer thread of the sqlite store {}: {e}",
                    path.display()
                );
                StoreError::Unavailable(Cause::new(message, e))
            })?;
        // Without it, waiters still hear of other processes' commits at their polls.
        let foreign =
            wake::ForeignWatch::start(wal_path(&path), changes.clone(), counters.clone()).ok();
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
        options.set(&mut opts);
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
        F: FnOnce(&Connection, Now) -> Result<(T, bool)> + Send + 'static,
    {
        self.write_record(None, false, work).await
    }

    /// [`SqliteStore::write`] of a write to the record under `key` (when `Some`), whose waiters
    /// its commit wakes; `single_statement` when `work` writes with one statement at most, which
    /// then runs without a transaction of its own when it is alone in its batch
    /// (`writer::Task::single_statement`).
    async fn write_record<T, F>(
        &self,
        key: Option<Key>,
        single_statement: bool,
        work: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Now) -> Result<(T, bool)> + Send + 'static,
    {
        let (task, answer) = Op::queue(key, single_statement, work);
        let stopped = || {
            StoreError::unavailable(format!(
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
            Err(StoreError::indeterminate(format!(
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
        self.write_record(Some(key.clone()), false, move |conn, now| {
            apply_transition(conn, &key, now, f)
        })
        .await
    }

    /// [`SqliteStore::transition`] with a first try: `fast` writes the common case with one
    /// statement and without reading the row, answering `Ok(out)` when it wrote, or
    /// `Err(input)` when it wrote nothing; then the transition `f` decides on the row as read,
    /// given `input`. Alone in its batch, the first try runs without a transaction around its
    /// statement (`writer::Task::single_statement`), and `f` in a write of its own; in a batch
    /// with others, both run in the batch's transaction.
    async fn transition_or<T, I, Fast, F>(&self, key: &Key, fast: Fast, f: F) -> Result<T>
    where
        T: Send + 'static,
        I: Send + 'static,
        Fast: FnOnce(&Connection, Now) -> Result<Result<T, I>> + Send + 'static,
        F: FnOnce(I, Option<&StoredRecord>, Timestamp) -> Result<(T, Change)> + Send + 'static,
    {
        let owned = key.clone();
        let tried = self
            .write_record(Some(key.clone()), true, move |conn, now| {
                match fast(conn, now)? {
                    Ok(out) => Ok((Ok(out), true)),
                    Err(input) if conn.is_autocommit() => Ok((Err((input, f)), false)),
                    Err(input) => {
                        let (out, wrote) =
                            apply_transition(conn, &owned, now, |cur, now| f(input, cur, now))?;
                        Ok((Ok(out), wrote))
                    }
                }
            })
            .await?;
        match tried {
            Ok(out) => Ok(out),
            Err((input, f)) => {
                self.transition(key, move |cur, now| f(input, cur, now))
                    .await
            }
        }
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
            let message =
                format!("failed to read the sqlite store: the read task ended early: {e}");
            Err(StoreError::Unavailable(Cause::new(message, e)))
        })
    }
}

/// Reads the row of `key` and writes what the transition `f` decides on it, in the caller's
/// transaction; answers `f`'s output and whether anything was written.
fn apply_transition<T>(
    conn: &Connection,
    key: &Key,
    now: Now,
    f: impl FnOnce(Option<&StoredRecord>, Timestamp) -> Result<(T, Change)>,
) -> Result<(T, bool)> {
    let cur = row::load(conn, key, Stage::Write, || now)?;
    let (out, change) = f(cur.as_ref(), now.wall)?;
    let wrote = row::apply(conn, key, cur.as_ref(), change, now)?;
    Ok((out, wrote))
}

/// The write-ahead log of the database at `path`, as SQLite names it.
fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// The SQL condition and parameters that select the rows whose view at `now` is in `state`, or
/// `None` for a state this version cannot express in SQL (then Rust filters).
fn state_condition(state: Option<State>, now: Now) -> Option<(String, Vec<Value>)> {
    use row::{COMPLETED, IN_FLIGHT, UNKNOWN};
    // Mirrors StoredRecord::view: a completed row past its tombstone counts as absent, one past
    // its ttl but within its tombstone as expired, an in-flight row past its lease as unknown.
    // A row completed before schema version 4 has no `retain_until` and kept no tombstone: it
    // counts until `expires_at` (as row::decode reads it).
    const RETAIN: &str = "coalesce(retain_until, expires_at)";
    // A lease written on this boot is judged by the boot clock, any other by the wall clock (as
    // row::decode reads it). Without a boot clock `lease_boot = NULL` is never true.
    const LEASE_LIVE: &str =
        "(CASE WHEN lease_boot = ? THEN lease_steady > ? ELSE lease_until > ? END)";
    let wall = Value::Integer(now.wall.as_millis());
    let lease = vec![
        now.steady
            .map_or(Value::Null, |s| Value::Blob(s.boot.to_be_bytes().to_vec())),
        now.steady.map_or(Value::Null, |s| Value::Integer(s.millis)),
        wall.clone(),
    ];
    Some(match state {
        None => (
            format!("NOT (state = {COMPLETED} AND {RETAIN} <= ?)"),
            vec![wall],
        ),
        Some(State::InFlight) => (format!("state = {IN_FLIGHT} AND {LEASE_LIVE}"), lease),
        Some(State::Completed) => (
            format!("state = {COMPLETED} AND expires_at > ?"),
            vec![wall],
        ),
        Some(State::Expired) => (
            format!("state = {COMPLETED} AND expires_at <= ? AND {RETAIN} > ?"),
            vec![wall.clone(), wall],
        ),
        Some(State::Unknown) => (
            format!("(state = {UNKNOWN} OR (state = {IN_FLIGHT} AND NOT {LEASE_LIVE}))"),
            lease,
        ),
        Some(_) => return None,
    })
}

/// The SQL condition and parameters that select the rows `filter` lists (its page included), or
/// `None` as the condition when it selects every row; and whether SQL says everything the
/// filter does, so that a LIMIT may go into the query.
fn list_condition(filter: &ListFilter, now: Now) -> (Option<String>, Vec<Value>, bool) {
    let mut conditions = Vec::new();
    let mut params = Vec::new();
    // Records in flight or unknown are few, and all among the rows from the settled mark on and
    // those its log names (schema version 8, upkeep.rs); a tenant's records may be millions.
    // Without statistics SQLite takes an equality on the primary key's first column for the
    // better search and would scan the tenant, so for these states the names are compared as
    // `+tenant` (the same value, but no index column).
    let unsettled = matches!(filter.state, Some(State::InFlight | State::Unknown));
    let by_name = if unsettled { "+" } else { "" };
    if unsettled {
        conditions.push(upkeep::unsettled_rows());
    }
    if let Some(tenant) = &filter.tenant {
        conditions.push(format!("{by_name}tenant = ?"));
        params.push(Value::Text(tenant.as_str().to_owned()));
    }
    if let Some(tool) = &filter.tool {
        conditions.push(format!("{by_name}tool = ?"));
        params.push(Value::Text(tool.as_str().to_owned()));
    }
    if let Some(scope) = &filter.scope {
        conditions.push("scope = ?".to_owned());
        params.push(Value::Text(scope.to_string()));
    }
    if let Some(prefix) = &filter.key_prefix {
        // Keys are ASCII, so characters are bytes and substr compares byte-wise, as the
        // BINARY collation and `ListFilter::matches` do.
        conditions.push("substr(key, 1, ?) = ?".to_owned());
        params.push(Value::Integer(
            i64::try_from(prefix.len()).unwrap_or(i64::MAX),
        ));
        params.push(Value::Text(prefix.to_string()));
    }
    if let Some(from) = filter.created_from {
        conditions.push("created_at >= ?".to_owned());
        params.push(Value::Integer(from.as_millis()));
    }
    if let Some(before) = filter.created_before {
        conditions.push("created_at < ?".to_owned());
        params.push(Value::Integer(before.as_millis()));
    }
    if let Some(after) = &filter.after {
        // The listing order, as a row value: the next page starts strictly after the cursor.
        conditions.push("(created_at, tenant, tool, key) > (?, ?, ?, ?)".to_owned());
        params.push(Value::Integer(after.created_at.as_millis()));
        params.push(Value::Text(after.key.tenant.as_str().to_owned()));
        params.push(Value::Text(after.key.tool.as_str().to_owned()));
        params.push(Value::Text(after.key.key.as_str().to_owned()));
    }
    let by_state = state_condition(filter.state, now);
    let exact = by_state.is_some();
    if let Some((sql, values)) = by_state {
        conditions.push(sql);
        params.extend(values);
    }
    let condition = (!conditions.is_empty()).then(|| conditions.join(" AND "));
    (condition, params, exact)
}

/// The statement that lists `filter`'s rows, and its parameters.
fn list_sql(filter: &ListFilter, now: Now) -> (String, Vec<Value>) {
    let (condition, mut params, exact) = list_condition(filter, now);
    let limit_in_sql = exact && filter.limit > 0;
    let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
    let mut sql = format!("SELECT {} FROM idemgate_record", row::columns!());
    if let Some(condition) = condition {
        sql.push_str(" WHERE ");
        sql.push_str(&condition);
    }
    // The memory store's order: (created_at, key), keys compared byte-wise as SQLite's BINARY
    // collation does.
    sql.push_str(" ORDER BY created_at, tenant, tool, key");
    if limit_in_sql {
        sql.push_str(" LIMIT ?");
        params.push(Value::Integer(limit));
    }
    (sql, params)
}

fn list_rows(conn: &Connection, filter: &ListFilter, now: Now) -> Result<Vec<Record>> {
    let (sql, params) = list_sql(filter, now);
    let what = || "list records";
    let mut stmt = conn.prepare_cached(&sql).during(Stage::Read, what)?;
    let mut rows = stmt
        .query(rusqlite::params_from_iter(params))
        .during(Stage::Read, what)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().during(Stage::Read, what)? {
        let stored = row::decode(r, now)?;
        if let Some(rec) = stored.view(now.wall).filter(|rec| filter.matches(rec)) {
            out.push(rec);
            if filter.limit > 0 && out.len() == filter.limit {
                break;
            }
        }
    }
    Ok(out)
}

/// How many rows `filter` selects (its page ignored), at most `at_most`: SQL counts them without
/// decoding a row, and stops at `at_most`.
/// The statement that counts the rows `filter` selects (its page ignored), at most `at_most`,
/// and its parameters; `None` when SQL cannot say everything the filter does.
fn count_sql(filter: &ListFilter, now: Now, at_most: usize) -> Option<(String, Vec<Value>)> {
    let (condition, mut params, exact) = list_condition(&filter.whole(), now);
    if !exact {
        return None;
    }
    let mut sql = "SELECT count(*) FROM (SELECT 1 FROM idemgate_record".to_owned();
    if let Some(condition) = condition {
        sql.push_str(" WHERE ");
        sql.push_str(&condition);
    }
    sql.push_str(" LIMIT ?)");
    params.push(Value::Integer(i64::try_from(at_most).unwrap_or(i64::MAX)));
    Some((sql, params))
}

/// How many rows `filter` selects (its page ignored), at most `at_most`: SQL counts them without
/// decoding a row, and stops at `at_most`.
fn count_rows(conn: &Connection, filter: &ListFilter, now: Now, at_most: usize) -> Result<usize> {
    let Some((sql, params)) = count_sql(filter, now, at_most) else {
        let mut whole = filter.whole();
        whole.limit = at_most;
        return Ok(list_rows(conn, &whole, now)?.len());
    };
    let n: i64 = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| stmt.query_row(rusqlite::params_from_iter(params), |r| r.get(0)))
        .during(Stage::Read, || "count records")?;
    Ok(usize::try_from(n).unwrap_or(0))
}

impl Store for SqliteStore {
    async fn reserve(&self, r: &Reservation) -> Result<Claim> {
        let owned = r.clone();
        self.transition_or(
            &r.key,
            // The common case, a key without a row: the new record is inserted at once, and
            // only a key found taken reads its row.
            move |conn, now| {
                if let (claim, Change::Put(rec)) = transition::reserve(None, &owned, now.wall) {
                    if row::insert_new(conn, &rec, now)? {
                        return Ok(Ok(claim));
                    }
                }
                Ok(Err(owned))
            },
            move |owned, cur, now| Ok(transition::reserve(cur, &owned, now)),
        )
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
        let held = key.clone();
        self.transition_or(
            key,
            // The common case, the record still in flight under this lease: its state is set
            // in one statement that checks just that, without reading the row first.
            move |conn, now| {
                let (done, state) = transition::completed(&outcome, keep, executed_at, now.wall);
                let set = row::set_state_if_held(conn, &held, lease, &state, now)?;
                Ok(set.then_some(done).ok_or(outcome))
            },
            move |outcome, cur, now| {
                transition::complete(cur, lease, &outcome, keep, executed_at, now)
            },
        )
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
            // Judged after the read: the snapshot is no newer than this instant.
            let mut read_at = None;
            let stored = row::load(conn, &key, Stage::Read, || *read_at.insert(clock.read()))?;
            let now = read_at.map_or_else(|| clock.now(), |n| n.wall);
            Ok(stored.and_then(|s| s.view(now)))
        })
        .await
    }

    async fn append_history(&self, key: &Key, entry: &HistoryEntry) -> Result<bool> {
        let (key, line) = (key.clone(), entry.to_line() + "\n");
        self.write(move |conn, _| {
            let appended = conn
                .prepare_cached(
                    "UPDATE idemgate_record SET history = coalesce(history, '') || ?4 \
                     WHERE tenant = ?1 AND tool = ?2 AND key = ?3",
                )
                .and_then(|mut stmt| {
                    stmt.execute((
                        key.tenant.as_str(),
                        key.tool.as_str(),
                        key.key.as_str(),
                        &line,
                    ))
                })
                .during(Stage::Write, || "append to a record's history")?;
            Ok((appended > 0, appended > 0))
        })
        .await
    }

    async fn history(&self, key: &Key) -> Result<Vec<HistoryEntry>> {
        let key = key.clone();
        self.read(move |conn, _| {
            let text: Option<String> = conn
                .prepare_cached(
                    "SELECT history FROM idemgate_record \
                     WHERE tenant = ?1 AND tool = ?2 AND key = ?3",
                )
                .and_then(|mut stmt| {
                    stmt.query_row(
                        (key.tenant.as_str(), key.tool.as_str(), key.key.as_str()),
                        |r| r.get(0),
                    )
                    .optional()
                })
                .during(Stage::Read, || "read a record's history")?
                .flatten();
            HistoryEntry::from_lines(text.as_deref().unwrap_or("")).map_err(|e| {
                StoreError::corrupt(format!("the history of record {key} is unreadable: {e}"))
            })
        })
        .await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let filter = filter.clone();
        self.read(move |conn, clock| list_rows(conn, &filter, clock.read()))
            .await
    }

    async fn count(&self, filter: &ListFilter, at_most: usize) -> Result<usize> {
        let filter = filter.clone();
        self.read(move |conn, clock| count_rows(conn, &filter, clock.read(), at_most))
            .await
    }

    async fn purge_expired(&self) -> Result<u64> {
        // Mirrors transition::purge: completed rows past their tombstone go (a row completed
        // before schema version 4 has no `retain_until` and goes at its `expires_at`, see
        // row::decode); completed rows past their ttl that stay as tombstones lose their
        // outcome's body, which nothing reads again (they are reported expired, without an
        // outcome), so that a long tombstone costs its key and a few numbers rather than a whole
        // result. Only deletions are counted. Unknown rows stay.
        //
        // Nothing due is one read of the purge horizon (schema version 8) and no write
        // transaction at all. Otherwise a pass reads the rows in ranges of PURGE_BATCH row ids,
        // one short transaction each, so that a large purge never holds the write lock long,
        // and raises the horizon to the earliest due time it saw (see upkeep.rs).
        let due: bool = self
            .read(|conn, clock| {
                upkeep::purge_due(conn, clock.read().wall.as_millis())
                    .during(Stage::Read, || "find records to purge")
            })
            .await?;
        if !due {
            return Ok(0);
        }
        let what = || "purge expired records";
        let mut pass = PurgePass {
            owner: None,
            first: true,
            after: 0,
            earliest: i64::MAX,
        };
        let mut purged = 0;
        loop {
            let (next, deleted, done) = self
                .write(move |conn, now| {
                    let now = now.wall.as_millis();
                    if pass.first {
                        pass.owner = upkeep::purge_begin(conn, now).during(Stage::Write, what)?;
                        pass.first = false;
                    } else if let Some(owner) = &pass.owner {
                        if !upkeep::purge_renew(conn, owner, now).during(Stage::Write, what)? {
                            pass.owner = None;
                        }
                    }
                    let Some(last) = upkeep::purge_batch_end(conn, pass.after, PURGE_BATCH)
                        .during(Stage::Write, what)?
                    else {
                        if let Some(owner) = &pass.owner {
                            upkeep::purge_end(conn, owner, pass.earliest)
                                .during(Stage::Write, what)?;
                        }
                        return Ok(((pass.clone(), 0, true), true));
                    };
                    let (deleted, earliest) = upkeep::purge_range(conn, pass.after, last, now)
                        .during(Stage::Write, what)?;
                    pass.after = last;
                    pass.earliest = pass.earliest.min(earliest);
                    Ok(((pass.clone(), deleted, false), true))
                })
                .await?;
            purged += deleted as u64;
            pass = next;
            if done {
                return Ok(purged);
            }
        }
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
        // by another process's commit ([`wake`]). The engine's poll (`Settings::max_poll`)
        // stays the backstop, e.g. for the first commit of another process, which the watcher
        // may not yet tell from this store's own.
        self.inner.changes.wait(key, since, timeout).await;
    }
}

#[cfg(test)]
mod tests;
