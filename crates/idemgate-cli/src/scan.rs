//! `idemgate scan`: the duplicate side effects in trace files (idemgate-scan does the finding).

use std::io::Read as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use idemgate::{ListCursor, ListFilter, Record, Store as _, ToolKind};
use idemgate_kit::exit;
use idemgate_mcp::Config;
use idemgate_scan::report::{self, Inputs};
use idemgate_scan::Rules;

use crate::args::{Cli, ScanArgs};
use crate::{out, Context};

/// Reads the files (and the records), finds the repeats, prints the report; exit 1 when a
/// repeat ran.
pub(crate) async fn run(cli: &Cli, args: &ScanArgs) -> Result<u8> {
    let config = match &args.config {
        Some(path) => match Config::load(path) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("idemgate: scan: {e}");
                return Ok(exit::USAGE);
            }
        },
        None => None,
    };
    let reads = args.read.clone();
    let config = config.map(std::sync::Arc::new);
    // The configuration's identity fields, tool by tool, where the command line gives none.
    let for_identity = config.clone();
    let identity_of = move |tool: &str| {
        for_identity
            .as_ref()
            .map(|c| c.policy(bare(tool), None).identity)
            .filter(|fields| !fields.is_empty())
    };
    let mut rules = Rules {
        window: args.window,
        is_read: Box::new(move |tool| {
            reads.iter().any(|r| r == tool || r == bare(tool))
                || config.as_ref().is_some_and(|c| {
                    // What the proxy would do with the tool, annotations unknown: a read, or a
                    // write whose repeats are harmless, is no side effect to report.
                    c.policy(bare(tool), None).kind != ToolKind::Write
                })
        }),
        identity: args.identity.iter().cloned().collect(),
        ..Rules::default()
    };
    let mut inputs = Inputs::default();
    let mut spans = Vec::new();
    for path in &args.files {
        let name = path.display().to_string();
        let bytes = match read_input(path) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("idemgate: scan: {name}: {e:#}");
                return Ok(exit::NO_INPUT);
            }
        };
        match idemgate_scan::read(&bytes, &name) {
            Ok(read) if read.spans.is_empty() && read.skipped.is_empty() => {
                eprintln!("idemgate: scan: {name}: holds no trace (it is empty)");
                return Ok(exit::NO_INPUT);
            }
            Ok(read) => {
                inputs.spans += read.spans.len();
                spans.extend(read.spans);
                inputs.skipped.extend(read.skipped);
            }
            Err(e) => {
                eprintln!("idemgate: scan: {e}");
                return Ok(exit::NO_INPUT);
            }
        }
        inputs.files.push(name);
    }
    let mut calls = idemgate_scan::calls(&spans, &rules);
    if args.records {
        let ctx = match Context::open(cli, "local").await? {
            Ok(ctx) => ctx,
            Err(code) => return Ok(code),
        };
        let records = match all_records(&ctx).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("idemgate: scan: failed to read the records: {e:#}");
                return Ok(exit::STORE_UNAVAILABLE);
            }
        };
        inputs.records = Some(records.len());
        calls.extend(idemgate_scan::record_calls(&records, &rules));
    }
    for call in &calls {
        if !rules.identity.contains_key(&call.tool) {
            if let Some(fields) = identity_of(&call.tool) {
                rules.identity.insert(call.tool.clone(), fields);
            }
        }
    }
    let scan = idemgate_scan::scan(calls, &rules);
    if let Some(path) = &args.html {
        if let Err(e) = std::fs::write(path, report::html(&scan, &inputs)) {
            eprintln!("idemgate: scan: failed to write {}: {e}", path.display());
            return Ok(exit::CANNOT_CREATE);
        }
    }
    if cli.json {
        out::stream(|w| {
            report::write_json(&scan, &inputs, &mut *w)?;
            w.write_all(b"\n")
        });
    } else {
        out::bytes(report::text(&scan, &inputs).as_bytes());
    }
    Ok(if scan.fails() {
        exit::DUPLICATES_FOUND
    } else {
        0
    })
}

/// Every record of the store (one tenant's when --tenant is given), page by page, saying on
/// stderr how far it got when there are many.
async fn all_records(ctx: &Context) -> Result<Vec<Record>> {
    const PAGE: usize = 10_000;
    let mut filter = ListFilter {
        tenant: ctx.tenant_given.then(|| ctx.tenant.clone()),
        limit: PAGE,
        ..ListFilter::default()
    };
    let mut records: Vec<Record> = Vec::new();
    loop {
        let page = ctx.store().list(&filter).await?;
        let full = page.len() == PAGE;
        records.extend(page);
        if !full {
            break;
        }
        filter.after = records.last().map(ListCursor::of);
        if records.len().is_multiple_of(100_000) {
            eprintln!("idemgate: scan: {} records read", records.len());
        }
    }
    Ok(records)
}

/// A tool's name as its server gives it: a record of the MCP proxy names it `<server>/<tool>`.
fn bare(tool: &str) -> &str {
    tool.rsplit_once('/').map_or(tool, |(_, t)| t)
}

fn read_input(path: &Path) -> Result<Vec<u8>> {
    if path == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("failed to read stdin")?;
        return Ok(bytes);
    }
    std::fs::read(path).context("failed to read the file")
}
