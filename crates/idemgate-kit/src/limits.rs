//! Per-tenant limits every front door enforces the same way: a request rate (a token bucket) and
//! a quota of keys in flight.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A request rate: `rate` requests a second, with bursts of up to twice that.
#[derive(Debug)]
pub struct RateLimit(Mutex<Bucket>);

impl RateLimit {
    /// `per_second` requests a second.
    pub fn new(per_second: f64) -> Self {
        RateLimit(Mutex::new(Bucket::new(per_second)))
    }

    /// Takes one request from the budget, or says when to come back.
    ///
    /// # Errors
    /// How long until a request is allowed again.
    pub fn admit(&self) -> Result<(), Duration> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(Instant::now())
    }
}

/// A token bucket: `rate` tokens a second, holding at most twice that.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl Bucket {
    fn new(rate: f64) -> Self {
        let burst = (2.0 * rate).max(1.0);
        Bucket {
            rate,
            burst,
            tokens: burst,
            last: None,
        }
    }

    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        if let Some(last) = self.last {
            let refill = now.saturating_duration_since(last).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + refill).min(self.burst);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// The records a front door holds in flight for one tenant, by key digest, each until its lease
/// would run out (a caller that never reports back stops counting when its lease ends). A key
/// held by two calls at once (a holder whose lease was taken over and the one that took it, an
/// observe-mode duplicate beside the call it duplicates) counts once, until both release it.
#[derive(Debug)]
pub struct LiveKeys {
    max: Option<usize>,
    /// Until when each key counts, and how many calls hold it.
    held: Mutex<HashMap<[u8; 32], (Instant, u32)>>,
}

impl LiveKeys {
    /// At most `max` keys at once (`None`: no limit).
    pub fn new(max: Option<usize>) -> Self {
        LiveKeys {
            max,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// The quota, if any.
    pub fn max(&self) -> Option<usize> {
        self.max
    }

    /// Counts `digest` as live until `until`; false when the tenant is at its quota.
    pub fn hold(&self, digest: [u8; 32], until: Instant) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(max) = self.max {
            if held.len() >= max && !held.contains_key(&digest) {
                let now = Instant::now();
                held.retain(|_, (t, _)| *t > now);
                if held.len() >= max {
                    return false;
                }
            }
        }
        let (t, holders) = held.entry(digest).or_insert((until, 0));
        *t = (*t).max(until);
        *holders += 1;
        true
    }

    /// Extends a held key (after a heartbeat).
    pub fn extend(&self, digest: [u8; 32], until: Instant) {
        if let Some(t) = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&digest)
        {
            t.0 = t.0.max(until);
        }
    }

    /// Stops counting a key for one of its holders (its outcome was reported); it stops
    /// counting when the last one does.
    pub fn release(&self, digest: &[u8; 32]) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, holders)) = held.get_mut(digest) {
            *holders -= 1;
            if *holders == 0 {
                held.remove(digest);
            }
        }
    }

    /// How many keys count now.
    pub fn len(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether none do.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_paces() {
        let mut b = Bucket::new(2.0);
        let t0 = Instant::now();
        for _ in 0..4 {
            assert!(b.take(t0).is_ok());
        }
        let wait = b.take(t0).unwrap_err();
        assert!(wait <= Duration::from_millis(500) && wait > Duration::ZERO);
        assert!(b.take(t0 + Duration::from_millis(500)).is_ok());
    }

    #[test]
    fn live_keys_enforce_the_quota_and_forget_expired_ones() {
        let live = LiveKeys::new(Some(1));
        let now = Instant::now();
        assert!(live.hold([1; 32], now + Duration::from_secs(60)));
        assert!(!live.hold([2; 32], now + Duration::from_secs(60)));
        live.release(&[1; 32]);
        assert!(live.hold([2; 32], now));
        // [2] expires at `now`, so it no longer counts.
        assert!(live.hold([3; 32], now + Duration::from_secs(60)));
        assert_eq!(live.len(), 1);
    }

    #[test]
    fn a_key_two_calls_hold_counts_once_until_both_release_it() {
        let live = LiveKeys::new(Some(1));
        let until = Instant::now() + Duration::from_secs(60);
        assert!(live.hold([1; 32], until));
        assert!(
            live.hold([1; 32], until),
            "the same key is not a second one"
        );
        live.release(&[1; 32]);
        assert_eq!(live.len(), 1, "the other holder still runs");
        assert!(!live.hold([2; 32], until));
        live.release(&[1; 32]);
        assert!(live.is_empty());
        live.release(&[1; 32]);
        assert!(live.hold([2; 32], until));
    }
}
