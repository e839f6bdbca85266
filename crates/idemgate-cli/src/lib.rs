#![doc = include_str!("../README.md")]

mod args;
mod console;
mod exec;
mod keys;
mod mcp;
mod out;
mod scan;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::Parser as _;
use idemgate::{AnyStore, Engine, EngineError, FileJournal, Key};
use idemgate_kit::{Door, Explanation, Resolve};

pub use args::Cli;
use args::{Command, JournalCommand, KeyCommand, McpArgs, McpCommand, TokenCommand};

/// Exit codes of `idemgate` itself (a command's own exit code passes through on execution and
/// replay): the engine's one table, so docs, tests and every front door agree.
pub use idemgate_kit::exit;

/// Parses the command line, runs it and returns the exit code.
pub fn run() -> ExitCode {
    ExitCode::from(run_from(std::env::args_os()))
}

/// Parses `args` (the program's name first, as `std::env::args_os` gives them), runs the command
/// and returns its exit code: the binary's `main`, and the `idemgate` command a `pip install` puts
/// on PATH (the Python package calls it in-process with `sys.argv`).
pub fn run_from<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        // `--help` and `--version` print and exit 0; a usage error prints and exits 2.
        Err(e) => {
            let e = with_near_option(e, &args);
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(exit::FAILURE);
        }
    };
    // The gateway and the console serve many connections at once; every other command is one call.
    let runtime = if matches!(cli.command, Command::Serve(_) | Command::Console(_)) {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idemgate: failed to start the runtime: {e}");
            return exit::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idemgate: {}", error_text(&e));
            exit::FAILURE
        }
    }
}

/// `e`, naming the option an unknown `--option` was probably meant to be when clap names none.
/// clap ranks options by Jaro similarity, whose match window is empty for names of three letters
/// or fewer: `exec --kye` shares only its first letter with `--key` there and got no "similar
/// argument" at all, just the tip for passing it to the command after `--`. An option of the same
/// command within one edit of it (a swap of two neighbouring letters included) is named.
fn with_near_option(mut e: clap::Error, args: &[std::ffi::OsString]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use clap::CommandFactory as _;
    if e.kind() != ErrorKind::UnknownArgument || e.get(ContextKind::SuggestedArg).is_some() {
        return e;
    }
    let typed = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => match arg.strip_prefix("--") {
            Some(name) => name.to_owned(),
            None => return e,
        },
        _ => return e,
    };
    // The subcommand the option was given to: the last subcommand name before `--`.
    let mut cmd = Cli::command();
    cmd.build();
    for arg in args.iter().skip(1).filter_map(|a| a.to_str()) {
        if arg == "--" {
            break;
        }
        if let Some(sub) = cmd.find_subcommand(arg) {
            cmd = sub.clone();
        }
    }
    let near = cmd
        .get_arguments()
        .filter_map(clap::Arg::get_long)
        .find(|long| within_one_edit(&typed, long));
    if let Some(long) = near {
        e.insert(
            ContextKind::SuggestedArg,
            ContextValue::String(format!("--{long}")),
        );
    }
    e
}

/// Whether `a` becomes `b` by at most one edit: a letter added, dropped or changed, or two
/// neighbouring letters swapped.
fn within_one_edit(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let same_start = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[same_start..], &b[same_start..]);
    match (a.len(), b.len()) {
        (0, 0) => true,
        (n, m) if n == m => {
            a[1..] == b[1..] || (n >= 2 && a[0] == b[1] && a[1] == b[0] && a[2..] == b[2..])
        }
        (n, m) if n + 1 == m => a == &b[1..],
        (n, m) if n == m + 1 => &a[1..] == b,
        _ => false,
    }
}

/// An error and its causes, joined by ": " as `{:#}` joins them, but each said once: an error
/// whose own message ends with its source's (the MCP proxy's "failed to start the server ...:
/// No such file or directory") is not followed by that source again. The engine's refusals are
/// said in the kit's words ([`refusal_text`]).
pub(crate) fn error_text(e: &anyhow::Error) -> String {
    if let Some(refused) = e
        .chain()
        .next()
        .and_then(|c| c.downcast_ref::<EngineError>())
    {
        return refusal_text(refused);
    }
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    text
}

/// How the command line names things in what it tells: a record by its key and tool, and
/// `idemgate keys` with the arguments `resolve` to settle it (a record of `exec`'s: a command's).
pub(crate) fn door<'a>(record: &'a str, resolve: &'a str) -> Door<'a> {
    Door {
        effect: "the command",
        record,
        resolve: Resolve::Exec(resolve),
        repeat: "run it again with a new --key",
        add_key: "pass --key",
        discreet: false,
    }
}

/// How the command line names `key`: its record, and the arguments that settle it.
pub(crate) fn names(key: &Key) -> (String, String) {
    (
        format!("{} (tool {})", key.key, key.tool),
        format!("{} --tool {} --tenant {}", key.key, key.tool, key.tenant),
    )
}

/// What the command line says of a refusal: the kit's words for a person.
pub(crate) fn refusal_text(e: &EngineError) -> String {
    let explanation = Explanation::of_error(e);
    let (record, resolve) = explanation.key.as_ref().map(names).unwrap_or_default();
    explanation.for_person(&door(&record, &resolve))
}

async fn dispatch(cli: Cli) -> Result<u8> {
    match &cli.command {
        Command::Key(KeyCommand::Mint) => {
            let key = idemgate::IdempotencyKey::mint();
            print_key(&cli, key.as_str());
            Ok(0)
        }
        Command::Key(KeyCommand::Derive { run, step }) => {
            // An unset `$RUN_ID` arrives as "": every run would share its keys and replay the
            // first run's steps, so it is refused rather than derived.
            let key = idemgate::IdempotencyKey::derive(run, step).map_err(|e| {
                anyhow::anyhow!("{e}: `key derive` needs the run id and the step that name this step of this run (an unset variable passes an empty one); nothing was derived")
            })?;
            print_key(&cli, key.as_str());
            Ok(0)
        }
        Command::Exec(args) => {
            let ctx = match Context::open(&cli, "local").await? {
                Ok(ctx) => ctx,
                Err(code) => return Ok(code),
            };
            exec::run(&ctx, args).await
        }
        Command::Keys(cmd) => {
            let ctx = match Context::open(&cli, "local").await? {
                Ok(ctx) => ctx,
                Err(code) => return Ok(code),
            };
            // Who settled a record and why is in the record's history in the store either way;
            // the audit log, when named, is the export of it.
            let ctx = match cmd.audit_log() {
                Some(path) => ctx.with_audit_log(path)?,
                None => ctx,
            };
            keys::run(&ctx, cmd).await
        }
        Command::Serve(args) => serve::run(&cli, args).await,
        Command::Console(args) => console::run(&cli, args).await,
        Command::Mcp(McpArgs {
            action: Some(McpCommand::Lint(args)),
            ..
        }) => mcp::lint(&cli, args),
        Command::Mcp(args) => mcp::run(&cli, args).await,
        Command::Scan(args) => scan::run(&cli, args).await,
        Command::Token(TokenCommand::Hash { token }) => {
            out::line(format_args!("{}", idemgate_http::token_sha256(token)));
            Ok(0)
        }
        Command::Token(TokenCommand::New) => {
            let token = idemgate_http::new_token();
            let hash = idemgate_http::token_sha256(&token);
            if cli.json {
                out::line(format_args!(
                    "{}",
                    serde_json::json!({"token": token, "token_sha256": hash})
                ));
            } else {
                out::line(format_args!("{token}"));
                out::line(format_args!("{hash}"));
            }
            Ok(0)
        }
        Command::Journal(JournalCommand::Flush) => {
            let ctx = match Context::open(&cli, "local").await? {
                Ok(ctx) => ctx,
                Err(code) => return Ok(code),
            };
            let report = ctx.engine.flush_journal().await?;
            if cli.json {
                out::line(format_args!("{}", serde_json::to_string(&report)?));
            } else {
                out::line(format_args!(
                    "applied {} (written back {}), superseded {}, displaced {}, still pending {}",
                    report.applied,
                    report.restored,
                    report.superseded,
                    report.displaced,
                    report.pending
                ));
            }
            Ok(if report.pending > 0 {
                exit::STORE_UNAVAILABLE
            } else {
                0
            })
        }
    }
}

/// A key on stdout: the key alone, or `{"key": ...}` with `--json`.
fn print_key(cli: &Cli, key: &str) {
    if cli.json {
        out::line(format_args!("{}", serde_json::json!({ "key": key })));
    } else {
        out::line(format_args!("{key}"));
    }
}

/// What every command that touches records needs.
pub(crate) struct Context {
    pub(crate) engine: Engine<AnyStore>,
    /// `--tenant`, else the command's default.
    pub(crate) tenant: idemgate::TenantId,
    /// Whether `--tenant` was given (operator commands look in every tenant otherwise).
    pub(crate) tenant_given: bool,
    pub(crate) json: bool,
}

impl Context {
    /// Opens the store and the journal. `Ok(Err(code))` when the store cannot be opened: that is
    /// said on stderr, and nothing ran, so the exit code is the store's (69), as at reservation.
    async fn open(cli: &Cli, default_tenant: &str) -> Result<Result<Self, u8>> {
        let tenant = idemgate::TenantId::new(cli.tenant.as_deref().unwrap_or(default_tenant))
            .context("invalid --tenant")?;
        let (url, journal_dir) = store_and_journal(cli)?;
        if url.trim() == "memory:" || url.starts_with("memory:") {
            anyhow::bail!(
                "refusing store memory: for a one-shot command: its records die with this process, so every later call would run again. Use the default SQLite file, sqlite://PATH, or a server store (memory: suits only `serve` and tests)"
            );
        }
        let store = match AnyStore::connect(&url).await {
            Ok(store) => store,
            Err(e) => {
                eprintln!(
                    "idemgate: failed to open store {}, so nothing ran: {e}",
                    redact(&url)
                );
                return Ok(Err(exit::STORE_UNAVAILABLE));
            }
        };
        let journal = FileJournal::open(&journal_dir)
            .with_context(|| format!("failed to open journal {}", journal_dir.display()))?;
        let engine = Engine::new(store).with_journal(Arc::new(journal));
        Ok(Ok(Context {
            engine,
            tenant,
            tenant_given: cli.tenant.is_some(),
            json: cli.json,
        }))
    }

    /// The context whose engine appends its operators' resolutions and reopenings to the audit
    /// log at `path`, through the kit's writer, as the gateway's and the console's engines do.
    fn with_audit_log(mut self, path: &std::path::Path) -> Result<Self> {
        let audit = idemgate_kit::Audit::open(Some(path))
            .with_context(|| format!("failed to open the audit log {}", path.display()))?;
        self.engine = self.engine.with_observer(Arc::new(audit));
        Ok(self)
    }

    pub(crate) fn key(&self, tool: &str, key: &str) -> Result<Key> {
        Ok(Key::new(
            self.tenant.clone(),
            idemgate::ToolName::new(tool).context("invalid --tool")?,
            idemgate::IdempotencyKey::new(key).context("invalid --key")?,
        ))
    }

    pub(crate) fn store(&self) -> &AnyStore {
        self.engine.store()
    }
}

/// The store URL and journal directory every command uses: `--store` (or `IDEMGATE_STORE`), else
/// the default SQLite file in the data directory; `--journal`, else beside the SQLite file or in
/// the data directory for server stores.
pub(crate) fn store_and_journal(cli: &Cli) -> Result<(String, PathBuf)> {
    store_and_journal_for(cli.store.as_deref(), cli.journal.as_deref())
}

/// As [`store_and_journal`], from a store URL and journal directory that may be given: the
/// facade's [`idemgate::store_and_journal`], shared with every other front door.
pub(crate) fn store_and_journal_for(
    store: Option<&str>,
    journal: Option<&std::path::Path>,
) -> Result<(String, PathBuf)> {
    Ok(idemgate::store_and_journal(store, journal)?)
}

/// A URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
    }

    #[test]
    fn an_error_that_says_its_source_is_not_followed_by_it_again() {
        // As idemgate_mcp's `Error::Spawn` is: its source in its message, and as its source.
        #[derive(Debug)]
        struct Says(std::io::Error);
        impl std::fmt::Display for Says {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "failed to start the server \"/x\": {}", self.0)
            }
        }
        impl std::error::Error for Says {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let gone = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = anyhow::Error::new(Says(gone()));
        assert_eq!(
            error_text(&e),
            format!("failed to start the server \"/x\": {}", gone())
        );
        // Causes a message does not repeat are kept, as `{:#}` keeps them.
        let e = anyhow::Error::new(gone()).context("failed to open journal /j");
        assert_eq!(error_text(&e), format!("{e:#}"));
        assert!(error_text(&e).ends_with(&gone().to_string()));
    }

    #[test]
    fn one_edit_is_a_swap_an_addition_a_removal_or_a_change() {
        for (typed, option) in [
            ("kye", "key"),
            ("ky", "key"),
            ("keey", "key"),
            ("kex", "key"),
        ] {
            assert!(within_one_edit(typed, option), "{typed}");
        }
        for (typed, option) in [
            ("yek", "key"),
            ("kyee", "key"),
            ("lease", "key"),
            ("", "key"),
        ] {
            assert!(!within_one_edit(typed, option), "{typed}");
        }
        assert!(within_one_edit("key", "key"));
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}
