//! The audit log: one JSON line per record state transition, appended to a file.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;

use idemgate::key::hex;
use idemgate::{Fence, Key, Timestamp};
use serde_json::json;

/// A state transition worth an audit line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A key was reserved for execution.
    Reserved,
    /// An outcome was recorded.
    Executed,
    /// A stored outcome was replayed to a duplicate.
    Replayed,
    /// The key was released (nothing happened).
    Released,
    /// The outcome became unknown.
    Unknown,
    /// An operator resolved an unknown record.
    Resolved,
}

impl Event {
    fn as_str(self) -> &'static str {
        match self {
            Event::Reserved => "reserved",
            Event::Executed => "executed",
            Event::Replayed => "replayed",
            Event::Released => "released",
            Event::Unknown => "unknown",
            Event::Resolved => "resolved",
        }
    }
}

/// Where audit lines go; absent when not configured.
#[derive(Debug, Default)]
pub(crate) struct Audit {
    file: Option<Mutex<File>>,
}

impl Audit {
    pub(crate) fn open(path: Option<&Path>) -> std::io::Result<Self> {
        let file = match path {
            Some(p) => Some(Mutex::new(
                OpenOptions::new().create(true).append(true).open(p)?,
            )),
            None => None,
        };
        Ok(Audit { file })
    }

    /// Appends one line. The raw key never appears: only its digest, as downstreams see it.
    pub(crate) fn record(&self, event: Event, key: &Key, fence: Option<Fence>) {
        let Some(file) = &self.file else { return };
        let line = json!({
            "time": Timestamp::now(),
            "event": event.as_str(),
            "tenant": key.tenant,
            "tool": key.tool,
            "key_digest": hex(&key.digest()),
            "fence": fence,
        });
        let mut line = line.to_string();
        line.push('\n');
        // One write of a whole line on an append-mode file: lines never interleave.
        let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f.write_all(line.as_bytes()) {
            tracing::error!(error = %e, "failed to write the audit log");
        }
    }
}
