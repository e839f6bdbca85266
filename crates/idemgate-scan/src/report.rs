//! A scan for a person (a table and a sentence per finding), for a program (JSON) and for a
//! browser (one self-contained page, a timeline per conversation).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use idemgate_core::Timestamp;
use idemgate_kit::html::escape as esc;
use serde::Serialize;
use serde_json::Value;

use crate::find::{duration_text, Call, Finding, Group, Scan};

/// What was read, for the report's first line.
#[derive(Debug, Default)]
pub struct Inputs {
    /// The files, as named.
    pub files: Vec<String>,
    /// Spans read.
    pub spans: usize,
    /// `(where, why)` of every part of a file that could not be read.
    pub skipped: Vec<(String, String)>,
    /// How many of idemgate's records were read, when they were.
    pub records: Option<usize>,
}

/// An instant for a person: RFC 3339 in UTC, to the millisecond.
pub fn instant(ns: u64) -> String {
    Timestamp::from_millis(i64::try_from(ns / 1_000_000).unwrap_or(i64::MAX)).to_string()
}

fn call_name(call: &Call) -> String {
    match &call.call_id {
        Some(id) => id.clone(),
        None => format!("span {}", call.span_id),
    }
}

/// A group in a table's cell: a conversation by its id alone.
fn group_name(group: &Group) -> String {
    match group {
        Group::Conversation { id } => id.clone(),
        other => other.to_string(),
    }
}

/// The summary line.
fn summary(scan: &Scan, inputs: &Inputs) -> String {
    let uncaught = scan.uncaught().count();
    let caught = scan.findings.len() - uncaught;
    let groups: std::collections::BTreeSet<Group> = scan
        .uncaught()
        .map(|f| scan.calls[f.duplicate].group())
        .collect();
    let reads = scan.calls.iter().filter(|c| c.read).count();
    let records = match inputs.records {
        Some(n) => format!(" and {n} record{} of idemgate's", plural(n)),
        None => String::new(),
    };
    let mut line = format!(
        "{uncaught} likely duplicate side effect{} in {} conversation{} ({} tool call{}, {reads} of them read{}, from {} span{} in {} file{}{records})",
        plural(uncaught),
        groups.len(),
        plural(groups.len()),
        scan.calls.len(),
        plural(scan.calls.len()),
        plural(reads),
        inputs.spans,
        plural(inputs.spans),
        inputs.files.len(),
        plural(inputs.files.len()),
    );
    if caught > 0 {
        let _ = write!(
            line,
            "; {caught} more repeat{} answered by idemgate without running again",
            plural(caught)
        );
    }
    line
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Text from a trace for a terminal: its control characters (an escape sequence a hostile trace
/// would send the terminal, a newline that would break the table) shown as U+FFFD.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// The readable report: the summary, a table of the repeats that ran, one sentence each, then
/// what a gate caught, the repeated reads and what could not be read.
pub fn text(scan: &Scan, inputs: &Inputs) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", summary(scan, inputs));
    let uncaught: Vec<&Finding> = scan.uncaught().collect();
    if !uncaught.is_empty() {
        out.push('\n');
        table(&mut out, scan, &uncaught);
        out.push('\n');
        for f in &uncaught {
            let d = &scan.calls[f.duplicate];
            let line = format!(
                "{} {} in {}: {} ({})",
                d.tool,
                call_name(d),
                d.group(),
                f.why,
                d.origin
            );
            let _ = writeln!(out, "{}", clean(&line));
        }
    }
    let caught: Vec<&Finding> = scan.findings.iter().filter(|f| f.caught).collect();
    if !caught.is_empty() {
        let _ = writeln!(
            out,
            "\nCaught by idemgate (answered without running again):"
        );
        table(&mut out, scan, &caught);
    }
    if !scan.repeated_reads.is_empty() {
        let _ = writeln!(
            out,
            "\nReads called again with the same arguments (not side effects):"
        );
        for r in &scan.repeated_reads {
            let line = format!("{} in {}: {} calls", r.tool, r.group, r.calls.len());
            let _ = writeln!(out, "  {}", clean(&line));
        }
    }
    if scan.without_arguments > 0 {
        let _ = writeln!(
            out,
            "\nNote: {} write call{} carry no arguments (gen_ai.tool.call.arguments; the instrumentation may leave content out): among them only a call id sent twice is found.",
            scan.without_arguments,
            plural(scan.without_arguments)
        );
    }
    for (at, why) in &inputs.skipped {
        let _ = writeln!(out, "Skipped {}", clean(&format!("{at}: {why}")));
    }
    out
}

fn table(out: &mut String, scan: &Scan, findings: &[&Finding]) {
    let header = [
        "TOOL",
        "CONVERSATION",
        "FIRST CALL",
        "AT",
        "REPEAT",
        "AT",
        "GAP",
        "SOURCE",
        "CONFIDENCE",
    ];
    let rows: Vec<[String; 9]> = findings
        .iter()
        .map(|f| {
            let (d, first) = (&scan.calls[f.duplicate], &scan.calls[f.first]);
            [
                d.tool.clone(),
                group_name(&d.group()),
                call_name(first),
                instant(first.start_ns),
                call_name(d),
                instant(d.start_ns),
                duration_text(f.gap_ns),
                f.source.label().to_owned(),
                format!("{:?}", f.confidence).to_lowercase(),
            ]
            .map(|cell| clean(&cell))
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}  ");
            }
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
}

/// One call as the JSON report shows it.
#[derive(Serialize)]
struct CallView<'a> {
    tool: &'a str,
    call_id: Option<&'a str>,
    conversation: Option<&'a str>,
    trace_id: &'a str,
    span_id: &'a str,
    start: String,
    end: String,
    start_unix_nano: String,
    duration_ms: f64,
    arguments: Option<&'a Value>,
    verdict: Option<&'a str>,
    error: Option<&'a str>,
    origin: &'a str,
}

fn call_view(call: &Call) -> CallView<'_> {
    CallView {
        tool: &call.tool,
        call_id: call.call_id.as_deref(),
        conversation: call.conversation.as_deref(),
        trace_id: &call.trace_id,
        span_id: &call.span_id,
        start: instant(call.start_ns),
        end: instant(call.end_ns),
        start_unix_nano: call.start_ns.to_string(),
        duration_ms: call.end_ns.saturating_sub(call.start_ns) as f64 / 1e6,
        arguments: call.arguments.as_ref(),
        verdict: call.verdict.as_deref(),
        error: call.error.as_deref(),
        origin: &call.origin,
    }
}

/// One finding as the JSON report shows it.
#[derive(Serialize)]
struct FindingView<'a> {
    tool: &'a str,
    group: Group,
    source: crate::find::Source,
    confidence: crate::find::Confidence,
    caught: bool,
    gap_ms: f64,
    why: &'a str,
    first: CallView<'a>,
    previous: CallView<'a>,
    duplicate: CallView<'a>,
}

#[derive(Serialize)]
struct ReadView<'a> {
    tool: &'a str,
    group: &'a Group,
    calls: Lazy<'a, CallView<'a>>,
}

#[derive(Serialize)]
struct SkippedView<'a> {
    at: &'a str,
    why: &'a str,
}

/// A JSON array written item by item as it is serialized, never held whole: a scan of a large
/// file can find a hundred thousand repeats, each with its calls.
struct Lazy<'a, T>(Box<dyn Fn() -> Box<dyn Iterator<Item = T> + 'a> + 'a>);

impl<T: Serialize> Serialize for Lazy<'_, T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq((self.0)())
    }
}

#[derive(Serialize)]
struct ReportView<'a> {
    summary: String,
    duplicates: Lazy<'a, FindingView<'a>>,
    caught: Lazy<'a, FindingView<'a>>,
    repeated_reads: Lazy<'a, ReadView<'a>>,
    tool_calls: usize,
    reads: usize,
    writes_without_arguments: usize,
    files: &'a [String],
    spans: usize,
    records: Option<usize>,
    skipped: Lazy<'a, SkippedView<'a>>,
}

fn view<'a>(scan: &'a Scan, inputs: &'a Inputs) -> ReportView<'a> {
    let finding = move |f: &'a Finding| {
        let d = &scan.calls[f.duplicate];
        FindingView {
            tool: &d.tool,
            group: d.group(),
            source: f.source,
            confidence: f.confidence,
            caught: f.caught,
            gap_ms: f.gap_ns as f64 / 1e6,
            why: &f.why,
            first: call_view(&scan.calls[f.first]),
            previous: call_view(&scan.calls[f.previous]),
            duplicate: call_view(d),
        }
    };
    ReportView {
        summary: summary(scan, inputs),
        duplicates: Lazy(Box::new(move || Box::new(scan.uncaught().map(finding)))),
        caught: Lazy(Box::new(move || {
            Box::new(scan.findings.iter().filter(|f| f.caught).map(finding))
        })),
        repeated_reads: Lazy(Box::new(move || {
            Box::new(scan.repeated_reads.iter().map(move |r| ReadView {
                tool: &r.tool,
                group: &r.group,
                calls: Lazy(Box::new(move || {
                    Box::new(r.calls.iter().map(move |&i| call_view(&scan.calls[i])))
                })),
            }))
        })),
        tool_calls: scan.calls.len(),
        reads: scan.calls.iter().filter(|c| c.read).count(),
        writes_without_arguments: scan.without_arguments,
        files: &inputs.files,
        spans: inputs.spans,
        records: inputs.records,
        skipped: Lazy(Box::new(move || {
            Box::new(
                inputs
                    .skipped
                    .iter()
                    .map(|(at, why)| SkippedView { at, why }),
            )
        })),
    }
}

/// The report as one JSON value (for a program that holds it; [`write_json`] streams it).
pub fn json(scan: &Scan, inputs: &Inputs) -> Value {
    serde_json::to_value(view(scan, inputs)).unwrap_or(Value::Null)
}

/// Writes the report as one pretty-printed JSON object to `out`, finding by finding, without
/// building it in memory first.
///
/// # Errors
/// What writing to `out` fails with.
pub fn write_json(scan: &Scan, inputs: &Inputs, out: impl std::io::Write) -> std::io::Result<()> {
    serde_json::to_writer_pretty(out, &view(scan, inputs)).map_err(std::io::Error::from)
}

/// What the page may do: show itself. The arguments it quotes come from traces, escaped, and no
/// script would run even if one slipped through; nothing is fetched.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'";

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:2em}\
table{border-collapse:collapse}td,th{padding:2px 8px;text-align:left;vertical-align:top;white-space:nowrap}td.why{white-space:normal;min-width:24em}\
th{border-bottom:1px solid #999}.tl{position:relative;height:14px;background:#f3f3f3;width:480px}\
.bar{position:absolute;top:1px;height:12px;min-width:3px;background:#7a9cc6}\
tr.dup .bar{background:#d9534f}tr.caught .bar{background:#e0a030}tr.read .bar{background:#bbb}\
tr.dup td.why{color:#a33}tr.caught td.why{color:#8a6000}.muted{color:#666}code{font-size:12px}";

/// One page, no scripts, nothing fetched: a timeline per conversation with every tool call, the
/// repeats marked and explained.
pub fn html(scan: &Scan, inputs: &Inputs) -> String {
    let mut marks: BTreeMap<usize, &Finding> = BTreeMap::new();
    for f in &scan.findings {
        marks.insert(f.duplicate, f);
    }
    let mut groups: BTreeMap<Group, Vec<usize>> = BTreeMap::new();
    for (i, c) in scan.calls.iter().enumerate() {
        groups.entry(c.group()).or_default().push(i);
    }
    let mut page = String::new();
    let _ = write!(
        page,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\"><title>idemgate scan</title><style>{STYLE}</style></head><body><main><h1>idemgate scan</h1><p id=\"summary\">{}</p>",
        esc(&summary(scan, inputs))
    );
    // Conversations with a repeat first, as a reader looks for them.
    let mut order: Vec<(&Group, &Vec<usize>)> = groups.iter().collect();
    order.sort_by_key(|(_, calls)| !calls.iter().any(|i| marks.contains_key(i)));
    for (group, members) in order {
        let start = members
            .iter()
            .map(|&i| scan.calls[i].start_ns)
            .min()
            .unwrap_or(0);
        let end = members
            .iter()
            .map(|&i| scan.calls[i].end_ns)
            .max()
            .unwrap_or(start)
            .max(start.saturating_add(1));
        let scale = |ns: u64| {
            (ns.saturating_sub(start)) as f64 * 100.0 / end.saturating_sub(start).max(1) as f64
        };
        let _ = write!(
            page,
            "<h2>{}</h2><p class=\"muted\">from {} for {}</p><table><tr><th>at</th><th>tool</th><th>call</th><th>timeline</th><th>took</th><th>what it was</th></tr>",
            esc(&group.to_string()),
            esc(&instant(start)),
            esc(&duration_text(end - start)),
        );
        for &i in members {
            let c = &scan.calls[i];
            let (class, why) = match marks.get(&i) {
                Some(f) if f.caught => ("caught", format!("repeat, caught by idemgate: {}", f.why)),
                Some(f) => (
                    "dup",
                    format!(
                        "likely duplicate ({}, {} confidence): {}",
                        f.source.label(),
                        format!("{:?}", f.confidence).to_lowercase(),
                        f.why
                    ),
                ),
                None if c.read => ("read", "read".to_owned()),
                None => ("", String::new()),
            };
            let left = scale(c.start_ns);
            let width = (scale(c.end_ns) - left).max(0.5);
            let _ = write!(
                page,
                "<tr class=\"{class}\"><td>{}</td><td>{}</td><td><code>{}</code></td><td><div class=\"tl\"><div class=\"bar\" style=\"left:{left:.2}%;width:{width:.2}%\" title=\"{}\"></div></div></td><td>{}</td><td class=\"why\">{}{}</td></tr>",
                esc(&instant(c.start_ns)),
                esc(&c.tool),
                esc(&call_name(c)),
                esc(&c.arguments.as_ref().map(Value::to_string).unwrap_or_default()),
                esc(&duration_text(c.end_ns - c.start_ns)),
                esc(&why),
                c.error
                    .as_deref()
                    .map(|e| format!(" <span class=\"muted\">failed: {}</span>", esc(e)))
                    .unwrap_or_default(),
            );
        }
        page.push_str("</table>");
    }
    if !inputs.skipped.is_empty() {
        page.push_str("<h2>Not read</h2><ul>");
        for (at, why) in &inputs.skipped {
            let _ = write!(page, "<li>{}: {}</li>", esc(at), esc(why));
        }
        page.push_str("</ul>");
    }
    page.push_str("</main></body></html>\n");
    page
}
