//! Prometheus counters and the request latency histogram, written by hand: a few maps behind
//! mutexes are all a front door needs. The counters are an engine [`Observer`]: every decision
//! reaches them without a front door writing a line.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use idemgate_core::{Answer, Decision, Event, KeyRule, Observer, Verdict};

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Distinct (tenant, tool, decision) series kept before new ones are folded into tool "other", a
/// second bound behind the configured tool names (tenants are configured too).
const MAX_CALL_SERIES: usize = 10_000;

/// The tool label of every tool that is not configured: tool names come from callers, and a caller
/// must not be able to add series.
pub const OTHER_TOOL: &str = "other";

/// An observed series: (tenant, tool, the verdict enforce mode would have given, the rule that
/// named the record).
type Observed = (String, String, &'static str, &'static str);

#[derive(Default)]
struct Histogram {
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// A front door's metrics.
#[derive(Default)]
pub struct Metrics {
    /// Tools labelled by name; `None` labels every tool by name (for doors whose tools are all
    /// known in advance, such as a single command).
    tools: Option<BTreeSet<String>>,
    calls: Mutex<BTreeMap<(String, String, &'static str), u64>>,
    /// Duplicates answered without running, by (tenant, tool, [`duplicate_rule`]).
    duplicates: Mutex<BTreeMap<(String, String, &'static str), u64>>,
    /// Operators' resolutions and reopenings, by (tenant, tool, [`resolution_how`]).
    resolutions: Mutex<BTreeMap<(String, String, &'static str), u64>>,
    /// Shadow mode: calls that ran where enforce mode would not have run them.
    observed: Mutex<BTreeMap<Observed, u64>>,
    in_flight_waits: AtomicU64,
    key_reuse: AtomicU64,
    unknown: AtomicU64,
    store_errors: AtomicU64,
    superseded: AtomicU64,
    durations: Mutex<BTreeMap<&'static str, Histogram>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Metrics that label the `tools` by name and every other tool as [`OTHER_TOOL`].
    pub fn for_tools<I, T>(tools: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        Metrics {
            tools: Some(tools.into_iter().map(Into::into).collect()),
            ..Metrics::default()
        }
    }

    /// The tool label of `tool`: its name when configured (or every name is), else
    /// [`OTHER_TOOL`].
    fn tool_label<'a>(&self, tool: &'a str) -> &'a str {
        match &self.tools {
            Some(known) if !known.contains(tool) => OTHER_TOOL,
            _ => tool,
        }
    }

    /// Adds one to a (tenant, tool, label) series, folding a new series into tool
    /// [`OTHER_TOOL`] once the map holds [`MAX_CALL_SERIES`]: the same two bounds as every
    /// labelled counter here (configured tools, then a ceiling).
    fn count(
        &self,
        map: &Mutex<BTreeMap<(String, String, &'static str), u64>>,
        tenant: &str,
        tool: &str,
        label: &'static str,
    ) {
        let mut series_map = map.lock().unwrap_or_else(|p| p.into_inner());
        let mut series = (tenant.to_owned(), self.tool_label(tool).to_owned(), label);
        if !series_map.contains_key(&series) && series_map.len() >= MAX_CALL_SERIES {
            OTHER_TOOL.clone_into(&mut series.1);
        }
        *series_map.entry(series).or_default() += 1;
    }

    /// Counts one call's verdict.
    pub fn call(&self, tenant: &str, tool: &str, verdict: Verdict) {
        self.count(&self.calls, tenant, tool, verdict.label());
        match verdict {
            Verdict::InFlight => self.in_flight_waits.fetch_add(1, Ordering::Relaxed),
            Verdict::KeyReused => self.key_reuse.fetch_add(1, Ordering::Relaxed),
            Verdict::Unknown => self.unknown.fetch_add(1, Ordering::Relaxed),
            Verdict::StoreUnavailable | Verdict::JournalFailed => {
                self.store_errors.fetch_add(1, Ordering::Relaxed)
            }
            _ => 0,
        };
    }

    /// Counts one duplicate answered without running, under the rule that made it one
    /// ([`duplicate_rule`]).
    pub fn duplicate(&self, tenant: &str, tool: &str, rule: &'static str) {
        self.count(&self.duplicates, tenant, tool, rule);
    }

    /// Counts one call observe mode ran where enforce mode would have answered `would` instead,
    /// for a record named by `rule` ([`KeyRule::duplicate_label`]; `none` for a call without a
    /// key, which names no record).
    pub fn observed(&self, tenant: &str, tool: &str, would: Verdict, rule: Option<KeyRule>) {
        let mut series_map = self.observed.lock().unwrap_or_else(|p| p.into_inner());
        let mut series = (
            tenant.to_owned(),
            self.tool_label(tool).to_owned(),
            would.label(),
            rule.map_or("none", KeyRule::duplicate_label),
        );
        if !series_map.contains_key(&series) && series_map.len() >= MAX_CALL_SERIES {
            OTHER_TOOL.clone_into(&mut series.1);
        }
        *series_map.entry(series).or_default() += 1;
    }

    /// Counts one operator's resolution or reopening, by how ([`resolution_how`]).
    pub fn resolution(&self, tenant: &str, tool: &str, how: &'static str) {
        self.count(&self.resolutions, tenant, tool, how);
    }

    /// Counts one failed store operation that no call verdict shows (a heartbeat, an operator's
    /// lookup).
    pub fn store_error(&self) {
        self.store_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Records one request's latency under its route template.
    pub fn request(&self, route: &'static str, took: Duration) {
        let secs = took.as_secs_f64();
        let mut durations = self.durations.lock().unwrap_or_else(|p| p.into_inner());
        let h = durations.entry(route).or_default();
        for (bound, n) in BUCKETS.iter().zip(h.buckets.iter_mut()) {
            if secs <= *bound {
                *n += 1;
            }
        }
        h.count += 1;
        h.sum += secs;
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP idemgate_calls_total Calls by tenant, tool and decision.\n");
        out.push_str("# TYPE idemgate_calls_total counter\n");
        for ((tenant, tool, decision), n) in
            self.calls.lock().unwrap_or_else(|p| p.into_inner()).iter()
        {
            let _ = writeln!(
                out,
                "idemgate_calls_total{{tenant=\"{}\",tool=\"{}\",decision=\"{decision}\"}} {n}",
                escape(tenant),
                escape(tool)
            );
        }
        for (name, help, label, map) in [
            (
                "idemgate_duplicates_answered_total",
                "Duplicates answered without running the action, by tenant, tool and the rule that made them duplicates (key, call_id, model_key, window, expired).",
                "rule",
                &self.duplicates,
            ),
            (
                "idemgate_resolutions_total",
                "Records an operator resolved or reopened, by tenant, tool and how (completed, released, reopened).",
                "how",
                &self.resolutions,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for ((tenant, tool, value), n) in map.lock().unwrap_or_else(|p| p.into_inner()).iter()
            {
                let _ = writeln!(
                    out,
                    "{name}{{tenant=\"{}\",tool=\"{}\",{label}=\"{value}\"}} {n}",
                    escape(tenant),
                    escape(tool)
                );
            }
        }
        out.push_str(
            "# HELP idemgate_observed_total Calls observe mode (shadow mode) ran that enforce mode would have answered without running, by tenant, tool, the verdict enforce would have given (replayed, in_flight, unknown, expired, key_reused, key_required, store_unavailable, execute) and the rule that named the record (key, call_id, model_key, window; none for a call without a key).\n\
             # TYPE idemgate_observed_total counter\n",
        );
        for ((tenant, tool, would, rule), n) in self
            .observed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "idemgate_observed_total{{tenant=\"{}\",tool=\"{}\",would=\"{would}\",rule=\"{rule}\"}} {n}",
                escape(tenant),
                escape(tool)
            );
        }
        for (name, help, v) in [
            (
                "idemgate_in_flight_waits_total",
                "Duplicates that waited for an in-flight call and got an in-flight answer.",
                &self.in_flight_waits,
            ),
            (
                "idemgate_key_reuse_total",
                "Calls refused because their key was used with other arguments.",
                &self.key_reuse,
            ),
            (
                "idemgate_unknown_total",
                "Answers with an unknown outcome.",
                &self.unknown,
            ),
            (
                "idemgate_store_errors_total",
                "Store operations that failed.",
                &self.store_errors,
            ),
            (
                "idemgate_journal_superseded_total",
                "Journaled outcomes that found their record taken over when flushed.",
                &self.superseded,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", v.load(Ordering::Relaxed));
        }
        out.push_str(
            "# HELP idemgate_request_duration_seconds Request latency by route.\n\
             # TYPE idemgate_request_duration_seconds histogram\n",
        );
        for (route, h) in self
            .durations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let route = escape(route);
            for (bound, n) in BUCKETS.iter().zip(h.buckets.iter()) {
                let _ = writeln!(
                    out,
                    "idemgate_request_duration_seconds_bucket{{route=\"{route}\",le=\"{bound}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "idemgate_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}\n\
                 idemgate_request_duration_seconds_sum{{route=\"{route}\"}} {}\n\
                 idemgate_request_duration_seconds_count{{route=\"{route}\"}} {}",
                h.count, h.sum, h.count
            );
        }
        out
    }
}

impl Observer for Metrics {
    fn observe(&self, event: &Event<'_>) {
        match event {
            Event::Call {
                tenant,
                tool,
                verdict,
                answer,
                ..
            } => {
                self.call(tenant.as_str(), tool.as_str(), *verdict);
                if let Some(rule) = answer.and_then(duplicate_rule) {
                    self.duplicate(tenant.as_str(), tool.as_str(), rule);
                }
            }
            Event::Resolved { key, released, .. } => self.resolution(
                key.tenant.as_str(),
                key.tool.as_str(),
                resolution_how(Some(*released)),
            ),
            Event::Reopened { key, .. } => {
                self.resolution(key.tenant.as_str(), key.tool.as_str(), resolution_how(None));
            }
            Event::Observed {
                tenant,
                tool,
                would,
                rule,
                ..
            } => self.observed(tenant.as_str(), tool.as_str(), *would, *rule),
            Event::Flushed(Err(_)) => self.store_error(),
            Event::Flushed(Ok(r)) => {
                self.superseded
                    .fetch_add(r.superseded as u64, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// The rule by which an answer was a duplicate answered without running the action, when it
/// was one: `key` (a replay of a record a key named: the caller's, the program's, the
/// orchestration layer's), `call_id` (a key its door derived from the framework's tool-call id),
/// `model_key` (one derived from the model's own `idempotency_key`), `window` (a replay of an
/// identical call within the fallback window) or `expired` (the action ran before and its outcome
/// is no longer kept: refused, not run again). A door that derives a key says so on the call
/// ([`idemgate_core::Call::key_named_by`]) and the answer carries it.
pub fn duplicate_rule(answer: &Answer) -> Option<&'static str> {
    match answer.decision {
        // A replay always has a record, so a rule; `key` if a door ever left it out.
        Decision::Replayed { .. } => {
            Some(answer.rule.unwrap_or(KeyRule::Explicit).duplicate_label())
        }
        Decision::Expired { .. } => Some("expired"),
        _ => None,
    }
}

/// How an operator settled a record: `completed` or `released` for a resolution (`Some(released)`),
/// `reopened` for a reopening (`None`). The labels the metrics and the audit log's readers share.
pub fn resolution_how(released: Option<bool>) -> &'static str {
    match released {
        Some(false) => "completed",
        Some(true) => "released",
        None => "reopened",
    }
}

/// Escapes a label value for the text format.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_cumulative_buckets() {
        let m = Metrics::default();
        m.call("acme", "charge", Verdict::Executed);
        m.call("acme", "charge", Verdict::Executed);
        m.call("acme", "charge", Verdict::InFlight);
        m.request("/v1/tools/{tool}/call", Duration::from_millis(20));
        let text = m.render();
        assert!(text.contains(
            "idemgate_calls_total{tenant=\"acme\",tool=\"charge\",decision=\"executed\"} 2"
        ));
        assert!(text.contains("idemgate_in_flight_waits_total 1"));
        assert!(text.contains(
            "idemgate_request_duration_seconds_bucket{route=\"/v1/tools/{tool}/call\",le=\"0.01\"} 0"
        ));
        assert!(text.contains(
            "idemgate_request_duration_seconds_bucket{route=\"/v1/tools/{tool}/call\",le=\"0.025\"} 1"
        ));
        assert!(text.contains(
            "idemgate_request_duration_seconds_count{route=\"/v1/tools/{tool}/call\"} 1"
        ));
    }

    #[test]
    fn unconfigured_tools_share_one_series() {
        let m = Metrics::for_tools(["charge"]);
        for i in 0..100 {
            m.call("acme", &format!("made-up-{i}"), Verdict::KeyRequired);
        }
        m.call("acme", "charge", Verdict::Replayed);
        let text = m.render();
        assert!(text.contains(
            "idemgate_calls_total{tenant=\"acme\",tool=\"other\",decision=\"key_required\"} 100"
        ));
        assert!(text.contains(
            "idemgate_calls_total{tenant=\"acme\",tool=\"charge\",decision=\"replayed\"} 1"
        ));
        assert!(!text.contains("made-up"), "{text}");
    }

    /// An answer of `decision` under `rule`, as the engine hands it to observers.
    fn answer(rule: KeyRule, decision: Decision) -> Answer {
        Answer {
            key: None,
            rule: Some(rule),
            decision,
        }
    }

    #[test]
    fn duplicates_count_by_rule_and_resolutions_by_how() {
        use idemgate_core::{IdempotencyKey, Key, Outcome, State, TenantId, Timestamp, ToolName};
        let m = Metrics::for_tools(["charge"]);
        let tenant = TenantId::new("acme").unwrap();
        let charge = ToolName::new("charge").unwrap();
        let made_up = ToolName::new("made-up").unwrap();
        let at = Timestamp::from_millis(1_000);
        let replayed = Decision::Replayed {
            outcome: Outcome::success(b"ok".to_vec()),
            executed_at: at,
            expires_at: at,
            verified: false,
        };
        let expired = Decision::Expired {
            executed_at: at,
            expired_at: at,
            retain_until: at,
            fence: 1,
        };
        let executed = Decision::Executed {
            outcome: Outcome::success(b"ok".to_vec()),
            executed_at: at,
            expires_at: at,
            recording: idemgate_core::Recording::Stored,
        };
        for (tool, verdict, answer) in [
            (
                &charge,
                Verdict::Replayed,
                answer(KeyRule::Explicit, replayed.clone()),
            ),
            (
                &charge,
                Verdict::Replayed,
                answer(KeyRule::Explicit, replayed.clone()),
            ),
            (
                &charge,
                Verdict::Replayed,
                answer(KeyRule::Fallback, replayed.clone()),
            ),
            // Keys its door derived from a call id or the model's key: not counted as `key`.
            (
                &charge,
                Verdict::Replayed,
                answer(KeyRule::CallId, replayed.clone()),
            ),
            (
                &charge,
                Verdict::Replayed,
                answer(KeyRule::ModelKey, replayed.clone()),
            ),
            (
                &charge,
                Verdict::Expired,
                answer(KeyRule::Explicit, expired),
            ),
            // Ran the action: not a duplicate.
            (
                &charge,
                Verdict::Executed,
                answer(KeyRule::Explicit, executed),
            ),
            // A tool nobody configured counts under "other", as its calls do.
            (
                &made_up,
                Verdict::Replayed,
                answer(KeyRule::Explicit, replayed),
            ),
        ] {
            m.observe(&Event::Call {
                tenant: &tenant,
                tool,
                key: None,
                verdict,
                fence: None,
                answer: Some(&answer),
                error: None,
            });
        }
        let key = Key::new(
            tenant.clone(),
            charge.clone(),
            IdempotencyKey::new("order-1").unwrap(),
        );
        for released in [false, true, true] {
            m.observe(&Event::Resolved {
                key: &key,
                fence: 1,
                released,
                by: None,
                reason: None,
            });
        }
        m.observe(&Event::Reopened {
            key: &key,
            fence: 2,
            was: State::Completed,
            by: None,
            reason: None,
        });
        let text = m.render();
        for line in [
            "idemgate_duplicates_answered_total{tenant=\"acme\",tool=\"charge\",rule=\"key\"} 2",
            "idemgate_duplicates_answered_total{tenant=\"acme\",tool=\"charge\",rule=\"window\"} 1",
            "idemgate_duplicates_answered_total{tenant=\"acme\",tool=\"charge\",rule=\"call_id\"} 1",
            "idemgate_duplicates_answered_total{tenant=\"acme\",tool=\"charge\",rule=\"model_key\"} 1",
            "idemgate_duplicates_answered_total{tenant=\"acme\",tool=\"charge\",rule=\"expired\"} 1",
            "idemgate_duplicates_answered_total{tenant=\"acme\",tool=\"other\",rule=\"key\"} 1",
            "idemgate_resolutions_total{tenant=\"acme\",tool=\"charge\",how=\"completed\"} 1",
            "idemgate_resolutions_total{tenant=\"acme\",tool=\"charge\",how=\"released\"} 2",
            "idemgate_resolutions_total{tenant=\"acme\",tool=\"charge\",how=\"reopened\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
        assert_eq!(
            text.matches("idemgate_duplicates_answered_total{").count(),
            6,
            "the executed call is no duplicate: {text}"
        );
        assert!(!text.contains("made-up"), "{text}");
    }
}
