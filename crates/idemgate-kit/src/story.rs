//! A record's story as every door tells it: the steps its state says (reserved, completed,
//! expired, unknown) merged with the history the store keeps ([`idemgate_core::history`]), in
//! time order, each with a sentence for people. `keys show`, `GET …/records/{key}`, the console and
//! the Python and Node `record()` all show this one list, so a trail reads the same everywhere.

use idemgate_core::history::became_unknown_at;
use idemgate_core::key::hex;
use idemgate_core::{Fence, Happening, HistoryEntry, Key, Record, RecordState, Timestamp};
use serde::Serialize;

use crate::Payload;

/// What the story says of an unknown record whose history gives no reason: the store cannot tell
/// a lease that ran out from a mark whose reason was lost, but the first is what happens.
pub const NO_REASON: &str = "no reason is on record: most likely the lease ended without an \
     outcome (the process running the call stopped, or lost the store)";

/// One step of a record's story.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    /// When.
    pub at: Timestamp,
    /// The fence it concerns, when it concerns one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<Fence>,
    /// What happened: `reserved`, `completed`, `expired`, `unknown` from the record's state, or a
    /// [`Happening`] of its history (`became_unknown`, `resolved_completed`, `reopened`, …).
    pub what: String,
    /// Who, when a person acted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Why, in the words of whoever acted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The step in one sentence.
    pub text: String,
    /// The fence that orders steps of one millisecond (the record's, for its own steps).
    #[serde(skip)]
    order: Fence,
}

/// The story of the record stored under a key: `record` when one counts, and its `history`
/// (which a record that counts as absent, released or reopened, may still have), oldest first.
pub fn story(record: Option<&Record>, history: &[HistoryEntry]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    if let Some(r) = record {
        // No fence shown: a takeover since (an operator's resolution, a retry after unknown)
        // raised the record's fence and kept its reservation time.
        let mut reserved = step(
            r.created_at,
            Some(r.fence),
            "reserved",
            "reserved: the call began",
        );
        reserved.fence = None;
        steps.push(reserved);
        match &r.state {
            RecordState::InFlight { lease_until } => steps.push(step(
                r.created_at,
                Some(r.fence),
                "in_flight",
                &format!("in flight: its call holds the record until {lease_until} unless it is extended"),
            )),
            RecordState::Completed {
                outcome,
                completed_at,
                expires_at,
                ..
            } => {
                let how = if Payload::is_resolution(outcome) {
                    "its outcome stored by an operator's resolution; nothing ran then"
                } else {
                    "the action ran and its outcome was stored"
                };
                steps.push(step(
                    *completed_at,
                    Some(r.fence),
                    "completed",
                    &format!("completed ({}): {how}; replayed until {expires_at}", outcome.kind),
                ));
            }
            RecordState::Expired {
                completed_at,
                expired_at,
                retain_until,
            } => {
                steps.push(step(
                    *completed_at,
                    Some(r.fence),
                    "completed",
                    "completed: the action ran and its outcome was stored",
                ));
                steps.push(step(
                    *expired_at,
                    Some(r.fence),
                    "expired",
                    &format!("its outcome expired; a retry is refused as expired until {retain_until}"),
                ));
            }
            RecordState::Unknown { since } => {
                if reason_at(history, r.fence).is_none() {
                    let mut s = step(*since, Some(r.fence), "unknown", "");
                    s.text = format!("became unknown: {NO_REASON}");
                    s.reason = Some(NO_REASON.to_owned());
                    steps.push(s);
                }
            }
        }
    }
    steps.extend(history.iter().map(told));
    // In time order; within one millisecond (a fast store reopens a record and runs the next
    // call in the same one), by fence: what an operator did at the fence they looked at comes
    // before the steps of the record the next call made at a higher one. Stable besides, so a
    // record's own steps come before history entries of the same instant and fence.
    steps.sort_by_key(|s| (s.at, s.order));
    steps
}

/// What observe mode (shadow mode) recorded in one record's history: the calls that ran where
/// enforce mode would have answered them without running.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Observed {
    /// How many.
    pub calls: usize,
    /// How many by the verdict enforce mode would have given (`replayed`, `in_flight`,
    /// `unknown`, `expired`, `key_reused`, `execute`), in that verdict's name order.
    pub would: std::collections::BTreeMap<String, usize>,
    /// When the last one ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last: Option<Timestamp>,
}

impl Observed {
    /// The observations among `history`'s entries.
    pub fn of(history: &[HistoryEntry]) -> Self {
        let mut seen = Observed::default();
        for e in history.iter().filter(|e| e.what == Happening::Observed) {
            seen.calls += 1;
            let would = e.would.clone().unwrap_or_else(|| "unsaid".to_owned());
            *seen.would.entry(would).or_default() += 1;
            seen.last = seen.last.max(Some(e.at));
        }
        seen
    }

    /// Whether there were none.
    pub fn is_empty(&self) -> bool {
        self.calls == 0
    }
}

/// "2 calls ran that enforce mode would not have run (replayed ×1, in_flight ×1), the last at T".
impl std::fmt::Display for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let by: Vec<String> = self
            .would
            .iter()
            .map(|(would, n)| format!("{would} ×{n}"))
            .collect();
        write!(
            f,
            "{} call{} ran that enforce mode would not have run ({})",
            self.calls,
            if self.calls == 1 { "" } else { "s" },
            by.join(", ")
        )?;
        if let Some(last) = self.last {
            write!(f, ", the last at {last}")?;
        }
        Ok(())
    }
}

/// Why the unknown `record` is unknown: the reason its history gives for its fence, else
/// [`NO_REASON`]. `None` for a record that is not unknown.
pub fn unknown_reason(record: &Record, history: &[HistoryEntry]) -> Option<String> {
    match record.state {
        RecordState::Unknown { .. } => Some(
            reason_at(history, record.fence)
                .unwrap_or(NO_REASON)
                .to_owned(),
        ),
        _ => None,
    }
}

/// The key a downstream sees for the record of `key` (the hex SHA-256 of tenant, tool and key,
/// as the gateway forwards it in `Idempotency-Key` and a verifier receives it): what an operator
/// searches for at the provider.
pub fn downstream_key(key: &Key) -> String {
    hex(&key.digest())
}

/// The reason the last "became unknown" entry at `fence` gives, if any.
fn reason_at(history: &[HistoryEntry], fence: Fence) -> Option<&str> {
    became_unknown_at(history, fence)
        .map(|e| e.reason.as_deref().unwrap_or("the caller gave no reason"))
}

fn step(at: Timestamp, fence: Option<Fence>, what: &str, text: &str) -> Step {
    Step {
        at,
        fence,
        what: what.to_owned(),
        by: None,
        reason: None,
        text: text.to_owned(),
        order: fence.unwrap_or(0),
    }
}

/// A history entry as a step, with its sentence.
fn told(e: &HistoryEntry) -> Step {
    let by =
        e.by.as_deref()
            .map(|b| format!(" by {b}"))
            .unwrap_or_default();
    let why = e
        .reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    let text = match e.what {
        Happening::BecameUnknown => format!(
            "became unknown{}",
            if why.is_empty() {
                ": the caller gave no reason".to_owned()
            } else {
                why
            }
        ),
        Happening::LateOutcomeRefused
        | Happening::RetriedAfterUnknown
        | Happening::Verified
        | Happening::Observed => e.reason.clone().unwrap_or_else(|| e.what.to_string()),
        Happening::ResolvedCompleted => format!("resolved as completed{by}{why}"),
        Happening::ResolvedReleased => {
            format!("resolved as not applied (released){by}{why}; the next call runs the action")
        }
        Happening::Reopened => format!(
            "reopened{}{by}{why}; the next call runs the action again",
            e.was.map(|w| format!(" (was {w})")).unwrap_or_default()
        ),
        // A kind of entry this build does not know (written by a newer one): said as it is.
        _ => format!("{}{by}{why}", e.what),
    };
    Step {
        at: e.at,
        fence: Some(e.fence),
        what: e.what.to_string(),
        by: e.by.clone(),
        reason: e.reason.clone(),
        text,
        order: e.fence,
    }
}

#[cfg(test)]
mod tests {
    use idemgate_core::{Fingerprint, IdempotencyKey, State, TenantId, ToolName};

    use super::*;

    fn unknown(fence: Fence, since: i64) -> Record {
        Record {
            key: Key::new(
                TenantId::new("acme").unwrap(),
                ToolName::new("mail").unwrap(),
                IdempotencyKey::new("m-1").unwrap(),
            ),
            fingerprint: Fingerprint::of_bytes(b""),
            fence,
            created_at: Timestamp::from_millis(1000),
            scope: None,
            state: RecordState::Unknown {
                since: Timestamp::from_millis(since),
            },
        }
    }

    fn entry(at: i64, fence: Fence, what: Happening, by: Option<&str>, why: &str) -> HistoryEntry {
        HistoryEntry::new(Timestamp::from_millis(at), fence, what, by, Some(why))
    }

    #[test]
    fn an_unknown_record_says_why_from_its_history_at_its_fence() {
        let r = unknown(2, 5000);
        let history = [
            entry(2000, 1, Happening::BecameUnknown, None, "an old reason"),
            entry(5000, 2, Happening::BecameUnknown, None, "smtp timeout"),
        ];
        assert_eq!(
            unknown_reason(&r, &history).as_deref(),
            Some("smtp timeout")
        );
        let steps = story(Some(&r), &history);
        let whats: Vec<&str> = steps.iter().map(|s| s.what.as_str()).collect();
        assert_eq!(whats, ["reserved", "became_unknown", "became_unknown"]);
        assert_eq!(steps[2].text, "became unknown: smtp timeout");
    }

    #[test]
    fn an_unknown_record_without_a_reason_says_what_most_likely_happened() {
        let r = unknown(1, 31_000);
        let history = [entry(
            9000,
            0,
            Happening::BecameUnknown,
            None,
            "another fence's",
        )];
        assert_eq!(unknown_reason(&r, &history).as_deref(), Some(NO_REASON));
        let steps = story(Some(&r), &history);
        assert_eq!(steps.last().unwrap().what, "unknown");
        assert!(steps.last().unwrap().text.contains("lease ended"));
    }

    #[test]
    fn within_one_millisecond_a_reopening_comes_before_the_next_calls_steps() {
        let mut r = unknown(2, 5000);
        r.created_at = Timestamp::from_millis(5000);
        r.state = RecordState::Completed {
            outcome: idemgate_core::Outcome::success(b"{}".to_vec()),
            completed_at: Timestamp::from_millis(5000),
            expires_at: Timestamp::from_millis(9000),
            retain_until: Timestamp::from_millis(9000),
        };
        let history = [entry(5000, 1, Happening::Reopened, Some("ann"), "again")];
        let whats: Vec<String> = story(Some(&r), &history)
            .into_iter()
            .map(|s| s.what)
            .collect();
        assert_eq!(whats, ["reopened", "reserved", "completed"]);
    }

    #[test]
    fn a_released_record_is_told_by_its_history_alone_with_the_operator_named() {
        let mut reopened = entry(7000, 3, Happening::Reopened, Some("alice"), "bounced");
        reopened.was = Some(State::Completed);
        let history = [
            entry(
                5000,
                2,
                Happening::ResolvedReleased,
                Some("bob"),
                "never sent",
            ),
            reopened,
        ];
        let steps = story(None, &history);
        assert_eq!(
            steps[0].text,
            "resolved as not applied (released) by bob: never sent; the next call runs the action"
        );
        assert_eq!(
            steps[1].text,
            "reopened (was completed) by alice: bounced; the next call runs the action again"
        );
        assert_eq!(steps[1].by.as_deref(), Some("alice"));
    }
}
