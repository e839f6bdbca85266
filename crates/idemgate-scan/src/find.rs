//! From spans to tool calls, and from tool calls to the ones that repeated an action.
//!
//! A tool call is a span of the GenAI conventions' `execute_tool` operation (`gen_ai.tool.name`,
//! with `gen_ai.tool.call.id` and `gen_ai.tool.call.arguments` when the instrumentation records
//! them). Two layers that both trace one call (a framework's span and, inside it, idemgate's own
//! or a server's) give one call: a tool span under another of the same tool and call id is
//! folded into the outer one, which holds the caller's view of its start and end.
//!
//! Calls are compared within their conversation (`gen_ai.conversation.id`, on the span or the
//! nearest ancestor that has it), else within their trace. A later write call repeats an
//! earlier one when, in order of precedence:
//!
//! 1. it carries the same call id: a framework re-ran a call it had already run (a retry, a
//!    resumed graph step);
//! 2. it has the same tool and canonical arguments under a new call id, within the window; it is
//!    a **client timeout** when it started while the earlier one was still running, or after the
//!    earlier one failed with a timeout or a cancellation, and otherwise the model's
//!    **re-emission** of an action it was unsure of;
//! 3. its arguments differ only where the action is described, not named, within the window: in
//!    the tool's identity fields when they are given (the arguments that name the action agree,
//!    the rest does not), else in free text only (a reworded body beside the same recipient) —
//!    a **re-plan**.
//!
//! Reads (by the gate's rules: the configuration's `kind = "read"`) are never side effects: they
//! are counted apart, and their repeats listed apart.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use idemgate_core::canonical::{canonicalize, Fingerprint};
use idemgate_core::{Record, RecordState, Timestamp};
use serde::Serialize;
use serde_json::Value;

use crate::otlp::Span;

/// The attributes that hold a tool call's arguments, in the order they are looked for: the
/// GenAI conventions' name, then Pydantic AI's before it adopted it.
const ARGUMENT_ATTRIBUTES: [&str; 2] = ["gen_ai.tool.call.arguments", "tool_arguments"];

/// The attributes that hold what a tool call returned, likewise.
const RESULT_ATTRIBUTES: [&str; 2] = ["gen_ai.tool.call.result", "tool_response"];

/// Verdicts (`idemgate.verdict`) of a call whose side effect ran, or may have: any other verdict
/// means the gate answered without running it. `unknown` is both a duplicate that found an
/// unknown record and a call that ran here with an ambiguous outcome; the span does not tell
/// them apart, so it counts as run: a duplicate is never hidden for being caught when it may
/// not have been.
const RAN: [&str; 8] = [
    "execute",
    "executed",
    "pass_through",
    "lease_lost",
    "unrecorded",
    "not_applied",
    "journal_failed",
    "unknown",
];

/// One tool call, as its spans tell it.
#[derive(Clone, Debug, Serialize)]
pub struct Call {
    /// `gen_ai.tool.name`.
    pub tool: String,
    /// `gen_ai.tool.call.id`, when recorded.
    pub call_id: Option<String>,
    /// The conversation (`gen_ai.conversation.id`), when any span above it names one; for a
    /// record, the scope it was made in.
    pub conversation: Option<String>,
    /// The tenant, for a call read from idemgate's records (traces do not say).
    pub tenant: Option<String>,
    /// The trace, lowercase hex.
    pub trace_id: String,
    /// The outermost span of the call, lowercase hex.
    pub span_id: String,
    /// Start, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// End, nanoseconds since the Unix epoch.
    pub end_ns: u64,
    /// The arguments, when recorded (a text that is not JSON is kept as a string).
    pub arguments: Option<Value>,
    /// The SHA-256 of the canonical arguments, as the gate computes it.
    #[serde(skip)]
    pub fingerprint: Option<Fingerprint>,
    /// What idemgate answered, when a gate traced the call (`idemgate.verdict`).
    pub verdict: Option<String>,
    /// Why the call failed, when it did.
    pub error: Option<String>,
    /// Whether its span recorded a result (`gen_ai.tool.call.result`): an instrumentation that
    /// records results leaves it out of a call that never returned (cancelled by its caller).
    pub returned: bool,
    /// Whether the gate's rules make it a read.
    pub read: bool,
    /// Where it was read: `FILE:LINE` for a span, `records` for a record.
    pub origin: String,
}

impl Call {
    /// Where the call was made: its conversation, else its trace.
    pub fn group(&self) -> Group {
        match (&self.tenant, &self.conversation) {
            (Some(tenant), scope) => Group::Records {
                tenant: tenant.clone(),
                scope: scope.clone(),
            },
            (None, Some(id)) => Group::Conversation { id: id.clone() },
            (None, None) => Group::Trace {
                id: self.trace_id.clone(),
            },
        }
    }

    /// What its id is called in a sentence.
    fn id_name(&self) -> &'static str {
        if self.tenant.is_some() {
            "key"
        } else {
            "call id"
        }
    }

    /// Whether the side effect ran: no gate answered it, or the gate let it run.
    pub fn ran(&self) -> bool {
        self.verdict.as_deref().is_none_or(|v| RAN.contains(&v))
    }

    fn timed_out(&self) -> bool {
        self.error.as_deref().is_some_and(|e| {
            let e = e.to_ascii_lowercase();
            ["timeout", "timed out", "deadline", "cancel"]
                .iter()
                .any(|w| e.contains(w))
        })
    }
}

/// Where calls are compared.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Group {
    /// A conversation (`gen_ai.conversation.id`).
    Conversation {
        /// Its id.
        id: String,
    },
    /// A trace, for calls no conversation names.
    Trace {
        /// Its id.
        id: String,
    },
    /// idemgate's records of one tenant made in one scope (or in none): tenants never meet.
    Records {
        /// The tenant.
        tenant: String,
        /// The conversation or session the records were made in, when they say.
        scope: Option<String>,
    },
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Group::Conversation { id } => write!(f, "conversation {id}"),
            Group::Trace { id } => write!(f, "trace {id}"),
            Group::Records {
                tenant,
                scope: Some(scope),
            } => write!(f, "tenant {tenant}, scope {scope}"),
            Group::Records {
                tenant,
                scope: None,
            } => write!(f, "tenant {tenant}, no scope"),
        }
    }
}

/// What the scan is told about the tools.
pub struct Rules {
    /// How far apart two calls may start and still be one action repeated (sources 2 and 3).
    pub window: Duration,
    /// Within this, a repeat of the same arguments is found with high confidence; beyond it,
    /// medium (an agent may mean to do a thing twice, minutes apart). The gate's own
    /// re-emission window.
    pub confident_within: Duration,
    /// Whether the gate's rules make a tool a read.
    pub is_read: Box<dyn Fn(&str) -> bool>,
    /// Per tool, its identity fields: the arguments that name its action (JSON pointers or
    /// top-level names, as a tool's policy gives them).
    pub identity: BTreeMap<String, Vec<String>>,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            window: Duration::from_secs(600),
            confident_within: Duration::from_secs(60),
            is_read: Box::new(|_| false),
            identity: BTreeMap::new(),
        }
    }
}

/// Why a call is taken for a repeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The same call id again: the framework ran the call twice (a retry, a resumed step).
    FrameworkRetry,
    /// The same arguments, started while the earlier call still ran or after it timed out: the
    /// caller gave up waiting and asked again.
    ClientTimeout,
    /// The same arguments under a new call id: the model emitted the action again.
    ModelReEmission,
    /// The arguments that name the action agree, its description was reworded.
    RePlan,
}

impl Source {
    /// In words, for the table.
    pub fn label(self) -> &'static str {
        match self {
            Source::FrameworkRetry => "framework retry",
            Source::ClientTimeout => "client timeout",
            Source::ModelReEmission => "model re-emission",
            Source::RePlan => "re-plan",
        }
    }
}

/// How sure the scan is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    /// Arguments that agree only in part, by the free-text heuristic.
    Low,
    /// The same arguments minutes apart, or agreeing identity fields.
    Medium,
    /// The same call id, or the same arguments within the gate's window.
    High,
}

/// One call that repeated an earlier one.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// The repeating call (an index into [`Scan::calls`]).
    pub duplicate: usize,
    /// The attempt it repeated: the nearest earlier call of the action.
    pub previous: usize,
    /// The first call of the action.
    pub first: usize,
    /// From the previous attempt's start to this one's, nanoseconds.
    pub gap_ns: u64,
    /// The likely source.
    pub source: Source,
    /// How sure.
    pub confidence: Confidence,
    /// Whether a gate answered it without running it again: found, and already harmless.
    pub caught: bool,
    /// The reason, in a sentence.
    pub why: String,
}

/// Calls with the same read repeated, listed apart: reads are not side effects.
#[derive(Clone, Debug, Serialize)]
pub struct RepeatedRead {
    /// The tool.
    pub tool: String,
    /// Where.
    pub group: Group,
    /// The calls (indices into [`Scan::calls`]), in order.
    pub calls: Vec<usize>,
}

/// What a scan found.
#[derive(Debug, Default, Serialize)]
pub struct Scan {
    /// Every tool call, in order of start.
    pub calls: Vec<Call>,
    /// Write calls that repeated an action, in order of the repeat's start.
    pub findings: Vec<Finding>,
    /// Reads called again with the same arguments.
    pub repeated_reads: Vec<RepeatedRead>,
    /// Write calls whose arguments are not in the trace: only a repeated call id finds them.
    pub without_arguments: usize,
}

impl Scan {
    /// The findings whose side effect ran again (a gate did not catch them).
    pub fn uncaught(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| !f.caught)
    }

    /// Whether a repeat that ran is found with at least medium confidence: what fails a CI run
    /// (a low-confidence re-plan, by free text alone, is reported but does not).
    pub fn fails(&self) -> bool {
        self.uncaught().any(|f| f.confidence >= Confidence::Medium)
    }
}

/// The tool calls of `spans`, folded and ordered by start.
pub fn calls(spans: &[Span], rules: &Rules) -> Vec<Call> {
    let by_id: HashMap<(&str, &str), &Span> = spans
        .iter()
        .map(|s| ((s.trace_id.as_str(), s.span_id.as_str()), s))
        .collect();
    let parent = |s: &Span| -> Option<&Span> {
        let id = s.parent_span_id.as_deref()?;
        by_id.get(&(s.trace_id.as_str(), id)).copied()
    };
    // Ancestors, nearest first, bounded so a cycle in a hostile file cannot loop.
    let ancestors = |s: &Span| -> Vec<&Span> {
        let mut out = Vec::new();
        let mut at = parent(s);
        while let Some(p) = at {
            if out.len() >= 256 {
                break;
            }
            out.push(p);
            at = parent(p);
        }
        out
    };
    let mut calls: Vec<Call> = Vec::new();
    let mut index_of: HashMap<(&str, &str), usize> = HashMap::new();
    // Each tool span with its ancestors, outer spans first, so an inner span finds its outer
    // call made.
    let mut tool_spans: Vec<(&Span, Vec<&Span>)> = spans
        .iter()
        .filter(|s| is_tool_span(s))
        .map(|s| (s, ancestors(s)))
        .collect();
    tool_spans.sort_by_key(|(_, line)| line.len());
    for (span, line) in tool_spans {
        let tool = span.text("gen_ai.tool.name").unwrap_or_default();
        let arguments = arguments_of(span);
        let call_id = span
            .text("gen_ai.tool.call.id")
            .or_else(|| arguments.as_ref().and_then(|(_, _, id)| id.clone()))
            .filter(|id| !id.is_empty());
        // The outermost call of the same tool and a compatible call id above this span.
        let outer = line
            .iter()
            .rev()
            .filter_map(|a| index_of.get(&(a.trace_id.as_str(), a.span_id.as_str())))
            .copied()
            .find(|&i| {
                let c: &Call = &calls[i];
                c.tool == tool && (c.call_id.is_none() || call_id.is_none() || c.call_id == call_id)
            });
        let arguments = arguments.map(|(a, f, _)| (a, f));
        let verdict = span.text("idemgate.verdict");
        if let Some(i) = outer {
            let call = &mut calls[i];
            call.call_id = call.call_id.take().or(call_id);
            if call.arguments.is_none() {
                call.fingerprint = arguments.as_ref().map(|(_, f)| *f);
                call.arguments = arguments.map(|(a, _)| a);
            }
            call.verdict = call.verdict.take().or(verdict);
            call.returned |= returned(span);
            index_of.insert((span.trace_id.as_str(), span.span_id.as_str()), i);
            continue;
        }
        let conversation = std::iter::once(span)
            .chain(line.iter().copied())
            .find_map(|s| s.text("gen_ai.conversation.id"))
            .filter(|c| !c.is_empty());
        index_of.insert((span.trace_id.as_str(), span.span_id.as_str()), calls.len());
        calls.push(Call {
            read: (rules.is_read)(&tool),
            tool,
            call_id,
            conversation,
            tenant: None,
            trace_id: span.trace_id.clone(),
            span_id: span.span_id.clone(),
            start_ns: span.start_ns,
            end_ns: span.end_ns,
            fingerprint: arguments.as_ref().map(|(_, f)| *f),
            arguments: arguments.map(|(a, _)| a),
            verdict,
            error: span.error.clone(),
            returned: returned(span),
            origin: span.origin.clone(),
        });
    }
    calls.sort_by(|a, b| (a.start_ns, &a.span_id).cmp(&(b.start_ns, &b.span_id)));
    calls
}

/// idemgate's own records as calls: each record is an action the gate let run once under its
/// key, so two records of one tenant, tool and scope with the same arguments (fingerprint) are
/// the action run twice under two keys, one the gate could not tell was the same (a key made new
/// for every request, a call id re-emitted after the window). Their arguments are not stored, only
/// their fingerprint: re-plans are not found here. An in-flight or unknown record counts as run:
/// its side effect may have happened.
pub fn record_calls(records: &[Record], rules: &Rules) -> Vec<Call> {
    let millis_ns = |t: Timestamp| u64::try_from(t.as_millis()).unwrap_or(0) * 1_000_000;
    // Each record as a call, and for a window's record (keyed `fallback-…`) until when the
    // window answered repeats of its action.
    let mut calls: Vec<(Call, Option<u64>)> = records
        .iter()
        .map(|r| {
            let (end, error, until) = match &r.state {
                RecordState::Completed {
                    completed_at,
                    expires_at,
                    ..
                } => (*completed_at, None, *expires_at),
                RecordState::Expired {
                    completed_at,
                    expired_at,
                    ..
                } => (*completed_at, None, *expired_at),
                RecordState::Unknown { since } => {
                    (*since, Some("outcome unknown".to_owned()), *since)
                }
                RecordState::InFlight { .. } => {
                    (r.created_at, Some("in flight".to_owned()), r.created_at)
                }
            };
            let window = r
                .key
                .key
                .as_str()
                .starts_with(idemgate_core::key::FALLBACK_PREFIX)
                .then(|| millis_ns(until.max(r.created_at)));
            let call = Call {
                tool: r.key.tool.as_str().to_owned(),
                call_id: Some(r.key.key.as_str().to_owned()),
                conversation: r.scope.as_deref().map(str::to_owned),
                tenant: Some(r.key.tenant.as_str().to_owned()),
                trace_id: String::new(),
                span_id: String::new(),
                start_ns: millis_ns(r.created_at),
                end_ns: millis_ns(end.max(r.created_at)),
                arguments: None,
                fingerprint: Some(r.fingerprint),
                verdict: None,
                // A completed record holds what the call returned; the others hold nothing.
                returned: error.is_none(),
                error,
                read: (rules.is_read)(r.key.tool.as_str()),
                origin: "records".to_owned(),
            };
            (call, window)
        })
        .collect();
    calls.sort_by(|(a, _), (b, _)| (a.start_ns, &a.call_id).cmp(&(b.start_ns, &b.call_id)));
    windows_folded(calls)
}

/// A door that names a call by its call id keeps the re-emission window's record inside the call
/// id's (`idemgate mcp`, the packages' integrations): the records of one action are the call
/// id's and the window's, keyed `fallback-…`. The window's is dropped: it is the call's own, not
/// a second run. A later call id's record of the same action made while the window still
/// answered was the window's replay (the call id's record stores the replayed outcome): it is
/// marked `replayed`, a repeat caught, not a run.
fn windows_folded(calls: Vec<(Call, Option<u64>)>) -> Vec<Call> {
    let same = |a: &Call, b: &Call| {
        a.tenant == b.tenant
            && a.conversation == b.conversation
            && a.tool == b.tool
            && a.fingerprint == b.fingerprint
    };
    // The window's record `w` was made while the call id's record `c` was running: `c`'s own.
    let inside = |c: &Call, w: &Call| c.start_ns <= w.start_ns && w.start_ns <= c.end_ns;
    let windows: Vec<(&Call, u64)> = calls
        .iter()
        .filter_map(|(c, until)| until.map(|u| (c, u)))
        .collect();
    let keyed = calls.iter().filter(|(_, until)| until.is_none());
    let answered = |c: &Call| {
        windows.iter().any(|(w, until)| {
            same(w, c) && !inside(c, w) && w.start_ns <= c.start_ns && c.start_ns <= *until
        })
    };
    let mut out: Vec<Call> = keyed
        .clone()
        .map(|(c, _)| {
            let mut c = c.clone();
            if answered(&c) {
                c.verdict = Some("replayed".to_owned());
            }
            c
        })
        // A window's record that no call id's holds is a call the window alone named: kept.
        .chain(
            windows
                .iter()
                .filter(|(w, _)| !keyed.clone().any(|(c, _)| same(c, w) && inside(c, w)))
                .map(|(w, _)| (*w).clone()),
        )
        .collect();
    out.sort_by(|a, b| (a.start_ns, &a.call_id).cmp(&(b.start_ns, &b.call_id)));
    out
}

fn returned(span: &Span) -> bool {
    RESULT_ATTRIBUTES
        .iter()
        .any(|name| span.attributes.contains_key(*name))
}

fn is_tool_span(span: &Span) -> bool {
    span.attributes.contains_key("gen_ai.tool.name")
        && span
            .text("gen_ai.operation.name")
            .is_none_or(|op| op == "execute_tool")
}

/// The call's arguments and their fingerprint, and the call id they carry when the span has
/// none of its own.
///
/// A JSON text is read as the gate reads it (integers kept exact), a structured attribute
/// through its canonical text, a text that is not JSON as itself. OpenLLMetry's LangChain
/// instrumentation (the `opentelemetry-instrumentation-langchain` package, which traces
/// LangGraph) writes the callback's whole envelope there, `{"input_str", "tags", "metadata",
/// "inputs", "kwargs"}`, with run ids and graph steps that differ between any two calls: its
/// `inputs` are the arguments, and `kwargs.tool_call_id` the call id.
fn arguments_of(span: &Span) -> Option<(Value, Fingerprint, Option<String>)> {
    let raw = ARGUMENT_ATTRIBUTES
        .iter()
        .find_map(|name| span.attributes.get(*name))?;
    Some(match raw {
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(envelope))
                if envelope.contains_key("input_str")
                    && envelope.get("inputs").is_some_and(Value::is_object) =>
            {
                let call_id = envelope
                    .get("kwargs")
                    .and_then(|k| k.get("tool_call_id"))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                let inputs = envelope["inputs"].clone();
                let fingerprint = Fingerprint::of_bytes(canonicalize(&inputs).as_bytes());
                (inputs, fingerprint, call_id)
            }
            Ok(value) => {
                let fingerprint = Fingerprint::of_json_text(text.as_bytes())
                    .unwrap_or_else(|_| Fingerprint::of_bytes(canonicalize(&value).as_bytes()));
                (value, fingerprint, None)
            }
            Err(_) => (raw.clone(), Fingerprint::of_bytes(text.as_bytes()), None),
        },
        other => (
            other.clone(),
            Fingerprint::of_bytes(canonicalize(other).as_bytes()),
            None,
        ),
    })
}

/// Finds the repeats among `calls` (as [`calls`] returns them).
pub fn scan(calls: Vec<Call>, rules: &Rules) -> Scan {
    let mut groups: BTreeMap<Group, Vec<usize>> = BTreeMap::new();
    for (i, call) in calls.iter().enumerate() {
        groups.entry(call.group()).or_default().push(i);
    }
    let mut findings = Vec::new();
    let mut repeated_reads = Vec::new();
    for (group, members) in &groups {
        let (reads, writes): (Vec<usize>, Vec<usize>) =
            members.iter().partition(|&&i| calls[i].read);
        repeated_reads.extend(repeats_of_reads(&calls, group, &reads));
        let mut first_of: HashMap<usize, usize> = HashMap::new();
        for (n, &i) in writes.iter().enumerate() {
            let earlier = &writes[..n];
            let Some((j, source, confidence, why)) = repeat_of(&calls, earlier, i, rules) else {
                continue;
            };
            let first = first_of.get(&j).copied().unwrap_or(j);
            first_of.insert(i, first);
            findings.push(Finding {
                duplicate: i,
                previous: j,
                first,
                gap_ns: calls[i].start_ns.saturating_sub(calls[j].start_ns),
                source,
                confidence,
                caught: !calls[i].ran(),
                why,
            });
        }
    }
    findings.sort_by_key(|f| f.duplicate);
    let without_arguments = calls
        .iter()
        .filter(|c| !c.read && c.arguments.is_none() && c.tenant.is_none())
        .count();
    Scan {
        calls,
        findings,
        repeated_reads,
        without_arguments,
    }
}

/// The earlier call that `i` repeats, by the rules' order of precedence.
fn repeat_of(
    calls: &[Call],
    earlier: &[usize],
    i: usize,
    rules: &Rules,
) -> Option<(usize, Source, Confidence, String)> {
    let call = &calls[i];
    let same_tool = || {
        earlier
            .iter()
            .rev()
            .copied()
            .filter(move |&j| calls[j].tool == call.tool)
    };
    if let Some(id) = &call.call_id {
        if let Some(j) = same_tool().find(|&j| calls[j].call_id.as_ref() == Some(id)) {
            let before = &calls[j];
            let also = if before.fingerprint != call.fingerprint {
                " (with other arguments)"
            } else {
                ""
            };
            let gap = duration_text(call.start_ns.saturating_sub(before.start_ns));
            // A framework that resumes a call its caller gave up on sends its id again: the
            // timeout is the cause, the resumption the means.
            if let Some(how) = given_up(before, call) {
                let why = format!(
                    "call id {id} ran again{also}, {gap} after the first began, {how}: its caller gave up waiting and the framework ran the call again"
                );
                return Some((j, Source::ClientTimeout, Confidence::High, why));
            }
            let why = format!(
                "call id {id} ran again{also}, {gap} after the first: the framework ran the call a second time"
            );
            return Some((j, Source::FrameworkRetry, Confidence::High, why));
        }
    }
    let window = u64::try_from(rules.window.as_nanos()).unwrap_or(u64::MAX);
    let within = |j: usize| call.start_ns.saturating_sub(calls[j].start_ns) <= window;
    let fingerprint = call.fingerprint?;
    let new_id = |j: usize| match (&calls[j].call_id, &call.call_id) {
        (Some(a), Some(b)) => format!("under {} {b} after {a}", call.id_name()),
        _ => "under a new call".to_owned(),
    };
    if let Some(j) = same_tool()
        .take_while(|&j| within(j))
        .find(|&j| calls[j].fingerprint == Some(fingerprint))
    {
        let before = &calls[j];
        let gap = call.start_ns.saturating_sub(before.start_ns);
        let confident = u64::try_from(rules.confident_within.as_nanos()).unwrap_or(u64::MAX);
        let confidence = if gap <= confident {
            Confidence::High
        } else {
            Confidence::Medium
        };
        // The caller gave up on the earlier call: it still ran when this one began, it failed
        // with a timeout, or it ended, with no error, without the result the instrumentation
        // records for this one (a call cancelled from outside ends quietly in some
        // instrumentations).
        let how = match given_up(before, call) {
            Some(how) => Some((how, Confidence::High)),
            None if call.returned && !before.returned && before.error.is_none() => Some((
                format!(
                    "after the first ended with no result, {} after it began",
                    duration_text(before.end_ns - before.start_ns)
                ),
                Confidence::Medium,
            )),
            None => None,
        };
        if let Some((how, confidence)) = how {
            let why = format!(
                "the same arguments {}, {} after the first began, {how}: its caller gave up waiting and asked again",
                new_id(j),
                duration_text(gap)
            );
            return Some((j, Source::ClientTimeout, confidence, why));
        }
        let why = format!(
            "the same arguments {}, {} after the first began, once it had finished: the model emitted the action again",
            new_id(j),
            duration_text(gap)
        );
        return Some((j, Source::ModelReEmission, confidence, why));
    }
    let arguments = call.arguments.as_ref()?;
    let identity = rules.identity.get(&call.tool);
    same_tool().take_while(|&j| within(j)).find_map(|j| {
        let before = calls[j].arguments.as_ref()?;
        let (confidence, named_by) = match identity {
            Some(pointers) => (
                Confidence::Medium,
                same_identity(before, arguments, pointers)?,
            ),
            None => (
                Confidence::Low,
                differs_in_free_text_only(before, arguments)?,
            ),
        };
        let why = format!(
            "{named_by}, {}, {} after the first: the action was planned again in other words",
            new_id(j),
            duration_text(call.start_ns.saturating_sub(calls[j].start_ns))
        );
        Some((j, Source::RePlan, confidence, why))
    })
}

/// How `before`'s caller gave up on it, as `call` shows: `call` began while it still ran, or
/// after it failed with a timeout or a cancellation.
fn given_up(before: &Call, call: &Call) -> Option<String> {
    if call.start_ns < before.end_ns {
        Some(format!(
            "while the first still ran (it ran {})",
            duration_text(before.end_ns - before.start_ns)
        ))
    } else if before.timed_out() {
        Some(format!(
            "after the first failed ({})",
            before.error.as_deref().unwrap_or("error")
        ))
    } else {
        None
    }
}

/// "the same to, subject", when both calls have every identity field and they agree: compared
/// by the gate's own identity fingerprint, so the scan and the gate name an action alike.
fn same_identity(a: &Value, b: &Value, fields: &[String]) -> Option<String> {
    let a = Fingerprint::of_identity(a.to_string().as_bytes(), fields)?;
    let b = Fingerprint::of_identity(b.to_string().as_bytes(), fields)?;
    (a == b).then(|| {
        let names: Vec<String> = fields
            .iter()
            .map(|f| f.trim_start_matches('/').replace('/', "."))
            .collect();
        format!("the same {}", names.join(", "))
    })
}

/// When `a` and `b` are objects that agree in at least one field that is not free text and
/// differ only in free text: "the same to, subject; reworded body".
fn differs_in_free_text_only(a: &Value, b: &Value) -> Option<String> {
    let (mut fa, mut fb) = (Vec::new(), Vec::new());
    leaves(a, String::new(), &mut fa);
    leaves(b, String::new(), &mut fb);
    let fa: BTreeMap<_, _> = fa.into_iter().collect();
    let fb: BTreeMap<_, _> = fb.into_iter().collect();
    if !a.is_object() || !b.is_object() || fa.keys().ne(fb.keys()) {
        return None;
    }
    let (mut same, mut reworded) = (Vec::new(), Vec::new());
    for (path, x) in &fa {
        let y = fb[path];
        if canonicalize(x) == canonicalize(y) {
            if !is_free_text(x) {
                same.push(path.as_str());
            }
        } else if is_free_text(x) && is_free_text(y) {
            reworded.push(path.as_str());
        } else {
            return None;
        }
    }
    if same.is_empty() || reworded.is_empty() {
        return None;
    }
    Some(format!(
        "the same {}; reworded {}",
        same.join(", "),
        reworded.join(", ")
    ))
}

/// Prose rather than a name: several words.
fn is_free_text(v: &Value) -> bool {
    v.as_str()
        .is_some_and(|s| s.split_whitespace().count() >= 4 || s.chars().count() >= 80)
}

/// The leaves of an object tree as `(dotted path, value)`; arrays and scalars are leaves.
fn leaves<'a>(v: &'a Value, path: String, out: &mut Vec<(String, &'a Value)>) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                leaves(child, p, out);
            }
        }
        _ => out.push((path, v)),
    }
}

fn repeats_of_reads(calls: &[Call], group: &Group, reads: &[usize]) -> Vec<RepeatedRead> {
    let mut by_action: BTreeMap<(&str, Fingerprint), Vec<usize>> = BTreeMap::new();
    for &i in reads {
        if let Some(f) = calls[i].fingerprint {
            by_action
                .entry((calls[i].tool.as_str(), f))
                .or_default()
                .push(i);
        }
    }
    by_action
        .into_iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|((tool, _), calls)| RepeatedRead {
            tool: tool.to_owned(),
            group: group.clone(),
            calls,
        })
        .collect()
}

/// A span of time for a person: `850 ms`, `4.0 s`, `3 min 12 s`.
pub fn duration_text(ns: u64) -> String {
    let ms = ns / 1_000_000;
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000)
    }
}
