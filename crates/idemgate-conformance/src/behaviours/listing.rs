//! The behaviours of listing and of keeping records apart: filters by tenant, tool, state and
//! scope, and one tenant never seeing another's records.

use idemgate_core::{
    Claim, IdempotencyKey, Key, ListFilter, Outcome, Record, RecordState, State, Store, TenantId,
    ToolName,
};

use super::steps::{acquire, reservation};
use crate::fixture::{fresh_key, Fixture, LONG_LEASE, LONG_TTL, PAST_SHORT_LEASE, SHORT_LEASE};

/// Listing filters by tenant, tool and state, expired leases counting as unknown.
pub async fn list_filters_by_tenant_tool_and_state<S: Store>(fx: &Fixture<S>) {
    let a = fresh_key("tool-a");
    let b = Key::new(
        a.tenant.clone(),
        ToolName::new("tool-b").unwrap(),
        a.key.clone(),
    );
    let c = Key::new(
        a.tenant.clone(),
        a.tool.clone(),
        IdempotencyKey::new("c").unwrap(),
    );
    let l = acquire(&fx.store, &reservation(&a, "x", LONG_LEASE)).await;
    fx.store
        .complete(&a, l, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    acquire(&fx.store, &reservation(&b, "x", LONG_LEASE)).await;
    acquire(&fx.store, &reservation(&c, "x", SHORT_LEASE)).await;
    fx.pass(PAST_SHORT_LEASE).await;
    let by = |tool: Option<&str>, state: Option<State>| ListFilter {
        tenant: Some(a.tenant.clone()),
        tool: tool.map(|t| ToolName::new(t).unwrap()),
        state,
        ..ListFilter::default()
    };
    let keys = |v: Vec<Record>| v.into_iter().map(|r| r.key).collect::<Vec<_>>();
    assert_eq!(fx.store.list(&by(None, None)).await.unwrap().len(), 3);
    assert_eq!(
        keys(fx.store.list(&by(Some("tool-a"), None)).await.unwrap()).len(),
        2
    );
    assert_eq!(
        keys(
            fx.store
                .list(&by(None, Some(State::Unknown)))
                .await
                .unwrap()
        ),
        vec![fx.listed(&c)]
    );
    assert_eq!(
        keys(
            fx.store
                .list(&by(None, Some(State::InFlight)))
                .await
                .unwrap()
        ),
        vec![fx.listed(&b)]
    );
    assert_eq!(
        keys(
            fx.store
                .list(&by(None, Some(State::Completed)))
                .await
                .unwrap()
        ),
        vec![fx.listed(&a)]
    );
    let limited = ListFilter {
        limit: 1,
        ..by(None, None)
    };
    assert_eq!(fx.store.list(&limited).await.unwrap().len(), 1);
}

/// A record keeps the scope of the reservation that made it, through completion and takeover (a
/// takeover is the same action, run again), and listing filters by it.
pub async fn records_keep_their_scope_and_list_by_it<S: Store>(fx: &Fixture<S>) {
    let a = fresh_key("scoped");
    let name = |k: &str| {
        Key::new(
            a.tenant.clone(),
            a.tool.clone(),
            IdempotencyKey::new(k).unwrap(),
        )
    };
    let (b, none) = (name("b"), name("none"));
    let scoped = |key: &Key, scope: &str, lease_for| {
        reservation(key, "x", lease_for).with_scope(Some(scope.into()))
    };
    let la = acquire(&fx.store, &scoped(&a, "conversation:1", SHORT_LEASE)).await;
    let lb = acquire(&fx.store, &scoped(&b, "conversation:2", LONG_LEASE)).await;
    acquire(&fx.store, &reservation(&none, "x", LONG_LEASE)).await;
    let scope_of = |rec: Option<Record>| rec.expect("record").scope.map(|s| s.to_string());
    assert_eq!(
        scope_of(fx.store.get(&a).await.expect("get")),
        Some("conversation:1".to_owned())
    );
    assert_eq!(scope_of(fx.store.get(&none).await.expect("get")), None);
    fx.store
        .complete(&b, lb, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    assert_eq!(
        scope_of(fx.store.get(&b).await.expect("get")),
        Some("conversation:2".to_owned())
    );
    // Taken over from another conversation: still the first one's record.
    fx.pass(PAST_SHORT_LEASE).await;
    match fx
        .store
        .takeover(&scoped(&a, "conversation:9", LONG_LEASE), la.fence)
        .await
        .expect("takeover")
    {
        Claim::Acquired(_) => {}
        Claim::Existing(rec) => panic!("takeover refused: {rec:?}"),
    }
    assert_eq!(
        scope_of(fx.store.get(&a).await.expect("get")),
        Some("conversation:1".to_owned())
    );
    let listed = |scope: &str| {
        let filter = ListFilter {
            tenant: Some(a.tenant.clone()),
            scope: Some(scope.into()),
            ..ListFilter::default()
        };
        async move {
            fx.store
                .list(&filter)
                .await
                .expect("list")
                .into_iter()
                .map(|r| r.key)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed("conversation:1").await, vec![fx.listed(&a)]);
    assert_eq!(listed("conversation:2").await, vec![fx.listed(&b)]);
    assert!(listed("conversation:9").await.is_empty());
    let completed_in_2 = ListFilter {
        tenant: Some(a.tenant.clone()),
        state: Some(State::Completed),
        scope: Some("conversation:2".into()),
        ..ListFilter::default()
    };
    assert_eq!(fx.store.list(&completed_in_2).await.expect("list").len(), 1);
}

/// The same key and arguments under two tenants are two records: neither sees the other's outcome.
pub async fn tenants_are_isolated<S: Store>(fx: &Fixture<S>) {
    let a = fresh_key("shared-tool");
    let b = Key::new(
        TenantId::new(format!("{}x", a.tenant)).unwrap(),
        a.tool.clone(),
        a.key.clone(),
    );
    let la = acquire(&fx.store, &reservation(&a, "same", LONG_LEASE)).await;
    fx.store
        .complete(
            &a,
            la,
            &Outcome::success(b"tenant a's secret".to_vec()),
            LONG_TTL,
        )
        .await
        .expect("complete");
    let lb = acquire(&fx.store, &reservation(&b, "same", LONG_LEASE)).await;
    assert!(matches!(
        fx.store.get(&b).await.unwrap().unwrap().state,
        RecordState::InFlight { .. }
    ));
    fx.store.release(&b, lb).await.expect("release");
    assert!(fx.store.get(&a).await.unwrap().is_some());
}
