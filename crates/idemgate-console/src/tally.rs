//! Refused calls, counted in this process: the audit log writes a line for each state
//! transition and each replay, but a refused call changes no record and leaves no line, so the
//! console counts refusals itself while the process serves calls. They start from zero at every
//! start, and `idemgate console` (which serves no calls) has none.

use std::collections::HashMap;
use std::sync::Mutex;

use idemgate::{Event, Observer, Timestamp, Verdict};

/// Hours of refusals kept.
pub(crate) const KEPT_HOURS: i64 = 48;
/// (tenant, tool) pairs counted at most; refusals of others count under "other" (callers name tools).
const MAX_TOOLS: usize = 1000;
const HOUR_MS: i64 = 3_600_000;

/// Refused calls per tenant and tool per hour, in this process. An engine [`Observer`].
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
        let hour = at.as_millis().div_euclid(HOUR_MS);
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut name = (tenant.to_owned(), tool.to_owned());
        if !all.contains_key(&name) && all.len() >= MAX_TOOLS {
            name.1 = "other".to_owned();
        }
        let hours = all.entry(name).or_default();
        *hours.entry(hour).or_default() += 1;
        hours.retain(|h, _| *h > hour - KEPT_HOURS);
    }

    /// Refusals per (tenant, tool), as (hour since the epoch, count).
    pub(crate) fn snapshot(&self) -> HashMap<(String, String), Vec<(i64, u64)>> {
        let all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.iter()
            .map(|(tool, hours)| (tool.clone(), hours.iter().map(|(h, n)| (*h, *n)).collect()))
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
