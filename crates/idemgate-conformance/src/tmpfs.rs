//! A small file system of its own for disk-trouble tests: a size-limited tmpfs, mounted by the
//! test (as root) and unmounted when dropped, so that "the disk is full" and "the files are
//! read-only" happen for real, to SQLite and to the journal alike.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// A mounted tmpfs; unmounted (and its directory removed) on drop.
#[derive(Debug)]
pub struct TmpFs {
    dir: PathBuf,
}

impl TmpFs {
    /// Mounts a tmpfs of `bytes` on a fresh directory under the system's temporary directory.
    ///
    /// # Panics
    /// When this machine does not let the test mount (not root, no `mount`, a container without
    /// the capability): a test that cannot do what it checks fails loudly rather than passing
    /// empty. `scripts/test-all` runs as root, as CI does.
    pub fn mount(bytes: u64) -> TmpFs {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "idemgate-tmpfs-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            panic!("failed to create {}: {e}", dir.display());
        }
        let size = format!("size={bytes}");
        match run("mount", &["-t", "tmpfs", "-o", &size, "tmpfs"], &dir) {
            Ok(()) => TmpFs { dir },
            Err(why) => {
                let _ = std::fs::remove_dir(&dir);
                panic!(
                    "this test needs a small tmpfs and cannot mount one here (run it as root on \
                     Linux): {why}"
                );
            }
        }
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Fills it to the last byte with a file `name`, and returns that file's path (remove it to
    /// make room again).
    ///
    /// # Panics
    /// On an error other than a full disk.
    pub fn fill(&self, name: &str) -> PathBuf {
        use std::io::Write;
        let path = self.dir.join(name);
        let mut f = std::fs::File::create(&path)
            .unwrap_or_else(|e| panic!("failed to create {}: {e}", path.display()));
        let chunk = vec![7u8; 4096];
        loop {
            match f.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("failed to fill {}: {e}", self.dir.display()),
            }
        }
        path
    }

    /// Remounts it read-only (every write fails with `EROFS`, for root too) or writable again.
    ///
    /// # Panics
    /// When `mount` refuses (read-only needs that no file is open for writing).
    pub fn set_read_only(&self, read_only: bool) {
        let mode = if read_only {
            "remount,ro"
        } else {
            "remount,rw"
        };
        run("mount", &["-o", mode], &self.dir)
            .unwrap_or_else(|why| panic!("failed to remount {}: {why}", self.dir.display()));
    }
}

impl Drop for TmpFs {
    fn drop(&mut self) {
        // A file still open (a store not dropped yet) makes a plain unmount fail; detaching it
        // still leaves no mount behind, and the memory goes once the files are closed.
        if run("umount", &[], &self.dir).is_err() {
            let _ = run("umount", &["-l"], &self.dir);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A file made immutable (`chattr +i`: every open for writing fails with `EPERM`, for root too),
/// as a read-only database file is to its owner; writable again on [`Immutable::lift`] or drop.
#[derive(Debug)]
pub struct Immutable {
    file: Option<PathBuf>,
}

impl Immutable {
    /// Makes `file` immutable.
    ///
    /// # Panics
    /// When this machine cannot (not root, no `chattr`, a file system without the attribute): the
    /// test fails loudly rather than passing empty.
    pub fn set(file: &Path) -> Immutable {
        match run("chattr", &["+i"], file) {
            Ok(()) => Immutable {
                file: Some(file.to_owned()),
            },
            Err(why) => panic!(
                "this test needs to make a file read-only for root and cannot here (run it as \
                 root on ext4, xfs or btrfs): {why}"
            ),
        }
    }

    /// Makes the file writable again.
    ///
    /// # Panics
    /// When `chattr` refuses.
    pub fn lift(mut self) {
        if let Some(file) = self.file.take() {
            run("chattr", &["-i"], &file)
                .unwrap_or_else(|why| panic!("failed to make {} writable: {why}", file.display()));
        }
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            let _ = run("chattr", &["-i"], &file);
        }
    }
}

fn run(program: &str, args: &[&str], path: &Path) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .arg(path)
        .output()
        .map_err(|e| format!("failed to run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
