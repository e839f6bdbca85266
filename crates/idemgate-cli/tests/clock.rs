//! One process's clock set wrong, with libfaketime (Debian's `libfaketime`, which scripts/test-all
//! installs): real `exec` processes on one SQLite file, the duplicate's wall clock 10 minutes or
//! 30 s ahead of or behind the holder's. SQLite leases are judged by the host's boot clock, which
//! the shim does not move, so a live call is never taken over and a dead one is unknown on time.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, SystemTime};

use crate::cli::{lines, text, Sandbox};
use crate::mcp::wait_for;

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The shim, or a loud failure: without it these tests would prove nothing.
fn libfaketime() -> PathBuf {
    let lib = PathBuf::from(LIBFAKETIME);
    assert!(
        lib.exists(),
        "{LIBFAKETIME} is missing: install Debian's libfaketime (scripts/test-all does)"
    );
    lib
}

/// `idemgate` with its wall clock moved by `offset` (libfaketime's syntax: "+10m", "-30s"),
/// killed if it runs for two minutes: a process the shim hung fails the test, not CI's clock.
fn skewed(sb: &Sandbox, offset: &str) -> Command {
    let mut c = sb.with_store("timeout");
    c.args(["-s", "KILL", "120", env!("CARGO_BIN_EXE_idemgate")])
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME", offset)
        // The wall clock alone, as a host whose clock is set wrong has it: libfaketime also moves
        // the monotonic clocks by default, and the runtime's timed waits hang under that.
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    c
}

/// A command that records that it ran, then, the first time only, runs until `gate` exists: a
/// second run (the failure these tests look for) ends at once, so the test fails fast.
fn held_script(effect: &Path, gate: &Path) -> String {
    let effect = effect.display();
    format!(
        "echo ran >> '{effect}'; [ \"$(wc -l < '{effect}')\" -gt 1 ] || \
         while [ ! -e '{}' ]; do sleep 0.02; done",
        gate.display()
    )
}

fn exec(mut c: Command, key: &str, extra: &[&str], script: &str) -> Output {
    c.args(["exec", "--key", key]).args(extra);
    c.args(["--", "sh", "-c", script]).output().unwrap()
}

/// The holder: `exec` of `script` under `key`, started once the command ran.
fn hold(sb: &Sandbox, key: &str, lease: &str, script: &str, effect: &Path) -> Child {
    let child = sb
        .idemgate()
        .args([
            "exec", "--key", key, "--lease", lease, "--", "sh", "-c", script,
        ])
        .spawn()
        .unwrap();
    wait_for("the held command to start", || lines(effect) == 1);
    child
}

/// The shim is in force: a call it times is recorded that far from now.
fn assert_skewed_by(sb: &Sandbox, offset: &str, expected_secs: i64) {
    let key = format!("probe{offset}");
    let out = exec(skewed(sb, offset), &key, &[], "true");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = sb.run(&["--json", "keys", "show", &key]);
    let v: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let created: idemgate::Timestamp = v["created_at"].as_str().unwrap().parse().unwrap();
    let now = idemgate::Timestamp::now().as_millis();
    let off_by = (created.as_millis() - now) / 1000;
    assert!(
        (off_by - expected_secs).abs() <= 5,
        "FAKETIME={offset}: recorded {off_by} s from now, expected {expected_secs} s"
    );
}

#[test]
fn a_process_whose_clock_is_ahead_or_behind_never_takes_over_a_live_call() {
    let sb = Sandbox::new();
    let (effect, gate) = (sb.path("effect"), sb.path("gate"));
    let script = held_script(&effect, &gate);
    let mut holder = hold(&sb, "live", "30s", &script, &effect);
    for (offset, secs) in [("+10m", 600), ("-10m", -600), ("+30s", 30), ("-30s", -30)] {
        assert_skewed_by(&sb, offset, secs);
        for on_unknown in ["retry", "block"] {
            let dup = exec(
                skewed(&sb, offset),
                "live",
                &[
                    "--lease",
                    "30s",
                    "--wait",
                    "200ms",
                    "--on-unknown",
                    on_unknown,
                ],
                &script,
            );
            assert_eq!(
                dup.status.code(),
                Some(75),
                "FAKETIME={offset} --on-unknown {on_unknown}: {}",
                text(&dup.stderr)
            );
            assert_eq!(lines(&effect), 1, "FAKETIME={offset}: ran again");
        }
    }
    fs::write(&gate, b"").unwrap();
    let done = holder.wait().unwrap();
    assert!(done.success(), "the holder was told {done:?}");
    // Its outcome is replayed to every process, whatever its clock says.
    for offset in ["+10m", "-10m"] {
        let replay = exec(skewed(&sb, offset), "live", &[], &script);
        assert!(replay.status.success(), "{}", text(&replay.stderr));
        assert_eq!(lines(&effect), 1);
    }
}

#[test]
fn a_process_whose_clock_is_behind_finds_a_dead_call_unknown_on_time() {
    let sb = Sandbox::new();
    let (effect, gate) = (sb.path("effect"), sb.path("gate"));
    let script = held_script(&effect, &gate);
    let mut holder = hold(&sb, "dead", "1s", &script, &effect);
    let status = Command::new("kill")
        .args(["-KILL", &holder.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    holder.wait().unwrap();
    let killed = SystemTime::now();
    // Its orphaned command ends once the gate exists.
    fs::write(&gate, b"").unwrap();
    // With its clock 10 minutes behind, a duplicate finds the lease over once the 1 s lease has
    // passed (the duplicate waits up to 5 s for it), not 10 minutes later.
    let dup = exec(
        skewed(&sb, "-10m"),
        "dead",
        &["--lease", "1s", "--wait", "5s"],
        &script,
    );
    assert_eq!(dup.status.code(), Some(76), "{}", text(&dup.stderr));
    assert!(killed.elapsed().unwrap() < Duration::from_secs(120));
    assert_eq!(lines(&effect), 1, "never silently re-run");
}

/// The clock row of the chaos suite: `IDEMGATE_CLOCK_KEYS` keys (default 12; scripts/chaos runs
/// more), each a call by a process with a right clock that runs for a moment, raced by two
/// duplicates whose clocks are 10 minutes ahead and behind, with `--on-unknown retry`. Prints
/// the keys, the doubles (a key whose command ran twice), the false unknowns (an "outcome
/// unknown" answer: no call here dies, so each one is false) and the lost outcomes (a duplicate
/// that neither replayed the outcome nor was told to come back: anything but exit 0 or 75);
/// fails on any.
#[test]
fn processes_with_clocks_set_wrong_run_each_call_once() {
    let keys: usize = std::env::var("IDEMGATE_CLOCK_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let sb = Sandbox::new();
    let (mut doubles, mut false_unknown, mut lost) = (0, 0, 0);
    // Four keys at a time: each key's three processes overlap with one another.
    for batch in (0..keys).collect::<Vec<_>>().chunks(4) {
        let mut running = Vec::new();
        for &i in batch {
            let effect = sb.path(&format!("effect-{i}"));
            let script = format!("echo ran >> '{}'; sleep 0.3", effect.display());
            let key = format!("race-{i}");
            let first = sb
                .idemgate()
                .args(["exec", "--key", &key, "--lease", "30s", "--"])
                .args(["sh", "-c", &script])
                .spawn()
                .unwrap();
            wait_for("the first call to start", || lines(&effect) >= 1);
            let dups: Vec<Child> = ["+10m", "-10m"]
                .into_iter()
                .map(|offset| {
                    let mut c = skewed(&sb, offset);
                    c.args(["exec", "--key", &key, "--lease", "30s", "--wait", "10s"])
                        .args(["--on-unknown", "retry", "--", "sh", "-c", &script])
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null());
                    c.spawn().unwrap()
                })
                .collect();
            running.push((effect, first, dups));
        }
        for (effect, mut first, dups) in running {
            assert!(first.wait().unwrap().success(), "the first call failed");
            for mut dup in dups {
                match dup.wait().unwrap().code() {
                    Some(0 | 75) => {}
                    Some(76) => false_unknown += 1,
                    _ => lost += 1,
                }
            }
            if lines(&effect) > 1 {
                doubles += 1;
            }
        }
    }
    println!("CLOCK-CHAOS keys={keys} doubles={doubles} false_unknown={false_unknown} lost={lost}");
    assert_eq!((doubles, false_unknown, lost), (0, 0, 0));
}
