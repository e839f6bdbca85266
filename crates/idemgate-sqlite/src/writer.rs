//! The writer thread: grouped commits of the store's write operations.
//!
//! Every write of a [`crate::SqliteStore`] is a [`Task`] sent to one thread that owns the write
//! connection. The thread takes whatever tasks are queued (up to `max_batch`), runs them one after
//! the other inside one `BEGIN IMMEDIATE` ... `COMMIT`, and answers each caller only after `COMMIT`
//! returned, so concurrent callers share one transaction and one fsync, and no answer runs ahead of
//! the disk. Each task runs inside its own `SAVEPOINT`: a task that fails is rolled back alone and
//! the others of its batch still commit.
//!
//! A caller that finds the writer idle (nothing queued, the thread waiting for work, the
//! connection free) runs its write itself instead, as a batch of one, on its own thread: the two
//! hand-offs between threads cost a lone caller more than its write (see [`Shared::run_inline`]).
//! Both take the same [`Core`] lock, so there is still one writer at a time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use idemgate_core::{Changes, Clock, Key, Now, StoreError};
use rusqlite::{Connection, ErrorCode};
use tokio::sync::{mpsc, oneshot};

use crate::error::{classify, Context, Stage};

/// One queued write operation, its inputs and its caller's answer channel inside.
pub(crate) trait Task: Send {
    /// Runs the operation on `conn`, inside the batch's transaction, at `now`; returns whether it
    /// wrote anything. Its answer is kept for [`Task::answer`].
    fn run(&mut self, conn: &Connection, now: Now) -> Result<bool, StoreError>;

    /// Answers the caller: its own result when `batch` committed, the batch's error otherwise. A
    /// caller that went away (its future was dropped) is not an error.
    fn answer(self: Box<Self>, batch: Result<(), StoreError>);

    /// Whether this is a [`WakeForCheckpoint`], which the thread does not run as a batch.
    fn is_wake(&self) -> bool {
        false
    }

    /// The record this task wrote, if it wrote one: once its batch committed, the record's
    /// waiters are woken.
    fn changed(&self) -> Option<&Key> {
        None
    }

    /// Whether the task writes with one statement at most, atomic on its own: alone in its
    /// batch, it runs without a transaction around it (its statement commits by itself, and
    /// SQLite keeps no statement journal for it).
    fn single_statement(&self) -> bool {
        false
    }
}

/// A [`Task`] made of a closure and the channel its result goes back on.
pub(crate) struct Op<T, F> {
    /// The record the work writes, whose waiters a commit wakes.
    key: Option<Key>,
    /// See [`Task::single_statement`].
    single_statement: bool,
    wrote: bool,
    work: Option<F>,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Op<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection, Now) -> Result<(T, bool), StoreError> + Send + 'static,
{
    /// The task and the receiver of its answer; `key` names the record the work writes, if one;
    /// `single_statement` says that the work writes with one statement at most (see
    /// [`Task::single_statement`]).
    pub(crate) fn queue(
        key: Option<Key>,
        single_statement: bool,
        work: F,
    ) -> (Box<dyn Task>, oneshot::Receiver<Result<T, StoreError>>) {
        let (reply, rx) = oneshot::channel();
        let op = Op {
            key,
            single_statement,
            wrote: false,
            work: Some(work),
            result: None,
            reply,
        };
        (Box::new(op), rx)
    }
}

impl<T, F> Task for Op<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection, Now) -> Result<(T, bool), StoreError> + Send + 'static,
{
    fn run(&mut self, conn: &Connection, now: Now) -> Result<bool, StoreError> {
        let Some(work) = self.work.take() else {
            return Ok(false);
        };
        match work(conn, now) {
            Ok((value, wrote)) => {
                self.result = Some(Ok(value));
                self.wrote = wrote;
                Ok(wrote)
            }
            Err(e) => {
                self.result = Some(Err(e.clone()));
                Err(e)
            }
        }
    }

    fn answer(self: Box<Self>, batch: Result<(), StoreError>) {
        let Op { result, reply, .. } = *self;
        let answer = batch.and_then(|()| {
            result.unwrap_or_else(|| {
                Err(StoreError::Unavailable(
                    "failed to run the operation: its batch ended before it".into(),
                ))
            })
        });
        // The caller may have dropped its future; the operation still ran fully or not at all.
        let _ = reply.send(answer);
    }

    fn changed(&self) -> Option<&Key> {
        self.key.as_ref().filter(|_| self.wrote)
    }

    fn single_statement(&self) -> bool {
        self.single_statement
    }
}

/// Counters of the writer, for tests and benchmarks.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Committed batches (transactions, so fsyncs of the WAL at `synchronous = FULL`).
    pub(crate) batches: AtomicU64,
    /// Operations in committed batches.
    pub(crate) operations: AtomicU64,
    /// Times the write connection began and ended changing the files (a batch, a checkpoint):
    /// equal while it is not, so that the watcher of other processes' commits
    /// ([`crate::wake`]) can tell a change of the log that was surely not this store's.
    pub(crate) own_begun: AtomicU64,
    pub(crate) own_ended: AtomicU64,
}

impl Counters {
    /// Runs `f`, which changes the files, between the two marks of [`Counters::own_begun`].
    fn own<R>(&self, f: impl FnOnce() -> R) -> R {
        self.own_begun.fetch_add(1, Ordering::SeqCst);
        let out = f();
        self.own_ended.fetch_add(1, Ordering::SeqCst);
        out
    }
}

/// How long the writer looks for more work before it sleeps.
const SPIN: std::time::Duration = std::time::Duration::from_micros(200);
/// How long no write at all (queued or inline) must have come before the writer counts as idle
/// and empties the log: callers writing inline keep it busy without ever reaching the thread.
const QUIET: std::time::Duration = std::time::Duration::from_millis(10);
/// How long a checkpoint of the write-ahead log waits for readers of old snapshots.
const CHECKPOINT_WAIT: std::time::Duration = std::time::Duration::from_millis(20);
/// The least time between two checkpoints that interrupt a busy writer, and the first pause of
/// an idle writer whose checkpoint readers kept from emptying the log.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
/// The longest pause of an idle writer between checkpoints that readers keep failing.
const IDLE_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// The read connections of a store. Every read holds the lock shared from taking a connection
/// until it is back among the idle ones, so that the writer, holding it exclusively, has every
/// read connection of the store in hand and can close them all (see [`Core::reopen_if_read_only`]).
pub(crate) struct Readers {
    idle: RwLock<Mutex<Vec<Connection>>>,
}

impl Readers {
    pub(crate) fn new(first: Connection) -> Self {
        Readers {
            idle: RwLock::new(Mutex::new(vec![first])),
        }
    }

    /// The lock a read holds while it has a connection.
    pub(crate) fn shared(&self) -> RwLockReadGuard<'_, Mutex<Vec<Connection>>> {
        // A panic while holding the lock leaves at worst a connection missing from the pool.
        self.idle.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The idle connections, under the shared lock.
    pub(crate) fn idle<'a>(
        shared: &'a RwLockReadGuard<'_, Mutex<Vec<Connection>>>,
    ) -> MutexGuard<'a, Vec<Connection>> {
        shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until no read has a connection out, then closes every one.
    fn close_all(&self) -> std::sync::RwLockWriteGuard<'_, Mutex<Vec<Connection>>> {
        let mut all = self.idle.write().unwrap_or_else(|p| p.into_inner());
        all.get_mut().unwrap_or_else(|p| p.into_inner()).clear();
        all
    }
}

/// The write connection and what a batch needs besides it; whoever runs a batch holds its lock.
pub(crate) struct Core {
    /// The write connection, or why it could not be opened again (every batch fails with that
    /// until a later one opens it).
    pub(crate) conn: Result<Connection, StoreError>,
    /// Whether the last batch's `BEGIN IMMEDIATE` was refused as read-only: the connection must
    /// be opened again, even when SQLite does not call it read-only.
    pub(crate) read_only: bool,
    /// The store's read connections, closed when the write connection is opened again.
    pub(crate) readers: Arc<Readers>,
    pub(crate) clock: Arc<dyn Clock>,
    /// The database file, to open the connection again (see [`Core::reopen_if_read_only`]).
    pub(crate) path: std::path::PathBuf,
    pub(crate) opts: crate::SqliteOptions,
    /// The write-ahead log file, measured when idle.
    pub(crate) wal: std::path::PathBuf,
    /// What the write connection's commits left in the log (see [`WalWatch`]).
    pub(crate) wal_watch: Arc<WalWatch>,
    /// When the writer last started a checkpoint of its own.
    pub(crate) last_checkpoint: Option<std::time::Instant>,
    /// Wakes the waiters of the records a batch wrote, once it committed.
    pub(crate) changes: Arc<Changes>,
    pub(crate) counters: Arc<Counters>,
    /// Writes committed since this store last settled the unsettled records' mark
    /// (`upkeep::settle`, every [`crate::upkeep::SETTLE_EVERY`] writes).
    pub(crate) writes_since_settle: u64,
}

/// What the writer thread and the callers share.
pub(crate) struct Shared {
    core: Mutex<Core>,
    /// Set by the thread from the moment it takes a task until its batch is answered, so that a
    /// caller does not jump ahead of a batch that is forming.
    thread_busy: AtomicBool,
    /// Set when a caller that wrote inline left the log past a quarter of its limit and woke the
    /// thread so that it checkpoints once idle; cleared by the thread when it has checkpointed.
    checkpoint_asked: AtomicBool,
    /// When the last batch ended, in microseconds since `epoch`.
    last_write: AtomicU64,
    epoch: std::time::Instant,
    /// The writer thread, to wake it from its wait for quiet (see [`Writer::next_task`]).
    thread: std::sync::OnceLock<std::thread::Thread>,
    /// Lets a test send every write through the thread (see `hold` in the tests).
    #[cfg(test)]
    pub(crate) inline_off: AtomicBool,
}

/// A task that writes nothing: it wakes the writer thread, which checkpoints once idle.
pub(crate) struct WakeForCheckpoint;

impl Task for WakeForCheckpoint {
    fn run(&mut self, _: &Connection, _: Now) -> Result<bool, StoreError> {
        Ok(false)
    }

    fn answer(self: Box<Self>, _: Result<(), StoreError>) {}

    fn is_wake(&self) -> bool {
        true
    }
}

/// What the log held after the write connection's last commit, as SQLite reports it to the
/// connection's WAL hook: the writer decides when to checkpoint from these instead of asking the
/// file system for the log's size after every batch (two `statx` calls a batch were 8% of a lone
/// caller's time at `synchronous=NORMAL`).
#[derive(Debug)]
pub(crate) struct WalWatch {
    /// Bytes of one frame of the log: a page and its frame header.
    frame_bytes: u64,
    /// The commits' own checkpoint: once the log holds this many frames, as `wal_autocheckpoint`.
    autocheckpoint: i32,
    /// Frames in the log after the last commit: the file is at least this long. It drops when
    /// a commit finds the log copied into the database and no reader in it, and starts over.
    frames: AtomicU64,
}

impl WalWatch {
    /// The watch of the log of `conn`, a write connection as [`crate::apply_pragmas`] set it up:
    /// its page size, and the commits' checkpoint that `wal_autocheckpoint` set (read before the
    /// hook replaces SQLite's own, which holds it).
    pub(crate) fn of(conn: &Connection) -> rusqlite::Result<Arc<Self>> {
        let page_size: i64 = conn.pragma_query_value(None, "page_size", |row| row.get(0))?;
        let autocheckpoint =
            conn.pragma_query_value(None, "wal_autocheckpoint", |row| row.get(0))?;
        Ok(Arc::new(WalWatch {
            frame_bytes: page_size.unsigned_abs() + WAL_FRAME_HEADER,
            autocheckpoint,
            frames: AtomicU64::new(0),
        }))
    }

    /// Installs the hook on the write connection. It replaces SQLite's own hook, which runs the
    /// commits' checkpoint (`wal_autocheckpoint`), so it runs that same checkpoint itself: passive,
    /// once the log holds [`SqliteOptions::wal_limit`](crate::SqliteOptions::wal_limit) in pages.
    pub(crate) fn install(self: &Arc<Self>, conn: &mut Connection) -> rusqlite::Result<()> {
        let watch = self.clone();
        conn.wal_hook(Some(
            move |wal: &mut rusqlite::hooks::Wal, frames: std::ffi::c_int| {
                let count = u64::try_from(frames).unwrap_or(0);
                watch.frames.store(count, Ordering::Relaxed);
                if frames >= watch.autocheckpoint {
                    // As with SQLite's own hook, a checkpoint that could not run does not fail
                    // the commit: the writer's own checkpoints bound the log.
                    let _ = wal.checkpoint();
                }
                Ok(())
            },
        ))
    }

    /// Bytes of log written since it last started over: the file holds at least this much.
    fn written(&self) -> u64 {
        self.frames.load(Ordering::Relaxed) * self.frame_bytes
    }
}

/// The header SQLite writes before each page in the log.
const WAL_FRAME_HEADER: u64 = 24;

/// The writer thread's own state.
pub(crate) struct Writer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) rx: mpsc::Receiver<Box<dyn Task>>,
    pub(crate) max_batch: usize,
    #[cfg(test)]
    pub(crate) hooks: Arc<TestHooks>,
}

/// Lets a test hold the writer after it took its first task, so that the test can queue a known
/// batch behind it.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct TestHooks {
    /// Held by the test; the writer takes it before draining the queue.
    pub(crate) gate: tokio::sync::Mutex<()>,
    /// How many times the writer arrived at the gate.
    pub(crate) arrived: AtomicU64,
    /// Set when the writer, idle, has tried to empty the log; cleared when it starts a batch.
    pub(crate) idle_checkpoint_tried: AtomicBool,
}

impl Shared {
    pub(crate) fn new(core: Core) -> Self {
        Shared {
            core: Mutex::new(core),
            thread_busy: AtomicBool::new(false),
            checkpoint_asked: AtomicBool::new(false),
            last_write: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            thread: std::sync::OnceLock::new(),
            #[cfg(test)]
            inline_off: AtomicBool::new(false),
        }
    }

    /// Wakes the thread if it waits for quiet, so that a task just queued is taken at once (a
    /// thread waiting on the queue itself is woken by the queue).
    pub(crate) fn task_queued(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }

    fn batch_ended(&self) {
        let micros = u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.last_write.store(micros, Ordering::SeqCst);
    }

    /// How long since the last batch ended.
    fn quiet_for(&self) -> std::time::Duration {
        let last = std::time::Duration::from_micros(self.last_write.load(Ordering::SeqCst));
        self.epoch.elapsed().saturating_sub(last)
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        // A panic inside a batch leaves the connection as SQLite left it: the next batch's BEGIN
        // (or its rollback in `run_batch`) copes with that, so the lock stays usable.
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `task` as a batch of one on the calling thread, if the writer is idle: nothing is
    /// queued (`queued`), the thread is not working on a batch, and nobody holds the connection.
    /// Otherwise gives `task` back, to be queued for the thread. Ran inline, it answers whether
    /// the thread should be woken (with [`WakeForCheckpoint`]): the checkpoint of an idle writer
    /// is the thread's, which only notices idleness when it has worked.
    ///
    /// On a worker of a multi-threaded tokio runtime the batch runs inside `block_in_place`, so
    /// that a commit waiting on the disk or on another process's lock (up to the busy timeout)
    /// does not hold up the tasks of that worker. On a current-thread runtime, whose one thread
    /// runs every task, it runs inline only for a lone call (`idemgate_core::caller::alone`: no
    /// other call is in flight to wait for the thread), and never on a thread that must not block
    /// (`idemgate_core::caller::without_blocking`).
    pub(crate) fn run_inline(
        &self,
        task: Box<dyn Task>,
        queued: bool,
    ) -> Result<bool, Box<dyn Task>> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        #[cfg(test)]
        if self.inline_off.load(Ordering::SeqCst) {
            return Err(task);
        }
        let flavor = Handle::try_current().map(|h| h.runtime_flavor()).ok();
        let multi_thread = matches!(flavor, Some(RuntimeFlavor::MultiThread));
        let lone = matches!(flavor, Some(RuntimeFlavor::CurrentThread))
            && idemgate_core::caller::is_alone();
        // A caller that must not block (an event loop's thread polling first) queues instead.
        if !(multi_thread || lone)
            || !idemgate_core::caller::may_block()
            || queued
            || self.thread_busy.load(Ordering::SeqCst)
        {
            return Err(task);
        }
        let Ok(mut core) = self.core.try_lock() else {
            return Err(task);
        };
        let run = |core: &mut Core| {
            core.run_batch(vec![task]);
            core.wal_watch.written() > core.opts.wal_limit / 4
        };
        let wal_past_quarter = if multi_thread {
            tokio::task::block_in_place(|| run(&mut core))
        } else {
            // The lone call's own thread: nothing else waits for it.
            run(&mut core)
        };
        self.batch_ended();
        Ok(wal_past_quarter && !self.checkpoint_asked.swap(true, Ordering::SeqCst))
    }
}

impl Writer {
    /// The next task. After a batch (`after_batch`) it is looked for briefly without sleeping
    /// first, because a caller's next write (the completion after its reservation) usually
    /// follows within microseconds, and putting this thread to sleep and waking it again costs
    /// more than the wait. Then the thread waits for [`QUIET`] since the last write, queued or
    /// inline, and empties the log (the fsyncs of a checkpoint delay nobody then) before it sleeps
    /// on the queue. Callers writing inline never reach the queue, so the thread checks the time
    /// of the last write rather than its own; a caller that queues a task wakes it
    /// ([`Shared::task_queued`]). When readers in the log keep the checkpoint from emptying it,
    /// the thread tries again after a pause (from [`CHECKPOINT_EVERY`], doubling up to
    /// [`IDLE_RETRY_MAX`]) instead of sleeping until a write that may never come.
    fn next_task(&mut self, after_batch: bool) -> Option<Box<dyn Task>> {
        let spin_until = after_batch.then(|| std::time::Instant::now() + SPIN);
        let mut retry = CHECKPOINT_EVERY;
        loop {
            match self.rx.try_recv() {
                Ok(task) => return Some(task),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            if spin_until.is_some_and(|until| std::time::Instant::now() < until) {
                std::thread::yield_now();
                continue;
            }
            let quiet = self.shared.quiet_for();
            if quiet < QUIET {
                std::thread::park_timeout(QUIET - quiet);
                continue;
            }
            // A caller holding the connection is writing: not idle after all.
            if let Ok(mut core) = self.shared.core.try_lock() {
                let quarter = core.opts.wal_limit / 4;
                let emptied = core.checkpoint_beyond(quarter, false);
                // Cleared with the connection held, so a caller that leaves the log long after
                // this checkpoint asks again.
                self.shared.checkpoint_asked.store(false, Ordering::SeqCst);
                drop(core);
                #[cfg(test)]
                self.hooks
                    .idle_checkpoint_tried
                    .store(true, Ordering::SeqCst);
                if emptied {
                    return self.rx.blocking_recv();
                }
                // Woken early by a task queued meanwhile.
                std::thread::park_timeout(retry);
                retry = (retry * 2).min(IDLE_RETRY_MAX);
                continue;
            }
            std::thread::park_timeout(QUIET);
        }
    }

    /// Runs batches until every sender is gone, then closes the connection.
    pub(crate) fn run(mut self) {
        let _ = self.shared.thread.set(std::thread::current());
        let mut after_batch = false;
        while let Some(first) = self.next_task(after_batch) {
            // A wake asks only for the idle checkpoint, which the next wait for quiet does.
            after_batch = !first.is_wake();
            if !after_batch {
                continue;
            }
            self.shared.thread_busy.store(true, Ordering::SeqCst);
            #[cfg(test)]
            {
                self.hooks
                    .idle_checkpoint_tried
                    .store(false, Ordering::SeqCst);
                self.hooks.arrived.fetch_add(1, Ordering::SeqCst);
                drop(self.hooks.gate.blocking_lock());
            }
            let mut core = self.shared.lock();
            let mut batch = vec![first];
            while batch.len() < self.max_batch {
                match self.rx.try_recv() {
                    Ok(task) if task.is_wake() => {}
                    Ok(task) => batch.push(task),
                    Err(_) => break,
                }
            }
            core.run_batch(batch);
            drop(core);
            self.shared.batch_ended();
            self.shared.thread_busy.store(false, Ordering::SeqCst);
        }
    }
}

impl Core {
    /// Runs a [`Task::single_statement`] task alone, without a transaction around it: its
    /// statement commits by itself, so its errors are classified as a commit's (the task's
    /// statements use [`crate::error::write_stage`]).
    fn execute_alone(&mut self, task: &mut dyn Task) -> Result<bool, StoreError> {
        let conn = self.conn.as_ref().map_err(Clone::clone)?;
        let now = self.clock.read();
        let result = task.run(conn, now);
        match &result {
            // A file that turned read-only is opened again before the next batch, as a refused
            // BEGIN makes it.
            Err(e) => self.read_only = crate::error::is_read_only(e),
            Ok(true) => {
                self.writes_since_settle += 1;
                if self.writes_since_settle >= crate::upkeep::SETTLE_EVERY {
                    // In a transaction of its own; failed, it is tried again after the next
                    // write, and the write stands.
                    let settled = run_cached(conn, "BEGIN IMMEDIATE")
                        .and_then(|_| crate::upkeep::settle(conn))
                        .and_then(|()| run_cached(conn, "COMMIT"));
                    if settled.is_ok() {
                        self.writes_since_settle = 0;
                    } else if !conn.is_autocommit() {
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                }
            }
            Ok(false) => {}
        }
        result
    }

    /// Moves the unsettled records' mark up to the newest row inside the batch's transaction,
    /// under a savepoint: a settling that fails is undone and tried again after the next
    /// batch, and the batch's own writes stand. Only a failure after which SQLite rolled back
    /// the whole transaction fails the batch.
    fn settle(conn: &Connection) -> Result<(), StoreError> {
        let what = || "settle the unsettled records' mark".to_owned();
        run_cached(conn, "SAVEPOINT settle").during(Stage::Write, what)?;
        match crate::upkeep::settle(conn) {
            Ok(()) => {
                run_cached(conn, "RELEASE settle").during(Stage::Write, what)?;
            }
            Err(_) if conn.is_autocommit() => {
                return Err(StoreError::unavailable(
                    "failed to run a batch of writes: sqlite rolled it back after an error while \
                     settling the unsettled records' mark"
                        .to_owned(),
                ));
            }
            // The listings stay right meanwhile: they read every row above the old mark.
            Err(_) => {
                run_cached(conn, "ROLLBACK TO settle").during(Stage::Write, what)?;
                run_cached(conn, "RELEASE settle").during(Stage::Write, what)?;
            }
        }
        Ok(())
    }

    /// Empties the write-ahead log once it holds more than `over` bytes. Commits checkpoint on
    /// their own (`wal_autocheckpoint`), but only passively: readers that keep taking snapshots
    /// stop those checkpoints short, the log is never restarted, and it grows until the disk is
    /// full. This checkpoint waits for the readers of old snapshots to move on, briefly
    /// ([`CHECKPOINT_WAIT`]), so that queued writes are barely delayed; if the readers are still
    /// there, the next attempt tries again. While busy, attempts are at least
    /// [`CHECKPOINT_EVERY`] apart until the log is half again past its limit, so that readers
    /// that hardly let go cost the writer a bounded share of its time; past that, the bound on the
    /// disk comes first and every batch tries; past twice its limit, the checkpoint waits as long
    /// as any write may ([`crate::SqliteOptions::busy_timeout`]) for the old readers, which
    /// bounds the log for sure: readers that start meanwhile read the database file, not the log.
    ///
    /// A busy writer checkpoints with `RESTART`: the next commit writes the log from its start,
    /// over blocks the file already has, and `journal_size_limit` trims the file to the limit.
    /// `TRUNCATE`, which empties the file, is only for an idle writer: every commit that extends
    /// the file makes its fsync also commit the file's new size to the file system's journal,
    /// which doubled the cost of a commit at `synchronous=FULL` (245 µs against 120 µs per fsync
    /// in one traced run). A busy writer truncated the file routinely: right after an
    /// autocheckpoint the file is a little past the limit (each page carries a frame header).
    ///
    /// Busy, the log's length is what the last commit left in it ([`WalWatch`]); idle, it is
    /// the file's size, which is what an idle checkpoint cuts.
    ///
    /// Answers `false` only when the checkpoint ran and readers kept it from finishing, so that
    /// trying again later may empty the log; `true` when the log is within `over`, or the
    /// checkpoint finished, failed otherwise (a read-only file), or was not due.
    fn checkpoint_beyond(&mut self, over: u64, busy: bool) -> bool {
        let counters = self.counters.clone();
        counters.own(|| self.checkpoint_beyond_owned(over, busy))
    }

    fn checkpoint_beyond_owned(&mut self, over: u64, busy: bool) -> bool {
        let size = if busy {
            self.wal_watch.written()
        } else {
            self.wal_size()
        };
        let limit = self.opts.wal_limit;
        let recent = self
            .last_checkpoint
            .is_some_and(|at| at.elapsed() < CHECKPOINT_EVERY);
        if size <= over || busy && recent && size <= limit + limit / 2 {
            return true;
        }
        let Ok(conn) = &self.conn else {
            return true;
        };
        self.last_checkpoint = Some(std::time::Instant::now());
        let wait = if size > 2 * limit {
            self.opts.busy_timeout
        } else {
            CHECKPOINT_WAIT.min(self.opts.busy_timeout)
        };
        let waits = conn.busy_timeout(wait);
        let checkpoint = if busy {
            "PRAGMA wal_checkpoint(RESTART)"
        } else {
            "PRAGMA wal_checkpoint(TRUNCATE)"
        };
        // One row: whether readers kept it from finishing, then counts of frames.
        let kept_by_readers = conn.query_row(checkpoint, [], |row| row.get::<_, i64>(0));
        if waits.is_ok() {
            let _ = conn.busy_timeout(self.opts.busy_timeout);
        }
        !matches!(kept_by_readers, Ok(busy) if busy != 0)
    }

    fn wal_size(&self) -> u64 {
        std::fs::metadata(&self.wal).map_or(0, |m| m.len())
    }

    /// Opens the write connection again when it cannot write: SQLite opened it read-only, or the
    /// last batch was refused as read-only, or opening it again failed. A connection opened while
    /// the files (or their file system) were read-only stays read-only for good, so without this
    /// every write would fail until a restart, long after an operator fixed the permissions.
    ///
    /// Every connection of the store closes first, the read ones included. SQLite shares one
    /// shared-memory index (`-shm`) among all the connections of a process to one database, as
    /// it opened it for the first of them: read-only if the file was. A connection opened while
    /// another one of this process is still open inherits that, and cannot write although SQLite
    /// does not call it read-only; only once all of them closed does the next one open the file
    /// anew, writable if it now is.
    ///
    /// Still read-only, the new connection fails this batch as before (SQLITE_READONLY, so
    /// Unavailable: nothing was written), and the next batch tries again.
    fn reopen_if_read_only(&mut self) {
        let can_write = match &self.conn {
            Ok(conn) => !self.read_only && !conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false),
            Err(_) => false,
        };
        if can_write {
            return;
        }
        // Reads wait until the new write connection is open, so that none opens the index first.
        let _readers = self.readers.close_all();
        // The old connection closes before the new one opens.
        self.conn = Err(StoreError::unavailable(format!(
            "failed to open the sqlite store {} again",
            self.path.display()
        )));
        self.read_only = false;
        self.conn = crate::schema::connect(&self.path, &self.opts, false).and_then(|mut conn| {
            self.wal_watch
                .install(&mut conn)
                .during(Stage::Open, || {
                    format!("watch the log of {}", self.path.display())
                })
                .map(|()| conn)
        });
    }

    fn run_batch(&mut self, batch: Vec<Box<dyn Task>>) {
        let counters = self.counters.clone();
        counters.own(|| self.run_batch_owned(batch));
    }

    fn run_batch_owned(&mut self, mut batch: Vec<Box<dyn Task>>) {
        self.reopen_if_read_only();
        let result = self.execute(&mut batch);
        if let Ok(conn) = &self.conn {
            if result.is_err() && !conn.is_autocommit() {
                // Nothing of a failed batch may stay behind for the next one. If even the rollback
                // fails, the connection is unusable and the next BEGIN reports it.
                let _ = conn.execute_batch("ROLLBACK");
            }
        }
        let wrote = matches!(result, Ok(true));
        if result.is_ok() {
            self.counters.batches.fetch_add(1, Ordering::Relaxed);
            self.counters
                .operations
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        let result = result.map(|_| ());
        if wrote {
            // Committed: a waiter that looks now sees the change. Woken before the writers hear
            // back, so that a duplicate answers as soon as the call it waited for.
            for key in batch.iter().filter_map(|task| task.changed()) {
                self.changes.notify(key);
            }
        }
        for task in batch {
            task.answer(result.clone());
        }
        if wrote {
            // Busy: only once the log is past its limit, which autocheckpoints normally prevent.
            self.checkpoint_beyond(self.opts.wal_limit, true);
        }
    }

    /// Runs `batch` in one transaction; returns whether any task wrote.
    fn execute(&mut self, batch: &mut [Box<dyn Task>]) -> Result<bool, StoreError> {
        let n = batch.len();
        // Only on a connection outside any transaction: one left open (a batch that panicked
        // halfway) would take the statement in and never commit it, where the BEGIN below fails
        // and the batch's end rolls that transaction back.
        let outside = matches!(&self.conn, Ok(conn) if conn.is_autocommit());
        if let [task] = batch {
            if task.single_statement() && outside {
                return self.execute_alone(task.as_mut());
            }
        }
        let conn = self.conn.as_ref().map_err(Clone::clone)?;
        if let Err(e) = run_cached(conn, "BEGIN IMMEDIATE") {
            self.read_only = e.sqlite_error_code() == Some(ErrorCode::ReadOnly);
            return Err(classify(
                Stage::Write,
                format!("begin a batch of {n} writes"),
                e,
            ));
        }
        // Alone in its batch (the common case at low concurrency), a write needs no savepoint: a
        // rollback of the whole transaction undoes exactly its statements.
        let isolated = n > 1;
        let savepoint = || format!("isolate one write in a batch of {n}");
        let mut wrote = false;
        for task in batch.iter_mut() {
            if isolated {
                run_cached(conn, "SAVEPOINT op").during(Stage::Write, savepoint)?;
            }
            let now = self.clock.read();
            match task.run(conn, now) {
                Ok(w) => wrote |= w,
                Err(_) if conn.is_autocommit() => {
                    // Some errors (I/O, disk full, out of memory) make SQLite roll back the whole
                    // transaction on its own: the writes of the earlier tasks are gone too.
                    return Err(StoreError::unavailable(format!(
                        "failed to run a batch of {n} writes: sqlite rolled it back after an error"
                    )));
                }
                // The task keeps its own error; only its own statements are undone.
                Err(_) if isolated => {
                    run_cached(conn, "ROLLBACK TO op").during(Stage::Write, savepoint)?;
                }
                Err(_) => {
                    run_cached(conn, "ROLLBACK")
                        .during(Stage::Write, || "roll back a failed write".to_owned())?;
                    return Ok(false);
                }
            }
            if isolated {
                run_cached(conn, "RELEASE op").during(Stage::Write, savepoint)?;
            }
        }
        if wrote {
            self.writes_since_settle += n as u64;
            if self.writes_since_settle >= crate::upkeep::SETTLE_EVERY {
                Self::settle(conn)?;
                self.writes_since_settle = 0;
            }
        }
        run_cached(conn, "COMMIT")
            .during(Stage::Commit, || format!("commit a batch of {n} writes"))?;
        Ok(wrote)
    }
}

/// Runs `sql`, a statement without parameters, through the connection's statement cache.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute([])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_takes_the_commits_checkpoint_that_the_pragmas_set() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let opts = crate::SqliteOptions {
            wal_limit: 256 << 10,
            ..crate::SqliteOptions::default()
        };
        let mut conn = crate::schema::connect(&path, &opts, false).unwrap();
        let watch = WalWatch::of(&conn).unwrap();
        assert_eq!((watch.autocheckpoint, watch.frame_bytes), (64, 4096 + 24));
        watch.install(&mut conn).unwrap();
        // The setting lived in SQLite's own hook, which ours replaced: read after the install,
        // the pragma says 0, hence `of` before `install`.
        let again: i32 = conn
            .pragma_query_value(None, "wal_autocheckpoint", |row| row.get(0))
            .unwrap();
        assert_eq!(again, 0);
    }
}
