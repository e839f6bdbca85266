//! `idemgate mcp lint`: what a gate needs to know about a server's tools, read from its
//! `tools/list` before anything is gated.
//!
//! Which tools write (the proxy makes every tool a write unless told otherwise), which say
//! nothing about themselves, which annotations contradict the tool's own name (a `delete_…`
//! marked read-only would pass the gate without a key), and which descriptions tell a model to
//! make its key new for every request (a retry then carries a new key and runs again: the
//! mechanism defeated by the server's own words). Then a starting configuration that writes down
//! what the listing said, tool by tool, for a person to check.
//!
//! [`inspect`] judges a listing and knows nothing of processes; [`list_tools`] is the small
//! stdio client that gets one from a server.

use std::collections::VecDeque;
use std::io::{BufRead as _, BufReader, Write as _};
#[cfg(unix)]
use std::os::unix::process::CommandExt as _;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idemgate_core::ToolKind;
use serde::Serialize;
use serde_json::{json, Value};

use crate::gate::catalog::KEY_ARGUMENTS;

/// The protocol version `initialize` offers; a server answers with the one it speaks.
const OFFERED_VERSION: &str = "2025-11-25";
/// How many lines of the server's output wait to be read before its reader waits too.
const LINES_QUEUED: usize = 256;
/// How many of the server's last stderr lines an error shows.
const STDERR_LINES: usize = 10;
/// More pages than any real listing has: a server whose cursor never ends is an error.
const MAX_PAGES: usize = 1000;

/// Words that make a tool's name say it only reads, when no write verb is in it.
#[rustfmt::skip]
const READ_WORDS: &[&str] = &[
    "get", "list", "read", "search", "find", "show", "describe", "fetch", "view", "lookup",
    "count", "status", "diff", "inspect", "browse", "retrieve", "preview", "explain", "ping",
    "query",
];
/// Verbs that make a tool's name say it changes something, wherever they stand in it
/// (`get_or_create_user`, `search_and_replace`, `status_update`). Words that are as often nouns
/// (order, email, post, tag, label, comment, run, log) are in neither list: a name made of them
/// says nothing.
#[rustfmt::skip]
const WRITE_WORDS: &[&str] = &[
    "create", "add", "insert", "append", "update", "upsert", "set", "put", "patch", "delete",
    "remove", "drop", "clear", "purge", "send", "write", "save", "commit", "push", "merge",
    "reset", "checkout", "move", "rename", "upload", "publish", "deploy", "submit", "pay",
    "charge", "refund", "transfer", "cancel", "approve", "reject", "assign", "close", "archive",
    "restore", "install", "uninstall", "init", "apply", "edit", "modify", "replace", "enable",
    "disable", "start", "stop", "kill", "restart", "schedule", "invite", "reply", "grant",
    "revoke", "register", "subscribe", "unsubscribe", "trigger", "notify", "destroy",
    "terminate", "erase", "truncate", "purchase", "buy", "withdraw", "import", "copy", "revert",
    "rollback", "invoke",
];
/// Verbs of a write that makes something new each time it runs: an `idempotentHint` on one is
/// suspect. Not "add": adding to a set is idempotent (`git add`).
#[rustfmt::skip]
const CREATE_WORDS: &[&str] = &[
    "create", "insert", "append", "send", "pay", "charge", "transfer", "invite", "reply",
    "submit", "purchase", "buy", "withdraw", "notify",
];
/// Words that make a create idempotent after all: `create_or_update_file`, `ensure_user`.
const UPSERT_WORDS: &[&str] = &["upsert", "ensure", "exists", "update"];

/// What a tool's name says it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NameSays {
    /// A word of it reads, and none writes.
    Reads,
    /// A word of it is a write verb.
    Writes,
    /// Neither list has any of its words.
    Nothing,
}

/// How sure a finding is that something is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing; the gate is safe either way.
    Note,
    /// The gate would be wrong, or defeated, if this were believed.
    Warning,
}

/// One thing the lint found about a tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// How sure it is.
    pub severity: Severity,
    /// A stable name for scripts.
    pub code: &'static str,
    /// What it means, in a sentence.
    pub message: String,
}

/// The annotations a tool carries (`annotations` of MCP 2025-03-26 and later).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Hints {
    /// `readOnlyHint`.
    pub read_only: Option<bool>,
    /// `destructiveHint`.
    pub destructive: Option<bool>,
    /// `idempotentHint`.
    pub idempotent: Option<bool>,
    /// `openWorldHint`.
    pub open_world: Option<bool>,
}

impl Hints {
    fn of(tool: &Value) -> Self {
        let hint = |name: &str| tool["annotations"][name].as_bool();
        Self {
            read_only: hint("readOnlyHint"),
            destructive: hint("destructiveHint"),
            idempotent: hint("idempotentHint"),
            open_world: hint("openWorldHint"),
        }
    }

    fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The hints in words, `-` when there are none.
    fn describe(&self) -> String {
        let mut words = Vec::new();
        let mut say = |hint: Option<bool>, yes: &'static str, no: &'static str| {
            if let Some(h) = hint {
                words.push(if h { yes } else { no });
            }
        };
        say(self.read_only, "read-only", "writes");
        say(self.destructive, "destructive", "not destructive");
        say(self.idempotent, "idempotent", "not idempotent");
        say(self.open_world, "open world", "closed world");
        if words.is_empty() {
            "-".to_owned()
        } else {
            words.join(", ")
        }
    }
}

/// What the lint says about one tool.
#[derive(Clone, Debug, Serialize)]
pub struct ToolReport {
    /// The tool's name.
    pub name: String,
    /// Its annotations, as the server wrote them.
    pub hints: Hints,
    /// What its name says.
    pub name_says: NameSays,
    /// The key argument its input schema declares (the proxy fills it with the downstream key).
    pub key_argument: Option<String>,
    /// The kind the starting configuration gives it: what the annotations say unless a finding
    /// contradicts them, else a write.
    pub kind: ToolKind,
    /// Whether the configuration's line for it is only a suggestion (commented out): a tool that
    /// says nothing of itself but whose name reads, or one whose `idempotentHint` is believable.
    pub suggested: Option<ToolKind>,
    /// What was found.
    pub findings: Vec<Finding>,
}

/// The whole lint of one server.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// `serverInfo` from the server's `initialize` answer, if it sent one.
    pub server: Option<Value>,
    /// The protocol version it answered with.
    pub protocol_version: Option<String>,
    /// The name records get (`<server_name>/<tool>`): the proxy's default for this command.
    pub server_name: String,
    /// Every tool, in the server's order.
    pub tools: Vec<ToolReport>,
}

impl Report {
    /// The server as its `initialize` answer named it: "name version".
    fn server_label(&self) -> Option<String> {
        self.server.as_ref().map(|s| {
            format!(
                "{} {}",
                s["name"].as_str().unwrap_or("?"),
                s["version"].as_str().unwrap_or("")
            )
            .trim_end()
            .to_owned()
        })
    }

    /// The worst severity of any finding, if there is one.
    pub fn worst(&self) -> Option<Severity> {
        self.tools
            .iter()
            .flat_map(|t| &t.findings)
            .map(|f| f.severity)
            .max()
    }
}

/// The words of a tool's name, lowercase: split at `_`, `-`, `.`, `/`, spaces, where a
/// lowercase letter or digit meets an uppercase one (`createEntities`), and before the last
/// capital of a run of them that a lowercase letter follows (`AWSCreateBucket`).
pub fn words(name: &str) -> Vec<String> {
    let chars: Vec<char> = name.chars().collect();
    let mut words = Vec::new();
    let mut word = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_alphanumeric() {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            continue;
        }
        let previous = i.checked_sub(1).map(|j| chars[j]);
        let next = chars.get(i + 1).copied();
        let boundary = c.is_uppercase()
            && previous.is_some_and(|p| {
                p.is_lowercase()
                    || p.is_ascii_digit()
                    || (p.is_uppercase() && next.is_some_and(char::is_lowercase))
            });
        if boundary && !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        word.extend(c.to_lowercase());
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// What a name says: it writes if any word is a write verb (`get_or_create_user`), else it
/// reads if a word reads (`git_diff_unstaged`, `read_graph`), else nothing.
pub fn name_says(name: &str) -> NameSays {
    let words = words(name);
    if words.iter().any(|w| WRITE_WORDS.contains(&w.as_str())) {
        return NameSays::Writes;
    }
    if words.iter().any(|w| READ_WORDS.contains(&w.as_str())) {
        return NameSays::Reads;
    }
    NameSays::Nothing
}

fn creates(name: &str) -> bool {
    let words = words(name);
    words.iter().any(|w| CREATE_WORDS.contains(&w.as_str()))
        && !words.iter().any(|w| UPSERT_WORDS.contains(&w.as_str()))
}

/// Whether `text`, said of an idempotency key, tells whoever fills it to make it new for every
/// request ("unique for every request", "a new key each time", "every call needs a unique
/// key"), which turns every retry into a new action. Advice that also says to reuse the key on
/// a retry is not flagged.
pub fn asks_for_a_new_key_every_time(text: &str) -> bool {
    let text = text.to_lowercase();
    if text.contains("retry") || text.contains("retries") || text.contains("same key") {
        return false;
    }
    let words: Vec<&str> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let unique = ["unique", "new", "fresh", "random", "different", "distinct"];
    let every = ["each", "every", "per"];
    #[rustfmt::skip]
    let request = [
        "request", "requests", "call", "calls", "invocation", "attempt", "operation", "time",
    ];
    let after = |i: usize| &words[i + 1..words.len().min(i + 7)];
    words.iter().enumerate().any(|(i, w)| {
        // "unique for every request", "a new key each time", "unique per call".
        let forward = unique.contains(w)
            && after(i)
                .windows(2)
                .any(|p| every.contains(&p[0]) && request.contains(&p[1]));
        // "every request needs a unique key".
        let backward = every.contains(w)
            && words.get(i + 1).is_some_and(|n| request.contains(n))
            && after(i).iter().any(|n| unique.contains(n));
        forward || backward
    })
}

/// Judges one `tools/list` listing (every page's `tools`, in order).
pub fn inspect(tools: &[Value]) -> Vec<ToolReport> {
    let mut reports: Vec<ToolReport> = Vec::new();
    for report in tools.iter().filter_map(judge) {
        // A name listed twice: one table for it (TOML allows no second), and a warning.
        if let Some(first) = reports.iter_mut().find(|r| r.name == report.name) {
            if !first.findings.iter().any(|f| f.code == "duplicate_name") {
                first.findings.push(finding(
                    Severity::Warning,
                    "duplicate_name",
                    "listed more than once: a call by this name cannot say which tool it means; only the first is judged".to_owned(),
                ));
            }
            continue;
        }
        reports.push(report);
    }
    reports
}

fn finding(severity: Severity, code: &'static str, message: String) -> Finding {
    Finding {
        severity,
        code,
        message,
    }
}

fn judge(tool: &Value) -> Option<ToolReport> {
    let name = tool["name"].as_str()?.to_owned();
    let hints = Hints::of(tool);
    let says = name_says(&name);
    let properties = tool["inputSchema"]["properties"].as_object();
    let key_argument = properties.and_then(|p| {
        KEY_ARGUMENTS
            .iter()
            .find(|k| p.contains_key(**k))
            .map(|k| (*k).to_owned())
    });
    let mut findings = Vec::new();
    let mut kind = ToolKind::Write;
    let mut suggested = None;

    let read_only = hints.read_only == Some(true);
    if hints.is_empty() {
        findings.push(finding(
            Severity::Note,
            "no_annotations",
            "no annotations: the proxy gates it as a write (a key on every call) unless the configuration says otherwise".to_owned(),
        ));
        if says == NameSays::Reads {
            suggested = Some(ToolKind::Read);
        }
    } else if read_only && says == NameSays::Writes {
        findings.push(finding(
            Severity::Warning,
            "read_only_name_writes",
            "annotated read-only, but its name says it writes: believed, it would run without a key and every retry would run again; the configuration keeps it a write".to_owned(),
        ));
    } else if read_only && hints.destructive == Some(true) {
        findings.push(finding(
            Severity::Warning,
            "read_only_and_destructive",
            "annotated both read-only and destructive, which contradict each other (destructiveHint means something only for a tool that writes); the configuration keeps it a write".to_owned(),
        ));
    } else if read_only {
        kind = ToolKind::Read;
    } else if says == NameSays::Reads {
        // Annotated, but not read-only (readOnlyHint false, or absent: MCP's default).
        findings.push(finding(
            Severity::Note,
            "write_name_reads",
            "annotated as a write (not read-only), but its name says it reads: gated as a write, every call needs a key; if it truly changes nothing, make it kind = \"read\"".to_owned(),
        ));
    }
    if !read_only && hints.idempotent == Some(true) {
        if creates(&name) {
            findings.push(finding(
                Severity::Warning,
                "idempotent_name_creates",
                "annotated idempotent, but its name says each call makes something new: believed, a repeated call would pass the gate and run again; the configuration keeps it a write".to_owned(),
            ));
        } else if hints.destructive == Some(false) {
            suggested = Some(ToolKind::NaturalIdempotent);
        } else {
            // MCP's default for destructiveHint is true.
            findings.push(finding(
                Severity::Note,
                "idempotent_but_destructive",
                "annotated idempotent, but destructive: repeated later, after what it destroyed was made again, it destroys it again; kept a write".to_owned(),
            ));
        }
    }
    if let Some(key) = &key_argument {
        findings.push(finding(
            Severity::Note,
            "declares_key_argument",
            format!("takes its own key argument `{key}`: the proxy fills it with the downstream key, the same on every retry of the action"),
        ));
    }
    let key_texts = properties
        .into_iter()
        .flatten()
        .filter(|(arg, _)| arg.to_lowercase().contains("idempotency"))
        .filter_map(|(arg, schema)| {
            let text = schema["description"].as_str()?;
            Some((format!("the description of `{arg}`"), text))
        });
    // The tool's own description only where it speaks of a key at all ("a new commit for each
    // file" is not about keys).
    let description = tool["description"]
        .as_str()
        .filter(|d| {
            let d = d.to_lowercase();
            d.contains("key") || d.contains("idempoten")
        })
        .map(|d| ("its description".to_owned(), d));
    for (whose, text) in description.into_iter().chain(key_texts) {
        if asks_for_a_new_key_every_time(text) {
            findings.push(finding(
                Severity::Warning,
                "new_key_every_request",
                format!("{whose} tells the model to make the key new for every request: a retry then carries a new key and runs again. A key names the action: the same on every retry of it, new only for a new action"),
            ));
        }
    }
    Some(ToolReport {
        name,
        hints,
        name_says: says,
        key_argument,
        kind,
        suggested,
        findings,
    })
}

/// The report as a person reads it: a summary line, a table of the tools, then every finding,
/// warnings first.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let server = report
        .server_label()
        .unwrap_or_else(|| "the server".to_owned());
    let count = |severity| {
        report
            .tools
            .iter()
            .flat_map(|t| &t.findings)
            .filter(|f| f.severity == severity)
            .count()
    };
    let writes = report
        .tools
        .iter()
        .filter(|t| t.kind == ToolKind::Write)
        .count();
    out.push_str(&format!(
        "{server}{}: {} tools, {writes} gated as writes; {} warnings, {} notes. Records are named {}/<tool>.\n\n",
        report
            .protocol_version
            .as_deref()
            .map(|v| format!(" (protocol {v})"))
            .unwrap_or_default(),
        report.tools.len(),
        count(Severity::Warning),
        count(Severity::Note),
        report.server_name,
    ));
    let rows: Vec<[String; 5]> = report
        .tools
        .iter()
        .map(|t| {
            let gated = match t.suggested {
                Some(k) => format!("{} (or {k}?)", t.kind),
                None => t.kind.to_string(),
            };
            let says = match t.name_says {
                NameSays::Reads => "reads",
                NameSays::Writes => "writes",
                NameSays::Nothing => "-",
            };
            let worst = t.findings.iter().map(|f| f.severity).max();
            let flag = match worst {
                Some(Severity::Warning) => "warning",
                Some(Severity::Note) => "note",
                None => "-",
            };
            [
                t.name.clone(),
                gated,
                t.hints.describe(),
                says.to_owned(),
                flag.to_owned(),
            ]
        })
        .collect();
    let header = ["tool", "gated as", "annotations", "name says", "worst"].map(str::to_owned);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    for (severity, title) in [(Severity::Warning, "Warnings"), (Severity::Note, "Notes")] {
        // One line per finding, naming every tool it was found on, in the server's order.
        let mut found: Vec<(&Finding, Vec<&str>)> = Vec::new();
        for t in &report.tools {
            for f in t.findings.iter().filter(|f| f.severity == severity) {
                match found.iter_mut().find(|(seen, _)| *seen == f) {
                    Some((_, tools)) => tools.push(&t.name),
                    None => found.push((f, vec![&t.name])),
                }
            }
        }
        if !found.is_empty() {
            out.push_str(&format!("\n{title}:\n"));
        }
        for (f, tools) in found {
            out.push_str(&format!(
                "  {} [{}]: {}\n",
                tools.join(", "),
                f.code,
                f.message
            ));
        }
    }
    out
}

/// A starting `idemgate mcp --config` file for the report's tools: every line what the listing
/// said, for a person to check before it gates anything.
pub fn starting_config(report: &Report) -> String {
    let mut out = String::new();
    let server = report
        .server_label()
        .map(|label| in_comment(&format!(" of {label}")))
        .unwrap_or_default();
    out.push_str(&format!(
        "# A starting configuration for `idemgate mcp --config FILE -- CMD`, from `idemgate mcp lint`{server}.\n\
         # Check every line: a tool of kind \"read\" or \"natural_idempotent\" passes without a key.\n\
         server_name = {}\n\
         # The annotations are written out below, tool by tool, instead of believed wholesale.\n\
         trusted = false\n\
         # To adopt it on a live agent without risk, observe first: every call runs, and what the\n\
         # gate would have replayed or refused is recorded (`idemgate keys list --observed`).\n\
         # mode = \"observe\"\n",
        toml_string(&report.server_name)
    ));
    let profile = crate::Profile::recognise(report.tools.iter().map(|t| t.name.as_str()));
    if let Some(p) = profile {
        out.push_str(&format!(
            "# These are the tools of {}:\n\
             # the proxy reads their keys there and answers in its words (docs/MCP.md, \"Commerce\n\
             # protocol bindings\"); its read tools pass without a key.\n\
             profile = \"{}\"\n",
            p.title(),
            p.name()
        ));
    }
    let writes: Vec<&str> = report
        .tools
        .iter()
        .filter(|t| t.kind == ToolKind::Write && t.suggested.is_none())
        .filter(|t| !profile.is_some_and(|p| p.reads(&t.name)))
        .map(|t| t.name.as_str())
        .collect();
    if !writes.is_empty() {
        out.push_str("\n# Writes: a key on every call (any tool not named below is one):\n");
        for line in wrap(&writes, 96) {
            out.push_str(&format!("#   {}\n", in_comment(&line)));
        }
    }
    for t in report.tools.iter().filter(|t| t.kind != ToolKind::Write) {
        out.push_str(&format!(
            "\n[tools.{}]   # annotated read-only\nkind = \"{}\"\n",
            toml_key(&t.name),
            t.kind
        ));
    }
    for (kind, why) in [
        (
            ToolKind::Read,
            "Not annotated, but the name reads: uncomment once you know it changes nothing.",
        ),
        (
            ToolKind::NaturalIdempotent,
            "Annotated idempotent and not destructive: uncomment once you know a repeat changes nothing more.",
        ),
    ] {
        let mut tools = report.tools.iter().filter(|t| t.suggested == Some(kind)).peekable();
        if tools.peek().is_some() {
            out.push_str(&format!("\n# {why}\n"));
        }
        for t in tools {
            out.push_str(&format!("# [tools.{}]\n# kind = \"{kind}\"\n", toml_key(&t.name)));
        }
    }
    out
}

/// `name` as a TOML key: bare when it can be, quoted otherwise.
fn toml_key(name: &str) -> String {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        name.to_owned()
    } else {
        toml_string(name)
    }
}

/// `text` as a TOML basic string, on one line: quote, backslash and control characters escaped.
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `text` as it may stand in a TOML comment: a server's name or a tool's with a newline in it
/// must not end the comment and write a line of configuration of its own.
fn in_comment(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn wrap(names: &[&str], width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for (i, name) in names.iter().enumerate() {
        let piece = if i + 1 < names.len() {
            format!("{name}, ")
        } else {
            (*name).to_owned()
        };
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() && line.len() + piece.len() > width {
            lines.push(piece);
        } else {
            line.push_str(&piece);
        }
    }
    lines.iter().map(|l| l.trim_end().to_owned()).collect()
}

/// What a server said when asked: its `initialize` answer and every tool of every page.
#[derive(Debug)]
pub struct Listing {
    /// `serverInfo`.
    pub server: Option<Value>,
    /// `protocolVersion`.
    pub protocol_version: Option<String>,
    /// Every tool, in order.
    pub tools: Vec<Value>,
}

/// Starts `command` as an MCP server over stdio, opens a session, reads every page of
/// `tools/list`, and closes it. `timeout` bounds the whole exchange; the server's stderr is
/// kept and its last lines returned in the error when it fails.
pub fn list_tools(command: &[String], timeout: Duration) -> Result<Listing, String> {
    let (program, args) = command
        .split_first()
        .ok_or("give the MCP server's command after --")?;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A group of its own, so that what a launcher (npx, uvx, sh -c) starts is stopped with it.
    #[cfg(unix)]
    command.process_group(0);
    let mut child = command
        .spawn()
        .map_err(|e| format!("failed to start {program}: {e}"))?;
    // Read all along, so that a server that logs much never blocks on a full pipe; the last
    // lines are kept for the error, readable while a process of the server still holds the pipe.
    let stderr = child.stderr.take().expect("stderr is piped");
    let tail = Arc::new(Mutex::new(VecDeque::new()));
    let kept = Arc::clone(&tail);
    let (read_all, stderr_ended) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        each_line(stderr, |line| {
            let mut last = kept.lock().unwrap_or_else(PoisonError::into_inner);
            if last.len() == STDERR_LINES {
                last.pop_front();
            }
            last.push_back(line);
            true
        });
        drop(read_all);
    });
    let mut session = Session::new(&mut child, Instant::now() + timeout);
    let listed = session.list();
    drop(session);
    finish(&mut child);
    // The server is gone: its stderr ends as soon as the reader has read what it wrote last,
    // unless a process it started still holds the pipe, so the wait is bounded.
    let _ = stderr_ended.recv_timeout(Duration::from_secs(2));
    let stderr = Vec::from(tail.lock().unwrap_or_else(PoisonError::into_inner).clone()).join("\n");
    listed.map_err(|e| {
        if stderr.is_empty() {
            e
        } else {
            format!("{e}\nthe server's stderr ended with:\n{stderr}")
        }
    })
}

/// Calls `f` with each line `from` gives (bytes that are not UTF-8 replaced, not an end) until
/// it ends or `f` says stop.
fn each_line(from: impl std::io::Read, mut f: impl FnMut(String) -> bool) {
    let mut reader = BufReader::new(from);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&buf);
                if !f(text.trim_end_matches(['\n', '\r']).to_owned()) {
                    return;
                }
            }
        }
    }
}

/// Closes the server's input, gives it a moment to leave, and stops it (and its process group)
/// if it does not.
fn finish(child: &mut Child) {
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    // Our own child, still running (not reaped, so its pid and group are still its own): stop
    // the group it leads, then it.
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        if pid > 1 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

struct Session {
    input: ChildStdin,
    lines: mpsc::Receiver<String>,
    deadline: Instant,
    next_id: u64,
}

impl Session {
    fn new(child: &mut Child, deadline: Instant) -> Self {
        let input = child.stdin.take().expect("stdin is piped");
        let output = child.stdout.take().expect("stdout is piped");
        // Bounded: a server that writes faster than the lint reads waits, and the deadline ends it.
        let (tx, lines) = mpsc::sync_channel(LINES_QUEUED);
        // The reader ends when the server closes its output or the receiver is gone.
        std::thread::spawn(move || each_line(output, |line| tx.send(line).is_ok()));
        Self {
            input,
            lines,
            deadline,
            next_id: 0,
        }
    }

    /// Writes one frame; `what` names it in the error.
    fn send(&mut self, frame: &Value, what: &str) -> Result<(), String> {
        let mut text = frame.to_string();
        text.push('\n');
        self.input
            .write_all(text.as_bytes())
            .and_then(|()| self.input.flush())
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::BrokenPipe => {
                    format!("the server closed its input before {what} could be sent")
                }
                _ => format!("failed to send {what} to the server: {e}"),
            })
    }

    /// Sends a request and waits for its answer's `result`, answering any request of the
    /// server's meanwhile with "method not found" (a lint has no roots, sampling or elicitation).
    fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
            method,
        )?;
        loop {
            // Checked before each line, not only when none comes: a server that never stops
            // writing (logs on stdout, notifications) is stopped by the deadline too.
            let now = Instant::now();
            if now >= self.deadline {
                return Err(format!("the server did not answer {method} in time"));
            }
            let left = self.deadline - now;
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!("the server did not answer {method} in time"))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(format!(
                        "the server closed its output before answering {method}"
                    ))
                }
            };
            let Ok(frame) = serde_json::from_str::<Value>(&line) else {
                // Not JSON-RPC (a server that logs on stdout): not ours to answer.
                continue;
            };
            if let Some(asked) = frame.get("method") {
                if let Some(their_id) = frame.get("id") {
                    // A ping is answered as MCP says; the lint has nothing else to give (no
                    // roots, sampling or elicitation).
                    let answer = if asked == "ping" {
                        json!({"jsonrpc": "2.0", "id": their_id, "result": {}})
                    } else {
                        json!({"jsonrpc": "2.0", "id": their_id,
                            "error": {"code": -32601, "message": "idemgate mcp lint answers no requests"}})
                    };
                    self.send(&answer, "an answer to the server's request")?;
                }
                continue;
            }
            // An error with a null id answers a request the server could not read at all.
            if frame["id"].is_null() {
                if let Some(error) = frame.get("error") {
                    return Err(format!(
                        "the server could not read {method} (it may not speak MCP over stdio, newline-delimited JSON-RPC): {error}"
                    ));
                }
            }
            if frame["id"] != json!(id) {
                if frame["id"].is_string() && frame["id"] == json!(id.to_string()) {
                    return Err(format!(
                        "the server answered {method} under the id \"{id}\", a string, where the request's was the number {id}"
                    ));
                }
                continue;
            }
            if let Some(error) = frame.get("error") {
                return Err(format!(
                    "the server answered {method} with an error: {error}"
                ));
            }
            return Ok(frame["result"].clone());
        }
    }

    fn list(&mut self) -> Result<Listing, String> {
        let init = self.request(
            "initialize",
            json!({
                "protocolVersion": OFFERED_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "idemgate-mcp-lint", "version": env!("CARGO_PKG_VERSION")},
            }),
        )?;
        self.send(
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            "notifications/initialized",
        )?;
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let page = self.request("tools/list", params)?;
            let listed = page["tools"]
                .as_array()
                .ok_or("the server's tools/list result has no tools array")?;
            tools.extend(listed.iter().cloned());
            match page["nextCursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => {
                    return Ok(Listing {
                        server: init.get("serverInfo").cloned(),
                        protocol_version: init["protocolVersion"].as_str().map(str::to_owned),
                        tools,
                    })
                }
            }
        }
        Err(format!(
            "the server's tools/list went on for {MAX_PAGES} pages without an end"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_into_words() {
        assert_eq!(words("git_create_branch"), ["git", "create", "branch"]);
        assert_eq!(words("createEntities"), ["create", "entities"]);
        assert_eq!(words("HTTPGet2"), ["http", "get2"]);
        assert_eq!(words("AWSCreateBucket"), ["aws", "create", "bucket"]);
        assert_eq!(words("files.read-text"), ["files", "read", "text"]);
        assert_eq!(name_says("git_diff_unstaged"), NameSays::Reads);
        assert_eq!(name_says("git_commit"), NameSays::Writes);
        assert_eq!(name_says("read_graph"), NameSays::Reads);
        assert_eq!(name_says("write_query"), NameSays::Writes);
        assert_eq!(name_says("sendEmail"), NameSays::Writes);
        assert_eq!(name_says("echo"), NameSays::Nothing);
        // A write verb anywhere writes; nouns that are also verbs say nothing.
        assert_eq!(name_says("get_or_create_user"), NameSays::Writes);
        assert_eq!(name_says("search_and_replace"), NameSays::Writes);
        assert_eq!(name_says("status_update"), NameSays::Writes);
        assert_eq!(name_says("get_post"), NameSays::Reads);
        assert_eq!(name_says("email_search"), NameSays::Reads);
        assert_eq!(name_says("run_query"), NameSays::Reads);
        assert_eq!(name_says("order_label"), NameSays::Nothing);
        assert!(creates("create_order") && creates("sendEmail"));
        assert!(!creates("create_or_update_file") && !creates("git_add"));
    }

    #[test]
    fn descriptions_that_ask_for_a_new_key_every_time() {
        for text in [
            "Idempotency key. Must be unique for every request.",
            "A UNIQUE key per request",
            "Generate a new key for each call",
            "a new key each time",
            "Every request needs a unique idempotency key.",
            "must be different on every invocation",
        ] {
            assert!(asks_for_a_new_key_every_time(text), "{text}");
        }
        for text in [
            "The same key on every retry of the action",
            "Unique identifier of the order",
            "A key naming the action; new for a new action",
            "Lists every request in the queue",
            "A new key for each new action; reuse it when you retry",
            "use a random UUID per action",
        ] {
            assert!(!asks_for_a_new_key_every_time(text), "{text}");
        }
    }

    fn report(tools: Value) -> Report {
        let tools = inspect(tools.as_array().unwrap());
        Report {
            server: Some(json!({"name": "srv", "version": "1.0"})),
            protocol_version: None,
            server_name: "srv".into(),
            tools,
        }
    }

    fn codes(r: &Report, tool: &str) -> Vec<&'static str> {
        r.tools
            .iter()
            .find(|t| t.name == tool)
            .unwrap()
            .findings
            .iter()
            .map(|f| f.code)
            .collect()
    }

    #[test]
    fn contradictions_keep_the_tool_a_write() {
        let r = report(json!([
            {"name": "delete_user", "annotations": {"readOnlyHint": true}},
            {"name": "list_users", "annotations": {"readOnlyHint": true}},
            {"name": "peek", "annotations": {"readOnlyHint": true, "destructiveHint": true}},
            {"name": "create_order", "annotations": {"readOnlyHint": false, "idempotentHint": true}},
            {"name": "set_flag", "annotations": {"readOnlyHint": false, "idempotentHint": true, "destructiveHint": false}},
            {"name": "delete_file", "annotations": {"idempotentHint": true}},
            {"name": "get_balance", "annotations": {"readOnlyHint": false}},
            {"name": "search_docs"},
            {"name": "pay", "description": "Charge a card.",
             "inputSchema": {"type": "object", "properties": {"idempotencyKey": {"type": "string",
               "description": "Must be unique for every request"}}}},
        ]));
        assert_eq!(codes(&r, "delete_user"), ["read_only_name_writes"]);
        assert_eq!(codes(&r, "list_users"), Vec::<&str>::new());
        assert_eq!(codes(&r, "peek"), ["read_only_and_destructive"]);
        assert_eq!(codes(&r, "create_order"), ["idempotent_name_creates"]);
        assert_eq!(codes(&r, "set_flag"), Vec::<&str>::new());
        assert_eq!(codes(&r, "delete_file"), ["idempotent_but_destructive"]);
        assert_eq!(codes(&r, "get_balance"), ["write_name_reads"]);
        assert_eq!(codes(&r, "search_docs"), ["no_annotations"]);
        assert_eq!(
            codes(&r, "pay"),
            [
                "no_annotations",
                "declares_key_argument",
                "new_key_every_request"
            ]
        );
        let kind = |name: &str| r.tools.iter().find(|t| t.name == name).unwrap().kind;
        assert_eq!(kind("delete_user"), ToolKind::Write);
        assert_eq!(kind("peek"), ToolKind::Write);
        assert_eq!(kind("list_users"), ToolKind::Read);
        assert_eq!(r.worst(), Some(Severity::Warning));

        let config = starting_config(&r);
        let parsed = crate::Config::parse(&config).unwrap_or_else(|e| panic!("{e}\n{config}"));
        assert_eq!(parsed.policy("list_users", None).kind, ToolKind::Read);
        assert_eq!(parsed.policy("delete_user", None).kind, ToolKind::Write);
        assert_eq!(parsed.policy("search_docs", None).kind, ToolKind::Write);
        assert!(!parsed.trusted);
        assert!(
            config.contains("# [tools.search_docs]\n# kind = \"read\""),
            "{config}"
        );
        assert!(
            config.contains("# [tools.set_flag]\n# kind = \"natural_idempotent\""),
            "{config}"
        );
        // Uncommenting the suggestions gives a configuration that still parses.
        let uncommented = config
            .replace("# [tools.", "[tools.")
            .replace("# kind", "kind");
        let parsed = crate::Config::parse(&uncommented).unwrap();
        assert_eq!(parsed.policy("search_docs", None).kind, ToolKind::Read);
        assert_eq!(
            parsed.policy("set_flag", None).kind,
            ToolKind::NaturalIdempotent
        );
    }

    #[test]
    fn the_configuration_stays_toml_whatever_the_names() {
        let tools = inspect(
            json!([
                {"name": "x\n[default]\nkind = \"read\"", "annotations": {"readOnlyHint": true}},
                {"name": "bell\u{7}\u{301}\u{200b}", "annotations": {"readOnlyHint": true}},
                {"name": "twice", "annotations": {"readOnlyHint": true}},
                {"name": "twice"},
                {"name": "delete\nme"},
            ])
            .as_array()
            .unwrap(),
        );
        assert_eq!(tools.len(), 4, "one report per name");
        let r = Report {
            server: Some(json!({"name": "evil\n[default]\nkind = \"read\"", "version": "\r1"})),
            protocol_version: None,
            server_name: "evil".into(),
            tools,
        };
        let twice = r.tools.iter().find(|t| t.name == "twice").unwrap();
        assert_eq!(twice.findings[0].code, "duplicate_name");
        let config = starting_config(&r);
        let parsed = crate::Config::parse(&config).unwrap_or_else(|e| panic!("{e}\n{config}"));
        // Nothing the server wrote became a line of configuration.
        assert_eq!(
            parsed.policy("anything", None).kind,
            ToolKind::Write,
            "{config}"
        );
        assert_eq!(
            parsed.policy("x\n[default]\nkind = \"read\"", None).kind,
            ToolKind::Read
        );
        assert_eq!(
            parsed.policy("bell\u{7}\u{301}\u{200b}", None).kind,
            ToolKind::Read
        );
        assert_eq!(parsed.policy("twice", None).kind, ToolKind::Read);
        assert_eq!(parsed.policy("delete\nme", None).kind, ToolKind::Write);
        assert_eq!(config.matches("[tools.").count(), 3, "{config}");
    }

    #[test]
    fn a_clean_listing_has_nothing_worse_than_notes() {
        let r = report(json!([
            {"name": "read_graph", "annotations": {"readOnlyHint": true}},
            {"name": "create_entities", "annotations": {"readOnlyHint": false, "destructiveHint": false}},
            {"name": "odd name!", "annotations": {"readOnlyHint": true}},
        ]));
        assert_eq!(r.worst(), None);
        let config = starting_config(&r);
        assert!(config.contains("[tools.\"odd name!\"]"), "{config}");
        assert!(config.contains("#   create_entities\n"), "{config}");
        crate::Config::parse(&config).unwrap();
    }

    #[test]
    fn a_commerce_bindings_tools_get_its_profile() {
        let acp = report(json!([
            {"name": "create_checkout_session"},
            {"name": "get_checkout_session"},
            {"name": "complete_checkout_session"},
        ]));
        let config = starting_config(&acp);
        assert!(config.contains("\nprofile = \"acp\"\n"), "{config}");
        assert!(
            config.contains("#   create_checkout_session, complete_checkout_session\n"),
            "the binding's read is not listed as a write: {config}"
        );
        let parsed = crate::Config::parse(&config).unwrap();
        assert_eq!(parsed.profile, Some(crate::Profile::Acp));
        let ucp = report(json!([{"name": "complete_checkout"}, {"name": "cancel_cart"}]));
        let parsed = crate::Config::parse(&starting_config(&ucp)).unwrap();
        assert_eq!(parsed.profile, Some(crate::Profile::Ucp));
        // One tool of a name is not a binding.
        let lone = report(json!([{"name": "complete_checkout"}, {"name": "send_mail"}]));
        assert!(!starting_config(&lone).contains("profile ="));
    }
}
