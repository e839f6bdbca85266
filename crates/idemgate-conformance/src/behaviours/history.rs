//! The behaviours of a record's history ([`idemgate_core::history`]): appended to whatever record
//! is stored under the key, kept across every change of the record and the next reservation of a
//! reopened key, and gone with the record.

use idemgate_core::{Happening, HistoryEntry, Outcome, Reopened, State, Store, Timestamp};

use super::steps::{acquire, reservation};
use crate::fixture::{fresh_key, Fixture, LONG_LEASE, LONG_TTL, PAST_SHORT_LEASE, SHORT_LEASE};

fn entry(n: u64, what: Happening, reason: &str) -> HistoryEntry {
    HistoryEntry::new(
        Timestamp::from_millis(1_800_000_000_000 + i64::try_from(n).unwrap()),
        n,
        what,
        Some("Zoë \"ops\""),
        Some(reason),
    )
}

/// A history is appended to the record stored under the key, in any state, and read back as
/// written (text with newlines, quotes and non-ASCII characters included); concurrent appends all
/// land. It is kept across a mark, a takeover, a completion, a reopening (the record still
/// stored, though it counts as absent) and the next reservation of the key, which continues it;
/// a release deletes the record and its history with it. Without a record, nothing is appended.
pub async fn history_follows_the_record_until_it_goes<S: Store + Clone>(fx: &Fixture<S>) {
    let key = fresh_key("history");
    let first = entry(
        1,
        Happening::BecameUnknown,
        "smtp timeout\nafter 30 s — «retry?»",
    );
    assert!(fx.store.history(&key).await.expect("history").is_empty());
    assert!(
        !fx.store.append_history(&key, &first).await.expect("append"),
        "no record: nothing appended"
    );
    assert!(fx.store.history(&key).await.expect("history").is_empty());

    let lease = acquire(&fx.store, &reservation(&key, "a", SHORT_LEASE)).await;
    fx.store.mark_unknown(&key, lease).await.expect("mark");
    assert!(fx.store.append_history(&key, &first).await.expect("append"));
    assert_eq!(
        fx.store.history(&key).await.expect("history"),
        vec![first.clone()]
    );

    // A takeover keeps it; appends racing each other all land.
    let taken = acquire_takeover(fx, &key, lease.fence).await;
    let racing: Vec<HistoryEntry> = (10..18)
        .map(|n| entry(n, Happening::LateOutcomeRefused, &format!("late {n}")))
        .collect();
    let appends: Vec<_> = racing
        .iter()
        .map(|e| {
            let (store, key, e) = (fx.store.clone(), key.clone(), e.clone());
            tokio::spawn(async move { store.append_history(&key, &e).await })
        })
        .collect();
    for appended in appends {
        assert!(appended.await.expect("task").expect("append"));
    }
    let history = fx.store.history(&key).await.expect("history");
    assert_eq!(history.len(), 1 + racing.len(), "{history:?}");
    assert_eq!(history[0], first, "the first entry stays first");
    for e in &racing {
        assert!(history.contains(e), "{e:?} lost: {history:?}");
    }

    // Completed, reopened: still stored, still appended to, continued by the next reservation.
    fx.store
        .complete(&key, taken, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    assert_eq!(
        fx.store.reopen(&key, taken.fence).await.expect("reopen"),
        Reopened::Expired
    );
    assert!(fx.store.get(&key).await.expect("get").is_none());
    let mut reopened = entry(20, Happening::Reopened, "the charge bounced");
    reopened.was = Some(State::Completed);
    assert!(
        fx.store
            .append_history(&key, &reopened)
            .await
            .expect("append"),
        "a reopened record is still stored"
    );
    let again = acquire(&fx.store, &reservation(&key, "b", LONG_LEASE)).await;
    assert!(again.fence > taken.fence);
    let history = fx.store.history(&key).await.expect("history");
    assert_eq!(history.len(), 2 + racing.len(), "{history:?}");
    assert_eq!(
        history.last(),
        Some(&reopened),
        "continued by the next reservation"
    );

    // A release deletes the record, and its history with it.
    fx.store.release(&key, again).await.expect("release");
    assert!(fx.store.history(&key).await.expect("history").is_empty());
    assert!(!fx.store.append_history(&key, &first).await.expect("append"));
}

/// A purge that deletes a record past its tombstone deletes its history; a record that stays
/// keeps its own.
pub async fn purge_takes_a_records_history_with_it<S: Store>(fx: &Fixture<S>) {
    let gone = fresh_key("history-purge");
    let stays = fresh_key("history-purge");
    let l = acquire(&fx.store, &reservation(&gone, "a", LONG_LEASE)).await;
    fx.store
        .complete(&gone, l, &Outcome::success(b"x".to_vec()), SHORT_LEASE)
        .await
        .expect("complete");
    let l = acquire(&fx.store, &reservation(&stays, "a", LONG_LEASE)).await;
    fx.store.mark_unknown(&stays, l).await.expect("mark");
    let e = entry(1, Happening::BecameUnknown, "why");
    assert!(fx.store.append_history(&gone, &e).await.expect("append"));
    assert!(fx.store.append_history(&stays, &e).await.expect("append"));
    fx.pass(PAST_SHORT_LEASE).await;
    fx.store.purge_expired().await.expect("purge");
    assert!(fx.store.history(&gone).await.expect("history").is_empty());
    assert_eq!(fx.store.history(&stays).await.expect("history"), vec![e]);
}

async fn acquire_takeover<S: Store>(
    fx: &Fixture<S>,
    key: &idemgate_core::Key,
    stale: idemgate_core::Fence,
) -> idemgate_core::Lease {
    match fx
        .store
        .takeover(&reservation(key, "a", LONG_LEASE), stale)
        .await
        .expect("takeover")
    {
        idemgate_core::Claim::Acquired(lease) => lease,
        idemgate_core::Claim::Existing(rec) => panic!("expected to take over, found {rec:?}"),
    }
}
