//! Helpers shared by the tests.

use idemgate_core::{IdempotencyKey, Key, TenantId, ToolName};
use idemgate_postgres::{PgOptions, PgStore};

/// The shared test server.
pub(crate) fn url() -> String {
    std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// How to start the shared server, for failure messages.
pub(crate) const START_HINT: &str = "start it with: pg_ctlcluster --skip-systemctl-redirect \
     $(ls /etc/postgresql) main start (or point IDEMGATE_TEST_POSTGRES_URL at one)";

/// The schema the shared tests use (keys are under random tenants): one per schema version, so
/// that a checkout with a newer schema never migrates the one an older checkout tests in (which
/// would then refuse it as newer than it knows).
pub(crate) fn schema() -> String {
    format!("idemgate_test_v{}", idemgate_postgres::SCHEMA_VERSION)
}

/// `options` with the test schema and a small pool.
pub(crate) fn options() -> PgOptions {
    PgOptions {
        schema: schema(),
        pool_size: 8,
        ..PgOptions::default()
    }
}

/// A store on the shared server; fails the test with a hint when it cannot be reached.
pub(crate) async fn connect_with(url: &str, options: PgOptions) -> PgStore {
    match PgStore::connect_with(url, options).await {
        Ok(store) => store,
        Err(e) => panic!("failed to connect to the test Postgres at {url}: {e}\n{START_HINT}"),
    }
}

/// A store on the shared server in the test schema.
pub(crate) async fn connect() -> PgStore {
    connect_with(&url(), options()).await
}

/// A plain client on `url`, its connection driven in the background.
pub(crate) async fn raw_client(url: &str) -> tokio_postgres::Client {
    let (client, conn) = match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
        Ok(c) => c,
        Err(e) => panic!("failed to connect to the test Postgres at {url}: {e}\n{START_HINT}"),
    };
    tokio::spawn(conn);
    client
}

/// A connection of our own listening on the store's notification channel, and the payloads it
/// receives (keep the client: dropping it ends the session).
pub(crate) async fn listen_payloads() -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (client, mut conn) = match tokio_postgres::connect(&url(), tokio_postgres::NoTls).await {
        Ok(c) => c,
        Err(e) => panic!("failed to connect to the test Postgres: {e}\n{START_HINT}"),
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = futures_util::StreamExt::next(&mut messages).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    client.batch_execute("LISTEN idemgate").await.unwrap();
    (client, rx)
}

/// A fresh schema name.
pub(crate) fn fresh_schema(prefix: &str) -> String {
    format!("{prefix}_{}", &IdempotencyKey::mint().as_str()[4..16])
}

/// Drops a schema of the shared server, with everything in it. A session still holding one of
/// its locks fails the drop after 10 s instead of hanging the test.
pub(crate) async fn drop_schema(schema: &str) {
    let client = raw_client(&url()).await;
    client
        .batch_execute(&format!(
            "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
        ))
        .await
        .expect("drop schema");
}

/// A key under a fresh random tenant.
pub(crate) fn fresh_key(tool: &str, key: &str) -> Key {
    Key::new(
        TenantId::new(&IdempotencyKey::mint().as_str()[4..20]).unwrap(),
        ToolName::new(tool).unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

/// `url` with extra query parameters.
pub(crate) fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}
