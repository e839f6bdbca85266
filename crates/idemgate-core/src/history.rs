//! A record's history: what happened to it that its state does not say, kept in the store with
//! the record so that every door and every process reads the same trail.
//!
//! The state already says when the record was reserved, completed or found unknown; the history
//! adds what only the writer knew at the time: why the outcome became unknown, that a late
//! outcome was refused, what a verifier found, and who resolved or reopened the record and why.
//! Entries are written only on those rare paths, never by a call that reserves and completes,
//! so a fresh call costs the store nothing more. Each entry is one append, made after the change
//! it tells of landed: a failed append loses the entry (the engine logs it, and the audit log
//! still has the line), never the change.
//!
//! The history lives as long as the record's row: across takeovers, a reopening and the next
//! reservation of the same key (which continues at the next fence), until a purge deletes the
//! row past its tombstone.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::record::{Fence, State};
use crate::time::Timestamp;

/// The longest `by` and `reason` kept, in bytes; longer text is cut at a character boundary
/// with an ellipsis, so that a caller cannot grow a record without bound.
pub const MAX_TEXT: usize = 1000;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Happening {
    /// The call reported its outcome ambiguous, or its verifier could not tell: the record was
    /// marked unknown. `reason` says why.
    BecameUnknown,
    /// A holder whose lease had been taken over reported its outcome after all; the store
    /// refused it (a stale fence). `reason` says what the late holder reported, which is what
    /// an operator needs to resolve the record it left unknown.
    LateOutcomeRefused,
    /// A call found the record unknown and, as its tool's `on_unknown = retry` says, took it over
    /// to run the action again; `reason` says since when it was unknown.
    RetriedAfterUnknown,
    /// A verifier looked the action up downstream after the record was found unknown; `reason`
    /// says what it found.
    Verified,
    /// An operator resolved the unknown record as completed, with a result.
    ResolvedCompleted,
    /// An operator resolved the unknown record as not applied: the next call runs the action.
    ResolvedReleased,
    /// The record was reopened: the next call runs the action again. `was` says its state.
    Reopened,
    /// Shadow mode ([`crate::Mode::Observe`]): a call that duplicated this record ran, where
    /// enforce mode would have answered it without running. `would` says the verdict it would
    /// have had, `rule` what named the record, `reason` the answer in words.
    Observed,
}

impl fmt::Display for Happening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Happening::BecameUnknown => "became_unknown",
            Happening::LateOutcomeRefused => "late_outcome_refused",
            Happening::RetriedAfterUnknown => "retried_after_unknown",
            Happening::Verified => "verified",
            Happening::ResolvedCompleted => "resolved_completed",
            Happening::ResolvedReleased => "resolved_released",
            Happening::Reopened => "reopened",
            Happening::Observed => "observed",
        })
    }
}

/// One entry of a record's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// When (the clock of the engine that wrote it).
    pub at: Timestamp,
    /// The fence it concerns: the one an operator looked at and acted on, the holder's whose
    /// outcome became unknown or was verified, the stale one of a refused late outcome.
    pub fence: Fence,
    /// What happened.
    pub what: Happening,
    /// Who: an operator's name (`alice`, `tenant:acme`, `console:alice`), when a person acted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Why, in the words of whoever acted (the caller's `ambiguous` reason, an operator's reason,
    /// what a verifier or a late holder reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The record's state before, for a reopening.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was: Option<State>,
    /// For an observation: the verdict enforce mode would have given (`replayed`, `in_flight`,
    /// `unknown`, `expired`, `key_reused`: [`crate::Verdict::label`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would: Option<String>,
    /// For an observation: the rule that named the record ([`crate::KeyRule::duplicate_label`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

impl HistoryEntry {
    /// An entry at `at` for the holder at `fence`, with `by` and `reason` cut to [`MAX_TEXT`].
    pub fn new(
        at: Timestamp,
        fence: Fence,
        what: Happening,
        by: Option<&str>,
        reason: Option<&str>,
    ) -> Self {
        HistoryEntry {
            at,
            fence,
            what,
            by: by.map(cut),
            reason: reason.map(cut),
            was: None,
            would: None,
            rule: None,
        }
    }

    /// The entry as the one line of JSON stores keep it as (no newline in it: JSON escapes them).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("a history entry always serializes")
    }

    /// Reads back one line [`HistoryEntry::to_line`] wrote.
    ///
    /// # Errors
    /// When the line is no history entry.
    pub fn from_line(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line)
    }

    /// Reads back lines of [`HistoryEntry::to_line`], one per line, as SQL and Redis stores keep
    /// a record's history in one text value (an append is one concatenation on the server).
    ///
    /// # Errors
    /// The first line that is no history entry.
    pub fn from_lines(text: &str) -> Result<Vec<Self>, serde_json::Error> {
        text.lines()
            .filter(|l| !l.is_empty())
            .map(Self::from_line)
            .collect()
    }
}

/// The last entry of `history` that says why the record became unknown at `fence`: what the
/// record's current unknown state is explained by, when anything is.
pub fn became_unknown_at(history: &[HistoryEntry], fence: Fence) -> Option<&HistoryEntry> {
    history
        .iter()
        .rev()
        .find(|e| e.what == Happening::BecameUnknown && e.fence == fence)
}

/// `text` cut to at most [`MAX_TEXT`] bytes, at a character boundary, marked with an ellipsis.
fn cut(text: &str) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_owned();
    }
    let mut end = MAX_TEXT - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_from_its_line_and_lines_from_their_text() {
        let mut e = HistoryEntry::new(
            Timestamp::from_millis(1_800_000_000_000),
            3,
            Happening::Reopened,
            Some("alice"),
            Some("the charge bounced\nsee ticket 42"),
        );
        e.was = Some(State::Completed);
        let line = e.to_line();
        assert!(!line.contains('\n'), "one line: {line}");
        assert_eq!(HistoryEntry::from_line(&line).unwrap(), e);
        let other = HistoryEntry::new(
            Timestamp::from_millis(1_800_000_000_001),
            4,
            Happening::BecameUnknown,
            None,
            None,
        );
        let text = format!("{line}\n{}\n", other.to_line());
        assert_eq!(HistoryEntry::from_lines(&text).unwrap(), vec![e, other]);
        assert!(HistoryEntry::from_lines("{\"at\":1}\n").is_err());
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_TEXT);
        let e = HistoryEntry::new(
            Timestamp::from_millis(0),
            1,
            Happening::BecameUnknown,
            Some(&long),
            Some("short"),
        );
        let by = e.by.unwrap();
        assert!(by.len() <= MAX_TEXT && by.ends_with('…'), "{}", by.len());
        assert_eq!(e.reason.as_deref(), Some("short"));
    }
}
