//! Tool policies: how each tool's calls are treated.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What kind of call a tool makes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// Changes nothing: passes un-keyed, without touching the store.
    Read,
    /// Changes state: needs a key (or a fallback window) and runs at most once per key. Tools that
    /// are not configured are writes.
    #[default]
    Write,
    /// Changes state, but repeating it is harmless (an upsert, a set-to-value): passes through.
    NaturalIdempotent,
}

impl fmt::Display for ToolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ToolKind::Read => "read",
            ToolKind::Write => "write",
            ToolKind::NaturalIdempotent => "natural_idempotent",
        })
    }
}

impl FromStr for ToolKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.replace('-', "_").as_str() {
            "read" => Ok(ToolKind::Read),
            "write" => Ok(ToolKind::Write),
            "natural_idempotent" => Ok(ToolKind::NaturalIdempotent),
            _ => Err(format!(
                "unknown tool kind {s:?}: expected read, write or natural_idempotent"
            )),
        }
    }
}

/// What duplicates of a call whose outcome is unknown get.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownPolicy {
    /// An outcome-unknown answer until an operator or a verifier resolves the record.
    #[default]
    Block,
    /// A verifier registered for the tool probes whether the side effect happened.
    Verify,
    /// Run again: only for tools that pass the key downstream (so the downstream deduplicates) or
    /// are otherwise safe to retry.
    Retry,
}

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnknownPolicy::Block => "block",
            UnknownPolicy::Verify => "verify",
            UnknownPolicy::Retry => "retry",
        })
    }
}

impl FromStr for UnknownPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "block" => Ok(UnknownPolicy::Block),
            "verify" => Ok(UnknownPolicy::Verify),
            "retry" => Ok(UnknownPolicy::Retry),
            _ => Err(format!(
                "unknown policy {s:?}: expected block, verify or retry"
            )),
        }
    }
}

/// Whether the gate acts on what it decides, or only records it (shadow mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Duplicates are replayed, waited for or refused: the gate's whole contract.
    #[default]
    Enforce,
    /// Shadow mode, for adopting the gate on a live agent: every call runs and nothing is
    /// replayed, waited for or refused. A call that enforce mode would have answered without
    /// running is recorded in the history of the record it duplicates (with the verdict it
    /// would have had and the rule that named the record) and told to the observers, so
    /// `keys list --observed`, the console and `/metrics` show what the gate would have done.
    /// Fresh calls reserve and complete their records as in enforce mode, so switching to
    /// enforce starts from the records observe mode kept.
    Observe,
}

impl Mode {
    /// Whether it is [`Mode::Enforce`] (the default, left out when a policy is written).
    pub fn is_enforce(&self) -> bool {
        *self == Mode::Enforce
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Enforce => "enforce",
            Mode::Observe => "observe",
        })
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "enforce" => Ok(Mode::Enforce),
            "observe" => Ok(Mode::Observe),
            _ => Err(format!("unknown mode {s:?}: expected enforce or observe")),
        }
    }
}

/// How long a record is remembered after its call ran, unless a tool's policy says otherwise.
pub const DEFAULT_TOMBSTONE: Duration = Duration::from_secs(30 * 24 * 3600);

/// How one tool's calls are treated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolPolicy {
    /// Read, write or naturally idempotent.
    pub kind: ToolKind,
    /// How long a completed outcome is kept and replayed.
    #[serde(with = "humantime_serde_compat")]
    pub ttl: Duration,
    /// How long after a call ran its record is remembered (counted from its completion, like
    /// `ttl`): a retry past the ttl and within this is refused as expired, told that the action
    /// ran and when, instead of running again. `"0s"` (or anything no longer than `ttl`) keeps no
    /// tombstone: a retry past the ttl runs the action again. Records the fallback window named
    /// never keep one.
    #[serde(with = "humantime_serde_compat")]
    pub tombstone: Duration,
    /// How long a reservation holds without a heartbeat; the engine heartbeats at a third of it
    /// while the side effect runs, so it bounds how long a crash goes unnoticed, not how long a
    /// call may take.
    #[serde(with = "humantime_serde_compat")]
    pub lease: Duration,
    /// How long a duplicate waits for an in-flight first call before it gets an in-flight answer.
    #[serde(with = "humantime_serde_compat")]
    pub wait: Duration,
    /// When set, a call without a key is deduplicated by (tool, canonical arguments) for this long.
    #[serde(with = "humantime_serde_compat::option")]
    pub fallback_window: Option<Duration>,
    /// The arguments that name the tool's action (its identity fields): JSON pointers (`/to`,
    /// `/order/id`) or top-level argument names (`to`). The fallback window (and the re-emission
    /// window a door keeps beside a call id) compares only these, so a call that rewords the
    /// rest (a re-planned mail's body) within the window is the same action. A call that lacks
    /// one of them is named by all its arguments. Empty: all arguments name the action.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub identity: Vec<String>,
    /// What duplicates of an unknown outcome get.
    pub on_unknown: UnknownPolicy,
    /// `enforce` (the default) or `observe`: shadow mode, where every call runs and what enforce
    /// would have done is recorded instead ([`Mode::Observe`]).
    #[serde(skip_serializing_if = "Mode::is_enforce")]
    pub mode: Mode,
}

impl Default for ToolPolicy {
    fn default() -> Self {
        ToolPolicy {
            kind: ToolKind::Write,
            ttl: Duration::from_secs(24 * 3600),
            tombstone: DEFAULT_TOMBSTONE,
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(5),
            fallback_window: None,
            identity: Vec::new(),
            on_unknown: UnknownPolicy::Block,
            mode: Mode::Enforce,
        }
    }
}

impl ToolPolicy {
    /// A read tool.
    pub fn read() -> Self {
        ToolPolicy {
            kind: ToolKind::Read,
            ..Self::default()
        }
    }

    /// A write tool with the default settings.
    pub fn write() -> Self {
        Self::default()
    }

    /// A naturally idempotent write.
    pub fn natural_idempotent() -> Self {
        ToolPolicy {
            kind: ToolKind::NaturalIdempotent,
            ..Self::default()
        }
    }
}

/// The policies of all tools, with a default for tools not named (a write, unless changed).
#[derive(Clone, Debug, Default)]
pub struct Policies {
    default: ToolPolicy,
    tools: HashMap<String, ToolPolicy>,
}

impl Policies {
    /// Every tool a write with the default settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the policy of tools that are not named.
    pub fn with_default(mut self, policy: ToolPolicy) -> Self {
        self.default = policy;
        self
    }

    /// Sets one tool's policy.
    pub fn with_tool(mut self, tool: impl Into<String>, policy: ToolPolicy) -> Self {
        self.tools.insert(tool.into(), policy);
        self
    }

    /// The policy of `tool`.
    pub fn get(&self, tool: &str) -> &ToolPolicy {
        self.tools.get(tool).unwrap_or(&self.default)
    }
}

/// Durations as human text ("30s", "24h") in configuration files.
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }

    pub(super) mod option {
        use super::*;

        pub(in super::super) fn serialize<S: Serializer>(
            d: &Option<Duration>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }

        pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            super::deserialize(d).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unnamed_tools_are_writes() {
        let p = Policies::new().with_tool("search", ToolPolicy::read());
        assert_eq!(p.get("search").kind, ToolKind::Read);
        assert_eq!(p.get("never-heard-of-it").kind, ToolKind::Write);
    }

    #[test]
    fn policy_reads_human_durations() {
        let p: ToolPolicy = serde_json::from_str(
            r#"{"kind":"write","ttl":"1h","fallback_window":"30s","on_unknown":"retry"}"#,
        )
        .unwrap();
        assert_eq!(p.ttl, Duration::from_secs(3600));
        assert_eq!(p.fallback_window, Some(Duration::from_secs(30)));
        assert_eq!(p.on_unknown, UnknownPolicy::Retry);
        assert_eq!(p.lease, ToolPolicy::default().lease);
        assert!(serde_json::from_str::<ToolPolicy>(r#"{"ttl":"soon"}"#).is_err());
        assert!(serde_json::from_str::<ToolPolicy>(r#"{"tll":"1h"}"#).is_err());
    }
}
