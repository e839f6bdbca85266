//! A durable journal of unconfirmed writes: one file per entry in a directory.
//!
//! One file per entry needs no locking between processes: an entry appears atomically (written to
//! a temporary name, synced, renamed, directory synced) and disappears with one unlink. Two
//! processes flushing the same entry both apply it; that is harmless because every journaled
//! write is a compare-and-set on its lease.
//!
//! # The reserve
//! The journal is written when the store could not take an outcome, and a full disk is one reason
//! a local store cannot (the journal sits beside the SQLite file by default). So the journal keeps
//! room of its own: spare files (`.reserve-N`, zeros written to disk, not sparse) made when it
//! opens. An append that meets a full disk gives up one spare file at a time, until the entry fits
//! or none is left; each is claimed by an atomic rename, so two processes never count the same one.
//! Spare files given up are made again when entries are removed (flushed into the store), and at
//! the next open, which fails if it cannot make them.
//!
//! # Sealed entries
//! When records are sealed (`docs/OPERATIONS.md`), so are the journal's entries: each file holds
//! its entry sealed under the keyring's current key (bound to the file's name) and is named by an
//! HMAC of the record's name, so the disk shows neither the outcome nor the key either. Entries
//! written in clear before sealing was turned on are still read and flushed.

use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use idemgate_core::key::hex;
use idemgate_core::{Journal, JournalEntry, JournalError};
use idemgate_seal::Seal;

/// How much room a [`FileJournal`] keeps for itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserve {
    /// How many spare files (0: no reserve).
    pub files: u32,
    /// The size of each, in bytes: an entry holds one outcome, so a few of the largest outcome
    /// bodies a tool returns.
    pub file_bytes: u64,
}

impl Default for Reserve {
    /// 8 files of 128 KiB (1 MiB): enough for dozens of typical outcomes while the disk is full.
    fn default() -> Self {
        Reserve {
            files: 8,
            file_bytes: 128 << 10,
        }
    }
}

/// A journal in a directory.
#[derive(Clone, Debug)]
pub struct FileJournal {
    dir: PathBuf,
    reserve: Reserve,
    seal: Option<Seal>,
}

impl FileJournal {
    /// Opens (and creates, if needed) the journal directory, with the default [`Reserve`].
    ///
    /// # Errors
    /// When the directory cannot be created, or its reserve cannot be made (the disk is full).
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        Self::open_with_reserve(dir, Reserve::default())
    }

    /// Opens (and creates, if needed) the journal directory, and makes its reserve complete. Its
    /// entries are sealed when the environment configures a seal, as the store's records are
    /// ([`idemgate_seal::from_env`]).
    ///
    /// # Errors
    /// When the directory cannot be created, or the reserve cannot be made: better to refuse to
    /// start than to run side effects whose outcomes might find no room anywhere. When the seal is
    /// configured wrongly.
    pub fn open_with_reserve(dir: impl Into<PathBuf>, reserve: Reserve) -> std::io::Result<Self> {
        let seal = idemgate_seal::from_env().map_err(|e| {
            std::io::Error::new(
                ErrorKind::InvalidInput,
                format!("failed to set up sealing: {e}"),
            )
        })?;
        Self::open_sealed(dir, reserve, seal)
    }

    /// As [`FileJournal::open_with_reserve`], its entries sealed by `seal` when given (and never
    /// by the environment).
    ///
    /// # Errors
    /// As [`FileJournal::open_with_reserve`].
    pub fn open_sealed(
        dir: impl Into<PathBuf>,
        reserve: Reserve,
        seal: Option<Seal>,
    ) -> std::io::Result<Self> {
        let dir = dir.into();
        crate::defaults::create_private_dir(&dir)?;
        let journal = FileJournal { dir, reserve, seal };
        journal.remove_stray_claims();
        journal.replenish().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "failed to reserve {} bytes for the journal in {}: {e}",
                    u64::from(reserve.files) * reserve.file_bytes,
                    journal.dir.display()
                ),
            )
        })?;
        Ok(journal)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The name of `entry`'s file, without its extension: its id, or when sealed an HMAC of
    /// the record's name (the id shows a plain digest of the key) and the lease's token.
    fn stem(&self, entry: &JournalEntry) -> String {
        match &self.seal {
            None => entry.id(),
            Some(seal) => {
                let k = &entry.key;
                let digest = seal.digest(&[
                    b"idemgate journal entry v1",
                    k.tenant.as_str().as_bytes(),
                    k.tool.as_str().as_bytes(),
                    k.key.as_str().as_bytes(),
                ]);
                format!("{}-{}", hex(&digest[..16]), entry.lease.token.to_hex())
            }
        }
    }

    fn path_of(&self, entry: &JournalEntry) -> PathBuf {
        self.dir.join(format!("{}.json", self.stem(entry)))
    }

    /// What an entry's file holds: its JSON, sealed for that file when sealing is on.
    fn encode(&self, stem: &str, entry: &JournalEntry) -> Result<Vec<u8>, JournalError> {
        let json = serde_json::to_vec(entry)
            .map_err(|e| JournalError::new(format!("failed to encode journal entry: {e}"), e))?;
        Ok(match &self.seal {
            None => json,
            Some(seal) => seal.seal(&journal_context(stem), &json),
        })
    }

    /// The entry a file holds; `None` for one this process cannot read (sealed under a key it
    /// does not hold, or not an entry), which stays on disk for an operator.
    fn decode(&self, stem: &str, bytes: &[u8]) -> Option<JournalEntry> {
        let json = if bytes.starts_with(idemgate_seal::SEALED_MAGIC) {
            self.seal
                .as_ref()?
                .open(&journal_context(stem), bytes)
                .ok()?
        } else {
            bytes.to_vec()
        };
        serde_json::from_slice(&json).ok()
    }

    /// Makes a rename or removal in the directory durable. On Unix, an fsync of the directory.
    /// Windows opens no directory as a file (without backup semantics, which `std` does not
    /// ask for), and NTFS journals a rename itself; there is nothing more to sync.
    fn sync_dir(&self) -> std::io::Result<()> {
        #[cfg(unix)]
        fs::File::open(&self.dir)?.sync_all()?;
        Ok(())
    }

    fn spare(&self, i: u32) -> PathBuf {
        self.dir.join(format!(".reserve-{i}"))
    }

    /// Makes every missing (or short) spare file, fully written and synced.
    fn replenish(&self) -> std::io::Result<()> {
        let mut made = false;
        for i in 0..self.reserve.files {
            let path = self.spare(i);
            if fs::metadata(&path).is_ok_and(|m| m.len() >= self.reserve.file_bytes) {
                continue;
            }
            // Written under a temporary name, so that a half-made file never counts as room.
            let tmp = self
                .dir
                .join(format!(".reserve-{i}.{}.tmp", std::process::id()));
            let made_one =
                write_zeros(&tmp, self.reserve.file_bytes).and_then(|()| fs::rename(&tmp, &path));
            if let Err(e) = made_one {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
            made = true;
        }
        if made {
            self.sync_dir()?;
        }
        Ok(())
    }

    /// Deletes spare files that a process claimed but did not get to delete (it died between the
    /// two steps), so that their room is not lost for good. Deleting one that a live process is
    /// about to delete is harmless: the room is freed either way.
    fn remove_stray_claims(&self) {
        let Ok(items) = fs::read_dir(&self.dir) else {
            return;
        };
        for item in items.flatten() {
            if item.file_name().to_string_lossy().starts_with(".claimed-") {
                let _ = fs::remove_file(item.path());
            }
        }
    }

    /// Gives up one spare file to make room; false when none is left.
    fn release_one_spare(&self) -> bool {
        static CLAIMS: AtomicU64 = AtomicU64::new(0);
        for i in 0..self.reserve.files {
            // The rename is the claim: of two processes, only one moves a given file.
            let claimed = self.dir.join(format!(
                ".claimed-{}-{}",
                std::process::id(),
                CLAIMS.fetch_add(1, Ordering::Relaxed)
            ));
            if fs::rename(self.spare(i), &claimed).is_ok() {
                let _ = fs::remove_file(&claimed);
                return true;
            }
        }
        false
    }

    /// Writes `body` as the entry file `path`, durably.
    fn write_entry(&self, tmp: &Path, path: &Path, body: &[u8]) -> std::io::Result<()> {
        let written = (|| {
            let mut f =
                private(OpenOptions::new().write(true).create(true).truncate(true)).open(tmp)?;
            f.write_all(body)?;
            f.sync_all()?;
            fs::rename(tmp, path)?;
            self.sync_dir()
        })();
        if written.is_err() {
            let _ = fs::remove_file(tmp);
        }
        written
    }
}

/// What a sealed entry is bound to: its file's name, so that it cannot pass for another.
fn journal_context(stem: &str) -> [&[u8]; 2] {
    [b"idemgate journal v1", stem.as_bytes()]
}

/// The options, creating a file readable by its owner only (0600 on Unix): an entry holds an
/// outcome the store has not confirmed.
fn private(options: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(options, 0o600);
    options
}

/// Writes a file of `len` zero bytes and syncs it: allocated on disk, unlike a sparse file.
fn write_zeros(path: &Path, len: u64) -> std::io::Result<()> {
    let mut f = private(OpenOptions::new().write(true).create(true).truncate(true)).open(path)?;
    let chunk = [0u8; 16 << 10];
    let mut left = len;
    while left > 0 {
        let n = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.sync_all()
}

/// Whether `e` says the disk (or the user's quota) is full.
fn is_full(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded)
}

impl Journal for FileJournal {
    fn append(&self, entry: &JournalEntry) -> Result<(), JournalError> {
        let fail = |e: std::io::Error, besides: &str| {
            let message = format!(
                "failed to write journal entry in {}: {e}{besides}",
                self.dir.display()
            );
            JournalError::new(message, e)
        };
        let stem = self.stem(entry);
        let body = self.encode(&stem, entry)?;
        let tmp = self.dir.join(format!(".{stem}.{}.tmp", std::process::id()));
        let path = self.path_of(entry);
        loop {
            match self.write_entry(&tmp, &path, &body) {
                Ok(()) => return Ok(()),
                Err(e) if is_full(&e) && self.release_one_spare() => continue,
                Err(e) if is_full(&e) => return Err(fail(e, " (and its reserve is used up)")),
                Err(e) => return Err(fail(e, "")),
            }
        }
    }

    fn pending(&self) -> Result<Vec<JournalEntry>, JournalError> {
        let fail = |e: std::io::Error| {
            JournalError::new(
                format!("failed to read journal {}: {e}", self.dir.display()),
                e,
            )
        };
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
            let stem = path.file_stem().unwrap_or_default().to_string_lossy();
            if let Some(entry) = self.decode(&stem, &bytes) {
                entries.push(entry);
            }
        }
        entries.sort_by_key(|e| e.journaled_at);
        Ok(entries)
    }

    fn remove(&self, entry: &JournalEntry) -> Result<(), JournalError> {
        let mut removed = fs::remove_file(self.path_of(entry));
        if self.seal.is_some()
            && removed
                .as_ref()
                .is_err_and(|e| e.kind() == ErrorKind::NotFound)
        {
            // An entry journaled in clear before sealing was turned on.
            removed = fs::remove_file(self.dir.join(format!("{}.json", entry.id())));
        }
        match removed {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(JournalError::new(
                    format!("failed to remove journal entry: {e}"),
                    e,
                ))
            }
        }
        self.sync_dir()
            .map_err(|e| JournalError::new(format!("failed to sync journal directory: {e}"), e))?;
        // The room the entry took is free again: the reserve takes it back first. Not making it
        // (the disk is still full) is no error here; the next removal or open tries again.
        let _ = self.replenish();
        Ok(())
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
            op: JournalOp::complete(
                Outcome::success(b"out".to_vec()),
                idemgate_core::Keep::replay(Duration::from_secs(5)),
            ),
            journaled_at: Timestamp::from_millis(at),
            fingerprint: None,
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

    /// The kind of the I/O error behind `e`.
    fn io_kind(e: &JournalError) -> Option<ErrorKind> {
        let io = std::error::Error::source(e)?.downcast_ref::<std::io::Error>()?;
        Some(io.kind())
    }

    #[test]
    fn a_failed_write_keeps_the_io_error_as_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let j = FileJournal::open(dir.path().join("journal")).unwrap();
        fs::remove_dir_all(j.dir()).unwrap();
        let e = j.append(&entry("a", 1)).unwrap_err();
        let says = format!("failed to write journal entry in {}: ", j.dir().display());
        assert!(e.to_string().starts_with(&says), "{e}");
        assert_eq!(io_kind(&e), Some(ErrorKind::NotFound), "{e:?}");
        let e = j.pending().unwrap_err();
        assert_eq!(io_kind(&e), Some(ErrorKind::NotFound), "{e:?}");
    }

    /// Every byte of every file in `dir`, names included.
    fn disk(dir: &Path) -> Vec<u8> {
        let mut bytes = Vec::new();
        for item in fs::read_dir(dir).unwrap() {
            let item = item.unwrap();
            bytes.extend(item.file_name().as_encoded_bytes());
            bytes.extend(fs::read(item.path()).unwrap());
        }
        bytes
    }

    fn secret_entry() -> JournalEntry {
        let mut e = entry(idemgate_seal::testing::SECRET_KEY, 1);
        e.op = JournalOp::complete(
            Outcome::success(idemgate_seal::testing::SECRET_RESULT.as_bytes().to_vec()),
            idemgate_core::Keep::replay(Duration::from_secs(5)),
        );
        e
    }

    #[test]
    fn sealed_entries_show_neither_the_outcome_nor_the_key_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let (plain_dir, sealed_dir) = (dir.path().join("plain"), dir.path().join("sealed"));
        let plain = FileJournal::open_sealed(&plain_dir, Reserve::default(), None).unwrap();
        let seal = idemgate_seal::testing::seal(&["k1"]);
        let sealed = FileJournal::open_sealed(&sealed_dir, Reserve::default(), Some(seal)).unwrap();
        // Before sealing was on, an entry was journaled in clear: it still flushes and goes.
        let (e, old) = (secret_entry(), entry("journaled-in-clear", 0));
        plain.append(&e).unwrap();
        fs::write(
            sealed_dir.join(format!("{}.json", old.id())),
            serde_json::to_vec(&old).unwrap(),
        )
        .unwrap();
        sealed.append(&e).unwrap();
        idemgate_seal::testing::assert_dump_hides_secrets(&disk(&plain_dir), &disk(&sealed_dir));
        assert!(
            !fs::read_dir(&sealed_dir).unwrap().any(|f| f
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(&e.id())),
            "the file is not named by the plain digest of the key"
        );
        assert_eq!(sealed.pending().unwrap(), vec![old.clone(), e.clone()]);
        // A journal without the key that sealed an entry leaves it on disk for an operator.
        let other = FileJournal::open_sealed(
            &sealed_dir,
            Reserve::default(),
            Some(idemgate_seal::testing::seal(&["k2"])),
        )
        .unwrap();
        assert_eq!(other.pending().unwrap(), vec![old.clone()]);
        sealed.remove(&e).unwrap();
        sealed.remove(&old).unwrap();
        assert_eq!(sealed.pending().unwrap(), vec![]);
        assert!(!disk(&sealed_dir).windows(5).any(|w| w == b".json"));
    }

    /// About 20 kB on disk: bodies are written as JSON arrays of numbers.
    fn big_entry(k: &str) -> JournalEntry {
        let mut e = entry(k, 1);
        e.op = JournalOp::complete(
            Outcome::success(vec![b'x'; 5_000]),
            idemgate_core::Keep::replay(Duration::from_secs(5)),
        );
        e
    }

    #[test]
    fn a_full_disk_still_takes_entries_from_the_reserve() {
        let fs = idemgate_conformance::tmpfs::TmpFs::mount(1 << 20);
        let reserve = Reserve {
            files: 4,
            file_bytes: 64 << 10,
        };
        let j = FileJournal::open_with_reserve(fs.path().join("journal"), reserve).unwrap();
        let filler = fs.fill("filler");
        // Without the reserve this entry had no room: the outcome of a side effect that ran was
        // lost, and the caller heard "unrecorded".
        let first = big_entry("a");
        j.append(&first).unwrap();
        assert_eq!(j.pending().unwrap(), vec![first.clone()]);
        // The reserve runs out, and then says so.
        let mut taken = 1;
        let e = loop {
            match j.append(&big_entry(&format!("k{taken}"))) {
                Ok(()) => taken += 1,
                Err(e) => break e,
            }
        };
        assert!(
            taken >= 8,
            "only {taken} entries of about 20 kB fit in 256 KiB"
        );
        assert!(e.to_string().contains("reserve is used up"), "{e}");
        assert!(
            matches!(
                io_kind(&e),
                Some(ErrorKind::StorageFull | ErrorKind::QuotaExceeded)
            ),
            "the disk's error is the source: {e:?}"
        );
        assert_eq!(j.pending().unwrap().len(), taken);
        assert!(
            !fs::read_dir(j.dir()).unwrap().any(|f| f
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".tmp")),
            "a failed append leaves no temporary file"
        );

        // Once the disk has room again, flushed entries give the reserve back.
        fs::remove_file(filler).unwrap();
        for e in j.pending().unwrap() {
            j.remove(&e).unwrap();
        }
        for i in 0..reserve.files {
            assert_eq!(fs::metadata(j.spare(i)).unwrap().len(), reserve.file_bytes);
        }
    }

    #[test]
    fn open_fails_loudly_without_room_for_the_reserve() {
        let fs = idemgate_conformance::tmpfs::TmpFs::mount(256 << 10);
        let e = FileJournal::open(fs.path().join("journal")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("failed to reserve 1048576 bytes for the journal in"),
            "{e}"
        );
        assert!(
            !fs::read_dir(fs.path().join("journal")).unwrap().any(|f| f
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".tmp")),
            "a failed reserve leaves no temporary file"
        );
    }
}
