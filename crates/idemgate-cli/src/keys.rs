//! `idemgate keys`: the operator's view of records, whichever front door wrote them.

use anyhow::{bail, Context as _, Result};
use idemgate::{
    EngineError, HistoryEntry, Keep, Key, ListCursor, ListFilter, OutcomeKind, Record, RecordState,
    Resolution, State, Store as _, Timestamp, ToolName,
};
use idemgate_kit::{story, Payload, EXEC_TOOL};

use crate::args::{KeysCommand, ReopenArgs, ResolveArgs};
use crate::{exit, out, Context};

pub(crate) async fn run(ctx: &Context, cmd: &KeysCommand) -> Result<u8> {
    match cmd {
        KeysCommand::List {
            state,
            tool,
            scope,
            key_prefix,
            created_from,
            created_before,
            all_tenants,
            limit,
            cursor,
            all,
            observed,
        } => {
            let time = |flag: &str, t: &Option<String>| -> Result<Option<Timestamp>> {
                t.as_deref()
                    .map(str::parse::<Timestamp>)
                    .transpose()
                    .map_err(|e| anyhow::anyhow!("invalid {flag}: {e}"))
            };
            let filter = ListFilter {
                // Without --tenant the operator sees every tenant: the gateway's records live
                // under its tenants ("default" without a config file), exec's under "local".
                tenant: (ctx.tenant_given && !all_tenants).then(|| ctx.tenant.clone()),
                tool: tool
                    .as_deref()
                    .map(ToolName::new)
                    .transpose()
                    .context("invalid --tool")?,
                state: state
                    .as_deref()
                    .map(str::parse::<State>)
                    .transpose()
                    .map_err(anyhow::Error::msg)?,
                scope: scope.as_deref().map(Into::into),
                key_prefix: key_prefix.as_deref().map(Into::into),
                created_from: time("--created-from", created_from)?,
                created_before: time("--created-before", created_before)?,
                after: cursor
                    .as_deref()
                    .map(str::parse::<ListCursor>)
                    .transpose()
                    .map_err(|e| anyhow::anyhow!("invalid --cursor: {e}"))?,
                limit: *limit,
            };
            list(ctx, filter, *all, *observed).await
        }
        KeysCommand::Show { key, tool } => {
            let Some(record) = find(ctx, key, tool.as_deref()).await? else {
                // A record released or reopened by an operator counts as absent but keeps its
                // history until a purge: shown when the record is named in full.
                let history = match (ctx.tenant_given, tool.as_deref()) {
                    (true, Some(tool)) => {
                        let name = Key::new(
                            ctx.tenant.clone(),
                            ToolName::new(tool).context("invalid --tool")?,
                            idemgate::IdempotencyKey::new(key.as_str()).context("invalid key")?,
                        );
                        ctx.store().history(&name).await?
                    }
                    _ => Vec::new(),
                };
                let steps = story::story(None, &history);
                if ctx.json {
                    match steps.is_empty() {
                        true => out::line(format_args!("null")),
                        false => out::line(format_args!(
                            "{}",
                            serde_json::json!({ "record": null, "history": steps })
                        )),
                    }
                } else {
                    eprintln!("no record for key {key}{}", scope(ctx, tool.as_deref()));
                    if !steps.is_empty() {
                        eprintln!(
                            "it counts as absent now (the next call runs the action); its history:"
                        );
                        print_steps(&steps, true);
                    }
                }
                return Ok(exit::FAILURE);
            };
            let history = ctx.store().history(&record.key).await?;
            if ctx.json {
                out::line(format_args!("{}", record_json(&record, Some(&history))));
            } else {
                print_record(&record, &history);
            }
            Ok(0)
        }
        KeysCommand::Resolve(args) => resolve(ctx, args).await,
        KeysCommand::Reopen(args) => reopen(ctx, args).await,
        KeysCommand::Purge { expired } => {
            if !expired {
                bail!("refusing to purge without --expired");
            }
            let n = ctx.engine.purge_expired().await?;
            if ctx.json {
                out::line(format_args!("{}", serde_json::json!({ "purged": n })));
            } else {
                // A reopened record's time is up at once, so it goes with the expired ones; the
                // store's count does not tell them apart, and calling them all expired told an
                // operator who had only reopened records that something had expired.
                out::line(format_args!(
                    "purged {n} record(s) whose time is up: expired past their tombstone, or reopened"
                ));
            }
            Ok(0)
        }
    }
}

/// `keys list`: one page of `filter` (or every page from it, with `all`), as a table or a JSON
/// array, and how to get the page after when there is one.
async fn list(ctx: &Context, mut filter: ListFilter, all: bool, observed: bool) -> Result<u8> {
    let page = filter.limit;
    // Observations are in the records' histories, which no store filters on: every page is
    // read, and only the records with some are printed.
    let all = all || observed;
    let mut printed = 0usize;
    // The widths of the table's name columns (state, tenant, tool, key): as wide as their longest
    // name so far (up to 64), so that long MCP tool names never push a row out of line; a
    // later page with longer names widens them from there on.
    let mut widths = [10usize, 12, 16, 24];
    if ctx.json {
        // One array however many pages it takes, written as they come.
        out::bytes(b"[");
    }
    let next = loop {
        // One more than the page, to know whether another follows without asking for it.
        let asked = ListFilter {
            limit: if page > 0 { page + 1 } else { 0 },
            ..filter.clone()
        };
        let mut records = ctx.store().list(&asked).await?;
        let more = page > 0 && records.len() > page;
        records.truncate(if page > 0 { page } else { records.len() });
        let last = records.last().map(ListCursor::of);
        let mut seen = Vec::new();
        if observed {
            (records, seen) = idemgate_kit::records::observed(&ctx.engine, records)
                .await?
                .into_iter()
                .unzip();
        }
        for r in &records {
            let names = [
                r.state_name().to_string().len(),
                r.key.tenant.as_str().chars().count(),
                r.key.tool.as_str().chars().count(),
                r.key.key.as_str().chars().count(),
            ];
            for (w, n) in widths.iter_mut().zip(names) {
                *w = (*w).max(n.min(64));
            }
        }
        let [ws, wn, wt, wk] = widths;
        for (i, r) in records.iter().enumerate() {
            let observed = seen.get(i);
            if ctx.json {
                let sep = if printed == 0 { "" } else { "," };
                let mut line = record_json(r, None);
                if let Some(o) = observed {
                    // The record's object, one member more.
                    line.pop();
                    line.push_str(&format!(",\"observed\":{}}}", serde_json::json!(o)));
                }
                out::bytes(format!("{sep}{line}").as_bytes());
            } else {
                if printed == 0 {
                    out::line(format_args!(
                        "{:<ws$} {:<wn$} {:<wt$} {:<wk$} {:>5}  {:<24}  DETAIL",
                        "STATE", "TENANT", "TOOL", "KEY", "FENCE", "CREATED"
                    ));
                }
                out::line(format_args!(
                    "{:<ws$} {:<wn$} {:<wt$} {:<wk$} {:>5}  {:<24}  {}",
                    r.state_name().to_string(),
                    r.key.tenant.as_str(),
                    r.key.tool.as_str(),
                    r.key.key.as_str(),
                    r.fence,
                    r.created_at.to_string(),
                    match observed {
                        Some(o) => format!("{}; observe mode: {o}", detail(r)),
                        None => detail(r),
                    }
                ));
            }
            printed += 1;
        }
        let next = more.then_some(last).flatten();
        match next {
            Some(cursor) if all => filter.after = Some(cursor),
            next => break next,
        }
    };
    if ctx.json {
        out::line(format_args!("]"));
    } else if printed == 0 && observed {
        eprintln!("no record holds an observation: observe mode ran no call that enforce mode would have answered without running");
    } else if printed == 0 {
        eprintln!("no records");
    }
    if let Some(cursor) = next {
        // On stderr, so that the page on stdout stays a table or a JSON array.
        eprintln!(
            "more records follow; the next page: {}\n(or --all for every page)",
            next_page_command(&cursor.to_string())
        );
    }
    Ok(0)
}

/// This command line again with `--cursor` set to `cursor`, quoted for a POSIX shell, for the
/// operator to run for the next page.
fn next_page_command(cursor: &str) -> String {
    let mut words = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--cursor" {
            args.next();
        } else if arg == "--store" {
            words.push(arg);
            if let Some(url) = args.next() {
                words.push(shell_word(&without_password(&url)));
            }
        } else if let Some(url) = arg.strip_prefix("--store=") {
            words.push(shell_word(&format!("--store={}", without_password(url))));
        } else if !arg.starts_with("--cursor=") {
            words.push(shell_word(&arg));
        }
    }
    words.push("--cursor".to_owned());
    words.push(shell_word(cursor));
    format!("idemgate {}", words.join(" "))
}

/// `url` with the password of its user part (`scheme://user:password@host`) written as `…`: the
/// command printed for the next page goes to a terminal or a log, which must not get it.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((user, _)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or("");
            format!("{scheme}://{name}:…@{}", &rest[user.len() + 1..])
        }
        _ => url.to_owned(),
    }
}

/// `word` as a POSIX shell reads it back: as it is when it has nothing the shell would read, else
/// in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.,:/=@%+".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// " (tool T, tenant N)" for messages, naming what the lookup was limited to.
fn scope(ctx: &Context, tool: Option<&str>) -> String {
    let mut parts = Vec::new();
    if let Some(t) = tool {
        parts.push(format!("tool {t}"));
    }
    parts.push(if ctx.tenant_given {
        format!("tenant {}", ctx.tenant)
    } else {
        "any tenant".to_owned()
    });
    format!(" ({})", parts.join(", "))
}

/// The record of `key`: under `--tenant` and `--tool` when given, else wherever exactly one
/// record has that key (an operator who copies a key from a log need not know which front door
/// or tenant wrote it). On a sealed store `key` is the caller's key or the stored name a listing
/// shows.
async fn find(ctx: &Context, key: &str, tool: Option<&str>) -> Result<Option<Record>> {
    let key = idemgate::IdempotencyKey::new(key).context("invalid key")?;
    let tool = tool
        .map(ToolName::new)
        .transpose()
        .context("invalid --tool")?;
    if let (true, Some(tool)) = (ctx.tenant_given, &tool) {
        let name = Key::new(ctx.tenant.clone(), tool.clone(), key);
        return Ok(ctx.store().get(&name).await?);
    }
    let filter = ListFilter {
        tenant: ctx.tenant_given.then(|| ctx.tenant.clone()),
        tool,
        ..ListFilter::default()
    };
    // A sealed store lists records under the HMAC of their name (`AnyStore::stored_name`): the
    // operator's key finds its record by that, and the record is shown under the key again.
    let mut found: Vec<Record> = ctx
        .store()
        .list(&filter)
        .await?
        .into_iter()
        .filter_map(|mut r| {
            let named = Key::new(r.key.tenant.clone(), r.key.tool.clone(), key.clone());
            if r.key != named && r.key != ctx.store().stored_name(&named) {
                return None;
            }
            r.key = named;
            Some(r)
        })
        .collect();
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => {
            let names: Vec<String> = found
                .iter()
                .map(|r| format!("--tenant {} --tool {}", r.key.tenant, r.key.tool))
                .collect();
            bail!(
                "key {key} has a record under several tenants or tools; name one with: {}",
                names.join(" | ")
            )
        }
    }
}

/// The record an operator settles (resolves or reopens), as [`find`]; says so when there is none.
async fn find_to_settle(ctx: &Context, key: &str, tool: Option<&str>) -> Result<Option<Record>> {
    let found = find(ctx, key, tool).await?;
    if found.is_none() {
        eprintln!("idemgate: no record for key {key}{}", scope(ctx, tool));
    }
    Ok(found)
}

async fn resolve(ctx: &Context, args: &ResolveArgs) -> Result<u8> {
    let Some(record) = find_to_settle(ctx, &args.key, args.tool.as_deref()).await? else {
        return Ok(exit::FAILURE);
    };
    let key = record.key.clone();
    let fence = args.fence.unwrap_or(record.fence);
    let resolution = if args.completed {
        let (payload, kind) = match (&args.result, args.exit_code, &args.stdout) {
            (Some(json), _, _) => (
                Payload::json_text(json).context("invalid --result")?,
                OutcomeKind::Success,
            ),
            // A command's outcome replayed to an HTTP or MCP caller is an exit code where it
            // expects its tool's result: only a record of `exec`'s own tool gets one unasked.
            (None, None, None) if key.tool.as_str() != EXEC_TOOL => {
                eprintln!(
                    "idemgate: {} (tool {}, tenant {}) is not a record of `idemgate exec` (tool {EXEC_TOOL}), so nothing was resolved: say what the action returned with --result JSON (the result its callers get replayed, as the HTTP gateway, the MCP proxy and the packages replay it), or, if `idemgate exec --tool {}` made it, its command's outcome with --exit-code N [--stdout TEXT]",
                    key.key, key.tool, key.tenant, key.tool
                );
                return Ok(exit::USAGE);
            }
            (None, exit_code, stdout) => {
                let exit_code = exit_code.unwrap_or(0);
                (
                    Payload::Command {
                        exit_code,
                        stdout: stdout.clone().unwrap_or_default().into_bytes(),
                        stderr: Vec::new(),
                    },
                    if exit_code == 0 {
                        OutcomeKind::Success
                    } else {
                        OutcomeKind::Failed
                    },
                )
            }
        };
        Resolution::Completed {
            // Marked, so that replays say an operator resolved it then, not that it ran then.
            outcome: payload.into_resolution(kind),
            keep: Keep {
                ttl: args.ttl,
                tombstone: args.tombstone,
            },
        }
    } else {
        Resolution::Release
    };
    match ctx
        .engine
        .resolve(
            &key,
            fence,
            resolution,
            operator().as_deref(),
            args.reason.as_deref(),
        )
        .await
    {
        Ok(after) => {
            if ctx.json {
                out::line(format_args!(
                    "{}",
                    after
                        .as_ref()
                        .map_or_else(|| "null".to_owned(), |r| record_json(r, None))
                ));
            } else if let Some(r) = after {
                out::line(format_args!(
                    "resolved: {} is now {}",
                    key.key,
                    r.state_name()
                ));
            } else {
                // Door-neutral: the record may be a command's, an HTTP call's or an MCP tool
                // call's, and once released nothing tells which.
                out::line(format_args!(
                    "released: the next call with key {} (tool {}, tenant {}) runs the action again",
                    key.key, key.tool, key.tenant
                ));
            }
            Ok(0)
        }
        Err(e @ (EngineError::NotResolvable { .. } | EngineError::NotFound { .. })) => {
            eprintln!("idemgate: {}", crate::refusal_text(&e));
            Ok(exit::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

/// Who runs an operator's command, for the audit log: the OS user.
fn operator() -> Option<String> {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
}

async fn reopen(ctx: &Context, args: &ReopenArgs) -> Result<u8> {
    let Some(record) = find_to_settle(ctx, &args.key, args.tool.as_deref()).await? else {
        return Ok(exit::FAILURE);
    };
    let key = record.key;
    let by = operator();
    match ctx
        .engine
        .reopen(&key, args.fence, by.as_deref(), Some(&args.reason))
        .await
    {
        Ok(was) => {
            if ctx.json {
                let said = serde_json::json!({
                    "reopened": true,
                    "tenant": key.tenant,
                    "tool": key.tool,
                    "key": key.key,
                    "fence": args.fence,
                    "was": was,
                });
                out::line(format_args!("{said}"));
            } else {
                out::line(format_args!(
                    "reopened: {} was {was}; the next call with key {} (tool {}, tenant {}) runs \
                     the action again (other processes on this store within 2 s)",
                    key.key, key.key, key.tool, key.tenant
                ));
            }
            Ok(0)
        }
        Err(e @ (EngineError::NotReopenable { .. } | EngineError::NotFound { .. })) => {
            eprintln!("idemgate: {}", crate::refusal_text(&e));
            Ok(exit::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

/// What `keys resolve --completed` needs besides for `r`: nothing for a command's record (exit 0
/// unless told), the result its callers get for any other door's.
fn completed_needs(r: &Record) -> &'static str {
    if r.key.tool.as_str() == EXEC_TOOL {
        ""
    } else {
        " --result JSON"
    }
}

fn detail(r: &Record) -> String {
    match &r.state {
        RecordState::InFlight { lease_until } => format!("lease until {lease_until}"),
        RecordState::Completed {
            outcome,
            completed_at,
            expires_at,
            ..
        } => {
            let what = match Payload::of(outcome) {
                Ok(Payload::Command { exit_code, .. }) => format!("exit {exit_code}"),
                Ok(Payload::Http { status, .. }) => format!("HTTP {status}"),
                Ok(p) => p.content().to_owned(),
                Err(_) => format!("{} bytes", outcome.body.len()),
            };
            let by = if Payload::is_resolution(outcome) {
                ", resolved by an operator"
            } else {
                ""
            };
            format!(
                "{} ({what}) at {completed_at}{by}, kept until {expires_at}",
                outcome.kind
            )
        }
        RecordState::Unknown { since } => format!(
            "since {since}: idemgate keys resolve {} --tool {} --tenant {} --fence {} (--completed{} | --release)",
            r.key.key,
            r.key.tool,
            r.key.tenant,
            r.fence,
            completed_needs(r)
        ),
        RecordState::Expired {
            completed_at,
            expired_at,
            retain_until,
        } => format!(
            "ran at {completed_at}, outcome expired at {expired_at}; retries refused until {retain_until}"
        ),
    }
}

/// The steps of a record's story, one per line (to stderr with `to_stderr`, beside a message
/// that went there).
fn print_steps(steps: &[story::Step], to_stderr: bool) {
    for s in steps {
        let fence = s.fence.map(|f| format!(" [fence {f}]")).unwrap_or_default();
        let line = format!("  {}{fence}  {}", s.at, s.text);
        match to_stderr {
            true => eprintln!("{line}"),
            false => out::line(format_args!("{line}")),
        }
    }
}

fn print_record(r: &Record, history: &[HistoryEntry]) {
    out::line(format_args!("key:          {}", r.key.key));
    out::line(format_args!("tool:         {}", r.key.tool));
    out::line(format_args!("tenant:       {}", r.key.tenant));
    out::line(format_args!("state:        {}", r.state_name()));
    out::line(format_args!("fence:        {}", r.fence));
    out::line(format_args!("fingerprint:  {}", r.fingerprint));
    out::line(format_args!("created:      {}", r.created_at));
    if let Some(scope) = &r.scope {
        out::line(format_args!("scope:        {scope}"));
    }
    out::line(format_args!(
        "downstream:   {} (the key the upstream got: search for it there)",
        story::downstream_key(&r.key)
    ));
    if let Some(reason) = story::unknown_reason(r, history) {
        out::line(format_args!("reason:       {reason}"));
    }
    print_record_state(r);
    out::line(format_args!("history:"));
    print_steps(&story::story(Some(r), history), false);
}

/// What `keys show` says of the record's state, and how to settle it.
fn print_record_state(r: &Record) {
    match &r.state {
        RecordState::InFlight { lease_until } => {
            out::line(format_args!("lease until:  {lease_until}"));
        }
        RecordState::Unknown { since } => {
            out::line(format_args!("unknown since: {since}"));
            let completed = match completed_needs(r) {
                "" => " [--exit-code N | --result JSON]",
                needs => needs,
            };
            out::line(format_args!(
                "resolve with: idemgate keys resolve {} --tool {} --tenant {} --fence {} (--completed{completed} | --release)",
                r.key.key, r.key.tool, r.key.tenant, r.fence
            ));
        }
        RecordState::Expired {
            completed_at,
            expired_at,
            retain_until,
        } => {
            out::line(format_args!("completed:    {completed_at}"));
            out::line(format_args!(
                "expired:      {expired_at} (its outcome is no longer kept)"
            ));
            out::line(format_args!(
                "remembered:   until {retain_until}: a retry is refused as expired (exit 80), not run again"
            ));
            out::line(format_args!(
                "reopen with:  idemgate keys reopen {} --tool {} --tenant {} --fence {} --reason TEXT (the next call runs the action again)",
                r.key.key, r.key.tool, r.key.tenant, r.fence
            ));
        }
        RecordState::Completed {
            outcome,
            completed_at,
            expires_at,
            retain_until,
        } => {
            out::line(format_args!("outcome:      {}", outcome.kind));
            out::line(format_args!("completed:    {completed_at}"));
            if Payload::is_resolution(outcome) {
                out::line(format_args!(
                    "resolved by:  an operator (`keys resolve`) at that time; nothing ran then"
                ));
            }
            out::line(format_args!("kept until:   {expires_at}"));
            if retain_until > expires_at {
                out::line(format_args!(
                    "remembered:   until {retain_until} (a retry after {expires_at} is refused as expired)"
                ));
            }
            out::line(format_args!(
                "reopen with:  idemgate keys reopen {} --tool {} --tenant {} --fence {} --reason TEXT (the next call runs the action again)",
                r.key.key, r.key.tool, r.key.tenant, r.fence
            ));
            match Payload::of(outcome) {
                Ok(Payload::Command {
                    exit_code,
                    stdout,
                    stderr,
                }) => {
                    out::line(format_args!("exit code:    {exit_code}"));
                    out::line(format_args!(
                        "stdout:       {}",
                        String::from_utf8_lossy(&stdout).trim_end()
                    ));
                    out::line(format_args!(
                        "stderr:       {}",
                        String::from_utf8_lossy(&stderr).trim_end()
                    ));
                }
                Ok(p) => {
                    out::line(format_args!("content:      {}", p.content()));
                    out::line(format_args!("result:       {}", p.to_json().get()));
                }
                Err(_) => out::line(format_args!("body:         {} bytes", outcome.body.len())),
            }
        }
    }
}

/// A record as JSON text. A stored result goes in as its own text (not through a JSON value), so
/// integers of any size keep their digits.
fn record_json(r: &Record, history: Option<&[HistoryEntry]>) -> String {
    #[derive(serde::Serialize)]
    struct Out<'a> {
        #[serde(flatten)]
        fields: serde_json::Map<String, serde_json::Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<&'a serde_json::value::RawValue>,
    }
    let mut fields = match serde_json::to_value(r) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    fields.insert(
        "downstream_key".into(),
        story::downstream_key(&r.key).into(),
    );
    // One record's view tells its story; a listing leaves it out (a read per record).
    if let Some(history) = history {
        if let Some(reason) = story::unknown_reason(r, history) {
            fields.insert("reason".into(), reason.into());
        }
        fields.insert(
            "history".into(),
            serde_json::to_value(story::story(Some(r), history)).unwrap_or_default(),
        );
    }
    let mut result = None;
    if let RecordState::Completed { outcome, .. } = &r.state {
        fields.remove("outcome");
        fields.insert("outcome_kind".into(), outcome.kind.to_string().into());
        if Payload::is_resolution(outcome) {
            fields.insert("resolved_by".into(), "operator".into());
        }
        if let Ok(p) = Payload::of(outcome) {
            fields.insert("content".into(), p.content().into());
            let view = p.to_json();
            match (&p, serde_json::from_str(view.get())) {
                // A command's fields (small numbers and text) sit beside the record's own.
                (Payload::Command { .. }, Ok(serde_json::Value::Object(cmd))) => fields.extend(cmd),
                _ => result = Some(view),
            }
        }
    }
    serde_json::to_string(&Out {
        fields,
        result: result.as_deref(),
    })
    .expect("a record always serializes")
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn the_next_page_command_never_repeats_a_password() {
        assert_eq!(
            without_password("postgres://idem:s3cret@db:5432/idem?sslmode=require"),
            "postgres://idem:…@db:5432/idem?sslmode=require"
        );
        assert_eq!(
            without_password("redis+sentinel://:pw@10.0.0.5,10.0.0.6/mymaster"),
            "redis+sentinel://:…@10.0.0.5,10.0.0.6/mymaster"
        );
        for kept in [
            "postgres://idem@db/idem",
            "sqlite:///var/lib/idemgate/idem.db",
            "sqlite:idem.db",
            "memory:",
        ] {
            assert_eq!(without_password(kept), kept);
        }
    }
}
