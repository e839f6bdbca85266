//! Refused calls, counted in this process: the audit log writes a line for each state
//! transition and each replay, but a refused call changes no record and leaves no line, so the
//! console counts refusals itself while the process serves calls. They start from zero at every
//! start, and `idemgate console` (which serves no calls) has none.

use std::collections::HashMap;
use std::sync::Mutex;

use idemgate::{Event, Observer, Timestamp, Verdict};

/// The length of the slots refusals are counted in: the smallest bucket a chart draws, so a
/// short window spreads them as finely as the audit log's lines.
pub(crate) const SLOT_MS: i64 = 5 * 60_000;
/// How long refusals are kept: the longest window a chart shows (48 hours).
const KEPT_MS: i64 = 48 * 3_600_000;
/// (tenant, tool) pairs counted at most; refusals of others count under "other" (callers name tools).
const MAX_TOOLS: usize = 1000;

/// Refused calls per tenant and tool per five-minute slot, in this process. An engine [`Observer`].
#[derive(Debug, Default)]
pub struct Tally(Mutex<HashMap<(String, String), HashMap<i64, u64>>>);

impl Tally {
    /// Whether a verdict is a refusal: the engine answered without running or replaying.
    pub fn is_refusal(verdict: Verdict) -> bool {
        matches!(
            verdict,
            Verdict::KeyRequired
                | Verdict::KeyReused
                | Verdict::BadRequest
                | Verdict::QuotaExceeded
                | Verdict::RateLimited
                | Verdict::InFlight
        )
    }

    /// Counts one refusal of `tenant`'s call of `tool` at `at`.
    pub fn refused(&self, tenant: &str, tool: &str, at: Timestamp) {
        let slot = at.as_millis().div_euclid(SLOT_MS);
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut name = (tenant.to_owned(), tool.to_owned());
        if !all.contains_key(&name) && all.len() >= MAX_TOOLS {
            name.1 = "other".to_owned();
        }
        let slots = all.entry(name).or_default();
        *slots.entry(slot).or_default() += 1;
        slots.retain(|s, _| *s > slot - KEPT_MS / SLOT_MS);
    }

    /// Refusals per (tenant, tool), as (the slot's start in milliseconds since the epoch, count).
    pub(crate) fn snapshot(&self) -> HashMap<(String, String), Vec<(i64, u64)>> {
        let all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.iter()
            .map(|(tool, slots)| {
                (
                    tool.clone(),
                    slots.iter().map(|(s, n)| (*s * SLOT_MS, *n)).collect(),
                )
            })
            .collect()
    }
}

impl Observer for Tally {
    fn observe(&self, event: &Event<'_>) {
        if let Event::Call {
            tenant,
            tool,
            verdict,
            ..
        } = event
        {
            if Self::is_refusal(*verdict) {
                self.refused(tenant.as_str(), tool.as_str(), Timestamp::now());
            }
        }
    }
}
