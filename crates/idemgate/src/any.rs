//! Store choice at run time, by URL.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use idemgate_core::store::Result;
use idemgate_core::url::UrlQuery;
use idemgate_core::{
    ChangeMark, Claim, Completion, Fence, HistoryEntry, Keep, Key, Lease, ListFilter, MemoryStore,
    Outcome, Record, Reopened, Reservation, Store, StoreError, Timestamp,
};
use idemgate_seal::{Seal, Sealed};

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
    /// One of the others, its records sealed: keys stored as HMACs, outcomes encrypted
    /// (`IDEMGATE_SEAL_KEYS` and `IDEMGATE_KEY_SECRET`, `docs/OPERATIONS.md`).
    Sealed(SealedStore),
}

impl AnyStore {
    /// Opens the store a URL names: `memory:`, `sqlite://PATH` (or `sqlite:PATH`),
    /// `postgres://…`/`postgresql://…`, `redis://…` (and
    /// `redis+cluster://…` for a Redis Cluster, `redis+sentinel://…` behind Redis Sentinel). `docs/STORES.md` lists the query options
    /// each kind takes.
    ///
    /// Records are sealed when the environment configures a seal ([`idemgate_seal::from_env`]:
    /// `IDEMGATE_SEAL_KEYS` or `IDEMGATE_SEAL_KEYS_FILE`, and `IDEMGATE_KEY_SECRET` or
    /// `IDEMGATE_KEY_SECRET_FILE`), so every front door that opens its store here seals alike;
    /// without them, records are stored in clear, as before.
    ///
    /// # Errors
    /// [`StoreError::Misconfigured`] for a URL of no known (or no compiled-in) kind or with a query
    /// option its store does not know, or a seal configured wrongly, and whatever the store
    /// reports when it cannot open.
    pub async fn connect(url: &str) -> Result<Self> {
        let seal = idemgate_seal::from_env()
            .map_err(|e| StoreError::misconfigured(format!("failed to set up sealing: {e}")))?;
        Self::connect_sealed(url, seal).await
    }

    /// As [`AnyStore::connect`], sealed by `seal` when given (and never by the environment).
    ///
    /// # Errors
    /// As [`AnyStore::connect`].
    pub async fn connect_sealed(url: &str, seal: Option<Seal>) -> Result<Self> {
        let store = Self::connect_unsealed(url).await?;
        if store.is_durable() {
            // A sealed store opened without its seal would find none of its records and run
            // every call again: refused, naming what is missing (`idemgate_seal::marker`).
            idemgate_seal::marker::check(&store, seal.as_ref()).await?;
        }
        Ok(match seal {
            Some(seal) => AnyStore::Sealed(SealedStore::new(store, seal)),
            None => store,
        })
    }

    /// Boxed: opening a store is once per process, and a boxed future keeps the types of the
    /// futures that await it (a door's start-up, a test) from nesting every store's connect.
    fn connect_unsealed(url: &str) -> Pin<Box<dyn Future<Output = Result<Self>> + Send + '_>> {
        Box::pin(async move {
            let scheme = url.split(':').next().unwrap_or_default();
            match scheme {
                "memory" => {
                    // Takes no options and names nothing: anything after `memory:` is a mistake.
                    let rest = UrlQuery::parse(url, "memory", &[])?.base;
                    if !matches!(rest, "memory:" | "memory://") {
                        return Err(StoreError::misconfigured(format!(
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
                _ => Err(StoreError::misconfigured(format!(
                    "no store has the scheme {scheme:?}: expected a URL starting with {}",
                    SCHEMES.join(", ")
                ))),
            }
        })
    }

    /// Whether the store keeps records across restarts of this process.
    pub fn is_durable(&self) -> bool {
        !matches!(self.unsealed(), AnyStore::Memory(_))
    }

    /// The store that holds the records: this one, or the one under the seal.
    pub fn unsealed(&self) -> &AnyStore {
        match self {
            AnyStore::Sealed(s) => s.0.inner().unsealed(),
            other => other,
        }
    }

    /// The seal, when records are sealed.
    pub fn seal(&self) -> Option<&Seal> {
        match self {
            AnyStore::Sealed(s) => Some(s.0.seal()),
            _ => None,
        }
    }

    /// The name under which the store keeps the record of `key`: `key` itself, or its HMAC when
    /// records are sealed ([`Seal::stored_name`]). Listings show records under it.
    pub fn stored_name(&self, key: &Key) -> Key {
        match self.seal() {
            Some(seal) => seal.stored_name(key),
            None => key.clone(),
        }
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

/// Forwards a method to whichever store this is: `sync` for a plain call, else awaited. The
/// futures of the network stores (and of the sealed one) are boxed: an allocation is nothing
/// beside a round trip, and it keeps every caller's future (the engine's, a door's) from nesting
/// theirs, which are deep enough to overflow the compiler's limit on laying out futures.
macro_rules! dispatch {
    ($self:ident, $method:ident($($arg:ident),*)) => {
        match $self {
            AnyStore::Memory(s) => s.$method($($arg),*).await,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite(s) => s.$method($($arg),*).await,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(s) => boxed(s.$method($($arg),*)).await,
            #[cfg(feature = "redis")]
            AnyStore::Redis(s) => boxed(s.$method($($arg),*)).await,
            AnyStore::Sealed(s) => s.0.$method($($arg),*).await,
        }
    };
    (sync $self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($s) => $call,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($s) => $call,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($s) => $call,
            #[cfg(feature = "redis")]
            AnyStore::Redis($s) => $call,
            AnyStore::Sealed(sealed) => {
                let $s = &*sealed.0;
                $call
            }
        }
    };
}

/// `future`, boxed (see [`dispatch`]).
#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
fn boxed<'a, T>(future: impl Future<Output = T> + Send + 'a) -> Boxed<'a, T> {
    Box::pin(future)
}

/// A store of [`AnyStore`] under a seal. Its operations are boxed behind a trait object: its
/// futures hold the futures of the store under it, which this store's own cannot name without a
/// cycle, and its type holds that store, which this one cannot hold by value.
#[derive(Clone, Debug)]
pub struct SealedStore(Arc<dyn Erased>);

impl SealedStore {
    /// `store`, sealed by `seal`.
    pub fn new(store: AnyStore, seal: Seal) -> Self {
        SealedStore(Arc::new(Sealed::new(store, seal)))
    }
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

macro_rules! erased {
    ($($method:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        /// [`Store`] for [`Sealed<AnyStore>`], its futures boxed.
        trait Erased: std::fmt::Debug + Send + Sync {
            fn inner(&self) -> &AnyStore;
            fn seal(&self) -> &Seal;
            fn change_mark(&self, key: &Key) -> ChangeMark;
            $(fn $method<'a>(&'a self, $($arg: $ty),*) -> Boxed<'a, $out>;)*
        }

        impl Erased for Sealed<AnyStore> {
            fn inner(&self) -> &AnyStore {
                Sealed::inner(self)
            }
            fn seal(&self) -> &Seal {
                Sealed::seal(self)
            }
            fn change_mark(&self, key: &Key) -> ChangeMark {
                Store::change_mark(self, key)
            }
            $(fn $method<'a>(&'a self, $($arg: $ty),*) -> Boxed<'a, $out> {
                Box::pin(Store::$method(self, $($arg),*))
            })*
        }
    };
}

erased! {
    reserve(r: &'a Reservation) -> Result<Claim>;
    takeover(r: &'a Reservation, stale: Fence) -> Result<Claim>;
    heartbeat(key: &'a Key, lease: Lease, lease_for: Duration) -> Result<Timestamp>;
    complete_at(
        key: &'a Key,
        lease: Lease,
        outcome: &'a Outcome,
        keep: Keep,
        executed_at: Option<Timestamp>
    ) -> Result<Completion>;
    release(key: &'a Key, lease: Lease) -> Result<()>;
    mark_unknown(key: &'a Key, lease: Lease) -> Result<()>;
    reopen(key: &'a Key, fence: Fence) -> Result<Reopened>;
    get(key: &'a Key) -> Result<Option<Record>>;
    append_history(key: &'a Key, entry: &'a HistoryEntry) -> Result<bool>;
    history(key: &'a Key) -> Result<Vec<HistoryEntry>>;
    list(filter: &'a ListFilter) -> Result<Vec<Record>>;
    count(filter: &'a ListFilter, at_most: usize) -> Result<usize>;
    purge_expired() -> Result<u64>;
    wait_changed(key: &'a Key, since: ChangeMark, timeout: Duration) -> ();
    probe_write() -> Result<()>;
}

impl Store for AnyStore {
    async fn reserve(&self, r: &Reservation) -> Result<Claim> {
        dispatch!(self, reserve(r))
    }
    async fn takeover(&self, r: &Reservation, stale: Fence) -> Result<Claim> {
        dispatch!(self, takeover(r, stale))
    }
    async fn heartbeat(&self, key: &Key, lease: Lease, lease_for: Duration) -> Result<Timestamp> {
        dispatch!(self, heartbeat(key, lease, lease_for))
    }
    async fn complete_at(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        keep: Keep,
        executed_at: Option<Timestamp>,
    ) -> Result<Completion> {
        dispatch!(self, complete_at(key, lease, outcome, keep, executed_at))
    }
    async fn release(&self, key: &Key, lease: Lease) -> Result<()> {
        dispatch!(self, release(key, lease))
    }
    async fn mark_unknown(&self, key: &Key, lease: Lease) -> Result<()> {
        dispatch!(self, mark_unknown(key, lease))
    }
    async fn reopen(&self, key: &Key, fence: Fence) -> Result<Reopened> {
        dispatch!(self, reopen(key, fence))
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        dispatch!(self, get(key))
    }
    async fn append_history(&self, key: &Key, entry: &HistoryEntry) -> Result<bool> {
        dispatch!(self, append_history(key, entry))
    }
    async fn history(&self, key: &Key) -> Result<Vec<HistoryEntry>> {
        dispatch!(self, history(key))
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        dispatch!(self, list(filter))
    }
    async fn count(&self, filter: &ListFilter, at_most: usize) -> Result<usize> {
        dispatch!(self, count(filter, at_most))
    }
    async fn purge_expired(&self) -> Result<u64> {
        dispatch!(self, purge_expired())
    }
    fn change_mark(&self, key: &Key) -> ChangeMark {
        dispatch!(sync self, s => s.change_mark(key))
    }
    async fn wait_changed(&self, key: &Key, since: ChangeMark, timeout: Duration) {
        dispatch!(self, wait_changed(key, since, timeout))
    }
    async fn probe_write(&self) -> Result<()> {
        dispatch!(self, probe_write())
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
