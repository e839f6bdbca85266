//! The behaviours of time running out and of making a record expire: a record past its TTL, the
//! tombstone that answers after it, purging, and reopening (which expires a record at once).

use std::time::Duration;

use idemgate_core::{
    IdempotencyKey, Keep, Key, ListFilter, Outcome, Record, RecordState, Reopened, State, Store,
    StoreError,
};

use super::steps::{acquire, assert_lease_lost, existing, fp, reservation};
use crate::fixture::{fresh_key, Fixture, LONG_LEASE, LONG_TTL, PAST_SHORT_LEASE, SHORT_LEASE};

/// A completed record past its TTL counts as absent: the key can be reserved again, with a fence
/// that never goes down.
pub async fn expired_record_counts_as_absent<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("ttl");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store
        .complete(&key, lease, &Outcome::success(b"x".to_vec()), SHORT_LEASE)
        .await
        .expect("complete");
    fx.pass(PAST_SHORT_LEASE).await;
    assert!(fx.store.get(&key).await.expect("get").is_none());
    let again = acquire(&fx.store, &reservation(&key, "other args", LONG_LEASE)).await;
    assert!(again.fence >= lease.fence);
}

/// How long the tombstone behaviours keep one: past [`PAST_SHORT_LEASE`] with margin for
/// server clocks and scheduling, so that the dozen operations a behaviour makes on the tombstone
/// after [`PAST_SHORT_LEASE`] fit before it goes on a loaded machine.
pub const TOMBSTONE: Duration = Duration::from_secs(3);

/// A completed record past its ttl and within its tombstone is reported expired: it says when the
/// action ran and when its outcome expired, and gives no outcome. It counts: a reservation (with
/// the same arguments or others) meets it and acquires nothing; it is listed as expired; purging
/// keeps it; the old lease can no longer release or mark it. Past the tombstone it counts as
/// absent, and the next reservation takes a higher fence.
pub async fn tombstone_answers_after_the_ttl_until_it_goes<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("tombstone");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let keep = Keep {
        ttl: SHORT_LEASE,
        tombstone: TOMBSTONE,
    };
    let done = fx
        .store
        .complete_at(&key, lease, &Outcome::success(b"x".to_vec()), keep, None)
        .await
        .expect("complete");
    fx.pass(PAST_SHORT_LEASE).await;

    let expired_state = RecordState::Expired {
        completed_at: done.completed_at,
        expired_at: done.expires_at,
        retain_until: done.completed_at.plus(TOMBSTONE),
    };
    let rec = fx.store.get(&key).await.expect("get").expect("a tombstone");
    assert_eq!((&rec.state, rec.fence), (&expired_state, lease.fence));
    assert_eq!(
        existing(fx.store.reserve(&reservation(&key, "a", LONG_LEASE)).await).state,
        expired_state,
        "a retry meets the tombstone"
    );
    let other = existing(fx.store.reserve(&reservation(&key, "b", LONG_LEASE)).await);
    assert_eq!(
        (other.state_name(), other.fingerprint),
        (State::Expired, fp("a")),
        "other arguments meet it too, and see whose arguments it was"
    );
    assert_eq!(
        existing(
            fx.store
                .takeover(&reservation(&key, "a", LONG_LEASE), lease.fence)
                .await
        )
        .state_name(),
        State::Expired,
        "a tombstone is never taken over"
    );
    assert_lease_lost(fx.store.release(&key, lease).await, "release a tombstone");
    assert_lease_lost(
        fx.store.mark_unknown(&key, lease).await,
        "mark a tombstone unknown",
    );
    let again = fx
        .store
        .complete_at(&key, lease, &Outcome::success(b"y".to_vec()), keep, None)
        .await
        .expect("completing again under the same lease");
    assert_eq!(again, done, "completing again returns the first completion");

    let by_state = |state| ListFilter {
        tenant: Some(key.tenant.clone()),
        state,
        ..ListFilter::default()
    };
    let keys = |v: Vec<Record>| v.into_iter().map(|r| r.key).collect::<Vec<_>>();
    assert_eq!(
        keys(fx.store.list(&by_state(None)).await.expect("list")),
        vec![fx.listed(&key)]
    );
    assert_eq!(
        keys(
            fx.store
                .list(&by_state(Some(State::Expired)))
                .await
                .expect("list")
        ),
        vec![fx.listed(&key)]
    );
    assert!(fx
        .store
        .list(&by_state(Some(State::Completed)))
        .await
        .expect("list")
        .is_empty());

    fx.store.purge_expired().await.expect("purge");
    assert_eq!(
        fx.store.get(&key).await.expect("get").map(|r| r.state),
        Some(expired_state),
        "purging keeps a tombstone (and may drop its outcome)"
    );

    fx.pass(TOMBSTONE).await;
    assert!(fx.store.get(&key).await.expect("get").is_none());
    assert!(fx
        .store
        .list(&by_state(None))
        .await
        .expect("list")
        .is_empty());
    // Not `>`: on a store the suite shares with behaviours running at once, another one's purge
    // may delete the record once its tombstone is past, and a deleted record's fence starts over.
    let next = acquire(&fx.store, &reservation(&key, "b", LONG_LEASE)).await;
    assert!(next.fence >= lease.fence, "{next:?} after {lease:?}");
}

/// Reopening a tombstone at its fence clears it: the key counts as absent at once and the next
/// reservation acquires it at a higher fence; a wrong fence changes nothing.
pub async fn reopen_clears_a_tombstone<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("tombstone-reopen");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let keep = Keep {
        ttl: SHORT_LEASE,
        tombstone: LONG_TTL,
    };
    fx.store
        .complete_at(&key, lease, &Outcome::success(b"x".to_vec()), keep, None)
        .await
        .expect("complete");
    fx.pass(PAST_SHORT_LEASE).await;
    let wrong = kept(fx.store.reopen(&key, lease.fence + 1).await).expect("record");
    assert_eq!(wrong.state_name(), State::Expired);
    assert_eq!(
        fx.store.reopen(&key, lease.fence).await.expect("reopen"),
        Reopened::Expired
    );
    assert!(fx.store.get(&key).await.expect("get").is_none());
    assert_eq!(kept(fx.store.reopen(&key, lease.fence).await), None);
    let next = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    assert!(next.fence > lease.fence, "{next:?} after {lease:?}");
}

/// Purging removes expired completed records only; unknown and live records stay.
pub async fn purge_removes_only_expired<S: Store>(fx: &Fixture<S>) {
    let expired = fresh_key("purge");
    let live = Key::new(
        expired.tenant.clone(),
        expired.tool.clone(),
        IdempotencyKey::new("live").unwrap(),
    );
    let unknown = Key::new(
        expired.tenant.clone(),
        expired.tool.clone(),
        IdempotencyKey::new("unknown").unwrap(),
    );
    let l = acquire(&fx.store, &reservation(&expired, "a", LONG_LEASE)).await;
    fx.store
        .complete(&expired, l, &Outcome::success(b"x".to_vec()), SHORT_LEASE)
        .await
        .expect("complete");
    let l = acquire(&fx.store, &reservation(&live, "a", LONG_LEASE)).await;
    fx.store
        .complete(&live, l, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    let l = acquire(&fx.store, &reservation(&unknown, "a", LONG_LEASE)).await;
    fx.store.mark_unknown(&unknown, l).await.expect("unknown");
    fx.pass(PAST_SHORT_LEASE).await;
    let purged = fx.store.purge_expired().await.expect("purge");
    assert!(purged >= 1, "the expired record is purged");
    assert!(fx.store.get(&live).await.expect("get").is_some());
    assert!(fx.store.get(&unknown).await.expect("get").is_some());
    let filter = ListFilter {
        tenant: Some(expired.tenant.clone()),
        ..ListFilter::default()
    };
    assert_eq!(fx.store.list(&filter).await.expect("list").len(), 2);
}

/// What a reopening answered, when it left the record as it was.
fn kept(r: Result<Reopened, StoreError>) -> Option<Record> {
    match r.expect("reopen") {
        Reopened::Kept(rec) => rec,
        Reopened::Expired => panic!("expected the record to be kept"),
    }
}

/// Reopening a completed record at its fence makes it count as absent at once: the next
/// reservation acquires it at a higher fence (the record expired, as after its TTL), a holder of
/// the old lease cannot complete the new record, and a reopening retried at the old fence leaves
/// the new record alone. A wrong fence changes nothing.
pub async fn reopen_expires_a_completed_record_at_its_fence<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("reopen");
    let old = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store
        .complete(&key, old, &Outcome::success(b"first".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    let wrong = kept(fx.store.reopen(&key, old.fence + 1).await).expect("record");
    assert_eq!(
        (wrong.state_name(), wrong.fence),
        (State::Completed, old.fence)
    );
    assert_eq!(
        fx.store.get(&key).await.expect("get").map(|r| r.fence),
        Some(old.fence),
        "a wrong fence changes nothing"
    );

    assert_eq!(
        fx.store.reopen(&key, old.fence).await.expect("reopen"),
        Reopened::Expired
    );
    assert!(fx.store.get(&key).await.expect("get").is_none());
    let filter = ListFilter {
        tenant: Some(key.tenant.clone()),
        ..ListFilter::default()
    };
    assert!(fx.store.list(&filter).await.expect("list").is_empty());
    assert_eq!(
        kept(fx.store.reopen(&key, old.fence).await),
        None,
        "reopened already: nothing counts"
    );

    let new = acquire(&fx.store, &reservation(&key, "b", LONG_LEASE)).await;
    assert!(
        new.fence > old.fence,
        "the next reservation continues the fence, as after an expiry: {new:?} after {old:?}"
    );
    let in_flight = kept(fx.store.reopen(&key, old.fence).await).expect("record");
    assert_eq!(
        (in_flight.state_name(), in_flight.fence),
        (State::InFlight, new.fence)
    );
    assert_lease_lost(
        fx.store
            .complete(&key, old, &Outcome::success(b"zombie".to_vec()), LONG_TTL)
            .await,
        "a late completion under the reopened record's lease",
    );
    fx.store
        .complete(&key, new, &Outcome::success(b"second".to_vec()), LONG_TTL)
        .await
        .expect("the new holder completes");
    let retried = kept(fx.store.reopen(&key, old.fence).await).expect("record");
    assert_eq!(
        (retried.state_name(), retried.fence),
        (State::Completed, new.fence),
        "a reopening retried at the old fence never meets the new record"
    );
    let rec = existing(fx.store.reserve(&reservation(&key, "b", LONG_LEASE)).await);
    assert!(
        matches!(rec.state, RecordState::Completed { ref outcome, .. } if outcome.body == b"second")
    );
}

/// Only completed records are reopened by the store: a record in flight (its call may be running
/// the action) or unknown (the engine takes it over first), an expired or an absent one is left
/// as it is, and returned as it stands.
pub async fn reopen_leaves_other_records_alone<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("reopen-other");
    assert_eq!(kept(fx.store.reopen(&key, 1).await), None, "absent");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let rec = kept(fx.store.reopen(&key, lease.fence).await).expect("record");
    assert_eq!(rec.state_name(), State::InFlight);
    fx.store
        .heartbeat(&key, lease, LONG_LEASE)
        .await
        .expect("the holder keeps its lease");
    fx.store
        .mark_unknown(&key, lease)
        .await
        .expect("mark unknown");
    let rec = kept(fx.store.reopen(&key, lease.fence).await).expect("record");
    assert_eq!(rec.state_name(), State::Unknown);

    let expired = Key::new(
        key.tenant.clone(),
        key.tool.clone(),
        IdempotencyKey::new("expired").unwrap(),
    );
    let lease = acquire(&fx.store, &reservation(&expired, "a", LONG_LEASE)).await;
    fx.store
        .complete(
            &expired,
            lease,
            &Outcome::success(b"x".to_vec()),
            SHORT_LEASE,
        )
        .await
        .expect("complete");
    fx.pass(PAST_SHORT_LEASE).await;
    assert_eq!(kept(fx.store.reopen(&expired, lease.fence).await), None);
}
