//! Reading the audit log (`idemgate_kit::Audit` writes it: one JSON line per transition, the key
//! as its digest) back, for the charts. A record's trail is its history in the store
//! (`idemgate_kit::story`), not this log: the log is the export.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::Path;

use idemgate::Timestamp;
use serde::Deserialize;

/// The most of the log's end that one page reads: a long log's oldest lines are left out
/// (the charts then start later, and the page says so).
pub(crate) const TAIL_BYTES: u64 = 16 * 1024 * 1024;

/// One line of the audit log.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Line {
    pub(crate) time: Timestamp,
    pub(crate) event: String,
    pub(crate) tenant: String,
    pub(crate) tool: String,
    pub(crate) key_digest: String,
    pub(crate) released: Option<bool>,
    /// Who resolved or reopened it (which door, for the value page).
    pub(crate) by: Option<String>,
    /// What made a replayed or expired call a duplicate (`key`, `window`, `expired`).
    pub(crate) rule: Option<String>,
}

/// What was read of the log.
#[derive(Debug, Default)]
pub(crate) struct Log {
    pub(crate) lines: Vec<Line>,
    /// Whether the log is longer than what was read.
    pub(crate) truncated: bool,
}

/// The log's lines (its last [`TAIL_BYTES`]); lines that do not parse are skipped.
///
/// # Errors
/// When the file exists but cannot be read.
pub(crate) fn read(path: &Path) -> std::io::Result<Log> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Log::default()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let truncated = len > TAIL_BYTES;
    if truncated {
        file.seek(SeekFrom::Start(len - TAIL_BYTES))?;
    }
    let mut bytes = Vec::new();
    file.take(TAIL_BYTES).read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text.lines().collect();
    if truncated && !lines.is_empty() {
        // The first line was cut in the middle.
        lines.remove(0);
    }
    Ok(Log {
        lines: lines
            .into_iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect(),
        truncated,
    })
}
