//! A primary that streams to an asynchronous standby is refused at connect (a failover to the
//! standby would lose acknowledged outcomes, and those calls would run again) unless the URL or
//! the options accept it; a synchronous standby is accepted. Private instances: a primary and a
//! real streaming standby made by `pg_basebackup`, each on its own loopback port.

use std::time::Duration;

use idemgate_conformance::servers::PrivatePostgres;
use idemgate_core::{
    Call, Decision, Effect, Engine, IdempotencyKey, Recording, TenantId, ToolName,
};
use idemgate_postgres::{PgOptions, PgStore};

use crate::support::with_params;

fn options() -> PgOptions {
    PgOptions {
        schema: "idemgate".to_owned(),
        pool_size: 2,
        connect_timeout: Duration::from_secs(5),
        ..PgOptions::default()
    }
}

/// Connects, expecting the refusal of an asynchronous standby; returns its message.
async fn refused(url: &str, options: PgOptions) -> String {
    match PgStore::connect_with(url, options).await {
        Err(idemgate_core::StoreError::Misconfigured(m)) => m.to_string(),
        other => panic!("{url}: expected the refusal of an asynchronous standby, got {other:?}"),
    }
}

/// Connects, expecting the store to open.
async fn opens(url: &str, options: PgOptions) -> PgStore {
    match PgStore::connect_with(url, options).await {
        Ok(store) => store,
        Err(e) => panic!("{url}: expected the store to open, got {e}"),
    }
}

/// One fresh call through the engine: it runs and its outcome is stored (the commit was
/// acknowledged, on a synchronous primary once the standby confirmed it).
async fn one_call_is_stored(store: PgStore) {
    let engine = Engine::new(store);
    let call = Call::new(
        TenantId::new("replication").unwrap(),
        ToolName::new("t").unwrap(),
    )
    .key(IdempotencyKey::mint())
    .args(&serde_json::json!({}));
    let answer = engine
        .call(call, || async { Effect::Success(b"ran".to_vec()) })
        .await
        .expect("the call");
    assert!(
        matches!(
            answer.decision,
            Decision::Executed {
                recording: Recording::Stored,
                ..
            }
        ),
        "{:?}",
        answer.decision
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_standby_is_refused_unless_accepted() {
    let mut primary = PrivatePostgres::init();
    primary.start();
    let standby = primary.start_standby();
    let name = standby.standby_name();
    assert_eq!(
        primary.psql(&format!(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}'"
        )),
        "async"
    );
    let url = primary.url();

    let m = refused(&url, options()).await;
    for part in [
        format!("Postgres streams to 1 asynchronous standby (application_name [\"{name}\"])"),
        "a failover to it loses the outcomes the store acknowledged".to_owned(),
        "calls that ran would run again when re-sent".to_owned(),
        "synchronous_standby_names".to_owned(),
        "allow_async_replication=true".to_owned(),
        "PgOptions::allow_async_replication".to_owned(),
    ] {
        assert!(m.contains(&part), "{part:?} missing from: {m}");
    }
    eprintln!("refused: {m}");
    // Refused before migrating: nothing was written.
    assert_eq!(
        primary.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'idemgate'"),
        "0"
    );
    // The URL's `false` wins over the options' `true`.
    let accepting = PgOptions {
        allow_async_replication: true,
        ..options()
    };
    let no = with_params(&url, "allow_async_replication=false");
    refused(&no, accepting.clone()).await;
    refused(&with_params(&url, "allow_async_replication=no"), options()).await;

    // Accepted knowingly: by the URL (among tokio-postgres's own options, which still take
    // effect), or by the options.
    let yes = with_params(
        &url,
        "application_name=replication%20test&allow_async_replication=true&connect_timeout=5",
    );
    let store = opens(&yes, options()).await;
    let client = store.pool().get().await.expect("a pooled connection");
    let row = client
        .query_one("SHOW application_name", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "replication test");
    drop(client);
    one_call_is_stored(store).await;
    for accepted in ["allow_async_replication", "allow_async_replication=1"] {
        drop(opens(&with_params(&url, accepted), options()).await);
    }
    one_call_is_stored(opens(&url, accepting).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_cannot_see_the_replication_state_is_not_refused() {
    let mut primary = PrivatePostgres::init();
    primary.start();
    let _standby = primary.start_standby();
    // A plain role sees the standby's row, but NULL in its state columns.
    let _ = primary.psql("CREATE ROLE plain LOGIN; GRANT CREATE ON DATABASE postgres TO plain");
    let plain = primary.url().replace("postgres@", "plain@");
    let (client, conn) = tokio_postgres::connect(&plain, tokio_postgres::NoTls)
        .await
        .expect("connect as plain");
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT count(*), count(sync_state) FROM pg_stat_replication",
            &[],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (1, 0));
    drop(opens(&plain, options()).await);
    // Given the right to read it, the same role is refused.
    let _ = primary.psql("GRANT pg_read_all_stats TO plain");
    let m = refused(&plain, options()).await;
    assert!(m.contains("1 asynchronous standby"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_is_accepted() {
    let mut primary = PrivatePostgres::init();
    primary.start_with(&[("synchronous_standby_names", "*")]);
    let standby = primary.start_standby();
    assert_eq!(
        primary.psql(&format!(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{}'",
            standby.standby_name()
        )),
        "sync"
    );
    let store = opens(&primary.url(), options()).await;
    one_call_is_stored(store).await;
}

/// A WAL receiver that never reports a flush position (`pg_receivewal` without `--synchronous`,
/// as an archive streams), run as root into a temporary directory; killed by its pid on drop.
struct WalReceiver {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Drop for WalReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_reports_counts_as_asynchronous_after_a_wait() {
    let mut primary = PrivatePostgres::init();
    primary.start_with(&[("synchronous_standby_names", "*")]);
    let dir = tempfile::tempdir().expect("temp dir");
    let child = std::process::Command::new(primary.bin_dir().join("pg_receivewal"))
        .args(["-h", "127.0.0.1", "-p", &primary.port().to_string()])
        .args(["-U", "postgres", "-n", "-D"])
        .arg(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start pg_receivewal");
    let _receiver = WalReceiver { child, _dir: dir };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let streaming = "SELECT count(*) FROM pg_stat_replication \
                     WHERE application_name = 'pg_receivewal' AND state = 'streaming'";
    while primary.psql(streaming) != "1" {
        assert!(
            std::time::Instant::now() < deadline,
            "pg_receivewal did not stream"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Shown as async however long it streams: no flush position, so it confirms no commit.
    let started = std::time::Instant::now();
    let m = refused(&primary.url(), options()).await;
    assert!(
        m.contains("1 asynchronous standby (application_name [\"pg_receivewal\"])"),
        "{m}"
    );
    // Looked at again before it counted, since synchronous standbys are configured.
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}
