//! The steps the behaviours share: a fingerprint of text, a reservation of a key, and what a
//! reservation, a completion or a release is expected to answer.

use std::time::Duration;

use idemgate_core::{Claim, Fingerprint, Key, Lease, Record, Reservation, Store, StoreError};

pub(super) fn fp(s: &str) -> Fingerprint {
    Fingerprint::of_bytes(s.as_bytes())
}

pub(super) fn reservation(key: &Key, args: &str, lease_for: Duration) -> Reservation {
    Reservation::new(key.clone(), fp(args), lease_for)
}

pub(super) async fn acquire<S: Store>(s: &S, r: &Reservation) -> Lease {
    match s.reserve(r).await.expect("reserve") {
        Claim::Acquired(lease) => lease,
        Claim::Existing(rec) => panic!("expected to acquire {}, found {rec:?}", r.key),
    }
}

pub(super) fn existing(claim: Result<Claim, StoreError>) -> Record {
    match claim.expect("store operation") {
        Claim::Existing(rec) => rec,
        Claim::Acquired(lease) => panic!("expected an existing record, acquired {lease:?}"),
    }
}

pub(super) fn assert_lease_lost<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) {
    match r {
        Err(StoreError::LeaseLost) => {}
        other => panic!("{what}: expected LeaseLost, got {other:?}"),
    }
}
