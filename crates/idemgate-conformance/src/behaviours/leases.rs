//! The behaviours of one lease: reserving a key (32 racers, a retried reservation), completing
//! it (a replay, a failure stored, a late completion), fences that reject a stale holder,
//! releasing, marking unknown, heartbeats, and reservations dropped half-way.

use std::time::Duration;

use idemgate_core::{Claim, Keep, Outcome, RecordState, State, Store, Timestamp};

use super::steps::{acquire, assert_lease_lost, existing, fp, reservation};
use crate::fixture::{fresh_key, Fixture, LONG_LEASE, LONG_TTL, PAST_SHORT_LEASE, SHORT_LEASE};

/// 32 tasks race to reserve one key: exactly one acquires, and the others all see its record.
pub async fn race_32_way_one_acquires<S: Store + Clone>(fx: &Fixture<S>) {
    let key = fresh_key("race");
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let store = fx.store.clone();
        let r = reservation(&key, "same", LONG_LEASE);
        tasks.push(tokio::spawn(async move { store.reserve(&r).await }));
    }
    let mut acquired = Vec::new();
    let mut seen = 0;
    for t in tasks {
        match t.await.expect("task").expect("reserve") {
            Claim::Acquired(lease) => acquired.push(lease),
            Claim::Existing(rec) => {
                assert_eq!(rec.state_name(), State::InFlight);
                seen += 1;
            }
        }
    }
    assert_eq!(acquired.len(), 1, "exactly one reservation must win");
    assert_eq!(seen, 31);
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert_eq!(rec.fence, acquired[0].fence);
}

/// A reservation retried with the same token (its first answer was lost) acquires its own record.
pub async fn reserve_retry_with_same_token_acquires<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("retry");
    let r = reservation(&key, "a", LONG_LEASE);
    let first = acquire(&fx.store, &r).await;
    let again = acquire(&fx.store, &r).await;
    assert_eq!(first, again);
    let other = reservation(&key, "a", LONG_LEASE);
    let rec = existing(fx.store.reserve(&other).await);
    assert_eq!(rec.state_name(), State::InFlight);
}

/// A completed record is returned with its outcome to every later reservation, until it expires.
pub async fn completed_record_replays<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("replay");
    let r = reservation(&key, "a", LONG_LEASE);
    let lease = acquire(&fx.store, &r).await;
    let done = fx
        .store
        .complete(&key, lease, &Outcome::success(b"paid".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    assert!(done.expires_at > done.completed_at);
    for _ in 0..3 {
        let rec = existing(fx.store.reserve(&reservation(&key, "a", LONG_LEASE)).await);
        match rec.state {
            RecordState::Completed {
                outcome,
                completed_at,
                expires_at,
                ..
            } => {
                assert_eq!(outcome, Outcome::success(b"paid".to_vec()));
                assert_eq!(
                    (completed_at, expires_at),
                    (done.completed_at, done.expires_at)
                );
            }
            other => panic!("expected completed, found {other:?}"),
        }
    }
}

/// A failed outcome is stored and returned like a success, with its kind.
pub async fn failed_outcome_is_stored<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("failed");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let outcome = Outcome::failed(vec![0, 159, 255, 10]);
    fx.store
        .complete(&key, lease, &outcome, LONG_TTL)
        .await
        .expect("complete");
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert!(matches!(rec.state, RecordState::Completed { outcome: o, .. } if o == outcome));
}

/// The record keeps the first call's fingerprint, so the engine can report a key reused with other
/// arguments.
pub async fn fingerprint_mismatch_is_visible<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("mismatch");
    let lease = acquire(&fx.store, &reservation(&key, "first", LONG_LEASE)).await;
    let rec = existing(
        fx.store
            .reserve(&reservation(&key, "second", LONG_LEASE))
            .await,
    );
    assert_eq!(rec.fingerprint, fp("first"));
    fx.store
        .complete(&key, lease, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    let rec = existing(
        fx.store
            .reserve(&reservation(&key, "second", LONG_LEASE))
            .await,
    );
    assert_eq!(rec.fingerprint, fp("first"));
}

/// An expired lease reads as unknown, is never overwritten by a reservation, and can be taken over
/// (by the right fence and fingerprint only), which raises the fence.
pub async fn expired_lease_becomes_unknown_and_can_be_taken_over<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("expiry");
    let lease = acquire(&fx.store, &reservation(&key, "a", SHORT_LEASE)).await;
    fx.pass(PAST_SHORT_LEASE).await;
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert_eq!(rec.state_name(), State::Unknown);
    assert_eq!(rec.fence, lease.fence);
    let rec = existing(fx.store.reserve(&reservation(&key, "a", LONG_LEASE)).await);
    assert_eq!(
        rec.state_name(),
        State::Unknown,
        "unknown is never overwritten"
    );
    // Wrong fence or other arguments: no takeover.
    let wrong = existing(
        fx.store
            .takeover(&reservation(&key, "a", LONG_LEASE), lease.fence + 5)
            .await,
    );
    assert_eq!(wrong.state_name(), State::Unknown);
    let other = existing(
        fx.store
            .takeover(&reservation(&key, "b", LONG_LEASE), lease.fence)
            .await,
    );
    assert_eq!(other.state_name(), State::Unknown);
    let r = reservation(&key, "a", LONG_LEASE);
    let new = match fx.store.takeover(&r, lease.fence).await.expect("takeover") {
        Claim::Acquired(l) => l,
        Claim::Existing(rec) => panic!("takeover refused: {rec:?}"),
    };
    assert!(new.fence > lease.fence, "takeover raises the fence");
    // A second taker with the old fence loses.
    let late = existing(
        fx.store
            .takeover(&reservation(&key, "a", LONG_LEASE), lease.fence)
            .await,
    );
    assert_eq!(late.state_name(), State::InFlight);
}

/// After a takeover, every write under the old lease fails with LeaseLost and changes nothing.
pub async fn stale_fence_is_rejected<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("zombie");
    let old = acquire(&fx.store, &reservation(&key, "a", SHORT_LEASE)).await;
    fx.pass(PAST_SHORT_LEASE).await;
    let new = match fx
        .store
        .takeover(&reservation(&key, "a", LONG_LEASE), old.fence)
        .await
        .expect("takeover")
    {
        Claim::Acquired(l) => l,
        Claim::Existing(rec) => panic!("takeover refused: {rec:?}"),
    };
    let zombie = Outcome::success(b"zombie".to_vec());
    assert_lease_lost(
        fx.store.complete(&key, old, &zombie, LONG_TTL).await,
        "complete",
    );
    assert_lease_lost(fx.store.release(&key, old).await, "release");
    assert_lease_lost(fx.store.mark_unknown(&key, old).await, "mark_unknown");
    assert_lease_lost(fx.store.heartbeat(&key, old, LONG_LEASE).await, "heartbeat");
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert_eq!(rec.state_name(), State::InFlight);
    assert_eq!(rec.fence, new.fence);
    fx.store
        .complete(&key, new, &Outcome::success(b"real".to_vec()), LONG_TTL)
        .await
        .expect("the current holder completes");
}

/// A lease token from a removed record never completes a new record under the same key, even when
/// the new record's fence happens to be the same number.
pub async fn released_lease_cannot_complete_new_record<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("aba");
    let old = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store.release(&key, old).await.expect("release");
    let new = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    assert_lease_lost(
        fx.store
            .complete(&key, old, &Outcome::success(b"old".to_vec()), LONG_TTL)
            .await,
        "complete with a released lease",
    );
    fx.store
        .complete(&key, new, &Outcome::success(b"new".to_vec()), LONG_TTL)
        .await
        .expect("complete");
}

/// The current holder may still complete after its lease ran out, as long as nobody took over: the
/// late truth replaces "unknown".
pub async fn late_completion_by_current_holder_is_kept<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("late");
    let lease = acquire(&fx.store, &reservation(&key, "a", SHORT_LEASE)).await;
    fx.pass(PAST_SHORT_LEASE).await;
    fx.store
        .complete(&key, lease, &Outcome::success(b"late".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert_eq!(rec.state_name(), State::Completed);
}

/// Completing twice with the same lease (a retry after a lost answer) returns the first completion
/// and keeps the first outcome.
pub async fn complete_is_idempotent_for_its_lease<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("complete-twice");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let first = fx
        .store
        .complete(&key, lease, &Outcome::success(b"one".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    fx.pass(Duration::from_millis(20)).await;
    let second = fx
        .store
        .complete(&key, lease, &Outcome::success(b"two".to_vec()), LONG_TTL)
        .await
        .expect("complete again");
    assert_eq!(first, second);
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert!(
        matches!(rec.state, RecordState::Completed { ref outcome, .. } if outcome.body == b"one")
    );
}

/// A completion stored later than its side effect ran (a journal flush) keeps the time it ran, never
/// one later than the store's now, and is kept for its whole TTL from when it is stored.
pub async fn late_completion_keeps_its_execution_time<S: Store>(fx: &Fixture<S>) {
    let now_key = fresh_key("complete-at-now");
    let lease = acquire(&fx.store, &reservation(&now_key, "a", LONG_LEASE)).await;
    let now = fx
        .store
        .complete(&now_key, lease, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete")
        .completed_at;

    let key = fresh_key("complete-at");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let ran = Timestamp::from_millis(now.as_millis() - 5_000);
    let done = fx
        .store
        .complete_at(
            &key,
            lease,
            &Outcome::success(b"y".to_vec()),
            Keep::replay(LONG_TTL),
            Some(ran),
        )
        .await
        .expect("complete at");
    assert_eq!(done.completed_at, ran);
    assert!(done.expires_at >= now.plus(LONG_TTL), "{done:?} from {now}");
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert!(
        matches!(rec.state, RecordState::Completed { completed_at, .. } if completed_at == ran),
        "{rec:?}"
    );

    // A time from the future (a clock ahead of the store's) is never believed.
    let future = fresh_key("complete-at-future");
    let lease = acquire(&fx.store, &reservation(&future, "a", LONG_LEASE)).await;
    let ahead = now.plus(Duration::from_secs(3600));
    let done = fx
        .store
        .complete_at(
            &future,
            lease,
            &Outcome::success(b"z".to_vec()),
            Keep::replay(LONG_TTL),
            Some(ahead),
        )
        .await
        .expect("complete at");
    assert!(
        done.completed_at < ahead && done.completed_at >= now,
        "{done:?}"
    );
}

/// Releasing removes the record so the next call runs; releasing again succeeds.
pub async fn release_removes_the_record<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("release");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store.release(&key, lease).await.expect("release");
    assert!(fx.store.get(&key).await.expect("get").is_none());
    fx.store.release(&key, lease).await.expect("release again");
    acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
}

/// A completed record cannot be released by its holder.
pub async fn completed_record_cannot_be_released<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("release-done");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store
        .complete(&key, lease, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    assert_lease_lost(
        fx.store.release(&key, lease).await,
        "release after complete",
    );
    assert!(fx.store.get(&key).await.expect("get").is_some());
}

/// An ambiguous outcome marks the record unknown at once; reservations then see it, not overwrite it.
pub async fn mark_unknown_blocks_the_key<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("ambiguous");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store
        .mark_unknown(&key, lease)
        .await
        .expect("mark unknown");
    fx.store.mark_unknown(&key, lease).await.expect("again");
    let rec = existing(fx.store.reserve(&reservation(&key, "a", LONG_LEASE)).await);
    assert_eq!(rec.state_name(), State::Unknown);
    assert_lease_lost(
        fx.store.heartbeat(&key, lease, LONG_LEASE).await,
        "heartbeat",
    );
}

/// A heartbeat keeps a long call's record in flight past its original lease.
pub async fn heartbeat_extends_the_lease<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("heartbeat");
    let lease = acquire(&fx.store, &reservation(&key, "a", SHORT_LEASE)).await;
    fx.store
        .heartbeat(&key, lease, LONG_LEASE)
        .await
        .expect("heartbeat");
    fx.pass(PAST_SHORT_LEASE).await;
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert_eq!(rec.state_name(), State::InFlight);
}

/// Reservation futures dropped at every point of their life leave the store consistent: the key is
/// either free or held by exactly one reservation, and a completion by a surviving holder works.
pub async fn dropped_reservations_leave_consistent_state<S: Store + Clone>(fx: &Fixture<S>) {
    let key = fresh_key("cancel");
    for round in 0..16u64 {
        let mut tasks = Vec::new();
        for i in 0..8u64 {
            let store = fx.store.clone();
            let r = reservation(&key, "a", LONG_LEASE);
            // Cancel most reservations after a few microseconds, at whatever point they reached.
            let budget = Duration::from_micros((round * 8 + i) % 5 * 50);
            tasks.push(tokio::spawn(async move {
                let res = tokio::time::timeout(budget, store.reserve(&r)).await;
                (r, res)
            }));
        }
        let mut holders = Vec::new();
        for t in tasks {
            let (r, res) = t.await.expect("task");
            match res {
                Ok(Ok(Claim::Acquired(lease))) => holders.push(lease),
                // Cancelled: if it did land, a retry with its token finds it.
                Err(_) => {
                    if let Ok(Claim::Acquired(lease)) = fx.store.reserve(&r).await {
                        holders.push(lease);
                    }
                }
                Ok(Ok(Claim::Existing(_))) | Ok(Err(_)) => {}
            }
        }
        assert!(holders.len() <= 1, "round {round}: two holders {holders:?}");
        match fx.store.get(&key).await.expect("get") {
            None => assert!(holders.is_empty()),
            Some(rec) => {
                assert_eq!(rec.state_name(), State::InFlight);
                let lease = holders.first().copied().unwrap_or_else(|| {
                    panic!("round {round}: a record stands that no reservation holds")
                });
                fx.store.release(&key, lease).await.expect("release");
            }
        }
    }
}
