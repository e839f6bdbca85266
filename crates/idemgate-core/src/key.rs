//! Names of records: tenant, tool and idempotency key, with their limits and the minting helpers.
//!
//! A record is named by `(tenant, tool, key)`. A key that a model or a client supplies is therefore
//! always namespaced under its tenant and tool: two tenants (or two tools) that pick the same key
//! never meet.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A name (tenant, tool or key) outside its limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The name was empty.
    #[error("{what} is empty")]
    Empty {
        /// Which kind of name.
        what: &'static str,
    },
    /// The name was longer than allowed.
    #[error("{what} is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Which kind of name.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An explicit key used a prefix the engine reserves for the keys it derives itself.
    #[error("{what} starts with {prefix:?}, which is reserved for keys idemgate derives itself (the fallback window); choose another key")]
    Reserved {
        /// Which kind of name.
        what: &'static str,
        /// The reserved prefix.
        prefix: &'static str,
    },
    /// The name had a character outside the allowed set.
    #[error("{what} has {found:?} at position {at}; only {allowed} are allowed")]
    BadChar {
        /// Which kind of name.
        what: &'static str,
        /// Byte offset of the character.
        at: usize,
        /// The character.
        found: char,
        /// The allowed set, in words.
        allowed: &'static str,
    },
}

/// Longest idempotency key accepted, in bytes (the IETF draft leaves it to the server; Stripe uses 255).
pub const MAX_KEY_LEN: usize = 255;
/// The prefix of the keys the engine derives for calls without a key (the fallback window).
pub const FALLBACK_PREFIX: &str = "fallback-";
/// Longest tenant id accepted, in bytes.
pub const MAX_TENANT_LEN: usize = 64;
/// Longest tool name accepted, in bytes.
pub const MAX_TOOL_LEN: usize = 128;

// Names are `Arc<str>`: a record's name is cloned into the reservation, the stored record and the
// answer of every call, and a clone should be a reference count, not three allocations.
macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:expr, $allowed:expr, $allowed_text:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(Arc<str>);

        impl $name {
            /// Checks `s` against the limits and wraps it.
            ///
            /// # Errors
            /// [`KeyError`] when `s` is empty, too long, or has a character outside the allowed set.
            pub fn new(s: impl Into<String>) -> Result<Self, KeyError> {
                let s = s.into();
                check(&s, $what, $max, $allowed, $allowed_text)?;
                Ok($name(s.into()))
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = KeyError;
            fn from_str(s: &str) -> Result<Self, KeyError> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = KeyError;
            fn try_from(s: String) -> Result<Self, KeyError> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(n: $name) -> String {
                n.0.to_string()
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

fn check(
    s: &str,
    what: &'static str,
    max: usize,
    allowed: fn(u8) -> bool,
    allowed_text: &'static str,
) -> Result<(), KeyError> {
    if s.is_empty() {
        return Err(KeyError::Empty { what });
    }
    if s.len() > max {
        return Err(KeyError::TooLong {
            what,
            len: s.len(),
            max,
        });
    }
    if let Some((at, c)) = s
        .char_indices()
        .find(|&(_, c)| !c.is_ascii() || !allowed(c as u8))
    {
        return Err(KeyError::BadChar {
            what,
            at,
            found: c,
            allowed: allowed_text,
        });
    }
    Ok(())
}

fn tenant_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

fn tool_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/')
}

fn key_char(b: u8) -> bool {
    // Visible ASCII: no spaces or control characters, so a key survives headers, logs and shells.
    b.is_ascii_graphic()
}

name_type!(
    /// A tenant: whose records these are. 1 to 64 bytes of `A-Z a-z 0-9 . _ -`.
    TenantId,
    "tenant id",
    MAX_TENANT_LEN,
    tenant_char,
    "letters, digits, '.', '_' and '-'"
);

name_type!(
    /// A tool (or scope): which side effect a key guards. 1 to 128 bytes of `A-Z a-z 0-9 . _ - : /`.
    ToolName,
    "tool name",
    MAX_TOOL_LEN,
    tool_char,
    "letters, digits, '.', '_', '-', ':' and '/'"
);

name_type!(
    /// An idempotency key naming one logical action: 1 to 255 bytes of visible ASCII (`!` to `~`).
    IdempotencyKey,
    "idempotency key",
    MAX_KEY_LEN,
    key_char,
    "visible ASCII characters ('!' to '~', no spaces)"
);

impl IdempotencyKey {
    /// Derives a stable key for one step of one orchestration run: the same `(run_id, step)` always
    /// gives the same key, so a retried step is recognised; different steps never collide.
    ///
    /// Use the run id of the agent run and a step id that names the logical action (a tool-call id,
    /// or a step number that the orchestrator does not renumber on retry).
    ///
    /// # Errors
    /// [`KeyError::Empty`] when the run id or the step is empty or only whitespace: a run id read
    /// from an unset variable would give every run the same keys, and every run after the first
    /// would replay its steps instead of running them.
    pub fn derive(run_id: &str, step: &str) -> Result<Self, KeyError> {
        if run_id.trim().is_empty() {
            return Err(KeyError::Empty { what: "run id" });
        }
        if step.trim().is_empty() {
            return Err(KeyError::Empty { what: "step" });
        }
        // Length-prefix both parts so ("ab", "c") and ("a", "bc") differ.
        let mut h = Sha256::new();
        h.update((run_id.len() as u64).to_be_bytes());
        h.update(run_id.as_bytes());
        h.update((step.len() as u64).to_be_bytes());
        h.update(step.as_bytes());
        Ok(IdempotencyKey(
            format!("run-{}", hex(&h.finalize()[..16])).into(),
        ))
    }

    /// Checks a key that a caller supplied: as [`IdempotencyKey::new`], and it must not start
    /// with the prefix of the keys the engine derives for the fallback window, so that a caller's
    /// key can never pass for one (and get the fallback window's shorter retention).
    ///
    /// # Errors
    /// As [`IdempotencyKey::new`], and [`KeyError::Reserved`] for the reserved prefix.
    pub fn explicit(s: impl Into<String>) -> Result<Self, KeyError> {
        let key = Self::new(s)?;
        if key.as_str().starts_with(FALLBACK_PREFIX) {
            return Err(KeyError::Reserved {
                what: "idempotency key",
                prefix: FALLBACK_PREFIX,
            });
        }
        Ok(key)
    }

    /// Mints a fresh random key (128 bits) for a new logical action.
    ///
    /// Mint it once per action, before the first attempt, and reuse it on every retry: a key minted
    /// per attempt deduplicates nothing.
    ///
    /// # Panics
    /// When the operating system has no randomness to give, which std also treats as fatal.
    pub fn mint() -> Self {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("failed to read randomness from the operating system");
        IdempotencyKey(format!("key-{}", hex(&bytes)).into())
    }
}

/// Which rule named a record: the caller's key, or the (tool, arguments) fallback window.
///
/// A key a door derived from what a model sent ([`KeyRule::CallId`], [`KeyRule::ModelKey`]) names
/// its record as any key does: it is kept as long, and on the wire (answers, problems, headers,
/// `_meta`) it is `explicit` like any key (the door says which one named the call, e.g. MCP's
/// `named_by`). The variants are there for the observers, which count duplicates by the rule that
/// made them duplicates (`idemgate_kit::metrics::duplicate_rule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyRule {
    /// The call carried an explicit idempotency key.
    Explicit,
    /// The call had no key; one was derived from the tool and its canonical arguments, valid for the
    /// tool's short fallback window.
    Fallback,
    /// The call's key was derived by its door from the framework's tool-call id, within the
    /// call's scope ([`Call::key_named_by`](crate::Call::key_named_by)).
    #[serde(rename(serialize = "explicit"), skip_deserializing)]
    CallId,
    /// The call's key was derived by its door from the model's own `idempotency_key` argument,
    /// within the call's scope ([`Call::key_named_by`](crate::Call::key_named_by)).
    #[serde(rename(serialize = "explicit"), skip_deserializing)]
    ModelKey,
}

impl KeyRule {
    /// The rule that named a record, as its key shows: the engine derives fallback keys under a
    /// prefix that callers' keys may not use ([`IdempotencyKey::explicit`]). (Which door's fact a
    /// key came from is not in it: never [`KeyRule::CallId`] or [`KeyRule::ModelKey`].)
    pub fn of(key: &IdempotencyKey) -> Self {
        if key.as_str().starts_with(FALLBACK_PREFIX) {
            KeyRule::Fallback
        } else {
            KeyRule::Explicit
        }
    }

    /// The rule in the words the observers count duplicates by: `key` (a key the caller, the
    /// program or the orchestration layer gave), `window` (an identical call within the
    /// fallback window), `call_id` or `model_key` (a key the door derived from the framework's
    /// call id or the model's own key).
    pub fn duplicate_label(self) -> &'static str {
        match self {
            KeyRule::Explicit => "key",
            KeyRule::Fallback => "window",
            KeyRule::CallId => "call_id",
            KeyRule::ModelKey => "model_key",
        }
    }

    /// Its name on the wire: `fallback`, or `explicit` for a record any key names.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyRule::Explicit | KeyRule::CallId | KeyRule::ModelKey => "explicit",
            KeyRule::Fallback => "fallback",
        }
    }
}

impl fmt::Display for KeyRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The full name of one record: `(tenant, tool, key)`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    /// Whose record.
    pub tenant: TenantId,
    /// Which tool or scope.
    pub tool: ToolName,
    /// Which logical action.
    pub key: IdempotencyKey,
}

impl Key {
    /// Names a record.
    pub fn new(tenant: TenantId, tool: ToolName, key: IdempotencyKey) -> Self {
        Key { tenant, tool, key }
    }

    /// The fallback key for a call without a key: derived from the canonical arguments' fingerprint,
    /// so byte-different but equal argument objects share it.
    pub fn fallback(tenant: TenantId, tool: ToolName, fingerprint: &crate::Fingerprint) -> Self {
        let key = IdempotencyKey(format!("{FALLBACK_PREFIX}{}", fingerprint.to_hex()).into());
        Key { tenant, tool, key }
    }

    /// A fixed-length digest of the whole name, for stores whose key names must not be shaped by
    /// client input (Redis key names, file names).
    pub fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        for part in [self.tenant.as_str(), self.tool.as_str(), self.key.as_str()] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().into()
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.tenant, self.tool, self.key)
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// The bytes [`hex`] wrote (either case read), or `None` for text that is not hex.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_enforced_with_clear_errors() {
        assert!(IdempotencyKey::new("order-42:attempt").is_ok());
        let e = IdempotencyKey::new("").unwrap_err();
        assert_eq!(e.to_string(), "idempotency key is empty");
        let e = IdempotencyKey::new("a b").unwrap_err();
        assert!(e.to_string().contains("position 1"), "{e}");
        let e = IdempotencyKey::new("k".repeat(256)).unwrap_err();
        assert!(e.to_string().contains("256 bytes"), "{e}");
        assert!(IdempotencyKey::new("k".repeat(255)).is_ok());
        assert!(TenantId::new("acme/prod").is_err());
        assert!(ToolName::new("payments/charge:v2").is_ok());
        assert!(ToolName::new("héllo").is_err());
    }

    #[test]
    fn explicit_keys_cannot_pass_for_fallback_keys() {
        let e = IdempotencyKey::explicit("fallback-1234").unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        let k = IdempotencyKey::explicit("order-1").unwrap();
        assert_eq!(KeyRule::of(&k), KeyRule::Explicit);
        let fp = crate::Fingerprint::of_bytes(b"x");
        let t = TenantId::new("t").unwrap();
        let f = Key::fallback(t, ToolName::new("x").unwrap(), &fp);
        assert_eq!(KeyRule::of(&f.key), KeyRule::Fallback);
    }

    #[test]
    fn a_key_a_door_derived_is_explicit_on_the_wire() {
        for rule in [KeyRule::Explicit, KeyRule::CallId, KeyRule::ModelKey] {
            assert_eq!(serde_json::to_value(rule).unwrap(), "explicit");
            assert_eq!(rule.to_string(), "explicit");
        }
        assert_eq!(serde_json::to_value(KeyRule::Fallback).unwrap(), "fallback");
        let read: KeyRule = serde_json::from_value(serde_json::json!("explicit")).unwrap();
        assert_eq!(read, KeyRule::Explicit);
        assert!(serde_json::from_value::<KeyRule>(serde_json::json!("call_id")).is_err());
    }

    #[test]
    fn derived_keys_are_stable_and_distinct() {
        let d = |r, s| IdempotencyKey::derive(r, s).unwrap();
        let a = d("run-1", "call-7");
        assert_eq!(a, d("run-1", "call-7"));
        assert_ne!(a, d("run-1", "call-8"));
        assert_ne!(d("ab", "c"), d("a", "bc"));
        assert!(IdempotencyKey::new(a.as_str()).is_ok());
    }

    #[test]
    fn derived_keys_need_a_run_and_a_step() {
        // `--run "$RUN_ID"` with the variable unset must not give every run one key.
        let e = IdempotencyKey::derive("", "3").unwrap_err();
        assert_eq!(e.to_string(), "run id is empty");
        let e = IdempotencyKey::derive("run-1", " ").unwrap_err();
        assert_eq!(e.to_string(), "step is empty");
    }

    #[test]
    fn minted_keys_are_fresh_and_valid() {
        let a = IdempotencyKey::mint();
        let b = IdempotencyKey::mint();
        assert_ne!(a, b);
        assert!(IdempotencyKey::new(a.as_str()).is_ok());
    }

    #[test]
    fn digest_separates_parts() {
        let k = |t: &str, o: &str, k: &str| {
            Key::new(
                TenantId::new(t).unwrap(),
                ToolName::new(o).unwrap(),
                IdempotencyKey::new(k).unwrap(),
            )
        };
        assert_ne!(k("a", "bc", "d").digest(), k("ab", "c", "d").digest());
        assert_eq!(k("a", "b", "c").digest(), k("a", "b", "c").digest());
    }
}
