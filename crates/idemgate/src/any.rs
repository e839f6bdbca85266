//! Store choice at run time, by URL.

use std::time::Duration;

use idemgate_core::store::Result;
use idemgate_core::url::UrlQuery;
use idemgate_core::{
    ChangeMark, Claim, Completion, Fence, Key, Lease, ListFilter, MemoryStore, Outcome, Record,
    Reopened, Reservation, Store, StoreError, Timestamp,
};

/// Any store, chosen by URL: a plain enum rather than a trait object, so every call is a match
/// and the async methods stay `Send` without boxing.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyStore {
    /// `memory:` (one process; for tests and trials).
    Memory(MemoryStore),
    /// `sqlite://PATH` (the embedded default).
    #[cfg(feature = "sqlite")]
    Sqlite(idemgate_sqlite::SqliteStore),
    /// `postgres://…` or `postgresql://…`.
    #[cfg(feature = "postgres")]
    Postgres(idemgate_postgres::PgStore),
    /// `redis://…`, a Redis Cluster (`redis+cluster://host:port,host:port…`), or the primary
    /// Redis Sentinel names (`redis+sentinel://host:port,host:port/service…`).
    #[cfg(feature = "redis")]
    Redis(idemgate_redis::RedisStore),
}

impl AnyStore {
    /// Opens the store a URL names: `memory:`, `sqlite://PATH` (or `sqlite:PATH`),
    /// `postgres://…`/`postgresql://…`, `redis://…` (and
    /// `redis+cluster://…` for a Redis Cluster, `redis+sentinel://…` behind Redis Sentinel). `docs/STORES.md` lists the query options
    /// each kind takes.
    ///
    /// # Errors
    /// [`StoreError::Misconfigured`] for a URL of no known (or no compiled-in) kind or with a query
    /// option its store does not know, and whatever the store reports when it cannot open.
    pub async fn connect(url: &str) -> Result<Self> {
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            "memory" => {
                // Takes no options and names nothing: anything after `memory:` is a mistake.
                let rest = UrlQuery::parse(url, "memory", &[])?.base;
                if !matches!(rest, "memory:" | "memory://") {
                    return Err(StoreError::Misconfigured(format!(
                        "failed to parse the memory URL {url:?}: it is just memory:"
                    )));
                }
                Ok(AnyStore::Memory(MemoryStore::new()))
            }
            #[cfg(feature = "sqlite")]
            "sqlite" => Ok(AnyStore::Sqlite(idemgate_sqlite::SqliteStore::connect(
                url,
            )?)),
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => Ok(AnyStore::Postgres(
                idemgate_postgres::PgStore::connect(url).await?,
            )),
            #[cfg(feature = "redis")]
            "redis" | "redis+cluster" | "redis+sentinel" => Ok(AnyStore::Redis(
                idemgate_redis::RedisStore::connect(url).await?,
            )),
            // Not the URL itself: a misspelt `postgress://user:password@…` carries a password.
            _ => Err(StoreError::Misconfigured(format!(
                "no store has the scheme {scheme:?}: expected a URL starting with {}",
                SCHEMES.join(", ")
            ))),
        }
    }

    /// Whether the store keeps records across restarts of this process.
    pub fn is_durable(&self) -> bool {
        !matches!(self, AnyStore::Memory(_))
    }
}

/// A store URL for messages: its password (`scheme://user:password@…`) replaced by `***`.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// The URL schemes compiled in.
pub const SCHEMES: &[&str] = &[
    "memory:",
    #[cfg(feature = "sqlite")]
    "sqlite://",
    #[cfg(feature = "postgres")]
    "postgres://",
    #[cfg(feature = "redis")]
    "redis://",
    #[cfg(feature = "redis")]
    "redis+cluster://",
    #[cfg(feature = "redis")]
    "redis+sentinel://",
];

/// Forwards a method to whichever store this is.
macro_rules! dispatch {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($s) => $call,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($s) => $call,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($s) => $call,
            #[cfg(feature = "redis")]
            AnyStore::Redis($s) => $call,
        }
    };
}

impl Store for AnyStore {
    async fn reserve(&self, r: &Reservation) -> Result<Claim> {
        dispatch!(self, s => s.reserve(r).await)
    }
    async fn takeover(&self, r: &Reservation, stale: Fence) -> Result<Claim> {
        dispatch!(self, s => s.takeover(r, stale).await)
    }
    async fn heartbeat(&self, key: &Key, lease: Lease, lease_for: Duration) -> Result<Timestamp> {
        dispatch!(self, s => s.heartbeat(key, lease, lease_for).await)
    }
    async fn complete_at(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        ttl: Duration,
        executed_at: Option<Timestamp>,
    ) -> Result<Completion> {
        dispatch!(self, s => s.complete_at(key, lease, outcome, ttl, executed_at).await)
    }
    async fn release(&self, key: &Key, lease: Lease) -> Result<()> {
        dispatch!(self, s => s.release(key, lease).await)
    }
    async fn mark_unknown(&self, key: &Key, lease: Lease) -> Result<()> {
        dispatch!(self, s => s.mark_unknown(key, lease).await)
    }
    async fn reopen(&self, key: &Key, fence: Fence) -> Result<Reopened> {
        dispatch!(self, s => s.reopen(key, fence).await)
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        dispatch!(self, s => s.get(key).await)
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        dispatch!(self, s => s.list(filter).await)
    }
    async fn purge_expired(&self) -> Result<u64> {
        dispatch!(self, s => s.purge_expired().await)
    }
    fn change_mark(&self, key: &Key) -> ChangeMark {
        dispatch!(self, s => s.change_mark(key))
    }
    async fn wait_changed(&self, key: &Key, since: ChangeMark, timeout: Duration) {
        dispatch!(self, s => s.wait_changed(key, since, timeout).await)
    }
    async fn probe_write(&self) -> Result<()> {
        dispatch!(self, s => s.probe_write().await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact_url("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(redact_url("redis://:secret@h:6379"), "redis://:***@h:6379");
        assert_eq!(redact_url("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact_url("redis://u@h"), "redis://u@h");
        assert_eq!(redact_url("sqlite:///a/b@c.db"), "sqlite:///a/b@c.db");
    }

    #[tokio::test]
    async fn unknown_schemes_are_refused_with_the_list() {
        let err = AnyStore::connect("mongodb://x").await.unwrap_err();
        assert!(err.to_string().contains("memory:"), "{err}");
        assert!(matches!(err, StoreError::Misconfigured(_)), "{err}");
        // A misspelt scheme is named, never the URL with its password.
        let err = AnyStore::connect("postgress://u:secret@h/db")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("\"postgress\""), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
        assert!(matches!(
            AnyStore::connect("memory:").await,
            Ok(AnyStore::Memory(_))
        ));
    }

    #[tokio::test]
    async fn unknown_options_are_refused_for_every_scheme() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.db");
        let mut urls = vec![("memory:?prefx=x", "prefx")];
        let sqlite = format!("sqlite://{}?mode=ro", db.display());
        if cfg!(feature = "sqlite") {
            urls.push((&sqlite, "mode"));
        }
        if cfg!(feature = "postgres") {
            // Refused before any connection is tried (nothing listens on port 1).
            urls.push(("postgres://u@127.0.0.1:1/db?sslmod=disable", "sslmod"));
        }
        if cfg!(feature = "redis") {
            urls.push(("redis://127.0.0.1:1/0?prefx=t:", "prefx"));
            urls.push(("redis+cluster://127.0.0.1:1,127.0.0.1:2?prefx=t:", "prefx"));
            urls.push(("redis+sentinel://127.0.0.1:1/mymaster?prefx=t:", "prefx"));
        }
        for (url, option) in urls {
            let e = AnyStore::connect(url).await.unwrap_err();
            assert!(
                matches!(&e, StoreError::Misconfigured(m)
                    if m.contains(&format!("unknown option {option:?}"))),
                "{url}: {e}"
            );
        }
        for bad in ["memory:x", "memory:/tmp/db"] {
            let e = AnyStore::connect(bad).await.unwrap_err();
            assert!(matches!(e, StoreError::Misconfigured(_)), "{bad}: {e}");
        }
        assert!(AnyStore::connect("memory://").await.is_ok());
    }
}
