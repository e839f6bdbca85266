//! Shadow mode ([`Mode::Observe`]): every call runs, and what enforce mode would have answered
//! instead is written into the history of the record the call duplicates and told to the
//! observers.
//!
//! A fresh call reserves and completes its record exactly as in enforce mode, so the records an
//! observing gate keeps are the ones an enforcing gate starts from. A call that finds a record
//! standing runs without touching it: observe mode never waits, never takes a record over,
//! never asks a verifier, never replays. What it would have done is judged from the record
//! found, at once.

use super::*;

use super::decide::{executing, name};
use super::OBSERVED_CALL;
use crate::policy::Mode;

/// The most observations one record's history keeps (see `observations_below_cap`).
pub const MAX_OBSERVATIONS: usize = 100;

impl<S: Store> Engine<S> {
    /// The decision of [`Engine::begin`] for a tool in [`Mode::Observe`]: [`Begun::Execute`] for
    /// a fresh call, [`Begun::PassThrough`] (after noting what enforce would have done) for every
    /// call enforce mode would have answered without running. Only a malformed call (an invalid
    /// key or arguments) is still refused: it names no action to run.
    pub(super) async fn decide_observed(
        &self,
        call: Call,
        policy: &ToolPolicy,
    ) -> Result<Begun, EngineError> {
        debug_assert_eq!(policy.mode, Mode::Observe);
        let fingerprint = call.window_arguments();
        let scope = call.scope.clone();
        let (tenant, tool) = (call.tenant.clone(), call.tool.clone());
        let nested = call.within_observed
            || OBSERVED_CALL
                .try_with(|(t, n)| *t == call.tenant && *n == call.tool)
                .unwrap_or(false);
        let Named { key, rule, keep } = match name(call, policy) {
            Ok(Some(named)) => named,
            Ok(None) => return Ok(Begun::PassThrough),
            Err(EngineError::KeyRequired { .. }) if nested => return Ok(Begun::PassThrough),
            Err(e @ EngineError::KeyRequired { .. }) => {
                let would = Verdict::of_error(&e);
                return Ok(self.observed(&tenant, &tool, None, would, None, false));
            }
            Err(e) => return Err(e),
        };
        let reservation = Reservation::new(key, fingerprint, policy.lease).with_scope(scope);
        let record = match self.store.reserve(&reservation).await {
            Ok(Claim::Acquired(lease)) => return Ok(executing(reservation, rule, keep, lease)),
            Ok(Claim::Existing(record)) => record,
            Err(e) => {
                // As enforce mode: a reservation that may have landed is taken back, so that it
                // never turns unknown later. Then the call runs without a record.
                let key = reservation.key.clone();
                let refused = Box::pin(self.judge(reservation, rule, keep, policy, Err(e))).await;
                if nested {
                    return Ok(Begun::PassThrough);
                }
                let would = match &refused {
                    Err(e) => Verdict::of_error(e),
                    Ok(_) => Verdict::StoreUnavailable,
                };
                return Ok(self.observed(&tenant, &tool, Some(key), would, Some(rule), false));
            }
        };
        // The call is nested in one already observed (its door's window inside a call id's
        // record): that one's record holds the observation, and the call runs as part of it.
        if nested {
            return Ok(Begun::PassThrough);
        }
        let (would, words) = would_have(&record, &reservation, policy);
        let key = reservation.key;
        if self.observations_below_cap(&key).await {
            let mut entry = HistoryEntry::new(
                self.clock.now(),
                record.fence,
                Happening::Observed,
                None,
                Some(&format!(
                    "observe mode ran a call that duplicated this record (named by {}); enforce \
                     mode would have {words}",
                    rule.duplicate_label()
                )),
            );
            entry.would = Some(would.label().to_owned());
            entry.rule = Some(rule.duplicate_label().to_owned());
            self.note(&key, entry).await;
        }
        Ok(self.observed(&tenant, &tool, Some(key), would, Some(rule), true))
    }

    /// Whether the record of `key` holds fewer than [`MAX_OBSERVATIONS`] observations, so that
    /// one more is kept in its history: an agent that repeats a call in a loop must not grow the
    /// record without bound (the observers still hear of every one). A history that cannot be
    /// read does not stop the entry.
    async fn observations_below_cap(&self, key: &Key) -> bool {
        match self.store.history(key).await {
            Ok(history) => {
                history
                    .iter()
                    .filter(|e| e.what == Happening::Observed)
                    .count()
                    < MAX_OBSERVATIONS
            }
            Err(_) => true,
        }
    }

    /// Tells the observers of an observed call, which then runs: `key` the record it was named
    /// by (its downstream key is the call's), `kept` whether that record stands (not when the
    /// store could not be reached).
    fn observed(
        &self,
        tenant: &TenantId,
        tool: &ToolName,
        key: Option<Key>,
        would: Verdict,
        rule: Option<KeyRule>,
        kept: bool,
    ) -> Begun {
        self.observers.observe(&Event::Observed {
            tenant,
            tool,
            key: key.as_ref().filter(|_| kept),
            would,
            rule,
        });
        Begun::Observed { would, key }
    }
}

/// What enforce mode would have answered a call that found `record` when it reserved, in its
/// verdict and in words (completing "enforce mode would have …"), without waiting or asking
/// anybody: the record as it stands decides.
fn would_have(
    record: &Record,
    reservation: &Reservation,
    policy: &ToolPolicy,
) -> (Verdict, String) {
    if record.fingerprint != reservation.fingerprint {
        return (
            Verdict::KeyReused,
            format!(
                "refused it: its key was first used at {} with other arguments",
                record.created_at
            ),
        );
    }
    match &record.state {
        RecordState::Completed { completed_at, .. } => (
            Verdict::Replayed,
            format!("replayed the outcome recorded at {completed_at} instead of running it"),
        ),
        RecordState::Expired {
            completed_at,
            expired_at,
            ..
        } => (
            Verdict::Expired,
            format!(
                "refused it as expired: the action ran at {completed_at}, and its outcome \
                 stopped being replayed at {expired_at}"
            ),
        ),
        RecordState::InFlight { .. } => (
            Verdict::InFlight,
            format!(
                "waited up to {} for the call in flight since {}, then replayed its outcome \
                 (or answered that it was still in flight)",
                humantime::format_duration(policy.wait),
                record.created_at
            ),
        ),
        RecordState::Unknown { since } => match policy.on_unknown {
            UnknownPolicy::Block => (
                Verdict::Unknown,
                format!(
                    "answered that the outcome is unknown (since {since}) until an operator \
                     resolves the record"
                ),
            ),
            UnknownPolicy::Verify => (
                Verdict::Unknown,
                format!(
                    "asked the tool's verifier whether the action happened (unknown since \
                     {since}), and replayed its outcome if it did"
                ),
            ),
            // Enforce mode would have run the call too, taking the record over.
            UnknownPolicy::Retry => (
                Verdict::Execute,
                format!(
                    "taken the record over and run the action again (on_unknown = retry; \
                     unknown since {since})"
                ),
            ),
        },
    }
}
