//! `idemgate exec`: run a command at most once per key.

use std::process::Stdio;

use anyhow::Result;
use idemgate::{
    Answer, Call, Decision, Effect, EngineError, Fingerprint, Recording, ToolPolicy, UnknownPolicy,
    Verdict,
};
use idemgate_kit::{exit, Explanation, Payload, VerdictCodes};
use idemgate_trace::TraceContext;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tracing::Instrument as _;

use crate::args::ExecArgs;
use crate::{out, Context};

pub(crate) async fn run(ctx: &Context, args: &ExecArgs) -> Result<u8> {
    let key = ctx.key(&args.tool, &args.key)?;
    // Exported when the OTEL_* variables ask; dropped (and so sent) when this call is done.
    let traces = idemgate_trace::install("idemgate")?;
    // Outcomes an earlier run could not record go in first, so this call sees them.
    let _ = ctx.engine.flush_journal().await;

    let policy = ToolPolicy {
        ttl: args.ttl,
        tombstone: args.tombstone,
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
    let mut started = false;
    // The caller's trace, as the environment carries it to a command (`TRACEPARENT`).
    let caller = TraceContext::parse(
        &std::env::var("TRACEPARENT").unwrap_or_default(),
        std::env::var("TRACESTATE").ok().as_deref(),
    );
    let span = idemgate_trace::call_span(
        idemgate_trace::Door::Exec,
        key.tenant.as_str(),
        key.tool.as_str(),
        None,
        caller.as_ref(),
    );
    let answer = ctx
        .engine
        .call_with_policy(call, &policy, || {
            run_command(
                &args.command,
                &args.not_applied,
                stream,
                &mut started,
                caller.as_ref(),
            )
        })
        .instrument(span.clone())
        .await;
    idemgate_trace::record(&span, &answer);
    drop(span);
    drop(traces);
    report(ctx, args, &policy, answer, started)
}

/// Runs the command, passing its output through live (unless `--json`) while keeping a copy.
/// SIGTERM and SIGINT sent to idemgate are passed on to the command, and its outcome is recorded
/// as usual once it exits: a command that exits on its own after the signal is recorded with its
/// exit code, one that the signal kills has an unknown outcome.
async fn run_command(
    argv: &[String],
    not_applied: &[i32],
    stream: bool,
    started: &mut bool,
    caller: Option<&TraceContext>,
) -> Effect {
    let mut cmd = tokio::process::Command::new(&argv[0]);
    // Inside the engine's `idemgate.effect`: the command's own spans are its children.
    if let Some(trace) = idemgate_trace::outgoing(caller) {
        cmd.env("TRACEPARENT", trace.traceparent());
        match trace.tracestate() {
            Some(state) => cmd.env("TRACESTATE", state),
            None => cmd.env_remove("TRACESTATE"),
        };
    }
    cmd.args(&argv[1..])
        .stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        // Nothing ran: release the key so that a corrected retry can run.
        Err(e) => return Effect::not_applied(format!("failed to start {:?}: {e}", argv[0])),
    };
    *started = true;
    let pid = child.id();
    let out = child
        .stdout
        .take()
        .map(|o| tee(o, tokio::io::stdout(), stream));
    let err = child
        .stderr
        .take()
        .map(|e| tee(e, tokio::io::stderr(), stream));
    let finished = async {
        tokio::join!(
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
        )
    };
    let (status, stdout, stderr) = forward_signals(pid, finished).await;
    let status = match status {
        Ok(s) => s,
        Err(e) => return Effect::Ambiguous(format!("failed to wait for the command: {e}")),
    };
    let Some(code) = status.code() else {
        // Killed by a signal: it may have done part or all of its work.
        return Effect::Ambiguous(format!("the command was stopped by a signal ({status})"));
    };
    if not_applied.contains(&code) {
        return Effect::not_applied(format!(
            "the command exited with {code}, which says it did nothing"
        ));
    }
    let body = Payload::Command {
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

/// Drives `finished` (the command and its output) to its end, passing SIGTERM and SIGINT that
/// reach idemgate on to the command meanwhile: idemgate stays to record what the command did.
#[cfg(unix)]
async fn forward_signals<T>(pid: Option<u32>, finished: impl std::future::Future<Output = T>) -> T {
    use tokio::signal::unix::{signal, SignalKind};
    let mut finished = std::pin::pin!(finished);
    let (Ok(mut term), Ok(mut int), Some(pid)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        pid.and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 0),
    ) else {
        return finished.await;
    };
    // Our own child's pid, positive and still ours until we reap it below: never a group or -1.
    let child = nix::unistd::Pid::from_raw(pid);
    loop {
        let sig = tokio::select! {
            done = &mut finished => return done,
            _ = term.recv() => nix::sys::signal::Signal::SIGTERM,
            _ = int.recv() => nix::sys::signal::Signal::SIGINT,
        };
        let _ = nix::sys::signal::kill(child, sig);
    }
}

/// Drives `finished` (the command and its output) to its end. A console's Ctrl-C and Ctrl-Break
/// reach every process attached to it, the command included, so there is nothing to pass on:
/// idemgate only keeps them from ending itself, and stays to record what the command did.
#[cfg(windows)]
async fn forward_signals<T>(
    _pid: Option<u32>,
    finished: impl std::future::Future<Output = T>,
) -> T {
    let mut finished = std::pin::pin!(finished);
    loop {
        tokio::select! {
            done = &mut finished => return done,
            heard = tokio::signal::ctrl_c() => {
                if heard.is_err() {
                    return finished.await;
                }
            }
        }
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

/// Tells the user what happened and picks the exit code: the command's own on execution and
/// replay, else the [`Verdict`]'s.
fn report(
    ctx: &Context,
    args: &ExecArgs,
    policy: &ToolPolicy,
    answer: Result<Answer, EngineError>,
    started: bool,
) -> Result<u8> {
    let verdict = Verdict::of(&answer);
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            let code = verdict.exit_code().unwrap_or(exit::FAILURE);
            let told = crate::refusal_text(&e);
            if ctx.json {
                let v =
                    serde_json::json!({ "decision": "error", "error": told, "exit_code": code });
                out::line(format_args!("{v}"));
            } else {
                eprintln!("idemgate: {told}");
            }
            return Ok(code);
        }
    };
    let mut fields = serde_json::Map::new();
    // A replay of an operator's resolution: stored at the time it was made, when nothing ran.
    let resolved = matches!(&answer.decision, Decision::Replayed { outcome, .. } if Payload::is_resolution(outcome));
    if resolved {
        fields.insert("resolved_by".into(), "operator".into());
    }
    let mut code = match verdict {
        // Nothing ran at all: the program could not be started.
        Verdict::NotApplied if !started => Some(exit::NOT_STARTED),
        _ => verdict.exit_code(),
    };
    if let Some(outcome) = answer.outcome() {
        let (exit_code, stdout, stderr) = Payload::of(&outcome)?.to_command(outcome.kind);
        let view = Payload::Command {
            exit_code,
            stdout: stdout.clone(),
            stderr: stderr.clone(),
        }
        .to_json();
        if let Ok(serde_json::Value::Object(view)) = serde_json::from_str(view.get()) {
            fields.extend(view);
        }
        code = code.or(Some(u8::try_from(exit_code.rem_euclid(256)).unwrap_or(1)));
        if !ctx.json && matches!(answer.decision, Decision::Replayed { .. }) {
            out::bytes(&stdout);
            let _ = std::io::Write::write_all(&mut std::io::stderr(), &stderr);
        }
    }
    if !ctx.json {
        tell(args, policy, &answer);
    }
    if let Decision::InFlight { retry_after, .. } = &answer.decision {
        fields.insert("retry_after_secs".into(), retry_after.as_secs().into());
    }
    let code = code.unwrap_or(0);
    if ctx.json {
        let mut v = serde_json::to_value(&answer)?;
        if let Some(obj) = v.as_object_mut() {
            obj.remove("outcome");
            obj.remove("reply");
            obj.insert("exit_code".into(), code.into());
            obj.extend(fields);
        }
        out::line(format_args!("{v}"));
    }
    Ok(code)
}

/// The line on stderr that says what happened, in the words of the kit's [`Explanation`]; none
/// for executions that went as planned, nor for replays under `--quiet`.
fn tell(args: &ExecArgs, policy: &ToolPolicy, answer: &Answer) {
    let as_planned = match &answer.decision {
        Decision::Executed { recording, .. } => *recording == Recording::Stored,
        Decision::PassedThrough { .. } => true,
        Decision::Replayed { .. } => args.quiet,
        Decision::NotApplied { .. }
        | Decision::InFlight { .. }
        | Decision::Unknown { .. }
        | Decision::Expired { .. } => false,
    };
    if as_planned {
        return;
    }
    let (record, resolve) = answer.key.as_ref().map(crate::names).unwrap_or_default();
    let explanation = Explanation::of_answer(answer)
        .retried_when_unknown(policy.on_unknown == UnknownPolicy::Retry);
    eprintln!(
        "idemgate: {}",
        explanation.for_person(&crate::door(&record, &resolve))
    );
}
