//! One explanation of a call's answer for every door: the facts (what happened, when, how it was
//! recorded, what the caller may do next) and the sentences that say them, one for a model and
//! one for a person. Each door renders an [`Explanation`] into its own wire (an MCP result, a
//! problem document, lines on stderr, a Python exception), but none words a decision or a
//! refusal itself: "in flight", "outcome unknown" or "key reused" reads the same at every door,
//! and a new decision is a compile error here, once, rather than in four matches.

use std::time::Duration;

use idemgate_core::{
    Answer, Decision, EngineError, Fence, Key, KeyRule, Recording, State, Timestamp, Verdict,
};

use crate::payload::Payload;
use crate::refusal::{Refusal, Settle, StoreFailure};

/// How a model is told to do an action again on purpose, by every door whose words a model
/// reads: the tool integrations give each tool an `idempotency_key` argument.
pub const MODEL_REPEAT: &str =
    "call the tool again with the argument idempotency_key set to a new value that names the new action";

/// How a door names things in its sentences.
#[derive(Clone, Copy, Debug)]
pub struct Door<'a> {
    /// What ran, as the caller knows it: "the command", "the function", "the tool send_mail".
    pub effect: &'a str,
    /// The record, as a person names it: "order-1 (tool charge)".
    pub record: &'a str,
    /// How an operator resolves a record at this door.
    pub resolve: Resolve<'a>,
    /// How the caller names a new action, to do one again on purpose: "call the tool again with
    /// the argument idempotency_key set to a new value that names the new action".
    pub repeat: &'a str,
    /// How the caller sends a key, for a write refused without one.
    pub add_key: &'a str,
    /// The door answers callers it keeps its insides from (the gateway's, over the network): its
    /// answers never name the caller's key (a `key` member; `record` names it in words) but in
    /// the path that settles its record, nor say why the store could not be reached (its hosts,
    /// its drivers' errors). A record the store cannot read is named all the same: it is the
    /// caller's own, and an operator needs to know which it is and, for a sealed one, which key
    /// id it needs.
    pub discreet: bool,
}

/// How an operator says what happened to an unknown record, or reopens one, at a door.
#[derive(Clone, Copy, Debug)]
pub enum Resolve<'a> {
    /// The `idemgate keys` command line, with the arguments that name the record:
    /// "order-1 --tool charge --tenant acme" (`keys resolve`, `keys reopen`).
    Command(&'a str),
    /// As [`Resolve::Command`], for a record `idemgate exec` made: a command's, whatever tool it
    /// is under, so a completion is said with its exit code.
    Exec(&'a str),
    /// The gateway's `POST /v1/tools/{tool}/records/{key}/resolve`.
    Http,
    /// The Python engine's `Engine.resolve`.
    Python,
    /// The Node engine's `Engine.resolve`.
    Node,
}

impl Resolve<'_> {
    /// The instruction for `record` at `fence`: how to say it happened, and that it did not.
    fn instruction(self, fence: Fence, record: Option<&Key>) -> String {
        let (did, did_not) = match self {
            Resolve::Command(name) | Resolve::Exec(name) => {
                // `keys resolve --completed` stores a command's exit 0 only on a record of exec's
                // own tool; a command under another tool says its exit code, and another door's
                // record the result its callers get replayed.
                let result = match (self, record) {
                    (_, Some(k)) if k.tool.as_str() == crate::EXEC_TOOL => "",
                    (_, None) => "",
                    (Resolve::Exec(_), Some(_)) => " --exit-code 0",
                    (_, Some(_)) => " --result JSON",
                };
                (
                    format!("`idemgate keys resolve {name} --fence {fence} --completed{result}`"),
                    "`--release`".to_owned(),
                )
            }
            Resolve::Http => (
                format!(
                    "`POST {}` with `{{\"fence\": {fence}, \"resolution\": \"completed\", \"outcome\": …}}`",
                    records_path(record, "resolve")
                ),
                "`\"resolution\": \"release\"`".to_owned(),
            ),
            Resolve::Python => (
                format!("`engine.resolve(tool, key, {fence}, \"completed\", result)` (or `idemgate keys resolve`)"),
                "`\"release\"`".to_owned(),
            ),
            Resolve::Node => (
                format!("`await engine.resolve(tool, key, {fence}, 'completed', {{ result }})` (or `idemgate keys resolve`)"),
                "`'release'`".to_owned(),
            ),
        };
        format!(
            "{did} (it did) or {did_not} (it did not; the next call with this key runs it again)"
        )
    }

    /// How a record at `fence` is reopened, so that the next call with its key runs the action
    /// again.
    fn reopen(self, fence: Fence, record: Option<&Key>) -> String {
        match self {
            Resolve::Command(record) | Resolve::Exec(record) => {
                format!("`idemgate keys reopen {record} --fence {fence} --reason \"…\"`")
            }
            Resolve::Http => format!(
                "`POST {}` with `{{\"fence\": {fence}, \"reason\": \"…\"}}`",
                records_path(record, "reopen")
            ),
            Resolve::Python => format!("`engine.reopen(tool, key, {fence}, reason=\"…\")` (or `idemgate keys reopen`)"),
            Resolve::Node => format!("`await engine.reopen(tool, key, {fence}, {{ reason: '…' }})` (or `idemgate keys reopen`)"),
        }
    }
}

/// The gateway's path that settles `record` (`resolve`, `reopen`): its tool and key as path
/// segments, percent-encoded, so that the caller can send it as it is. The key is the caller's own
/// (it sent it in the `Idempotency-Key` header): an instruction with a `{key}` placeholder would
/// leave the caller to build the path, and to get its encoding wrong.
fn records_path(record: Option<&Key>, action: &str) -> String {
    match record {
        Some(k) => format!(
            "/v1/tools/{}/records/{}/{action}",
            path_segment(k.tool.as_str()),
            path_segment(k.key.as_str())
        ),
        // Every answer that asks for a resolution names its record; this is only the words for
        // one that would not.
        None => format!("/v1/tools/TOOL/records/KEY/{action}"),
    }
}

/// `text` percent-encoded for one URL path segment or query value: every byte but RFC 3986's
/// unreserved characters encoded.
pub fn path_segment(text: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// What a call's answer says, as facts every door shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// The verdict, from the core's one table.
    pub verdict: Verdict,
    /// The rule that named the record, for answers about one.
    pub rule: Option<KeyRule>,
    /// The record, when the answer or refusal names one.
    pub key: Option<Key>,
    /// What happened.
    pub what: What,
    /// What the caller may do next.
    pub next: Next,
    /// The tool's identity fields, in words ("to, subject"), when the fallback window compared
    /// only them ([`Explanation::named_by`]): a replay then says that an action with the same
    /// ones ran, rather than an identical call.
    pub identity: Option<String>,
}

/// What happened to the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum What {
    /// The side effect ran in this call, at `at`; `recording` says whether its outcome is kept.
    Ran {
        /// When its outcome was recorded.
        at: Timestamp,
        /// How it was recorded.
        recording: Recording,
    },
    /// A duplicate: the stored outcome of an earlier run, not run now.
    Replayed {
        /// When the earlier run's outcome was recorded, or when an operator resolved it.
        at: Timestamp,
        /// Until when duplicates get it.
        until: Timestamp,
        /// The outcome is an operator's resolution, not one the side effect returned.
        by_operator: bool,
    },
    /// Run without a record (a read, a naturally idempotent tool).
    PassedThrough,
    /// The side effect ran and reported that nothing happened; the key is free again unless the
    /// release was lost.
    NotApplied {
        /// What the side effect said.
        why: String,
        /// How the release was recorded.
        recording: Recording,
    },
    /// Another call holds the record and did not finish within the wait bound.
    InFlight {
        /// Since when.
        since: Timestamp,
        /// When to ask again.
        retry_after: Duration,
    },
    /// Nobody can tell whether the side effect happened.
    Unknown {
        /// Since when.
        since: Timestamp,
        /// The record's fence, which a resolution names.
        fence: Fence,
        /// This very call ran it (and the side effect said its outcome is ambiguous).
        ran_here: bool,
        /// What the side effect or its verifier said.
        why: Option<String>,
    },
    /// The action ran before, and its outcome is no longer kept (the record's ttl passed; its
    /// tombstone remains): nothing ran now.
    Expired {
        /// When the action's outcome was recorded.
        at: Timestamp,
        /// When its outcome stopped being replayed.
        expired_at: Timestamp,
        /// Until when the tombstone answers so (then the key names a new action).
        until: Timestamp,
        /// The record's fence, which a reopening names.
        fence: Fence,
    },
    /// Nothing ran (or, for a lost lease, what ran is not the record's outcome): the call was
    /// refused, for the reason given.
    Refused(Refusal),
}

/// What the caller may do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing: the answer is final until the record expires.
    Nothing,
    /// The fallback window took this call for a repeat: a new key runs it again on purpose.
    RepeatWithNewKey,
    /// Call again with the same key after this long to get the other call's result.
    CallAgainAfter(Duration),
    /// The next call with the same key runs the side effect.
    NextCallRuns,
    /// An operator says what happened, naming this fence.
    Resolve(Fence),
    /// A new key runs the action again on purpose, or an operator reopens the record at this
    /// fence.
    NewKeyOrReopen(Fence),
    /// An operator resolves the record once it reads unknown (its lease ends): its outcome was
    /// recorded nowhere.
    ResolveOnceUnknown,
    /// Look at the record: it holds another call's outcome, not this one.
    LookAtRecord,
    /// Call again with a key.
    AddKey,
    /// A new key for a new action, the same arguments for a retry.
    NewKeyOrSameArguments,
    /// Try again later.
    TryLater,
    /// Nothing: an operator must fix the store (or its keyring) first.
    FixStore,
    /// Fix the request.
    FixRequest,
}

impl Explanation {
    /// The explanation of a call's result.
    pub fn of(result: &Result<Answer, EngineError>) -> Self {
        match result {
            Ok(answer) => Self::of_answer(answer),
            Err(e) => Self::of_error(e),
        }
    }

    /// The explanation of an answer.
    pub fn of_answer(answer: &Answer) -> Self {
        let verdict = Verdict::of_answer(answer);
        let rule = answer.rule;
        let (what, next) = match &answer.decision {
            Decision::Executed {
                executed_at,
                recording,
                ..
            } => (
                What::Ran {
                    at: *executed_at,
                    recording: recording.clone(),
                },
                match recording {
                    Recording::Stored | Recording::Journaled => Next::Nothing,
                    Recording::LeaseLost => Next::LookAtRecord,
                    Recording::Unrecorded(_) => Next::ResolveOnceUnknown,
                },
            ),
            Decision::Replayed {
                outcome,
                executed_at,
                expires_at,
                ..
            } => (
                What::Replayed {
                    at: *executed_at,
                    until: *expires_at,
                    by_operator: Payload::is_resolution(outcome),
                },
                if rule == Some(KeyRule::Fallback) {
                    Next::RepeatWithNewKey
                } else {
                    Next::Nothing
                },
            ),
            Decision::PassedThrough { .. } => (What::PassedThrough, Next::Nothing),
            Decision::NotApplied {
                message, recording, ..
            } => (
                What::NotApplied {
                    why: message.clone(),
                    recording: recording.clone(),
                },
                match recording {
                    Recording::Stored | Recording::Journaled => Next::NextCallRuns,
                    Recording::LeaseLost => Next::LookAtRecord,
                    Recording::Unrecorded(_) => Next::ResolveOnceUnknown,
                },
            ),
            Decision::InFlight { since, retry_after } => (
                What::InFlight {
                    since: *since,
                    retry_after: *retry_after,
                },
                Next::CallAgainAfter(*retry_after),
            ),
            Decision::Unknown {
                since,
                fence,
                ran_here,
                message,
                ..
            } => (
                What::Unknown {
                    since: *since,
                    fence: *fence,
                    ran_here: *ran_here,
                    why: message.clone(),
                },
                Next::Resolve(*fence),
            ),
            Decision::Expired {
                executed_at,
                expired_at,
                retain_until,
                fence,
            } => (
                What::Expired {
                    at: *executed_at,
                    expired_at: *expired_at,
                    until: *retain_until,
                    fence: *fence,
                },
                Next::NewKeyOrReopen(*fence),
            ),
        };
        Explanation {
            verdict,
            rule,
            key: answer.key.clone(),
            what,
            next,
            identity: None,
        }
    }

    /// The explanation of an engine error: a refusal, with the record and rule it names.
    pub fn of_error(e: &EngineError) -> Self {
        let (rule, key) = match e {
            EngineError::KeyReuse { key, rule, .. } => (Some(*rule), Some(key)),
            EngineError::NotFound { key }
            | EngineError::NotResolvable { key, .. }
            | EngineError::NotReopenable { key, .. } => (None, Some(key)),
            _ => (None, None),
        };
        Explanation {
            rule,
            key: key.cloned(),
            ..Self::refused(Refusal::of(e))
        }
    }

    /// The explanation of a refusal, about no record in particular (a door's own: a lease it was
    /// handed that is no longer the record's).
    pub fn refused(refusal: Refusal) -> Self {
        let next = match &refusal {
            Refusal::KeyRequired { .. } => Next::AddKey,
            Refusal::KeyReused { .. } => Next::NewKeyOrSameArguments,
            Refusal::Store {
                failure: StoreFailure::Unreachable(_),
                ..
            }
            | Refusal::Journal { .. } => Next::TryLater,
            Refusal::Store {
                failure: StoreFailure::Unreadable(_) | StoreFailure::Misconfigured(_),
                ..
            } => Next::FixStore,
            Refusal::LeaseLost => Next::LookAtRecord,
            Refusal::Invalid { .. }
            | Refusal::NotFound
            | Refusal::NotSettleable { .. }
            | Refusal::Other { .. } => Next::FixRequest,
        };
        Explanation {
            verdict: refusal.verdict(),
            rule: None,
            key: None,
            what: What::Refused(refusal),
            next,
            identity: None,
        }
    }

    /// The record's full name (`tenant/tool/key`), as the in-process packages name it in their
    /// words; empty when the answer or refusal names none.
    pub fn record_name(&self) -> String {
        self.key.as_ref().map(Key::to_string).unwrap_or_default()
    }

    /// Whether the tool's unknown policy runs an unknown record again on the next call; the
    /// explanation then says so instead of asking for an operator. Doors call it with the tool's
    /// policy (`policy.on_unknown == UnknownPolicy::Retry`).
    #[must_use]
    pub fn retried_when_unknown(mut self, retry: bool) -> Self {
        if let (
            true,
            What::Unknown {
                ran_here: false, ..
            },
        ) = (retry, &self.what)
        {
            self.next = Next::NextCallRuns;
        }
        self
    }

    /// Says that the fallback window compared only the tool's identity fields (`identity`, its
    /// policy's): a replay it answers then names them. Doors call it with the tool's policy.
    #[must_use]
    pub fn named_by(mut self, identity: &[String]) -> Self {
        if !identity.is_empty() && self.rule == Some(KeyRule::Fallback) {
            self.identity = Some(identity.join(", "));
        }
        self
    }

    /// What a person reads (stderr, an exception, a problem's detail): one paragraph that names
    /// the record and says what happened and what to do.
    pub fn for_person(&self, door: &Door<'_>) -> String {
        let Door { effect, record, .. } = *door;
        let next = self.next_for_person(door);
        match &self.what {
            What::Ran { at, recording } => match recording {
                Recording::Stored => format!("{effect} ran at {at}; its outcome is stored"),
                Recording::Journaled => format!("{effect} ran at {at}, but the store did not confirm its outcome: it is journaled and is stored when the store takes writes again"),
                Recording::LeaseLost => format!("{effect} ran, but outlived its lease on {record} and another call took the record over: the record holds that call's outcome, not this one{next}"),
                Recording::Unrecorded(why) => format!("{effect} ran, but its outcome for {record} was recorded neither in the store nor in the journal ({why}); the record turns unknown when its lease ends, for an operator to resolve"),
            },
            What::Replayed {
                at,
                until,
                by_operator,
            } => {
                let same = self.identity.as_ref().map(|fields| {
                    format!("the fallback window (a call without a key with the same {fields}, the arguments that name the action)")
                });
                let by = match (self.rule, &same) {
                    (Some(KeyRule::Fallback), Some(same)) => same.as_str(),
                    (Some(KeyRule::Fallback), None) => "the fallback window (an identical call without a key)",
                    _ => "key",
                };
                let when = if *by_operator {
                    format!("an operator resolved it with `idemgate keys resolve` at {at}; {effect} was not run now")
                } else {
                    format!("{effect} ran at {at}, not now")
                };
                format!("replayed the outcome of {record} by {by}: {when} (kept until {until}){next}")
            }
            What::PassedThrough => format!("{effect} ran without a record (it does not change state)"),
            What::NotApplied { why, recording } => match recording {
                Recording::Stored | Recording::Journaled => format!("{why}; the key of {record} is free again{next}"),
                Recording::LeaseLost => format!("{why}; but the lease on {record} was lost meanwhile and another call holds the record{next}"),
                Recording::Unrecorded(e) => format!("{why}; but releasing the key of {record} failed in the store and the journal ({e}): it turns unknown when its lease ends"),
            },
            What::InFlight { since, .. } => format!("another call holds {record} (since {since}) and did not finish within the wait bound, so this one did not start it again{next}"),
            What::Unknown { since, fence, ran_here, why } => {
                // `why` is the reason the record's history keeps, when the call that ran it gave
                // one. Without it, a call that stopped (a crash, a lease that ran out) and one
                // whose reason was lost look alike, so the words name both rather than guess.
                let why = why.clone().unwrap_or_else(|| if *ran_here {
                    "the side effect said its outcome is ambiguous".to_owned()
                } else {
                    "no outcome was ever recorded for it (the call that ran it stopped first, or reported that it could not tell whether it took effect)".to_owned()
                });
                format!("the outcome of {record} is unknown since {since} (fence {fence}): {why}{next}")
            }
            What::Expired {
                at,
                expired_at,
                until,
                ..
            } => format!("{effect} already ran at {at} under {record}, and its outcome is no longer kept (it expired at {expired_at}; the record is remembered until {until} so that a late retry is not run again), so it was not run now{next}"),
            What::Refused(refusal) => format!("{}{next}", refusal_for_person(refusal, door)),
        }
    }

    fn next_for_person(&self, door: &Door<'_>) -> String {
        match self.next {
            Next::Nothing
            | Next::FixRequest
            | Next::AddKey
            | Next::NewKeyOrSameArguments
            | Next::ResolveOnceUnknown => String::new(),
            Next::RepeatWithNewKey => format!(". To run it again on purpose: {}", door.repeat),
            Next::CallAgainAfter(after) => format!(
                "; try again with the same key in {} s to get its result",
                after.as_secs().max(1)
            ),
            Next::NextCallRuns => {
                "; the next call with the same key runs it again".to_owned()
            }
            Next::Resolve(fence) => format!(
                ". It is not run again: check whether it took effect, then record what happened with {}",
                door.resolve.instruction(fence, self.key.as_ref())
            ),
            Next::NewKeyOrReopen(fence) => format!(
                ". To run it again on purpose: {}, or reopen the record with {}",
                door.repeat,
                door.resolve.reopen(fence, self.key.as_ref())
            ),
            Next::LookAtRecord => " (look at the record to see it)".to_owned(),
            Next::TryLater => "; try again later".to_owned(),
            Next::FixStore => {
                "; retrying cannot help until an operator fixes it".to_owned()
            }
        }
    }

    /// What a model reads in the answer to its tool call: what happened to *this action*, in
    /// words, and what it can do. Replays say it in a note beside the stored result.
    pub fn for_model(&self, door: &Door<'_>) -> String {
        let effect = door.effect;
        match &self.what {
            What::Replayed {
                at, by_operator, ..
            } => {
                if let (Some(KeyRule::Fallback), Some(fields)) = (self.rule, &self.identity) {
                    format!("an action of this tool with the same {fields} (the arguments that name it; the others may have been worded differently) ran at {at} in this conversation, so this call was taken for a repeat of that action and was not run again; the result above is the one it returned then. To do it again on purpose, {}.", door.repeat)
                } else if self.rule == Some(KeyRule::Fallback) {
                    format!("an identical call of this tool (the same arguments, without an idempotency key) ran at {at} in this conversation, so this one was taken for a repeat of that action and was not run again; the result above is the one it returned then. To do it again on purpose, {}.", door.repeat)
                } else if *by_operator {
                    format!("an operator resolved this action with `idemgate keys resolve` at {at}; it was not run now, and the result above is the one the operator recorded.")
                } else {
                    format!("this action was already performed at {at} and was not repeated; the result above is the one it returned then.")
                }
            }
            What::InFlight { since, retry_after } => format!(
                "This action is already running in another call (since {since}); it was not started again. Call again with the same key in about {} s to get its result.",
                retry_after.as_secs().max(1)
            ),
            What::Unknown {
                since,
                fence,
                ran_here,
                why,
            } => {
                let why = why.clone().unwrap_or_else(|| {
                    "no outcome was ever recorded for an earlier attempt (it stopped first, or could not tell whether it took effect)".to_owned()
                });
                // The model cannot resolve a record (it has no operator's tools), and a retry under
                // a new key could do the action twice: it is told to stop and to tell the user,
                // and the person who reads that is told which record and how.
                let resolve = format!(
                    "You cannot resolve this yourself, and calling again under a new key could do it twice: tell the user that a person must check whether it took effect and record what happened for {} with {}.",
                    door.record,
                    door.resolve.instruction(*fence, self.key.as_ref())
                );
                let next = match (ran_here, self.next) {
                    (false, Next::NextCallRuns) => {
                        "The next call with the same key runs it again.".to_owned()
                    }
                    (false, _) => {
                        format!("It was NOT repeated, so that it cannot happen twice. {resolve}")
                    }
                    (true, _) => format!("It was sent to {effect} once and calls with the same key will not send it again. {resolve}"),
                };
                format!("The outcome of this action is unknown (since {since}): {why}. {next}")
            }
            What::NotApplied { why, .. } => {
                format!("Nothing was done: {why}. The call may be sent again.")
            }
            What::Expired { at, expired_at, .. } => format!(
                "This action was already performed at {at}, and its result is no longer kept (it expired at {expired_at}), so it was NOT performed again and its result cannot be shown. If the user wants it done again as a new action, {}.",
                door.repeat
            ),
            What::Refused(refusal) => {
                let words = refusal_for_person(refusal, door);
                match refusal {
                    Refusal::KeyRequired { .. } => format!(
                        "{effect} is treated as a write (it is not known to be read-only), so this call needs an idempotency key, and none was sent; nothing was done. {}",
                        door.add_key
                    ),
                    Refusal::KeyReused { first_seen } => format!(
                        "This idempotency key was already used for {effect} with other arguments (first at {first_seen}), so nothing was done. Use a new key for a new action, and the same arguments when retrying an action."
                    ),
                    Refusal::Store {
                        failure: StoreFailure::Unreachable(_),
                        ..
                    } => format!(
                        "The idempotency store is unavailable, so nothing was done (the call was not sent to {effect}). Try again later. ({words})"
                    ),
                    Refusal::Store {
                        failure: StoreFailure::Unreadable(_) | StoreFailure::Misconfigured(_),
                        ..
                    } => format!(
                        "The idempotency store cannot be used for this action, so nothing was done (the call was not sent to {effect}), and calling again will not help until a person fixes it: tell the user. ({words})"
                    ),
                    Refusal::Invalid { .. } => format!(
                        "This call is not valid, so nothing was done: {words}. Fix it before sending it again."
                    ),
                    Refusal::LeaseLost => format!(
                        "This call's hold on the action's record was lost ({words}): the record holds another call's outcome, not this one."
                    ),
                    Refusal::NotFound | Refusal::NotSettleable { .. } => {
                        format!("Nothing was changed: {words}.")
                    }
                    Refusal::Journal { why } => format!(
                        "The journal of outcomes the store has not confirmed could not be used: {why}."
                    ),
                    Refusal::Other { .. } => format!("{}.", capitalized(&words)),
                }
            }
            What::Ran { .. } | What::PassedThrough => {
                format!("{}.", capitalized(&self.for_person(door)))
            }
        }
    }
}

/// What a refusal says to a person, without what to do next.
fn refusal_for_person(refusal: &Refusal, door: &Door<'_>) -> String {
    let record = door.record;
    match refusal {
        Refusal::KeyRequired { tool } => format!(
            "tool {tool} is treated as a write (it is not known to be read-only) and needs an idempotency key, and none was sent, so nothing ran: {} (derive it from the run id and step), configure a fallback window for the tool, or mark it read-only if it is",
            door.add_key
        ),
        Refusal::KeyReused { first_seen } => format!(
            "{record} was already used with different arguments (first use at {first_seen}), so nothing ran; use a new key for a new action, and the same arguments to retry one"
        ),
        Refusal::Invalid { why } => format!("{why}; nothing ran"),
        Refusal::Store { reserving, failure } => {
            // A discreet door keeps the store's insides to itself, but never which record cannot
            // be read: that is what the operator must fix.
            let words = match failure {
                StoreFailure::Unreadable(why) => Some(why.as_str()),
                StoreFailure::Unreachable(why) | StoreFailure::Misconfigured(why) => {
                    (!door.discreet).then_some(why.as_str())
                }
            };
            match (reserving, words) {
                (true, Some(why)) => format!("failed to reserve the key, so nothing ran: {why}"),
                (true, None) => "failed to reserve the key, so nothing ran".to_owned(),
                (false, Some(why)) => why.to_owned(),
                (false, None) => match failure {
                    StoreFailure::Misconfigured(_) => "the store is misconfigured".to_owned(),
                    StoreFailure::Unreachable(_) | StoreFailure::Unreadable(_) => {
                        "the store is unavailable".to_owned()
                    }
                },
            }
        }
        Refusal::LeaseLost => "the lease is no longer the record's current one: it was taken over, resolved or released".to_owned(),
        Refusal::NotFound => format!("no record under {record}"),
        Refusal::NotSettleable {
            asked,
            state,
            fence,
        } => {
            let (can, hint) = match (asked, state) {
                (Settle::Resolve, _) => ("only an unknown record at the fence you looked at can be resolved", ""),
                (Settle::Reopen, State::InFlight) => (
                    "only a completed or unknown record at the fence you looked at can be reopened",
                    ": a call holds it and may be running the action now, so reopening it could run the action twice; wait until it finishes or its lease ends (it then reads unknown)",
                ),
                (Settle::Reopen, _) => ("only a completed or unknown record at the fence you looked at can be reopened", ""),
            };
            format!("the record of {record} is {state} at fence {fence}; {can}{hint}")
        }
        Refusal::Journal { why } => format!("failed to use the completion journal: {why}"),
        Refusal::Other { why, .. } => why.clone(),
    }
}

fn capitalized(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_core::{Answer, Outcome};

    const CLI: Door<'static> = Door {
        effect: "the command",
        record: "k (tool t)",
        resolve: Resolve::Command("k --tool t --tenant a"),
        repeat: "run it again with a new --key",
        add_key: "pass --key",
        discreet: false,
    };

    fn answer(decision: Decision, rule: Option<KeyRule>) -> Answer {
        Answer {
            key: None,
            rule,
            decision,
        }
    }

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn an_unknown_outcome_names_the_fence_and_both_resolutions_unless_the_tool_retries() {
        let unknown = answer(
            Decision::Unknown {
                since: at(1_000),
                fence: 7,
                ran_here: false,
                message: None,
                recording: None,
            },
            Some(KeyRule::Explicit),
        );
        let told = Explanation::of_answer(&unknown);
        assert_eq!(told.next, Next::Resolve(7));
        let person = told.for_person(&CLI);
        assert!(
            person.contains("--fence 7 --completed") && person.contains("--release"),
            "{person}"
        );
        let model = told.for_model(&CLI);
        assert!(model.contains("NOT repeated"), "{model}");
        // What the model can do: nothing itself; the person it tells learns which record and
        // how to resolve it.
        assert!(
            model.contains("You cannot resolve this yourself")
                && model.contains("tell the user")
                && model.contains(CLI.record)
                && model.contains("--fence 7"),
            "{model}"
        );

        let retried = Explanation::of_answer(&unknown).retried_when_unknown(true);
        assert_eq!(retried.next, Next::NextCallRuns);
        let person = retried.for_person(&CLI);
        assert!(
            person.contains("runs it again") && !person.contains("--fence"),
            "{person}"
        );
    }

    #[test]
    fn the_command_lines_resolution_of_another_doors_record_names_its_result() {
        let record = |tool: &str| {
            Explanation::of_answer(&Answer {
                key: Some(Key::new(
                    idemgate_core::TenantId::new("a").unwrap(),
                    idemgate_core::ToolName::new(tool).unwrap(),
                    idemgate_core::IdempotencyKey::new("k").unwrap(),
                )),
                rule: Some(KeyRule::Explicit),
                decision: Decision::Unknown {
                    since: at(1_000),
                    fence: 3,
                    ran_here: false,
                    message: None,
                    recording: None,
                },
            })
        };
        // A gateway's or MCP server's tool replays a result, not a command's exit code.
        let mail = record("send_mail").for_person(&CLI);
        assert!(
            mail.contains("--fence 3 --completed --result JSON`"),
            "{mail}"
        );
        // `exec`'s own records take a bare `--completed` (exit 0).
        let command = record(crate::EXEC_TOOL).for_person(&CLI);
        assert!(
            command.contains("--fence 3 --completed`") && !command.contains("--result"),
            "{command}"
        );
        // A command `exec` ran under another tool says its exit code.
        let exec = Door {
            resolve: Resolve::Exec("k --tool deploy --tenant a"),
            ..CLI
        };
        let deploy = record("deploy").for_person(&exec);
        assert!(
            deploy.contains("--fence 3 --completed --exit-code 0`"),
            "{deploy}"
        );
    }

    #[test]
    fn a_window_replay_says_it_was_taken_for_a_repeat_and_how_to_repeat_on_purpose() {
        let replay = |rule, outcome| {
            Explanation::of_answer(&answer(
                Decision::Replayed {
                    outcome,
                    executed_at: at(1_000),
                    expires_at: at(9_000),
                    verified: false,
                },
                Some(rule),
            ))
        };
        let window = replay(KeyRule::Fallback, Outcome::success(b"1".to_vec()));
        assert_eq!(window.next, Next::RepeatWithNewKey);
        let model = window.for_model(&CLI);
        assert!(
            model.contains("taken for a repeat") && model.contains("a new --key"),
            "{model}"
        );
        let keyed = replay(KeyRule::Explicit, Outcome::success(b"1".to_vec()));
        assert_eq!(keyed.next, Next::Nothing);
        assert!(keyed.for_model(&CLI).contains("not repeated"));
        assert!(keyed
            .for_person(&CLI)
            .contains("the command ran at 1970-01-01T00:00:01.000Z, not now"));
        let resolution = Payload::Json(serde_json::value::to_raw_value(&1).unwrap())
            .into_resolution(idemgate_core::OutcomeKind::Success);
        let resolved = replay(KeyRule::Explicit, resolution);
        assert!(matches!(
            resolved.what,
            What::Replayed {
                by_operator: true,
                ..
            }
        ));
        assert!(resolved.for_model(&CLI).contains("an operator resolved"));

        // Named by identity fields: the replay says which arguments named the action; a key's
        // replay is not the window's and says nothing of them.
        let fields = ["to".to_owned(), "subject".to_owned()];
        let named = replay(KeyRule::Fallback, Outcome::success(b"1".to_vec())).named_by(&fields);
        let model = named.for_model(&CLI);
        assert!(
            model.contains(
                "an action of this tool with the same to, subject (the arguments that name it"
            ),
            "{model}"
        );
        assert!(named.for_person(&CLI).contains("with the same to, subject"));
        let keyed = replay(KeyRule::Explicit, Outcome::success(b"1".to_vec())).named_by(&fields);
        assert_eq!(keyed.identity, None);
    }

    #[test]
    fn an_outcome_recorded_nowhere_is_never_told_as_done() {
        let lost = Explanation::of_answer(&answer(
            Decision::Executed {
                outcome: Outcome::success(Vec::new()),
                executed_at: at(0),
                expires_at: at(1),
                recording: Recording::Unrecorded("disk full".into()),
            },
            None,
        ));
        assert_eq!(lost.verdict, Verdict::Unrecorded);
        assert_eq!(lost.next, Next::ResolveOnceUnknown);
        let person = lost.for_person(&CLI);
        assert!(
            person.contains("recorded neither") && person.contains("disk full"),
            "{person}"
        );
    }

    #[test]
    fn a_refusal_says_nothing_ran_and_what_to_do() {
        let e = EngineError::KeyRequired {
            tool: "t".to_owned(),
        };
        let told = Explanation::of_error(&e);
        assert_eq!(
            (told.verdict, told.next),
            (Verdict::KeyRequired, Next::AddKey)
        );
        assert!(told.for_model(&CLI).contains("pass --key"));
        let busy = Explanation::of_answer(&answer(
            Decision::InFlight {
                since: at(0),
                retry_after: Duration::from_millis(300),
            },
            None,
        ));
        assert_eq!(busy.next, Next::CallAgainAfter(Duration::from_millis(300)));
        assert!(busy
            .for_person(&CLI)
            .contains("try again with the same key in 1 s"));
    }

    #[test]
    fn an_expired_action_says_when_it_ran_that_nothing_ran_now_and_how_to_run_it_again() {
        let expired = answer(
            Decision::Expired {
                executed_at: at(1_000),
                expired_at: at(2_000),
                retain_until: at(9_000),
                fence: 3,
            },
            Some(KeyRule::Explicit),
        );
        let told = Explanation::of_answer(&expired);
        assert_eq!(told.verdict, Verdict::Expired);
        assert_eq!(told.next, Next::NewKeyOrReopen(3));
        let person = told.for_person(&CLI);
        for said in [
            "already ran at 1970-01-01T00:00:01",
            "no longer kept",
            "not run now",
            "run it again with a new --key",
            "`idemgate keys reopen k --tool t --tenant a --fence 3 --reason",
        ] {
            assert!(person.contains(said), "{said:?} in {person}");
        }
        let model = told.for_model(&CLI);
        for said in [
            "already performed at 1970-01-01T00:00:01",
            "NOT performed again",
            "run it again with a new --key",
        ] {
            assert!(model.contains(said), "{said:?} in {model}");
        }
        assert!(!model.contains("keys reopen"), "{model}");
    }
}
