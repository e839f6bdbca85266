//! Prometheus counters and the request latency histogram, written by hand: a few maps behind
//! mutexes are all the gateway needs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Distinct (tenant, tool, decision) series kept before new ones are folded into tool "other":
/// tool names come from request paths, and a caller must not be able to grow memory without bound.
const MAX_CALL_SERIES: usize = 10_000;

#[derive(Default)]
struct Histogram {
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// The gateway's metrics.
#[derive(Default)]
pub(crate) struct Metrics {
    calls: Mutex<BTreeMap<(String, String, &'static str), u64>>,
    in_flight_waits: AtomicU64,
    key_reuse: AtomicU64,
    unknown: AtomicU64,
    store_errors: AtomicU64,
    durations: Mutex<BTreeMap<&'static str, Histogram>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Counts one call's decision (`executed`, `replayed`, `pass_through`, `not_applied`,
    /// `in_flight`, `unknown`, `key_reused`, `rejected`, ...).
    pub(crate) fn call(&self, tenant: &str, tool: &str, decision: &'static str) {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let mut series = (tenant.to_owned(), tool.to_owned(), decision);
        if !calls.contains_key(&series) && calls.len() >= MAX_CALL_SERIES {
            series.1 = "other".to_owned();
        }
        *calls.entry(series).or_default() += 1;
        match decision {
            "in_flight" => self.in_flight_waits.fetch_add(1, Ordering::Relaxed),
            "key_reused" => self.key_reuse.fetch_add(1, Ordering::Relaxed),
            "unknown" => self.unknown.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    /// Counts a call the engine refused, by why.
    pub(crate) fn engine_error(&self, tenant: &str, tool: &str, e: &idemgate::EngineError) {
        use idemgate::EngineError as E;
        let decision = match e {
            E::KeyRequired { .. } => "key_required",
            E::KeyReuse { .. } => "key_reused",
            E::InvalidKey(_) | E::InvalidArguments(_) => "bad_request",
            _ => {
                self.store_error();
                "store_unavailable"
            }
        };
        self.call(tenant, tool, decision);
    }

    /// Counts one failed store operation.
    pub(crate) fn store_error(&self) {
        self.store_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Records one request's latency under its route template.
    pub(crate) fn observe(&self, route: &'static str, took: Duration) {
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
    pub(crate) fn render(&self) -> String {
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
        m.call("acme", "charge", "executed");
        m.call("acme", "charge", "executed");
        m.call("acme", "charge", "in_flight");
        m.observe("/v1/tools/{tool}/call", Duration::from_millis(20));
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
}
