//! One log line per decision, through `tracing`: an engine [`Observer`]. Lines name records by a
//! short digest, never by the raw key.

use idemgate_core::key::hex;
use idemgate_core::{Decision, Event, Key, Observer, Recording, Verdict};

/// The log observer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Log;

/// A short, non-reversible name of a record for logs: never the raw key.
pub fn short(key: &Key) -> String {
    hex(&key.digest()[..6])
}

/// Why a call ended as it did, when the answer says: an unknown outcome's message (a crashed
/// server, an ambiguous tool error, a verifier that could not tell) or why an outcome could not
/// be recorded.
fn reason_of(decision: Option<&Decision>) -> Option<&str> {
    match decision? {
        Decision::Unknown {
            message: Some(m), ..
        } => Some(m),
        Decision::Executed {
            recording: Recording::Unrecorded(why),
            ..
        }
        | Decision::NotApplied {
            recording: Recording::Unrecorded(why),
            ..
        } => Some(why),
        _ => None,
    }
}

fn recording_of(decision: Option<&Decision>) -> Option<&'static str> {
    let recording = match decision? {
        Decision::Executed { recording, .. } | Decision::NotApplied { recording, .. } => recording,
        Decision::Unknown {
            recording: Some(recording),
            ..
        } => recording,
        _ => return None,
    };
    Some(recording.name())
}

impl Observer for Log {
    fn observe(&self, event: &Event<'_>) {
        match event {
            Event::Call {
                tenant,
                tool,
                key,
                verdict,
                fence,
                answer,
                error,
            } => {
                // Fields without a value are left out (`None`), never written empty.
                let key = key.map(short);
                let decision = answer.map(|a| &a.decision);
                let recording = recording_of(decision);
                let error = error
                    .map(ToString::to_string)
                    .or_else(|| reason_of(decision).map(str::to_owned));
                match verdict {
                    Verdict::Unknown
                    | Verdict::LeaseLost
                    | Verdict::Unrecorded
                    | Verdict::StoreUnavailable
                    | Verdict::JournalFailed => tracing::warn!(
                        %tenant, %tool, key, fence, recording, error, decision = %verdict
                    ),
                    _ => tracing::info!(
                        %tenant, %tool, key, fence, recording, error, decision = %verdict
                    ),
                }
            }
            Event::Resolved {
                key,
                fence,
                released,
                by,
                reason,
            } => tracing::info!(
                tenant = %key.tenant, tool = %key.tool, key = short(key), fence, released, by,
                reason, "resolved"
            ),
            Event::Observed {
                tenant,
                tool,
                key,
                would,
                rule,
            } => tracing::info!(
                %tenant, %tool, key = key.map(short), would = %would,
                rule = rule.map(idemgate_core::KeyRule::duplicate_label),
                "observe mode ran a call that enforce mode would not have run"
            ),
            Event::Reopened {
                key,
                fence,
                was,
                by,
                reason,
            } => tracing::info!(
                tenant = %key.tenant, tool = %key.tool, key = short(key), fence, was = %was, by,
                reason, "reopened: the next call runs the action again"
            ),
            Event::Flushed(Ok(r)) if r.displaced > 0 => tracing::warn!(
                applied = r.applied,
                superseded = r.superseded,
                displaced = r.displaced,
                pending = r.pending,
                "flushed the journal: outcomes acknowledged to callers were dropped because the store lost their records and another call's record stands under the same key (an asynchronous standby promoted, a backup restored)"
            ),
            Event::Flushed(Ok(r)) if r.superseded > 0 => tracing::warn!(
                applied = r.applied,
                superseded = r.superseded,
                pending = r.pending,
                "flushed the journal: outcomes acknowledged to callers were superseded by a takeover (this process was cut off from the store past its lease)"
            ),
            Event::Flushed(Ok(r)) if r.restored > 0 => tracing::warn!(
                applied = r.applied,
                restored = r.restored,
                pending = r.pending,
                "flushed the journal: the store no longer had the records of outcomes acknowledged to callers; they were written back"
            ),
            Event::Flushed(Ok(r)) => tracing::info!(
                applied = r.applied,
                superseded = r.superseded,
                pending = r.pending,
                "flushed the journal"
            ),
            Event::Flushed(Err(e)) => tracing::warn!(error = %e, "failed to flush the journal"),
            _ => {}
        }
    }
}
