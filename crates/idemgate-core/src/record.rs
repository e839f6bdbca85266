//! Records, their states, and the outcome stored in them.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::canonical::Fingerprint;
use crate::key::{hex, Key};
use crate::time::Timestamp;

/// A number that grows with every takeover of a record. Together with a random [`LeaseToken`] it
/// names one holder; only the current holder may complete, release or heartbeat.
pub type Fence = u64;

/// 128 random bits minted per reservation, so that a record removed and reserved again (whose fence
/// starts over) can never be completed by a holder of the old one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(pub u128);

impl LeaseToken {
    /// A fresh token: 64 random bits drawn once per process, then 64 bits that are a keyed hash
    /// (SipHash with a random per-process key) of a counter. Tokens never repeat within a process
    /// in practice and cannot be guessed from one another, which matters once a lease travels
    /// over HTTP; a syscall for fresh randomness on every call would cost more than the rest of
    /// the call.
    ///
    /// # Panics
    /// When the operating system has no randomness to give.
    pub fn mint() -> Self {
        use std::hash::BuildHasher as _;
        static KEYS: std::sync::OnceLock<(u64, std::collections::hash_map::RandomState)> =
            std::sync::OnceLock::new();
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let (prefix, hasher) = KEYS.get_or_init(|| {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b).expect("failed to read randomness from the operating system");
            (
                u64::from_be_bytes(b),
                std::collections::hash_map::RandomState::new(),
            )
        });
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        LeaseToken((u128::from(*prefix) << 64) | u128::from(hasher.hash_one(n)))
    }

    /// Lower-case hex, 32 characters.
    pub fn to_hex(self) -> String {
        hex(&self.0.to_be_bytes())
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({}…)", &self.to_hex()[..8])
    }
}

impl FromStr for LeaseToken {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        u128::from_str_radix(s, 16).map(LeaseToken)
    }
}

impl Serialize for LeaseToken {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for LeaseToken {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Proof of holding a record: its fence and token. Written `FENCE.TOKEN` when it travels as text
/// (the HTTP coordination API carries it between begin and complete).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lease {
    /// The record's fence at reservation or takeover.
    pub fence: Fence,
    /// The holder's random token.
    pub token: LeaseToken,
}

impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.fence, self.token.to_hex())
    }
}

impl FromStr for Lease {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("failed to read lease {s:?}: expected FENCE.TOKEN");
        let (fence, token) = s.split_once('.').ok_or_else(bad)?;
        Ok(Lease {
            fence: fence.parse().map_err(|_| bad())?,
            token: token.parse().map_err(|_| bad())?,
        })
    }
}

/// Whether a stored outcome was a success or a terminal failure. Both are replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    /// The side effect succeeded.
    Success,
    /// The side effect failed for good (a retry would fail the same way); replayed as a failure.
    Failed,
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutcomeKind::Success => "success",
            OutcomeKind::Failed => "failed",
        })
    }
}

impl FromStr for OutcomeKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "success" => Ok(OutcomeKind::Success),
            "failed" => Ok(OutcomeKind::Failed),
            _ => Err(format!(
                "unknown outcome kind {s:?}: expected success or failed"
            )),
        }
    }
}

/// The stored result of a side effect: its kind and opaque bytes chosen by the front door (the
/// command line stores exit code and output, the gateway the HTTP answer).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Outcome {
    /// Success or terminal failure.
    pub kind: OutcomeKind,
    /// The result itself.
    pub body: Vec<u8>,
}

impl Outcome {
    /// A success with `body`.
    pub fn success(body: impl Into<Vec<u8>>) -> Self {
        Outcome {
            kind: OutcomeKind::Success,
            body: body.into(),
        }
    }

    /// A terminal failure with `body`.
    pub fn failed(body: impl Into<Vec<u8>>) -> Self {
        Outcome {
            kind: OutcomeKind::Failed,
            body: body.into(),
        }
    }
}

/// The state names, for filters and display.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum State {
    /// Reserved; the side effect may be running.
    InFlight,
    /// Outcome stored.
    Completed,
    /// The lease ran out without a completion, or the tool said the outcome is ambiguous.
    Unknown,
    /// Completed, past its ttl, and still remembered: a retry is told that the action ran and
    /// that its result is no longer kept, instead of running again.
    Expired,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::InFlight => "in_flight",
            State::Completed => "completed",
            State::Unknown => "unknown",
            State::Expired => "expired",
        })
    }
}

impl FromStr for State {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.replace('-', "_").as_str() {
            "in_flight" => Ok(State::InFlight),
            "completed" => Ok(State::Completed),
            "unknown" => Ok(State::Unknown),
            "expired" => Ok(State::Expired),
            _ => Err(format!(
                "unknown state {s:?}: expected in_flight, completed, unknown or expired"
            )),
        }
    }
}

/// What a record holds in each state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RecordState {
    /// Reserved before the side effect runs; held until `lease_until` unless heartbeats extend it.
    InFlight {
        /// When the lease runs out (store clock).
        lease_until: Timestamp,
    },
    /// The outcome is stored and replayed to duplicates until `expires_at`.
    Completed {
        /// The stored outcome.
        outcome: Outcome,
        /// When the outcome was recorded (the original execution's time).
        completed_at: Timestamp,
        /// When the outcome stops being replayed.
        expires_at: Timestamp,
        /// Until when the record is remembered after `expires_at` (its tombstone: a retry is
        /// told the action ran, see [`RecordState::Expired`]); then it is as if absent. Equal to
        /// `expires_at` when the tool keeps no tombstone.
        retain_until: Timestamp,
    },
    /// The side effect may or may not have happened. Never silently re-run.
    Unknown {
        /// Since when the outcome is unknown (lease expiry or the ambiguous report).
        since: Timestamp,
    },
    /// A completed record past `expires_at` and before `retain_until`, as stores report it: the
    /// action ran at `completed_at`, its outcome is no longer given (and may be gone from the
    /// store), and a retry is refused as expired instead of running again. Stores never write
    /// this state; they report a completed record in it.
    Expired {
        /// When the action's outcome was recorded.
        completed_at: Timestamp,
        /// When its outcome stopped being replayed.
        expired_at: Timestamp,
        /// When the tombstone goes and the key counts as absent.
        retain_until: Timestamp,
    },
}

/// One record as a store returns it. Stores report an in-flight record whose lease has run out as
/// [`RecordState::Unknown`] (since the lease's end), whether or not they have rewritten it yet, and
/// a completed record past its `expires_at` as [`RecordState::Expired`] until its `retain_until`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The record's name.
    pub key: Key,
    /// The fingerprint of the arguments of the call that reserved it.
    pub fingerprint: Fingerprint,
    /// The current fence (see [`Lease`]).
    pub fence: Fence,
    /// When the key was first reserved (this incarnation of the record).
    pub created_at: Timestamp,
    /// Where the call that reserved it was made (a conversation, an MCP session:
    /// [`crate::Call::scope`]), when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Arc<str>>,
    /// The state and what it holds.
    #[serde(flatten)]
    pub state: RecordState,
}

impl Record {
    /// The state's name.
    pub fn state_name(&self) -> State {
        match self.state {
            RecordState::InFlight { .. } => State::InFlight,
            RecordState::Completed { .. } => State::Completed,
            RecordState::Unknown { .. } => State::Unknown,
            RecordState::Expired { .. } => State::Expired,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_text_round_trips() {
        let lease = Lease {
            fence: 7,
            token: LeaseToken::mint(),
        };
        assert_eq!(lease.to_string().parse::<Lease>().unwrap(), lease);
        assert!("7".parse::<Lease>().is_err());
        assert!("x.ab".parse::<Lease>().is_err());
    }

    #[test]
    fn minted_tokens_are_distinct_and_not_sequential() {
        let tokens: Vec<u128> = (0..10_000).map(|_| LeaseToken::mint().0).collect();
        let unique: std::collections::HashSet<_> = tokens.iter().collect();
        assert_eq!(unique.len(), tokens.len());
        let low = |t: u128| t as u64;
        assert!(
            tokens
                .windows(2)
                .all(|w| low(w[1]).wrapping_sub(low(w[0])) != 1),
            "the low half must not be a visible counter"
        );
    }

    #[test]
    fn state_names_round_trip() {
        for s in [
            State::InFlight,
            State::Completed,
            State::Unknown,
            State::Expired,
        ] {
            assert_eq!(s.to_string().parse::<State>().unwrap(), s);
        }
        assert_eq!("in-flight".parse::<State>().unwrap(), State::InFlight);
    }
}
