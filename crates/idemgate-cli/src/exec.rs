//! `idemgate exec`: run a command at most once per key.

use std::io::Write as _;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Result;
use idemgate::{
    Answer, Call, Decision, Effect, EngineError, Fingerprint, KeyRule, Outcome, Recording,
    ToolPolicy, UnknownPolicy,
};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::args::ExecArgs;
use crate::exit;
use crate::outcome::CommandOutcome;
use crate::Context;

pub(crate) async fn run(ctx: &Context, args: &ExecArgs) -> Result<u8> {
    let key = ctx.key(&args.tool, &args.key)?;
    // Outcomes an earlier run could not record go in first, so this call sees them.
    let _ = ctx.engine.flush_journal().await;

    let policy = ToolPolicy {
        ttl: args.ttl,
        lease: args.lease,
        wait: args.wait,
        on_unknown: if args.on_unknown == "retry" {
            UnknownPolicy::Retry
        } else {
            UnknownPolicy::Block
        },
        ..ToolPolicy::default()
    };
    // The command line is the call's arguments; as canonical JSON so that the fingerprint is the
    // same one every front door would compute for the same argv.
    let argv = serde_json::json!({ "argv": args.command });
    let call = Call::new(key.tenant.clone(), key.tool.clone())
        .key(key.key.clone())
        .fingerprint(Fingerprint::of_json(&argv));
    let stream = !ctx.json;
    let answer = ctx
        .engine
        .call_with_policy(call, &policy, || {
            run_command(&args.command, &args.not_applied, stream)
        })
        .await;
    report(ctx, args, answer)
}

/// Runs the command, passing its output through live (unless `--json`) while keeping a copy.
async fn run_command(argv: &[String], not_applied: &[i32], stream: bool) -> Effect {
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        // Nothing ran: release the key so that a corrected retry can run.
        Err(e) => return Effect::NotApplied(format!("failed to start {:?}: {e}", argv[0])),
    };
    let out = child
        .stdout
        .take()
        .map(|o| tee(o, tokio::io::stdout(), stream));
    let err = child
        .stderr
        .take()
        .map(|e| tee(e, tokio::io::stderr(), stream));
    let (status, stdout, stderr) = tokio::join!(
        child.wait(),
        async {
            match out {
                Some(f) => f.await,
                None => Vec::new(),
            }
        },
        async {
            match err {
                Some(f) => f.await,
                None => Vec::new(),
            }
        },
    );
    let status = match status {
        Ok(s) => s,
        Err(e) => return Effect::Ambiguous(format!("failed to wait for the command: {e}")),
    };
    let Some(code) = status.code() else {
        // Killed by a signal: it may have done part or all of its work.
        return Effect::Ambiguous(format!("the command was stopped by a signal ({status})"));
    };
    if not_applied.contains(&code) {
        return Effect::NotApplied(format!(
            "the command exited with {code}, which says it did nothing"
        ));
    }
    let body = CommandOutcome {
        exit_code: code,
        stdout,
        stderr,
    }
    .encode();
    if code == 0 {
        Effect::Success(body)
    } else {
        Effect::Failed(body)
    }
}

/// Copies `from` to `to` (when `stream`) and returns everything read.
async fn tee(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    stream: bool,
) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if stream {
                    // A closed terminal must not stop the command or lose the stored copy.
                    let _ = to.write_all(&buf[..n]).await;
                    let _ = to.flush().await;
                }
            }
        }
    }
    kept
}

fn report(ctx: &Context, args: &ExecArgs, answer: Result<Answer, EngineError>) -> Result<u8> {
    let key_text = format!("{} (tool {})", args.key, args.tool);
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            let code = match e {
                EngineError::KeyReuse { .. } => exit::KEY_REUSE,
                EngineError::ReserveFailed(_) => exit::STORE_UNAVAILABLE,
                _ => exit::FAILURE,
            };
            if ctx.json {
                let v = serde_json::json!({ "decision": "error", "error": e.to_string(), "exit_code": code });
                println!("{v}");
            } else {
                eprintln!("idemgate: {e}");
            }
            return Ok(code);
        }
    };
    let mut fields = serde_json::Map::new();
    let code = match &answer.decision {
        Decision::Executed {
            outcome, recording, ..
        } => {
            let cmd = decode(outcome)?;
            cmd.json_fields(&mut fields);
            match recording {
                Recording::Stored => {}
                Recording::Journaled => warn(ctx, "the store did not confirm the outcome; it is journaled and will be stored on the next run"),
                Recording::LeaseLost => warn(ctx, "the command outlived its lease and another run took the key over; this outcome was not stored"),
                Recording::Unrecorded(why) => warn(ctx, &format!("the outcome could not be recorded ({why}); the key will read as unknown until resolved")),
            }
            cmd.status()
        }
        Decision::Replayed {
            outcome,
            executed_at,
            expires_at,
            verified: _,
        } => {
            let cmd = decode(outcome)?;
            cmd.json_fields(&mut fields);
            if !ctx.json {
                std::io::stdout().write_all(&cmd.stdout)?;
                std::io::stderr().write_all(&cmd.stderr)?;
                if !args.quiet {
                    let rule = match answer.rule {
                        Some(KeyRule::Fallback) => "fallback window",
                        _ => "key",
                    };
                    eprintln!(
                        "idemgate: replayed the outcome of {key_text} by {rule}: the command ran at {executed_at}, not now (kept until {expires_at})"
                    );
                }
            }
            cmd.status()
        }
        Decision::NotApplied { message, .. } => {
            if !ctx.json {
                eprintln!("idemgate: {message}; nothing ran and the key {key_text} is free again");
            }
            exit::NOT_STARTED
        }
        Decision::InFlight { since, retry_after } => {
            if !ctx.json {
                eprintln!(
                    "idemgate: {key_text} is being run by another process since {since}; try again in {}",
                    humantime::format_duration(round_secs(*retry_after))
                );
            }
            fields.insert("retry_after_secs".into(), retry_after.as_secs().into());
            exit::IN_FLIGHT
        }
        Decision::Unknown {
            since,
            fence,
            ran_here,
            message,
        } => {
            if !ctx.json {
                let why = match (ran_here, message) {
                    (_, Some(m)) => m.clone(),
                    (false, None) => "an earlier run stopped before recording its outcome".into(),
                    (true, None) => "the command's outcome is ambiguous".into(),
                };
                eprintln!(
                    "idemgate: the outcome of {key_text} is unknown since {since}: {why}.\n\
                     It was not run again. Check whether it took effect, then record what happened:\n  \
                     idemgate keys resolve {} --tool {} --fence {fence} --completed [--exit-code N]   # it did\n  \
                     idemgate keys resolve {} --tool {} --fence {fence} --release                     # it did not",
                    args.key, args.tool, args.key, args.tool
                );
            }
            exit::UNKNOWN
        }
        Decision::PassedThrough { .. } => 0,
        _ => exit::FAILURE,
    };
    if ctx.json {
        let mut v = serde_json::to_value(&answer)?;
        if let Some(obj) = v.as_object_mut() {
            obj.remove("outcome");
            obj.extend(fields);
        }
        println!("{v}");
    }
    Ok(code)
}

fn decode(outcome: &Outcome) -> Result<CommandOutcome> {
    CommandOutcome::decode(&outcome.body)
}

fn warn(ctx: &Context, msg: &str) {
    if !ctx.json {
        eprintln!("idemgate: warning: {msg}");
    }
}

fn round_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs().max(1))
}
