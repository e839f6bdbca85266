//! Hearing of other processes' commits, for the duplicates that wait on them.
//!
//! A store wakes its own waiters when its own writer commits ([`Changes`]). Nothing in SQLite
//! tells a process of another one's commits (the WAL hook sees only its own connection's), so
//! without this a duplicate waiting on a record that another process settles would find out
//! only at its next poll. While anyone waits, a thread looks at the write-ahead log's size and
//! modification time every [`TICK`]: every commit, whoever makes it, appends to the log (or
//! rewrites it from the start after a checkpoint, which moves its time). A change of the log
//! while this store's own writer was surely not touching the files ([`Counters::own_begun`]) is
//! another process's: from then on every change of the log wakes every waiter, which look at
//! their records again. Until another process has been seen, changes that may be this store's own
//! wake nobody, so a store used by one process pays one `stat` per tick while someone waits, and
//! no spurious wake-ups.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use idemgate_core::Changes;

use crate::writer::Counters;

/// How often the log is looked at while anyone waits.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// How long the thread rests between checks that anyone waits, when nobody did; a waiter wakes
/// it at once ([`ForeignWatch::waiting`]).
const REST: Duration = Duration::from_secs(1);

/// How long the thread keeps looking after it last saw a waiter or a waiter woke it: a waiter
/// wakes it just before it counts as waiting. A rest that ends with nobody waiting is followed by
/// another, so an idle store's thread wakes once per [`REST`] and looks at nothing.
const LINGER: Duration = Duration::from_millis(50);

/// The watcher thread of a store; stopped and joined when dropped.
pub(crate) struct ForeignWatch {
    flags: Arc<Flags>,
    thread: Option<JoinHandle<()>>,
}

/// What the store tells its watcher thread.
#[derive(Default)]
struct Flags {
    stop: AtomicBool,
    /// A waiter woke the thread (an unpark alone cannot be told from the end of a rest).
    woken: AtomicBool,
}

impl ForeignWatch {
    /// Starts watching the log at `wal` for the waiters of `changes`.
    pub(crate) fn start(
        wal: PathBuf,
        changes: Arc<Changes>,
        counters: Arc<Counters>,
    ) -> std::io::Result<Self> {
        let flags = Arc::new(Flags::default());
        let thread = std::thread::Builder::new()
            .name("idemgate-sqlite-foreign".into())
            .spawn({
                let flags = flags.clone();
                move || watch(&wal, &changes, &counters, &flags)
            })?;
        Ok(ForeignWatch {
            flags,
            thread: Some(thread),
        })
    }

    /// Someone is about to wait: the thread stops resting.
    pub(crate) fn waiting(&self) {
        self.flags.woken.store(true, Ordering::SeqCst);
        if let Some(thread) = &self.thread {
            thread.thread().unpark();
        }
    }
}

impl Drop for ForeignWatch {
    fn drop(&mut self) {
        self.flags.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// What a look at the log found: its size and modification time (none while there is no log).
type Look = Option<(u64, SystemTime)>;

fn look(wal: &PathBuf) -> Look {
    let meta = std::fs::metadata(wal).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

fn watch(wal: &PathBuf, changes: &Changes, counters: &Counters, flags: &Flags) {
    let own = || {
        (
            counters.own_begun.load(Ordering::SeqCst),
            counters.own_ended.load(Ordering::SeqCst),
        )
    };
    let mut foreign_seen = false;
    // The last look, and the store's own activity count when it was surely quiet around it.
    let mut last: Look = look(wal);
    let mut quiet_at: Option<u64> = None;
    let mut looking_until = Instant::now() + LINGER;
    while !flags.stop.load(Ordering::SeqCst) {
        if changes.waiting() {
            looking_until = Instant::now() + LINGER;
        } else if Instant::now() >= looking_until {
            std::thread::park_timeout(REST);
            if !flags.woken.swap(false, Ordering::SeqCst) {
                continue; // the end of a rest: nobody waits, rest again
            }
            looking_until = Instant::now() + LINGER;
            // The last look stays: a commit between a waiter's look at its record and this
            // thread's next look is a change to report. Whose it was is not known, though.
            quiet_at = None;
            continue;
        }
        std::thread::sleep(TICK);
        let (begun, _) = own();
        let now = look(wal);
        let (_, ended) = own();
        // Quiet: no own batch or checkpoint in progress now, and none begun since the last look
        // that was also quiet, so any change of the log between the two looks is another's.
        let quiet_now = begun == ended;
        let surely_foreign = quiet_now && quiet_at == Some(begun);
        if now != last && (surely_foreign || foreign_seen) {
            foreign_seen = true;
            changes.notify_all();
        }
        last = now;
        quiet_at = quiet_now.then_some(begun);
    }
}
