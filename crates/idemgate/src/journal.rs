//! A durable journal of unconfirmed writes: one file per entry in a directory.
//!
//! One file per entry needs no locking between processes: an entry appears atomically (written to
//! a temporary name, synced, renamed, directory synced) and disappears with one unlink. Two
//! processes flushing the same entry both apply it; that is harmless because every journaled
//! write is a compare-and-set on its lease.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use idemgate_core::{Journal, JournalEntry};

/// A journal in a directory.
#[derive(Clone, Debug)]
pub struct FileJournal {
    dir: PathBuf,
}

impl FileJournal {
    /// Opens (and creates, if needed) the journal directory.
    ///
    /// # Errors
    /// When the directory cannot be created.
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(FileJournal { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_of(&self, entry: &JournalEntry) -> PathBuf {
        self.dir.join(format!("{}.json", entry.id()))
    }

    fn sync_dir(&self) -> std::io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

impl Journal for FileJournal {
    fn append(&self, entry: &JournalEntry) -> Result<(), String> {
        let fail = |e: std::io::Error| {
            format!(
                "failed to write journal entry in {}: {e}",
                self.dir.display()
            )
        };
        let body = serde_json::to_vec(entry)
            .map_err(|e| format!("failed to encode journal entry: {e}"))?;
        let tmp = self
            .dir
            .join(format!(".{}.{}.tmp", entry.id(), std::process::id()));
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(fail)?;
        f.write_all(&body).map_err(fail)?;
        f.sync_all().map_err(fail)?;
        fs::rename(&tmp, self.path_of(entry)).map_err(fail)?;
        self.sync_dir().map_err(fail)
    }

    fn pending(&self) -> Result<Vec<JournalEntry>, String> {
        let fail =
            |e: std::io::Error| format!("failed to read journal {}: {e}", self.dir.display());
        let mut entries = Vec::new();
        for item in fs::read_dir(&self.dir).map_err(fail)? {
            let path = item.map_err(fail)?.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let bytes = match fs::read(&path) {
                Ok(b) => b,
                // Another process flushed and removed it meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(fail(e)),
            };
            // An entry this version cannot read stays on disk for an operator; it must not stop
            // the others from flushing.
            if let Ok(entry) = serde_json::from_slice::<JournalEntry>(&bytes) {
                entries.push(entry);
            }
        }
        entries.sort_by_key(|e| e.journaled_at);
        Ok(entries)
    }

    fn remove(&self, entry: &JournalEntry) -> Result<(), String> {
        match fs::remove_file(self.path_of(entry)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("failed to remove journal entry: {e}")),
        }
        self.sync_dir()
            .map_err(|e| format!("failed to sync journal directory: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_core::{
        IdempotencyKey, JournalOp, Key, Lease, LeaseToken, Outcome, TenantId, Timestamp, ToolName,
    };
    use std::time::Duration;

    fn entry(k: &str, at: i64) -> JournalEntry {
        JournalEntry {
            key: Key::new(
                TenantId::new("t").unwrap(),
                ToolName::new("x").unwrap(),
                IdempotencyKey::new(k).unwrap(),
            ),
            lease: Lease {
                fence: 1,
                token: LeaseToken::mint(),
            },
            op: JournalOp::complete(Outcome::success(b"out".to_vec()), Duration::from_secs(5)),
            journaled_at: Timestamp::from_millis(at),
        }
    }

    #[test]
    fn entries_survive_reopening_and_leave_on_remove() {
        let dir = tempfile::tempdir().unwrap();
        let j = FileJournal::open(dir.path().join("journal")).unwrap();
        let (a, b) = (entry("a", 2), entry("b", 1));
        j.append(&a).unwrap();
        j.append(&b).unwrap();
        fs::write(j.dir().join("garbage.json"), b"{not json").unwrap();
        let reopened = FileJournal::open(dir.path().join("journal")).unwrap();
        assert_eq!(
            reopened.pending().unwrap(),
            vec![b.clone(), a.clone()],
            "oldest first"
        );
        reopened.remove(&b).unwrap();
        reopened.remove(&b).unwrap();
        assert_eq!(j.pending().unwrap(), vec![a]);
        assert!(
            j.dir().join("garbage.json").exists(),
            "unreadable entries are kept"
        );
    }
}
