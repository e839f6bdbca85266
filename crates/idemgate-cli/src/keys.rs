//! `idemgate keys`: the operator's view of records.

use anyhow::{bail, Context as _, Result};
use idemgate::{
    EngineError, ListFilter, Outcome, Record, RecordState, Resolution, State, Store as _, ToolName,
};

use crate::args::{KeysCommand, ResolveArgs};
use crate::outcome::CommandOutcome;
use crate::{exit, Context};

pub(crate) async fn run(ctx: &Context, cmd: &KeysCommand) -> Result<u8> {
    match cmd {
        KeysCommand::List {
            state,
            tool,
            all_tenants,
            limit,
        } => {
            let filter = ListFilter {
                tenant: (!all_tenants).then(|| ctx.tenant.clone()),
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
                limit: *limit,
            };
            let records = ctx.store().list(&filter).await?;
            if ctx.json {
                let rows: Vec<_> = records.iter().map(record_json).collect();
                println!("{}", serde_json::Value::Array(rows));
            } else if records.is_empty() {
                eprintln!("no records");
            } else {
                println!(
                    "{:<10} {:<16} {:<24} {:>5}  {:<24}  DETAIL",
                    "STATE", "TOOL", "KEY", "FENCE", "CREATED"
                );
                for r in &records {
                    println!(
                        "{:<10} {:<16} {:<24} {:>5}  {:<24}  {}",
                        r.state_name().to_string(),
                        r.key.tool.as_str(),
                        r.key.key.as_str(),
                        r.fence,
                        r.created_at.to_string(),
                        detail(r)
                    );
                }
            }
            Ok(0)
        }
        KeysCommand::Show { key, tool } => {
            let key = ctx.key(tool, key)?;
            let Some(record) = ctx.store().get(&key).await? else {
                if ctx.json {
                    println!("null");
                } else {
                    eprintln!(
                        "no record for key {} (tool {}, tenant {})",
                        key.key, key.tool, key.tenant
                    );
                }
                return Ok(exit::FAILURE);
            };
            if ctx.json {
                println!("{}", record_json(&record));
            } else {
                print_record(&record);
            }
            Ok(0)
        }
        KeysCommand::Resolve(args) => resolve(ctx, args).await,
        KeysCommand::Purge { expired } => {
            if !expired {
                bail!("refusing to purge without --expired");
            }
            let n = ctx.engine.purge_expired().await?;
            if ctx.json {
                println!("{}", serde_json::json!({ "purged": n }));
            } else {
                println!("purged {n} expired record(s)");
            }
            Ok(0)
        }
    }
}

async fn resolve(ctx: &Context, args: &ResolveArgs) -> Result<u8> {
    let key = ctx.key(&args.tool, &args.key)?;
    let fence = match args.fence {
        Some(f) => f,
        None => match ctx.store().get(&key).await? {
            Some(r) => r.fence,
            None => bail!("no record for key {} (tool {})", key.key, key.tool),
        },
    };
    let resolution = if args.completed {
        let body = CommandOutcome {
            exit_code: args.exit_code,
            stdout: args.stdout.clone().into_bytes(),
            stderr: Vec::new(),
        }
        .encode();
        let outcome = if args.exit_code == 0 {
            Outcome::success(body)
        } else {
            Outcome::failed(body)
        };
        Resolution::Completed {
            outcome,
            ttl: args.ttl,
        }
    } else {
        Resolution::Release
    };
    match ctx.engine.resolve(&key, fence, resolution).await {
        Ok(after) => {
            if ctx.json {
                println!(
                    "{}",
                    after.as_ref().map_or(serde_json::Value::Null, record_json)
                );
            } else if let Some(r) = after {
                println!("resolved: {} is now {}", key.key, r.state_name());
            } else {
                println!(
                    "released: the next call with key {} runs the command",
                    key.key
                );
            }
            Ok(0)
        }
        Err(e @ (EngineError::NotResolvable { .. } | EngineError::NotFound { .. })) => {
            eprintln!("idemgate: {e}");
            Ok(exit::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

fn detail(r: &Record) -> String {
    match &r.state {
        RecordState::InFlight { lease_until } => format!("lease until {lease_until}"),
        RecordState::Completed {
            outcome,
            completed_at,
            expires_at,
        } => {
            let exit = CommandOutcome::decode(&outcome.body)
                .map(|c| format!("exit {}", c.exit_code))
                .unwrap_or_else(|_| format!("{} bytes", outcome.body.len()));
            format!(
                "{} ({exit}) at {completed_at}, kept until {expires_at}",
                outcome.kind
            )
        }
        RecordState::Unknown { since } => {
            format!("since {since}: resolve with `idemgate keys resolve`")
        }
    }
}

fn print_record(r: &Record) {
    println!("key:          {}", r.key.key);
    println!("tool:         {}", r.key.tool);
    println!("tenant:       {}", r.key.tenant);
    println!("state:        {}", r.state_name());
    println!("fence:        {}", r.fence);
    println!("fingerprint:  {}", r.fingerprint);
    println!("created:      {}", r.created_at);
    match &r.state {
        RecordState::InFlight { lease_until } => println!("lease until:  {lease_until}"),
        RecordState::Unknown { since } => {
            println!("unknown since: {since}");
            println!(
                "resolve with: idemgate keys resolve {} --tool {} --fence {} (--completed [--exit-code N] | --release)",
                r.key.key, r.key.tool, r.fence
            );
        }
        RecordState::Completed {
            outcome,
            completed_at,
            expires_at,
        } => {
            println!("outcome:      {}", outcome.kind);
            println!("completed:    {completed_at}");
            println!("kept until:   {expires_at}");
            match CommandOutcome::decode(&outcome.body) {
                Ok(c) => {
                    println!("exit code:    {}", c.exit_code);
                    println!(
                        "stdout:       {}",
                        String::from_utf8_lossy(&c.stdout).trim_end()
                    );
                    println!(
                        "stderr:       {}",
                        String::from_utf8_lossy(&c.stderr).trim_end()
                    );
                }
                Err(_) => println!("body:         {} bytes", outcome.body.len()),
            }
        }
    }
}

fn record_json(r: &Record) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if let (Some(obj), RecordState::Completed { outcome, .. }) = (v.as_object_mut(), &r.state) {
        obj.remove("outcome");
        obj.insert("outcome_kind".into(), outcome.kind.to_string().into());
        if let Ok(c) = CommandOutcome::decode(&outcome.body) {
            c.json_fields(obj);
        }
    }
    v
}
