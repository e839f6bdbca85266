//! What idemgate saved, read from the audit log: the duplicates it answered without running
//! the action (by tenant, tool and rule), the records operators settled (by how, and through
//! which door), and the time the replays did not spend running the action again.
//!
//! From the log rather than the store or this process's counters: the log is written by every
//! process on the store (gateway, `exec`, the proxy, `keys resolve`), survives restarts, and
//! already holds a line per replay and per resolution, so no store query is added for it.

use std::collections::{BTreeMap, HashMap};

use crate::audit;

/// Through which door an operator's line came, from the `by` it is signed with: the console
/// signs `console:<name>`, the gateway's records API `tenant:<id>`, and `keys resolve` /
/// `keys reopen` the OS user.
pub(crate) fn door_of(by: Option<&str>) -> &'static str {
    match by {
        Some(b) if b.starts_with("console:") => "console",
        Some(b) if b.starts_with("tenant:") => "API",
        Some(_) => "CLI",
        None => "unsigned",
    }
}

/// The time a record's last execution took: from the line that reserved it to the line that
/// recorded its outcome, in milliseconds.
type Took = i64;

/// The value counted from one read of the log.
#[derive(Debug, Default)]
pub(crate) struct Value {
    /// Duplicates answered without running, by (tenant, tool, rule).
    pub(crate) duplicates: BTreeMap<(String, String, String), u64>,
    /// Records settled by an operator, by (tenant, tool, how, door).
    pub(crate) resolutions: BTreeMap<(String, String, &'static str, &'static str), u64>,
    /// By (tenant, tool): replays whose original execution the log timed, and the sum of those
    /// executions' durations in milliseconds (each counted once per replay: the time each
    /// replay did not spend running it again).
    pub(crate) saved: BTreeMap<(String, String), (u64, i64)>,
    /// By (tenant, tool): replays whose original execution is not in the log (before the log's
    /// start, or a record resolved by an operator, which ran nothing idemgate timed).
    pub(crate) untimed: BTreeMap<(String, String), u64>,
}

/// Counts the lines of `log` that `visible` lets through (a tenant's own, or every tenant's).
pub(crate) fn count(log: &audit::Log, visible: impl Fn(&str) -> bool) -> Value {
    let mut value = Value::default();
    // Per record (tenant, tool, key digest): when its current reservation was made, and how long
    // its last execution took, as the log saw them in order.
    let mut reserved_at: HashMap<(&str, &str, &str), i64> = HashMap::new();
    let mut took: HashMap<(&str, &str, &str), Took> = HashMap::new();
    for line in &log.lines {
        if !visible(&line.tenant) {
            continue;
        }
        let record = (
            line.tenant.as_str(),
            line.tool.as_str(),
            line.key_digest.as_str(),
        );
        let pair = (line.tenant.clone(), line.tool.clone());
        let at = line.time.as_millis();
        match line.event.as_str() {
            "reserved" => {
                reserved_at.insert(record, at);
            }
            "executed" => {
                if let Some(start) = reserved_at.remove(&record) {
                    took.insert(record, (at - start).max(0));
                }
            }
            "replayed" | "expired" => {
                // Lines written before the log named the rule were replays of a key (the log
                // wrote no expired lines then).
                let rule = line.rule.clone().unwrap_or_else(|| "key".to_owned());
                *value
                    .duplicates
                    .entry((pair.0.clone(), pair.1.clone(), rule))
                    .or_default() += 1;
                if line.event == "replayed" {
                    match took.get(&record) {
                        Some(ms) => {
                            let saved = value.saved.entry(pair).or_default();
                            saved.0 += 1;
                            saved.1 += ms;
                        }
                        None => *value.untimed.entry(pair).or_default() += 1,
                    }
                }
            }
            "resolved" | "reopened" => {
                let how = idemgate_kit::metrics::resolution_how(if line.event == "resolved" {
                    Some(line.released.unwrap_or(false))
                } else {
                    None
                });
                *value
                    .resolutions
                    .entry((pair.0, pair.1, how, door_of(line.by.as_deref())))
                    .or_default() += 1;
                // What is replayed from now on is the operator's word (or a new run), not the
                // execution timed before.
                took.remove(&record);
            }
            _ => {}
        }
    }
    value
}

/// A duration in words a person reads at a glance: `850 ms`, `12.5 s`, `3 min 20 s`, `2 h 5 min`.
pub(crate) fn duration(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1_000.0)
    } else if ms < 3_600_000 {
        format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1_000)
    } else {
        format!("{} h {} min", ms / 3_600_000, (ms % 3_600_000) / 60_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(
        event: &str,
        tenant: &str,
        key: &str,
        at: i64,
        extra: serde_json::Value,
    ) -> audit::Line {
        let mut v = serde_json::json!({
            "time": at, "event": event, "tenant": tenant, "tool": "charge", "key_digest": key,
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn none() -> serde_json::Value {
        serde_json::json!({})
    }

    #[test]
    fn counts_duplicates_by_rule_resolutions_by_how_and_door_and_the_time_replays_saved() {
        let log = audit::Log {
            lines: vec![
                line("reserved", "a", "k1", 1_000, none()),
                line("executed", "a", "k1", 3_500, none()),
                line(
                    "replayed",
                    "a",
                    "k1",
                    10_000,
                    serde_json::json!({"rule": "key"}),
                ),
                line(
                    "replayed",
                    "a",
                    "k1",
                    11_000,
                    serde_json::json!({"rule": "key"}),
                ),
                line(
                    "replayed",
                    "a",
                    "w",
                    11_000,
                    serde_json::json!({"rule": "window"}),
                ),
                line(
                    "expired",
                    "a",
                    "k1",
                    12_000,
                    serde_json::json!({"rule": "expired"}),
                ),
                // Another tenant's, whose execution took 1 s.
                line("reserved", "b", "k1", 1_000, none()),
                line("executed", "b", "k1", 2_000, none()),
                line(
                    "replayed",
                    "b",
                    "k1",
                    5_000,
                    serde_json::json!({"rule": "key"}),
                ),
                line(
                    "resolved",
                    "a",
                    "u1",
                    20_000,
                    serde_json::json!({"released": false, "by": "console:alice"}),
                ),
                line(
                    "resolved",
                    "a",
                    "u2",
                    20_000,
                    serde_json::json!({"released": true, "by": "tenant:a"}),
                ),
                line(
                    "reopened",
                    "a",
                    "k1",
                    21_000,
                    serde_json::json!({"was": "completed", "by": "root"}),
                ),
                // After the reopening, the old execution's time is not what this replay saved.
                line(
                    "replayed",
                    "a",
                    "k1",
                    22_000,
                    serde_json::json!({"rule": "key"}),
                ),
            ],
            truncated: false,
        };
        let v = count(&log, |_| true);
        let dup = |t: &str, r: &str| {
            v.duplicates
                .get(&(t.into(), "charge".into(), r.into()))
                .copied()
        };
        assert_eq!(dup("a", "key"), Some(3));
        assert_eq!(dup("a", "window"), Some(1));
        assert_eq!(dup("a", "expired"), Some(1));
        assert_eq!(dup("b", "key"), Some(1));
        let a = ("a".to_owned(), "charge".to_owned());
        // Two replays of the 2.5 s execution; the window's replay and the one after the
        // reopening have no timed execution.
        assert_eq!(v.saved[&a], (2, 5_000));
        assert_eq!(v.untimed[&a], 2);
        assert_eq!(v.saved[&("b".to_owned(), "charge".to_owned())], (1, 1_000));
        let res = |how, door| {
            v.resolutions
                .get(&("a".into(), "charge".into(), how, door))
                .copied()
        };
        assert_eq!(res("completed", "console"), Some(1));
        assert_eq!(res("released", "API"), Some(1));
        assert_eq!(res("reopened", "CLI"), Some(1));
        let only_b = count(&log, |t| t == "b");
        assert_eq!(only_b.duplicates.len(), 1);
        assert!(only_b.resolutions.is_empty());
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(850), "850 ms");
        assert_eq!(duration(12_500), "12.5 s");
        assert_eq!(duration(200_000), "3 min 20 s");
        assert_eq!(duration(7_500_000), "2 h 5 min");
    }
}
