//! The audit log: one JSON line per record state transition, appended to a file. An engine
//! [`Observer`]: it hears every transition from the engine itself. An operator's resolution or
//! reopening also says who (`by`: the OS user at the command line, `tenant:ID` at the gateway) and
//! why (`reason`), when they were given.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;

use idemgate_core::key::hex;
use idemgate_core::{Decision, Event, Fence, Key, Observer, Timestamp, Verdict};
use serde_json::{json, Value};

/// Where audit lines go; absent when not configured.
#[derive(Debug, Default)]
pub struct Audit {
    file: Option<Mutex<File>>,
}

impl Audit {
    /// Appends to the file at `path`, or writes nothing when there is none.
    ///
    /// # Errors
    /// When the file cannot be opened for appending.
    pub fn open(path: Option<&Path>) -> std::io::Result<Self> {
        let file = match path {
            Some(p) => Some(Mutex::new(
                OpenOptions::new().create(true).append(true).open(p)?,
            )),
            None => None,
        };
        Ok(Audit { file })
    }

    /// Appends one line, with `extra` members (those with a null value left out). The raw key
    /// never appears: only its digest, as downstreams see it.
    fn record(&self, event: &str, key: &Key, fence: Option<Fence>, extra: &[(&str, Value)]) {
        let Some(file) = &self.file else { return };
        let mut line = json!({
            "time": Timestamp::now(),
            "event": event,
            "tenant": key.tenant,
            "tool": key.tool,
            "key_digest": hex(&key.digest()),
            "fence": fence,
        });
        for (name, value) in extra.iter().filter(|(_, v)| !v.is_null()) {
            line[*name] = value.clone();
        }
        let mut line = line.to_string();
        line.push('\n');
        // One write of a whole line on an append-mode file: lines never interleave.
        let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f.write_all(line.as_bytes()) {
            tracing::error!(error = %e, "failed to write the audit log");
        }
    }
}

/// The audit name of a call's verdict, when it changed a record (or replayed one).
fn transition(verdict: Verdict, decision: Option<&Decision>) -> Option<&'static str> {
    Some(match verdict {
        Verdict::Execute => "reserved",
        Verdict::Executed => "executed",
        Verdict::LeaseLost => "lease_lost",
        Verdict::Unrecorded => "unrecorded",
        Verdict::Replayed => "replayed",
        // A duplicate refused because its action ran before and its outcome is no longer kept:
        // like a replay it changes no record, and like one it is a call answered without
        // running, which the console counts.
        Verdict::Expired => "expired",
        Verdict::NotApplied => "released",
        // Only the call that marked the record unknown changed it; duplicates that find it
        // unknown did not.
        Verdict::Unknown => match decision {
            Some(Decision::Unknown {
                recording: Some(_), ..
            }) => "unknown",
            _ => return None,
        },
        _ => return None,
    })
}

impl Observer for Audit {
    fn observe(&self, event: &Event<'_>) {
        if self.file.is_none() {
            return;
        }
        match event {
            Event::Call {
                key: Some(key),
                verdict,
                fence,
                answer,
                ..
            } => {
                let decision = answer.map(|a| &a.decision);
                if let Some(name) = transition(*verdict, decision) {
                    let (fence, reason) = match decision {
                        // Why the outcome became unknown (the caller's `ambiguous` reason, the
                        // tool's error, the verifier's doubt): the record itself does not keep
                        // it, so its trail is where an operator finds it.
                        Some(Decision::Unknown { fence, message, .. }) => {
                            (Some(*fence), message.as_deref())
                        }
                        _ => (*fence, None),
                    };
                    // The rule that made a replay (or an expired refusal) a duplicate, so the
                    // console can count duplicates by rule from the log alone.
                    let rule = answer.and_then(crate::metrics::duplicate_rule);
                    self.record(
                        name,
                        key,
                        fence,
                        &[("reason", json!(reason)), ("rule", json!(rule))],
                    );
                }
            }
            Event::Resolved {
                key,
                fence,
                released,
                by,
                reason,
            } => self.record(
                "resolved",
                key,
                Some(*fence),
                &[
                    ("released", json!(released)),
                    ("by", json!(by)),
                    ("reason", json!(reason)),
                ],
            ),
            // Shadow mode: a call ran that enforce mode would have answered without running.
            // It changed no record, but it is what an operator adopting the gate reads.
            Event::Observed {
                key: Some(key),
                would,
                rule,
                ..
            } => self.record(
                "observed",
                key,
                None,
                &[
                    ("would", json!(would.label())),
                    (
                        "rule",
                        json!(rule.map(idemgate_core::KeyRule::duplicate_label)),
                    ),
                ],
            ),
            Event::Reopened {
                key,
                fence,
                was,
                by,
                reason,
            } => self.record(
                "reopened",
                key,
                Some(*fence),
                &[
                    ("was", json!(was)),
                    ("by", json!(by)),
                    ("reason", json!(reason)),
                ],
            ),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use idemgate_core::{IdempotencyKey, State, TenantId, ToolName};

    use super::*;

    #[test]
    fn operator_lines_say_who_and_why_when_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let audit = Audit::open(Some(&path)).unwrap();
        let key = Key::new(
            TenantId::new("acme").unwrap(),
            ToolName::new("charge").unwrap(),
            IdempotencyKey::new("order-1").unwrap(),
        );
        audit.observe(&Event::Reopened {
            key: &key,
            fence: 3,
            was: State::Completed,
            by: Some("alice"),
            reason: Some("the charge bounced"),
        });
        audit.observe(&Event::Resolved {
            key: &key,
            fence: 4,
            released: true,
            by: None,
            reason: None,
        });
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["event"], "reopened");
        assert_eq!(lines[0]["fence"], 3);
        assert_eq!(lines[0]["was"], "completed");
        assert_eq!(lines[0]["by"], "alice");
        assert_eq!(lines[0]["reason"], "the charge bounced");
        assert!(
            !text.contains("order-1"),
            "the raw key never appears: {text}"
        );
        assert_eq!(lines[1]["event"], "resolved");
        assert_eq!(lines[1]["released"], true);
        assert!(lines[1].get("by").is_none() && lines[1].get("reason").is_none());
    }
}
