//! Key names are fixed-length digests: client keys cannot shape them.

use std::time::Duration;

use idemgate_core::{
    Claim, Fingerprint, IdempotencyKey, Key, ListFilter, Outcome, RecordState, Reservation, Store,
    TenantId, ToolName,
};

use crate::common::{delete_prefix, random_hex, raw, run_prefix, shared_store, test_url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_names_have_fixed_length_whatever_the_key() {
    let prefix = format!("{}keys-{}:", run_prefix(), random_hex(4));
    let store = shared_store(&prefix).await;
    let tenant = TenantId::new(format!("t{}", random_hex(4))).unwrap();
    let tool = ToolName::new("globs/tool:v1").unwrap();
    let nasty = "{}*?[]".repeat(43)[..255].to_owned();
    let keys: Vec<Key> = ["a", nasty.as_str(), "}{", "*", "[a-z]?"]
        .into_iter()
        .map(|k| {
            Key::new(
                tenant.clone(),
                tool.clone(),
                IdempotencyKey::new(k).unwrap(),
            )
        })
        .collect();
    for (i, key) in keys.iter().enumerate() {
        let r = Reservation::new(
            key.clone(),
            Fingerprint::of_bytes(b"args"),
            Duration::from_secs(60),
        );
        let Claim::Acquired(lease) = store.reserve(&r).await.expect("reserve") else {
            panic!("expected to acquire {key}");
        };
        let body = format!("result {i}").into_bytes();
        store
            .complete(key, lease, &Outcome::success(body), Duration::from_secs(60))
            .await
            .expect("complete");
    }

    let mut conn = raw(&test_url()).await;
    // A full SCAN cycle (the shared server may hold many other keys; one step sees only some).
    let mut names = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("scan");
        names.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    names.sort();
    names.dedup();
    assert_eq!(names.len(), keys.len(), "{names:?}");
    for name in &names {
        assert_eq!(name.len(), prefix.len() + 66, "{name}");
        let tag = &name[prefix.len()..];
        assert!(tag.starts_with('{') && tag.ends_with('}'), "{name}");
        assert!(tag[1..65].bytes().all(|b| b.is_ascii_hexdigit()), "{name}");
    }
    for key in &keys {
        assert!(names.contains(&store.record_key(key)));
        let rec = store.get(key).await.expect("get").expect("record");
        assert_eq!(&rec.key, key, "the key survives intact");
        assert!(matches!(rec.state, RecordState::Completed { .. }));
    }
    let listed = store
        .list(&ListFilter {
            tenant: Some(tenant.clone()),
            ..ListFilter::default()
        })
        .await
        .expect("list");
    let mut got: Vec<&Key> = listed.iter().map(|r| &r.key).collect();
    got.sort();
    let mut want: Vec<&Key> = keys.iter().collect();
    want.sort();
    assert_eq!(got, want);
    delete_prefix(&test_url(), &prefix).await;
}
