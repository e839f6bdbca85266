//! The behaviours of listing and of keeping records apart: filters by tenant, tool, state and
//! scope, pages that reach every record once, and one tenant never seeing another's records.

use idemgate_core::{
    Claim, IdempotencyKey, Key, ListCursor, ListFilter, Outcome, Record, RecordState, State, Store,
    TenantId, ToolName,
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

/// Every page of `filter` from the first, `page` records each, following each page's cursor as a
/// caller does; `between` runs after each page but the last (to write records meanwhile).
async fn every_page<S: Store, F: std::future::Future<Output = ()>>(
    store: &S,
    filter: &ListFilter,
    page: usize,
    mut between: impl FnMut(usize) -> F,
) -> Vec<Record> {
    let mut all = Vec::new();
    let mut after: Option<ListCursor> = None;
    for n in 0.. {
        assert!(
            n < 1000,
            "the pages never end: {} records so far",
            all.len()
        );
        let asked = ListFilter {
            after: after.clone(),
            limit: page,
            ..filter.clone()
        };
        let got = store.list(&asked).await.expect("list a page");
        assert!(got.len() <= page, "a page of {page} held {}", got.len());
        let Some(last) = got.last() else { break };
        // The cursor travels as text (a URL's query, a shell argument): read it back as a caller
        // passing it on would.
        let text = ListCursor::of(last).to_string();
        after = Some(text.parse().expect("a cursor reads back"));
        assert_eq!(after, Some(ListCursor::of(last)), "cursor {text}");
        let short = got.len() < page;
        all.extend(got);
        if short {
            break;
        }
        between(n).await;
    }
    all
}

fn names(records: &[Record]) -> Vec<Key> {
    records.iter().map(|r| r.key.clone()).collect()
}

/// Paging through a listing with a page smaller than the set (following each page's cursor)
/// gives every record exactly once, in the order of the whole listing, with and without filters
/// (tool, state, key prefix, creation time), and records reserved between pages (one whose key
/// sorts before all the others included) never make a record that was there skipped or repeated.
/// Counting gives the true number of records, and stops where it is told to.
pub async fn pages_list_every_record_once<S: Store>(fx: &Fixture<S>) {
    let base = fresh_key("paged-a");
    let name = |tool: &str, key: &str| {
        Key::new(
            base.tenant.clone(),
            ToolName::new(tool).unwrap(),
            IdempotencyKey::new(key).unwrap(),
        )
    };
    // Two batches of records a moment apart, each with records created in the same millisecond
    // on a manual clock (the order then rests on the names), in two tools and three states.
    let mut first = Vec::new();
    for i in 0..7 {
        let tool = if i % 2 == 0 { "paged-a" } else { "paged-b" };
        let prefix = if i % 3 == 0 { "p-" } else { "q-" };
        first.push(name(tool, &format!("{prefix}{}", 9 - i)));
    }
    let mut second = Vec::new();
    for i in 0..6 {
        let tool = if i % 2 == 0 { "paged-b" } else { "paged-a" };
        second.push(name(tool, &format!("p-late-{i}")));
    }
    let reserve_all = |keys: Vec<Key>| async move {
        for (i, key) in keys.iter().enumerate() {
            let lease = acquire(&fx.store, &reservation(key, "x", LONG_LEASE)).await;
            if i % 3 != 1 {
                fx.store
                    .complete(key, lease, &Outcome::success(b"x".to_vec()), LONG_TTL)
                    .await
                    .expect("complete");
            }
        }
    };
    reserve_all(first.clone()).await;
    fx.pass(std::time::Duration::from_millis(20)).await;
    reserve_all(second.clone()).await;
    let tenant = ListFilter {
        tenant: Some(base.tenant.clone()),
        ..ListFilter::default()
    };
    let whole = fx.store.list(&tenant).await.expect("list");
    assert_eq!(whole.len(), first.len() + second.len());
    let mut sorted = whole.clone();
    sorted.sort_by(|a, b| {
        ListCursor::of(a)
            .sort_key()
            .cmp(&ListCursor::of(b).sort_key())
    });
    assert_eq!(names(&sorted), names(&whole), "the listing order");
    let no_writes = |_| async {};

    let created_second = whole
        .iter()
        .filter(|r| second.iter().any(|k| fx.listed(k) == r.key))
        .map(|r| r.created_at)
        .min()
        .expect("the second batch is listed");
    let mut filters = vec![
        ("no filter", tenant.clone()),
        (
            "a tool",
            ListFilter {
                tool: Some(ToolName::new("paged-b").unwrap()),
                ..tenant.clone()
            },
        ),
        (
            "a state",
            ListFilter {
                state: Some(State::Completed),
                ..tenant.clone()
            },
        ),
        (
            "created from",
            ListFilter {
                created_from: Some(created_second),
                ..tenant.clone()
            },
        ),
        (
            "created before",
            ListFilter {
                created_before: Some(created_second),
                ..tenant.clone()
            },
        ),
    ];
    // A store that keeps keys in another form (a sealed store keeps their HMACs) cannot select
    // them by what they start with.
    let keys_as_written = fx.listed(&base) == base;
    if keys_as_written {
        filters.push((
            "a key prefix",
            ListFilter {
                key_prefix: Some("p-".into()),
                ..tenant.clone()
            },
        ));
    }
    for (what, filter) in &filters {
        let expected = fx.store.list(filter).await.expect("list");
        let wanted = whole.iter().filter(|r| filter.matches(r)).count();
        assert_eq!(expected.len(), wanted, "{what}: the whole listing");
        assert!(
            expected.len() > 2,
            "{what}: {} records, too few to page",
            expected.len()
        );
        for page in [1, 2, 3] {
            let paged = every_page(&fx.store, filter, page, no_writes).await;
            assert_eq!(
                names(&paged),
                names(&expected),
                "{what}: pages of {page} against the whole listing"
            );
        }
        assert_eq!(
            fx.store.count(filter, 1000).await.expect("count"),
            expected.len(),
            "{what}: the count"
        );
        assert_eq!(
            fx.store.count(filter, 2).await.expect("count"),
            2,
            "{what}: the count stops where it is told"
        );
        // A page's cursor does not change what the count counts.
        let from_page = ListFilter {
            after: Some(ListCursor::of(&expected[0])),
            limit: 1,
            ..filter.clone()
        };
        assert_eq!(
            fx.store.count(&from_page, 1000).await.expect("count"),
            expected.len(),
            "{what}: the count of a later page"
        );
    }
    if keys_as_written {
        let only_p = fx
            .store
            .list(&ListFilter {
                key_prefix: Some("p-".into()),
                ..tenant.clone()
            })
            .await
            .expect("list");
        assert!(only_p.iter().all(|r| r.key.key.as_str().starts_with("p-")));
    }

    // Records reserved between pages: after each of the first pages two, one whose key sorts
    // before every other name of the same millisecond (on a manual clock) and one after. (Not
    // after every page: pages of two that gain two records each would never end.)
    let mut added = 0;
    let paged = every_page(&fx.store, &tenant, 2, |n| {
        let new = if n < 3 {
            added += 2;
            vec![
                name("paged-a", &format!("0-new-{n}")),
                name("paged-b", &format!("z-new-{n}")),
            ]
        } else {
            Vec::new()
        };
        async move { reserve_all(new).await }
    })
    .await;
    let mut seen = std::collections::HashSet::new();
    for r in &paged {
        assert!(seen.insert(r.key.clone()), "{} listed twice", r.key);
    }
    for r in &whole {
        assert!(seen.contains(&r.key), "{} was skipped", r.key);
    }
    assert_eq!(added, 6, "records were written between pages");
    assert!(paged.len() >= whole.len());
}
