//! Where records live when nobody says: the default SQLite file in the data directory and the
//! journal of unconfirmed outcomes beside it. Every front door (the command line, the gateway, the
//! Python package) asks here, so they all find the same records.

use std::path::{Path, PathBuf};

use crate::Fingerprint;

/// The store URL and journal directory to use: `store` if given, else the default SQLite file
/// `idemgate.db` in [`data_dir`] (created if missing); `journal` if given, else beside the SQLite
/// file (`PATH.journal`), or `journal-<digest of the URL>` in [`data_dir`] for other stores.
///
/// # Errors
/// When the data directory cannot be created.
pub fn store_and_journal(
    store: Option<&str>,
    journal: Option<&Path>,
) -> std::io::Result<(String, PathBuf)> {
    let (url, default_journal) = match store {
        Some(url) => {
            let journal = sqlite_path(url)
                .map(journal_beside)
                .unwrap_or_else(|| data_dir().join(format!("journal-{}", short_digest(url))));
            (url.to_owned(), journal)
        }
        None => {
            let dir = data_dir();
            create_private_dir(&dir).map_err(|e| {
                std::io::Error::new(e.kind(), format!("failed to create {}: {e}", dir.display()))
            })?;
            let db = dir.join("idemgate.db");
            (format!("sqlite://{}", db.display()), journal_beside(db))
        }
    };
    Ok((url, journal.map(PathBuf::from).unwrap_or(default_journal)))
}

/// Creates `dir` and its missing parents for their owner only (0700 on Unix): records and
/// journaled outcomes hold results. A directory that exists keeps its mode.
///
/// # Errors
/// When a directory cannot be created.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// The data directory: `$XDG_DATA_HOME/idemgate` when that is set (on every platform, so that
/// a test or a user can point it anywhere), else the platform's place for an application's
/// data: `%LOCALAPPDATA%\idemgate` on Windows (local, not roaming: a store is this machine's),
/// `~/Library/Application Support/idemgate` on macOS, `~/.local/share/idemgate` elsewhere.
pub fn data_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let home = |under: &str| var("HOME").map(|h| PathBuf::from(h).join(under));
    let platform = if cfg!(windows) {
        var("LOCALAPPDATA").map(PathBuf::from)
    } else if cfg!(target_os = "macos") {
        home("Library/Application Support")
    } else {
        home(".local/share")
    };
    var("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or(platform)
        .unwrap_or_else(|| PathBuf::from("."))
        .join("idemgate")
}

fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    Some(PathBuf::from(rest))
}

fn journal_beside(db: PathBuf) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".journal");
    db.with_file_name(name)
}

fn short_digest(s: &str) -> String {
    Fingerprint::of_bytes(s.as_bytes()).to_hex()[..12].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_sits_beside_the_database() {
        assert_eq!(
            journal_beside(PathBuf::from("/tmp/x/idem.db")),
            PathBuf::from("/tmp/x/idem.db.journal")
        );
        assert_eq!(
            sqlite_path("sqlite:///a/b.db"),
            Some(PathBuf::from("/a/b.db"))
        );
        assert_eq!(sqlite_path("sqlite:rel.db"), Some(PathBuf::from("rel.db")));
        let (url, journal) = store_and_journal(Some("sqlite:///a/b.db"), None).unwrap();
        assert_eq!(url, "sqlite:///a/b.db");
        assert_eq!(journal, PathBuf::from("/a/b.db.journal"));
        let (_, journal) = store_and_journal(Some("redis://h"), None).unwrap();
        assert!(journal.starts_with(data_dir()), "{}", journal.display());
        let (_, journal) = store_and_journal(Some("redis://h"), Some(Path::new("/j"))).unwrap();
        assert_eq!(journal, PathBuf::from("/j"));
    }
}
