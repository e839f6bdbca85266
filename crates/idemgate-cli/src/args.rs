//! Command-line arguments.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

const ABOUT: &str =
    "Run commands at most once per idempotency key, and inspect and resolve the records.";

const LONG_ABOUT: &str = "\
Run commands at most once per idempotency key, and inspect and resolve the records.

`idemgate exec --key K -- CMD ARGS...` reserves K before CMD runs, stores CMD's exit code, stdout
and stderr under K, and answers every later call with the same key by replaying them without
running CMD again. Racing duplicates in other processes wait for the first one (up to --wait) or
get an in-flight answer. If the process running CMD dies, later calls get an outcome-unknown
answer, never a silent second run, until an operator resolves the record with `keys resolve`.

Records live in a store named by --store (default: an SQLite file in your data directory).";

const EXAMPLES: &str = "\
Examples:
  # charge once, however often the agent retries this line
  idemgate exec --key order-1234-charge -- ./charge.sh 1234 19.99

  # derive the key from the orchestrator's run id and step
  idemgate exec --key \"$(idemgate key derive --run \"$RUN_ID\" --step 3)\" -- send-mail.sh

  # what is stuck?
  idemgate keys list --state unknown
  idemgate keys resolve order-1234-charge --completed --exit-code 0

Exit codes of `exec`: the command's own on execution and replay; 2 the command line was not
understood (nothing ran); 65 key reused with other arguments; 69 store unavailable (nothing ran);
70 the command ran but its outcome could not be recorded; 75 in flight elsewhere; 76 outcome
unknown; 77 the command ran but outlived its lease and another run took the key over; 79 the
command declared it did nothing (--not-applied-exit-code; the key is free again); 80 the command
ran before and its outcome expired (it was not run again); 127 the command could not be started
(nothing ran; the key is free again); 1 other errors.

Signals: SIGTERM and SIGINT sent to idemgate are passed on to the command, and idemgate waits for
it and records what it did: its exit code if it exits, an unknown outcome if the signal kills it.";

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "idemgate", version, about = ABOUT, long_about = LONG_ABOUT, after_long_help = EXAMPLES)]
pub struct Cli {
    /// Where records live: sqlite://PATH, postgres://..., redis://... (a Redis Cluster:
    /// redis+cluster://HOST:PORT,HOST:PORT...; behind Sentinel:
    /// redis+sentinel://HOST:PORT,HOST:PORT/SERVICE), or memory:.
    /// Default: idemgate.db in the data directory: $XDG_DATA_HOME/idemgate when set, else
    /// ~/.local/share/idemgate (Linux), %LOCALAPPDATA%\idemgate (Windows), ~/Library/Application
    /// Support/idemgate (macOS).
    #[arg(long, global = true, env = "IDEMGATE_STORE", value_name = "URL")]
    pub store: Option<String>,

    /// The tenant whose records to use; keys of different tenants never meet. Default: "local"
    /// for exec; `keys list` shows every tenant and `keys show`/`keys resolve` find the key in
    /// any; `serve` without --config names its one tenant "default".
    #[arg(long, global = true, env = "IDEMGATE_TENANT")]
    pub tenant: Option<String>,

    /// Directory of the journal of outcomes the store has not confirmed yet.
    /// Default: next to the SQLite file, or in the data directory for server stores.
    #[arg(long, global = true, env = "IDEMGATE_JOURNAL", value_name = "DIR")]
    pub journal: Option<PathBuf>,

    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command at most once per key; replay its outcome to duplicates.
    Exec(ExecArgs),
    /// Inspect and resolve records.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Make idempotency keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Flush outcomes the store did not confirm into it (exec does this on every start).
    #[command(subcommand)]
    Journal(JournalCommand),
    /// Run the HTTP gateway (docs/HTTP.md).
    #[command(long_about = SERVE_ABOUT, after_long_help = SERVE_EXAMPLES)]
    Serve(ServeArgs),
    /// Serve the web console over a store, where no gateway runs (docs/OPERATIONS.md).
    #[command(long_about = CONSOLE_ABOUT)]
    Console(ConsoleArgs),
    /// Put idemgate in front of an MCP server, on stdio or Streamable HTTP (docs/MCP.md).
    #[command(long_about = MCP_ABOUT, after_long_help = MCP_EXAMPLES)]
    Mcp(McpArgs),
    /// Make and hash the gateway's bearer tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Find the duplicate side effects that already happened, in OpenTelemetry traces.
    #[command(long_about = SCAN_ABOUT, after_long_help = SCAN_EXAMPLES)]
    Scan(ScanArgs),
}

const SCAN_ABOUT: &str = "\
Find the duplicate side effects that already happened: read OpenTelemetry traces of an agent's
tool calls and report the write calls that repeated an earlier call's action.

Reads OTLP trace files: JSON lines (the OTLP file exporter's format, and the collector's `file`
exporter with `format: json`), protobuf frames (`format: proto`) or one OTLP/HTTP protobuf body;
`-` reads stdin. A tool call is a GenAI `execute_tool` span: gen_ai.tool.name,
gen_ai.tool.call.id, gen_ai.tool.call.arguments (which the instrumentation records only when told
to include content), and gen_ai.conversation.id on it or on a span above it. Calls are compared
within their conversation, else within their trace. A later write call repeats an earlier one
when (in this order):

  framework retry     it carries the same call id again (a client timeout instead, when the
                      earlier call still ran or had timed out: the framework resumed it);
  client timeout      the same tool and arguments, started while the earlier call still ran, or
                      after it failed with a timeout or a cancellation, or after it ended without
                      the result the instrumentation records for the later one (its caller gave
                      up and asked again);
  model re-emission   the same tool and arguments under a new call id, within --window (high
                      confidence within 60 s, the gate's own window; medium beyond);
  re-plan             the arguments that name the action agree and the rest was reworded: the
                      tool's identity fields (--identity, or `identity` in the --config file)
                      agree (medium), or, without them, the arguments differ only in free text
                      (low).

With --records, idemgate's own records (the store of --store) are read as well: two records of
one tenant, tool and scope with the same arguments are an action that ran under two keys, which
the gate could not tell apart (a key made new for every request, a call id re-emitted after the
window). Records keep the arguments' fingerprint only, so re-plans are found in traces alone.

Reads are not side effects: with --config (an `idemgate mcp` configuration) tools of kind \"read\"
or \"natural_idempotent\" are listed apart, as are tools named by --read. A repeat that idemgate
already answered without running it (its span says idemgate.verdict = replayed, in_flight, ...)
is listed as caught.

Prints a table and a sentence per repeat (--json: one JSON object); --html PATH also writes one
self-contained page with a timeline per conversation. Exit status: 0 nothing found (or only
low-confidence re-plans, which are reported), 1 a repeat that ran found with medium or high
confidence, 2 usage (a --config that cannot be read included), 66 a file that could not be read,
is empty or holds no trace, 69 the store of --records could not be read, 73 the --html page could
not be written. Parts of a file that cannot be read (a cut-off last line) are reported and
skipped.";

const SCAN_EXAMPLES: &str = "\
Examples:
  # the traces the collector's file exporter wrote
  idemgate scan /var/log/otel/traces.jsonl

  # tell reads apart as the proxy does, and name what a send_mail action is
  idemgate scan --config mcp.toml --identity send_mail=to,subject traces.jsonl

  # the actions idemgate itself let run twice, under two keys
  idemgate scan --records --store postgres://idem@db/idem

  # a page to look at, and no repeat allowed in CI
  idemgate scan --html scan.html traces.jsonl || exit 1";

/// `scan`.
#[derive(Debug, Args)]
pub struct ScanArgs {
    /// Trace files: OTLP JSON lines, OTLP protobuf frames or one OTLP protobuf message (`-`: stdin).
    #[arg(required_unless_present = "records", value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Also read idemgate's own records (the store of --store; one tenant's with --tenant): an
    /// action that ran under two keys, the same arguments in one tenant and scope.
    #[arg(long)]
    pub records: bool,

    /// An `idemgate mcp` configuration whose tool kinds tell reads from writes, as the proxy does.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// A tool that only reads (repeatable): its repeats are listed apart, not reported.
    #[arg(long, value_name = "TOOL")]
    pub read: Vec<String>,

    /// The arguments that name a tool's action, for re-plans (repeatable):
    /// TOOL=FIELD[,FIELD...], each a top-level argument name or a JSON pointer (/to/0).
    #[arg(long, value_name = "TOOL=FIELDS", value_parser = parse_identity)]
    pub identity: Vec<(String, Vec<String>)>,

    /// How far apart two calls with the same arguments may start and still be one action repeated.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub window: Duration,

    /// Also write the report as one self-contained HTML page, with a timeline per conversation.
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,
}

fn parse_identity(text: &str) -> Result<(String, Vec<String>), String> {
    let (tool, fields) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not TOOL=FIELD[,FIELD...]"))?;
    let fields: Vec<String> = fields
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    if tool.is_empty() || fields.is_empty() {
        return Err(format!(
            "{text:?} names no tool or no field: TOOL=FIELD[,FIELD...]"
        ));
    }
    Ok((tool.to_owned(), fields))
}

const SERVE_ABOUT: &str = "\
Run the HTTP gateway (docs/HTTP.md): forwarded and coordinated tool calls, at most once per key.

With --config PATH the TOML file says everything (listen address, store, tenants, tools); a file
without server.store uses --store or the default SQLite file, as the other commands do.

Without --config the gateway listens on 127.0.0.1:8080 (or --listen) with one tenant, \"default\"
(or --tenant), whose bearer token is read from the environment variable named by --token-env
(IDEMGATE_TOKEN unless changed; at least 16 characters). It never starts without a tenant: there is no
unauthenticated mode. Every tool is a coordinated write with the default policy; forwarded tools
need a config file.

A forwarded tool can answer by a commerce protocol's idempotency contract instead of idemgate's:
[tools.NAME] profile = \"acp\", \"ucp\" or \"x402\" (where the key lives, what counts as the same
request, which answers are kept, the protocol's error codes: docs/HTTP.md, \"Commerce protocol
profiles\").

The web console at /ui (docs/OPERATIONS.md) signs in tenants with their tokens, and operators (who
see every tenant) by name: [[console.operators]] gives each a name and a token of their own, and
[console.oidc] lets them sign in at an OpenID Connect provider; the audit log signs each console
action console:<name>. Both need a config file.

Logs are JSON lines on stderr, filtered by IDEMGATE_LOG (default info). SIGTERM or Ctrl-C stops
accepting, lets in-flight requests finish, flushes the journal and exits 0.";

const SERVE_EXAMPLES: &str = "\
Examples:
  # quickest start, on the default SQLite file
  export IDEMGATE_TOKEN=\"$(idemgate token new | head -n1)\"
  idemgate serve

  # everything from a file (hash tokens with `idemgate token hash TOKEN`)
  idemgate serve --config /etc/idemgate/gateway.toml";

/// `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The gateway's TOML configuration (docs/HTTP.md).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Without --config: the environment variable holding the bearer token of the one tenant,
    /// "default".
    #[arg(long, value_name = "VAR", default_value = "IDEMGATE_TOKEN")]
    pub token_env: String,

    /// Without --config: the address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
}

const CONSOLE_ABOUT: &str = "\
Serve the web console (docs/OPERATIONS.md) at http://ADDR/ui over the store of --store, where no
gateway runs (`idemgate serve` serves it too, at /ui). Records by state, unknown first, each with
its history from the store (why it became unknown, who resolved or reopened it and why, whichever
door or process did); resolve and reopen with a reason, kept in that history with who did it and
appended to the audit log (--audit-log) when one is named; per-tool charts from the audit log.

One operator signs in, with the token in the environment variable named by --token-env
(IDEMGATE_OPERATOR_TOKEN unless changed; at least 16 characters) and sees every tenant's records;
the audit log signs its actions console:operator (operators by name are configured for `idemgate
serve`, in [[console.operators]]). It never starts without one. It listens on loopback unless told otherwise: put a TLS-terminating
proxy in front (and pass --secure-cookie) before exposing it.

Example:
  IDEMGATE_OPERATOR_TOKEN=$(idemgate token new | head -1) \\
    idemgate --store sqlite://./idemgate.db console --audit-log ./audit.jsonl";

/// `console`.
#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// The address to listen on; port 0 picks a free one (the URL is printed on stdout).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    pub listen: std::net::SocketAddr,

    /// The environment variable holding the operator's token.
    #[arg(long, value_name = "VAR", default_value = "IDEMGATE_OPERATOR_TOKEN")]
    pub token_env: String,

    /// The audit log to read the charts from, and to append resolutions and reopenings to (the
    /// gateway's server.audit_log). A record's history is in the store, with or without it.
    #[arg(long, value_name = "PATH")]
    pub audit_log: Option<PathBuf>,

    /// Mark the session cookie Secure (the console is reached over HTTPS through a proxy).
    #[arg(long)]
    pub secure_cookie: bool,
}

const MCP_ABOUT: &str = "\
Put idemgate in front of an MCP server (docs/MCP.md): every write tool runs at most once per
logical action.

`idemgate mcp -- CMD ARGS...` starts CMD as the MCP server and relays newline-delimited JSON-RPC
between the agent (this process's stdin and stdout) and CMD, frame by frame, unchanged, except for
`tools/call`. A call to a write tool (every tool, unless the config says otherwise or a trusted
server annotates it read-only or idempotent) needs an idempotency key, in
params._meta[\"dev.idemgate/idempotency-key\"] or in an argument `idempotency_key`; the first call
with a key runs and its result is stored, and every later call with the key gets the stored result
back, marked as a replay, without running the tool again.

A server that speaks a commerce protocol's MCP binding keeps its keys where the protocol puts
them: `profile = \"acp\"` (meta.idempotency_key), \"ucp\" (meta[\"idempotency-key\"]) or \"x402\"
(the payment identifier) in --config; its refusals then come in the protocol's words (docs/MCP.md,
\"Commerce protocol bindings\").

Records live in the store every command uses (--store, default: the SQLite file in your data
directory), so `idemgate keys list` shows them and a new proxy process per call still replays.
The server's stderr is passed through; idemgate's own logs are JSON lines on stderr.

With --listen ADDR the agent side is MCP Streamable HTTP instead, at http://ADDR/mcp: every
session (initialize) gets its own CMD process. The `Idempotency-Key` header keys a tools/call.
Bearer tokens name tenants as the HTTP gateway's [[tenants]] do; with [oauth] the endpoint is also
an OAuth 2.1 resource server (Protected Resource Metadata at /.well-known/oauth-protected-resource,
JWT access tokens of its authorization servers mapped to tenants: docs/OPERATIONS.md); without
either only a loopback address is served. Requests with an Origin header not in [http]
allowed_origins get 403.

With --upstream-url URL instead of a command the MCP server is a remote one, reached over
Streamable HTTP at URL (POST per message, JSON or SSE answers, Mcp-Session-Id, DELETE at the end);
with --listen each agent session gets its own upstream session. --upstream-header 'Name: value'
(repeatable) adds a header to every request to it, e.g. an Authorization; `${VAR}` in a value is
replaced by the environment variable VAR, so that a secret stays out of the process list. Header
values are never logged. A lost connection, a 5xx or an expired session (404) while a call is in
flight leaves its outcome unknown, exactly as a crashed child does: it is never run again.";

const MCP_EXAMPLES: &str = "\
Examples:
  # in an agent's MCP configuration: \"command\": \"idemgate\", \"args\": [\"mcp\", \"--\", ...]
  idemgate mcp -- npx -y @modelcontextprotocol/server-memory

  # per-tool policies, trusted annotations, audit log
  idemgate mcp --config ~/.config/idemgate/memory.toml -- npx -y @modelcontextprotocol/server-memory

  # Streamable HTTP on loopback: the agent connects to http://127.0.0.1:8765/mcp
  idemgate mcp --listen 127.0.0.1:8765 -- npx -y @modelcontextprotocol/server-memory

  # before gating a server: its tools as the gate sees them, and a starting configuration
  idemgate mcp lint -- npx -y @modelcontextprotocol/server-memory

  # a remote MCP server over Streamable HTTP, its token from the environment
  idemgate mcp --upstream-url https://mcp.example.com/mcp \\
    --upstream-header 'Authorization: Bearer ${EXAMPLE_TOKEN}'";

/// `mcp`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct McpArgs {
    /// `mcp lint`, instead of running the proxy.
    #[command(subcommand)]
    pub action: Option<McpCommand>,

    /// The proxy's TOML configuration (docs/MCP.md).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Serve MCP Streamable HTTP on this address (endpoint /mcp) instead of stdio; port 0 picks
    /// a free port (the URL is printed on stderr). Non-loopback addresses need [[tenants]].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,

    /// The URL of an MCP server reached over Streamable HTTP, instead of a command.
    #[arg(long, value_name = "URL", conflicts_with = "command")]
    pub upstream_url: Option<String>,

    /// A header on every request to --upstream-url, as 'Name: value' (repeatable); `${VAR}` in
    /// the value is the environment variable VAR. Values are never logged.
    #[arg(long, value_name = "HEADER")]
    pub upstream_header: Vec<String>,

    /// Believe the server's `readOnlyHint` and `idempotentHint` annotations (`trusted = true` in
    /// the configuration): its read-only tools pass without a key. Only for a server you trust to
    /// mark them truly; without it, every tool not named in [tools] is a write.
    #[arg(long)]
    pub trust_annotations: bool,

    /// The MCP server's command and its arguments (after `--`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `mcp ...`: what `idemgate mcp` does besides proxying.
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Ask an MCP server for its tools and report what a gate needs to know, with a starting
    /// configuration.
    #[command(long_about = MCP_LINT_ABOUT, after_long_help = MCP_LINT_EXAMPLES)]
    Lint(McpLintArgs),
}

const MCP_LINT_ABOUT: &str = "\
Ask an MCP server for its tools (`initialize`, then every page of `tools/list`) and report what a
gate needs to know before it gates anything, then print a starting `idemgate mcp --config` file.

For each tool: whether it writes (the proxy gates every tool as a write unless the configuration
says otherwise, or a trusted server annotates it read-only or idempotent), its annotations, the key
argument it declares, and what is wrong:
  read_only_name_writes      annotated read-only, but its name writes (delete_user): believed, it
                             would run without a key and every retry would run again
  read_only_and_destructive  both hints at once, which contradict each other
  idempotent_name_creates    annotated idempotent, but each call makes something new (create_order)
  new_key_every_request      its description tells the model to make the key unique for every
                             request, so a retry carries a new key and runs again
  duplicate_name             two tools listed under one name
  idempotent_but_destructive (note) annotated idempotent, but destructive (MCP's default): a
                             repeat after what it destroyed was made again destroys it again
  write_name_reads           (note) annotated as a write, but its name reads
  no_annotations             (note) says nothing of itself: a write until the configuration says
  declares_key_argument      (note) takes its own idempotency_key: the proxy fills it

The configuration writes the annotations out tool by tool (trusted = false): read-only tools as
kind = \"read\", except where a finding contradicts them; unannotated tools whose name reads, and
tools annotated idempotent and not destructive, as commented suggestions to check.

Exit status: 0 when nothing is worse than a note, 1 when a warning was found (for CI), 69 when the
server could not be started or did not answer.";

const MCP_LINT_EXAMPLES: &str = "\
Examples:
  idemgate mcp lint -- npx -y @modelcontextprotocol/server-memory
  idemgate mcp lint --print-config -- uvx mcp-server-git > git.toml
  idemgate mcp lint --json -- python my_server.py | jq '.tools[] | select(.findings != [])'";

/// `mcp lint`.
#[derive(Debug, Args)]
pub struct McpLintArgs {
    /// Print only the starting configuration (TOML), e.g. to redirect into a file; the warnings
    /// go to stderr. (`--json` prints the whole report as one JSON object instead.)
    #[arg(long)]
    pub print_config: bool,

    /// How long the server may take to start and list its tools.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,

    /// The MCP server's command and its arguments (after `--`).
    #[arg(last = true, value_name = "CMD", required = true)]
    pub command: Vec<String>,
}

/// `token ...`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print the SHA-256 of a token, for `token_sha256` in the gateway's configuration.
    Hash {
        /// The bearer token.
        token: String,
    },
    /// Print a fresh random token (first line) and its SHA-256 (second line).
    New,
}

/// `exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The idempotency key naming this logical action (1-255 visible ASCII characters). Use the
    /// same key on every retry of the action, and a new one for a new action.
    #[arg(long, short = 'k')]
    pub key: String,

    /// The scope of the key; the same key under another tool is another record.
    #[arg(long, default_value = idemgate_kit::EXEC_TOOL)]
    pub tool: String,

    /// How long the outcome is kept and replayed.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub ttl: Duration,

    /// How long after the command ran its record is remembered: a retry after --ttl and within
    /// this is refused as expired (exit 80: it ran at T, its output is no longer kept) instead of
    /// running the command again. 0s remembers nothing past --ttl.
    #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
    pub tombstone: Duration,

    /// How long the reservation holds without a heartbeat. While CMD runs it is renewed every
    /// third of this, so it bounds how soon a crash is noticed, not how long CMD may run.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease: Duration,

    /// How long to wait for a duplicate that is running elsewhere before answering "in flight".
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub wait: Duration,

    /// What a call finds an unknown outcome does: block (answer "unknown" until resolved) or
    /// retry (run again: only for commands that are safe to repeat or pass the key on).
    #[arg(long, default_value = "block", value_parser = ["block", "retry"])]
    pub on_unknown: String,

    /// An exit code by which CMD says it did nothing (so the key is released and a retry runs),
    /// for example 75 for a temporary failure before any effect. Repeatable. Any other non-zero
    /// exit is stored and replayed like a success.
    #[arg(long = "not-applied-exit-code", value_name = "CODE")]
    pub not_applied: Vec<i32>,

    /// Do not print the one-line notice on stderr when an outcome is replayed.
    #[arg(long, short = 'q')]
    pub quiet: bool,

    /// The command and its arguments (after `--`). They are the call's arguments: the same key
    /// with another command line is refused as key reuse. Standard input is not part of it.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `keys ...`.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// List records, oldest first.
    List {
        /// Only records in this state: in_flight, completed, unknown or expired (the tombstones
        /// of actions whose outcomes are no longer kept).
        #[arg(long)]
        state: Option<String>,
        /// Only this tool's records.
        #[arg(long)]
        tool: Option<String>,
        /// Only records reserved in this scope: the conversation or session a call was made in
        /// (the MCP proxy names them `conversation:ID` or `session:ID`).
        #[arg(long)]
        scope: Option<String>,
        /// Only records whose key starts with this.
        #[arg(long)]
        key_prefix: Option<String>,
        /// Only records created at or after this time (RFC 3339, e.g. 2026-12-05T09:00:00Z).
        #[arg(long, value_name = "TIME")]
        created_from: Option<String>,
        /// Only records created before this time (RFC 3339).
        #[arg(long, value_name = "TIME")]
        created_before: Option<String>,
        /// Records of every tenant, not just --tenant's.
        #[arg(long)]
        all_tenants: bool,
        /// At most this many, one page (0: all in one page). With --all, the size of each page.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Start after this cursor: the next page, as the page before printed it (records are
        /// listed oldest first, and each page goes on where the one before stopped).
        #[arg(long)]
        cursor: Option<String>,
        /// Every page, one after the other (each of --limit records), until the last.
        #[arg(long)]
        all: bool,
        /// Only records whose history holds what observe mode (shadow mode, `mode =
        /// "observe"`) recorded: calls that ran where enforce mode would have replayed them,
        /// made them wait or refused them, each record with how many and the verdicts. Reads
        /// each listed record's history, page after page (--all is implied): meant for
        /// deciding when to switch a tool to enforce, not for a hot loop.
        #[arg(long)]
        observed: bool,
    },
    /// Show one record, with its stored outcome.
    Show {
        /// The key.
        key: String,
        /// The tool it was used with. Default: whichever tool has a record under the key.
        #[arg(long)]
        tool: Option<String>,
    },
    /// Resolve an unknown record after checking what really happened (a command, an HTTP call or
    /// an MCP tool call, whichever front door wrote it).
    Resolve(ResolveArgs),
    /// Reopen a completed or unknown record, so that the next call with its key runs the action
    /// again.
    #[command(long_about = REOPEN_ABOUT)]
    Reopen(ReopenArgs),
    /// Delete completed records whose time is up (reopened ones too), and drop the outcomes of
    /// tombstones.
    Purge {
        /// Required: purge records past their tombstone (or their TTL when they keep none, and
        /// reopened ones), and drop the stored outcome of those past their TTL (unknown records
        /// are never purged).
        #[arg(long, required = true)]
        expired: bool,
    },
}

impl KeysCommand {
    /// The audit log an operator's command appends to (`resolve`, `reopen`), when it names one;
    /// `None` for the commands that change no record, and when none is named.
    pub(crate) fn audit_log(&self) -> Option<&std::path::Path> {
        match self {
            KeysCommand::Resolve(args) => args.audit_log.as_deref(),
            KeysCommand::Reopen(args) => args.audit_log.as_deref(),
            KeysCommand::List { .. } | KeysCommand::Show { .. } | KeysCommand::Purge { .. } => None,
        }
    }
}

/// `keys resolve`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("how").required(true).args(["completed", "release"])))]
pub struct ResolveArgs {
    /// The key.
    pub key: String,
    /// The tool it was used with. Default: whichever tool has a record under the key.
    #[arg(long)]
    pub tool: Option<String>,
    /// The fence you looked at (`keys show`); the resolution is refused if the record moved on.
    /// Default: the record's current fence.
    #[arg(long)]
    pub fence: Option<u64>,
    /// The action did take effect: store this outcome and replay it to duplicates.
    #[arg(long)]
    pub completed: bool,
    /// With --completed: the result to replay, as JSON (for records of the HTTP gateway, the MCP
    /// proxy and the library; every front door replays a JSON result). Required for a record
    /// whose tool is not `exec`, unless --exit-code says it is a command's.
    #[arg(long, value_name = "JSON", requires = "completed", conflicts_with_all = ["exit_code", "stdout"])]
    pub result: Option<String>,
    /// With --completed: the record is a command's (`idemgate exec`); the exit code to replay.
    /// Default for a record of tool `exec`: 0.
    #[arg(long, requires = "completed")]
    pub exit_code: Option<i32>,
    /// With --completed: the record is a command's (`idemgate exec`); the standard output to
    /// replay. Default: none.
    #[arg(long, requires = "completed")]
    pub stdout: Option<String>,
    /// With --completed: how long to keep it.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration, requires = "completed")]
    pub ttl: Duration,
    /// With --completed: how long after now the record is remembered, so that a retry after
    /// --ttl is refused as expired instead of running again (0s: not past --ttl).
    #[arg(long, default_value = "30d", value_parser = humantime::parse_duration, requires = "completed")]
    pub tombstone: Duration,
    /// The action did not take effect: the record counts as absent from now on (it keeps its
    /// history), so that the next call with the key runs the action again.
    #[arg(long)]
    pub release: bool,
    /// Why, in words: kept in the record's history in the store, with your OS user (and in the
    /// audit log, when --audit-log names one).
    #[arg(long)]
    pub reason: Option<String>,
    /// The audit log to append the resolution to, with who (your OS user) and why: the one the
    /// gateway (server.audit_log), the MCP proxy and the console write.
    #[arg(long, env = "IDEMGATE_AUDIT_LOG", value_name = "PATH")]
    pub audit_log: Option<PathBuf>,
}

/// The long help of `keys reopen`.
const REOPEN_ABOUT: &str = "\
Reopen a completed or unknown record, so that the next call with its key runs the action again.

Use it when a stored outcome must not be replayed any more (the action has to be done again: a
charge was refunded, a message bounced), or when an unknown outcome turned out not to have taken
effect. The record is reopened only if it still stands at the fence you looked at (`keys show`);
a record in flight is never reopened, since its call may be running the action now: wait until it
finishes or its lease ends.

The next call with the key runs the action again, here at once. Other processes using the same
store (gateways, MCP proxies, Python workers) may still replay the old outcome from their memory
for up to 2 seconds (the engine's replay_cache_fresh), then run it again too. The record's
history (`keys show`) keeps who (your OS user) reopened it, at which fence, and why; so does the
audit log, when --audit-log names one.";

/// `keys reopen`.
#[derive(Debug, Args)]
pub struct ReopenArgs {
    /// The key.
    pub key: String,
    /// The tool it was used with. Default: whichever tool has a record under the key.
    #[arg(long)]
    pub tool: Option<String>,
    /// The fence you looked at (`keys show`); the record is reopened only if it still stands at
    /// it.
    #[arg(long)]
    pub fence: u64,
    /// Why, in words: kept in the record's history in the store, with your OS user (and in the
    /// audit log, when --audit-log names one).
    #[arg(long)]
    pub reason: String,
    /// The audit log to append the reopening to, with who (your OS user) and why: the one the
    /// gateway (server.audit_log), the MCP proxy and the console write.
    #[arg(long, env = "IDEMGATE_AUDIT_LOG", value_name = "PATH")]
    pub audit_log: Option<PathBuf>,
}

/// `key ...`.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Print a fresh random key (mint it once per action, before the first attempt).
    Mint,
    /// Print the stable key of one step of one run: the same run and step give the same key.
    Derive {
        /// The orchestration run id.
        #[arg(long)]
        run: String,
        /// The step or tool-call id within the run.
        #[arg(long)]
        step: String,
    },
}

/// `journal ...`.
#[derive(Debug, Subcommand)]
pub enum JournalCommand {
    /// Apply journaled outcomes to the store now.
    Flush,
}
