#![doc = include_str!("../README.md")]

mod codec;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod watch;

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use idemgate_core::ReservePath;

use idemgate_core::key::hex;
use idemgate_core::store::Result;
use idemgate_core::transition::{self, Change, StoredRecord};
use idemgate_core::url::UrlQuery;
use idemgate_core::{
    ChangeMark, Changes, Claim, Completion, Fence, Keep, Key, Lease, ListFilter, Outcome, Record,
    Reopened, Reservation, ReserveHistory, Store, StoreError, Timestamp,
};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    Cmd, ConnectionInfo, ErrorKind, FromRedisValue, Pipeline, RedisConnectionInfo, RedisFuture,
    RedisResult, Script, ServerErrorKind, ToRedisArgs, Value,
};

use crate::codec::{array, hash_record, number, stored_record, text};
use crate::error::{classify, corrupt};

/// The longest duration sent to a script, in milliseconds (about 35,000 years). Scripts compute
/// in Lua doubles, exact up to 2^53; capping durations keeps every timestamp exact.
const MAX_MS: u64 = 1 << 50;

/// How many keys one `SCAN` step asks for.
const SCAN_COUNT: u64 = 500;

/// Settings of a [`RedisStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    /// Accept a Redis without append-only persistence, with `appendfsync no`, or whose settings
    /// cannot be read: records, in-flight reservations included, are lost when it (or its
    /// machine) restarts, so a side effect may run twice.
    /// Also set by `?allow_volatile=true` in the URL.
    pub allow_volatile: bool,
    /// After every write, wait until this many replicas acknowledged it (`WAIT n timeout`); fewer
    /// acknowledgements make the write [`StoreError::Indeterminate`], since a failover could lose it.
    /// Also set by `?wait_replicas=N&wait_timeout=500ms` in the URL.
    pub wait_replicas: Option<(u32, Duration)>,
    /// The prefix of every key name: letters, digits, `:`, `_`, `.` and `-`, at most 64 bytes. Also
    /// set by `?key_prefix=...` in the URL.
    pub key_prefix: String,
    /// How long a command may take before its answer counts as lost (then the write is
    /// [`StoreError::Indeterminate`]). `None`: wait forever.
    pub response_timeout: Option<Duration>,
    /// How long one connection attempt may take.
    pub connection_timeout: Option<Duration>,
    /// How long after it stops counting (the end of its tombstone, or its expiry when it keeps
    /// none) a completed record stays in Redis before Redis reaps it. Within the grace the record
    /// already counts as absent, but it still carries its fence (so the next reservation
    /// continues the count) and still answers a late retry of its completion.
    pub expiry_grace: Duration,
    /// How a reservation reaches its record (only the cost differs; see [`ReservePath`]): the
    /// reserve script, or first a plain `HGETALL`, which runs no script, so that a duplicate is
    /// one plain read. With `wait_replicas` every reservation runs the script (and its `WAIT`).
    pub reserve_path: ReservePath,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            allow_volatile: false,
            wait_replicas: None,
            key_prefix: "idemgate:".to_owned(),
            response_timeout: Some(Duration::from_secs(5)),
            connection_timeout: Some(Duration::from_secs(2)),
            expiry_grace: Duration::from_secs(60),
            reserve_path: ReservePath::Adaptive,
        }
    }
}

/// The Lua scripts, one per transition; [`Script`] loads them again after a `NOSCRIPT`.
#[derive(Debug)]
struct Scripts {
    reserve: Script,
    takeover: Script,
    heartbeat: Script,
    complete: Script,
    release: Script,
    mark_unknown: Script,
    reopen: Script,
    get: Script,
    purge: Script,
    wait: Script,
}

impl Scripts {
    fn new() -> Self {
        let common = include_str!("common.lua");
        let script = |body: &str| Script::new(&format!("{common}\n{body}"));
        Scripts {
            reserve: script(include_str!("reserve.lua")),
            takeover: script(include_str!("takeover.lua")),
            heartbeat: script(include_str!("heartbeat.lua")),
            complete: script(include_str!("complete.lua")),
            release: script(include_str!("release.lua")),
            mark_unknown: script(include_str!("mark_unknown.lua")),
            reopen: script(include_str!("reopen.lua")),
            get: script(include_str!("get.lua")),
            purge: script(include_str!("purge.lua")),
            wait: script(include_str!("wait.lua")),
        }
    }
}

/// Idempotency records in Redis: one hash per record, every transition one Lua script judged by
/// the server's clock. Clones share one multiplexed connection, which reconnects by itself.
///
/// # Concurrent calls on the same key
/// Each operation is one script, and Redis runs scripts one at a time, so racing reservations see
/// each other exactly as the memory store's lock makes them.
///
/// # Cancellation
/// A dropped future either never sent its script or sent all of it: Redis runs a script whole.
/// Whether a sent script ran is then unknown to the caller, as after a lost answer; retrying with
/// the same reservation token or lease is safe.
///
/// # Errors
/// See the crate's error mapping: [`StoreError::Unavailable`] when nothing was sent or Redis
/// refused the command, [`StoreError::Indeterminate`] when the answer was lost (timeout, broken
/// connection) or too few replicas acknowledged a write, [`StoreError::LeaseLost`] from the
/// scripts' compare-and-set, [`StoreError::Corrupt`] for records this version cannot read.
///
/// # Fences after Redis reaped a record
/// A completed record stays [`RedisOptions::expiry_grace`] past the point it stops counting (its
/// tombstone's end, or its expiry when it keeps none), so a reservation soon after continues its
/// fence (old fence + 1) as the contract says. Once Redis has reaped it (or a purge has deleted
/// it) the next reservation starts again at fence 1, as after a release; the random lease token
/// still keeps any holder of the old record from completing the new one.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    link: Link,
    scripts: Scripts,
    options: RedisOptions,
    /// The URL without credentials, for messages.
    shown_url: String,
    /// What recent reservations found, for [`ReservePath::Adaptive`].
    found: ReserveHistory,
    /// Wake-ups of waiting duplicates, from the subscriber ([`watch`]), by record name.
    changes: Arc<Changes>,
    /// Whether the subscriber's subscription is in effect.
    listening: tokio::sync::watch::Receiver<bool>,
    /// Dropped with the last clone, which stops the subscriber task.
    _subscriber: tokio::sync::oneshot::Sender<()>,
}

/// The connection of a store: one server (or a primary behind replicas) through a reconnecting
/// manager, or a Redis Cluster, whose connection routes each command to the master of its key's
/// slot. The store's code is the same for both; only waiting for replicas, scanning and
/// per-node settings differ.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// How a store reaches Redis: a fixed connection, or the primary that the sentinels name.
enum Link {
    Fixed(Conn),
    Sentinel(Box<SentinelLink>),
}

/// The connection of one operation, and through Sentinel which resolution of the primary it is.
struct Pinned {
    conn: Conn,
    generation: Option<u64>,
}

/// The primary behind Redis Sentinel: found through the sentinels when first needed and again
/// after any operation on it failed, so that a store follows a failover.
struct SentinelLink {
    client: tokio::sync::Mutex<SentinelClient>,
    /// The current primary's connection and its resolution number.
    current: std::sync::Mutex<Option<(u64, ConnectionManager)>>,
    resolutions: AtomicU64,
    config: ConnectionManagerConfig,
    /// The longest a resolution (sentinels, then the primary) may take.
    resolve_timeout: Duration,
}

impl SentinelLink {
    fn current(&self) -> Option<(u64, ConnectionManager)> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The primary's connection, asking the sentinels for it when none is current.
    async fn primary(&self) -> RedisResult<(u64, ConnectionManager)> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let mut client = self.client.lock().await;
        // Another operation may have found it while this one waited for the lock.
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let timed_out = || {
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer from the sentinels and the primary they name in time",
            ))
        };
        let found = tokio::time::timeout(self.resolve_timeout, async {
            let primary = client.async_get_client().await?;
            ConnectionManager::new_with_config(primary, self.config.clone()).await
        })
        .await
        .map_err(|_| timed_out())??;
        let generation = self.resolutions.fetch_add(1, Ordering::Relaxed) + 1;
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((generation, found.clone()));
        Ok((generation, found))
    }

    /// Drops resolution `generation` if it is still the current one, so that the next operation
    /// asks the sentinels again.
    fn forget(&self, generation: u64) {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }
}

/// A call of one of the store's scripts. Unlike redis-rs's `ScriptInvocation`, its keys and
/// arguments stay at hand, so that a write and its `WAIT` can go out in one pipeline on one
/// connection.
struct Invocation<'a> {
    script: &'a Script,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl<'a> Invocation<'a> {
    fn new(script: &'a Script) -> Self {
        Invocation {
            script,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// `EVALSHA hash numkeys keys... args...`.
    fn evalsha(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash()).arg(self.keys.len());
        for part in self.keys.iter().chain(&self.args) {
            cmd.arg(part.as_slice());
        }
        cmd
    }

    /// Runs the script on `conn`, loading it first when the server does not know it (a
    /// `NOSCRIPT` refusal ran nothing, so the call is sent again).
    async fn invoke<T: FromRedisValue>(&self, conn: &mut Conn) -> RedisResult<T> {
        match self.evalsha().query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.evalsha().query_async(conn).await
            }
            other => other,
        }
    }

    /// Runs the script and `WAIT replicas timeout` in one pipeline on one connection, so that
    /// the `WAIT` counts the acknowledgements of this very write: sent apart, a reconnection in
    /// between would put the `WAIT` on a fresh connection with nothing to wait for, and it would
    /// acknowledge at once. On a cluster both go to the master of `key`'s slot, where the write
    /// runs. Returns the script's answer and the replicas that acknowledged.
    async fn invoke_and_wait(
        &self,
        conn: &mut Conn,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<(Value, i64)> {
        let pipeline = || {
            let mut pipe = redis::pipe();
            pipe.add_command(self.evalsha());
            pipe.cmd("WAIT").arg(replicas).arg(ms(timeout));
            pipe
        };
        match conn.pipe_on_slot(key, pipeline()).await {
            // The script did not run: its WAIT waited for nothing. Load it and send both again.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                conn.pipe_on_slot(key, pipeline()).await
            }
            other => other,
        }
    }
}

/// A node of a cluster, as `host:port` (the address the cluster reports).
type Node = (String, u16);

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Runs `pipe` on the node that holds `key`: on a cluster, its slot's master, named
    /// explicitly rather than left to the driver's routing of the pipeline's first keyed command.
    async fn pipe_on_slot<T: FromRedisValue>(
        &mut self,
        key: &str,
        pipe: Pipeline,
    ) -> RedisResult<T> {
        match self {
            Conn::Single(c) => pipe.query_async(c).await,
            Conn::Cluster(c) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                    key.as_bytes(),
                    SlotAddr::Master,
                ));
                let n = pipe.len();
                let replies = c.route_pipeline(pipe, 0, n, route).await?;
                Ok(redis::from_redis_value(
                    Value::Array(replies).extract_error()?,
                )?)
            }
        }
    }

    /// The nodes to scan: `[None]` for a single server, every master of a cluster.
    async fn masters(&mut self) -> RedisResult<Vec<Option<Node>>> {
        match self {
            Conn::Single(_) => Ok(vec![None]),
            Conn::Cluster(c) => {
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let replies = c.route_command(redis::cmd("PING"), all).await?;
                Ok(per_node(replies)?
                    .into_iter()
                    .map(|(node, _)| Some(node))
                    .collect())
            }
        }
    }

    /// Runs `cmd` on `node` (`None`: the single server, or wherever the cluster routes it).
    async fn on<T: redis::FromRedisValue>(
        &mut self,
        node: Option<&Node>,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        match (self, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let reply = c.route_command(cmd.clone(), routing).await?;
                Ok(redis::from_redis_value(reply.extract_error()?)?)
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }

    /// Runs a pipeline of commands on keys of `node` (see [`Conn::on`]).
    async fn pipe_on<T: redis::FromRedisValue>(
        &mut self,
        node: Option<&Node>,
        pipe: Pipeline,
    ) -> RedisResult<T> {
        match (self, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                let n = pipe.len();
                let replies = c.route_pipeline(pipe, 0, n, route).await?;
                let replies = Value::Array(replies).extract_error()?;
                Ok(redis::from_redis_value(replies)?)
            }
            (conn, _) => pipe.query_async(conn).await,
        }
    }

    /// `CONFIG GET name` on every node that could hold records: the single server, or every
    /// node of a cluster (replicas included: one may be promoted). `None` names the single server.
    async fn config_get(&mut self, name: &str) -> RedisResult<Vec<(Option<Node>, Vec<String>)>> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        match self {
            Conn::Single(c) => Ok(vec![(None, cmd.query_async(c).await?)]),
            Conn::Cluster(c) => {
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None));
                let replies = c.route_command(cmd, all).await?;
                per_node(replies)?
                    .into_iter()
                    .map(|(node, v)| Ok((Some(node), redis::from_redis_value(v.extract_error()?)?)))
                    .collect()
            }
        }
    }
}

/// The replies of a command sent to several cluster nodes, by node.
fn per_node(replies: Value) -> RedisResult<Vec<(Node, Value)>> {
    let bad = |what: String| {
        redis::RedisError::from((
            redis::ErrorKind::Client,
            "unexpected reply from the cluster",
            what,
        ))
    };
    let Value::Map(pairs) = replies else {
        return Err(bad(format!("expected replies by node, got {replies:?}")));
    };
    pairs
        .into_iter()
        .map(|(addr, value)| {
            let addr: String = redis::from_redis_value(addr)?;
            let node = addr
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.to_owned(), p.parse().ok()?)))
                .ok_or_else(|| bad(format!("node address {addr:?}")))?;
            Ok((node, value))
        })
        .collect()
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.shown_url)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://[user:password@]host[:port][/db][?query]`; a
    /// Redis Cluster as `redis+cluster://[user:password@]host:port,host:port[?query]`; the primary
    /// that Redis Sentinel names as
    /// `redis+sentinel://[user:password@]host:port,host:port/service[/db][?query]`) with the
    /// default [`RedisOptions`]; the query may set `allow_volatile=true`, `key_prefix=...`,
    /// `wait_replicas=N` and `wait_timeout=...`, and
    /// redis-rs's own `protocol` (and, for `redis+unix://` URLs, `db`, `user` and `pass`).
    /// `docs/STORES.md` describes them.
    ///
    /// # Errors
    /// [`StoreError::Misconfigured`] for a bad URL, an unknown query option, or a Redis without
    /// append-only persistence (see [`RedisOptions::allow_volatile`]), [`StoreError::Unavailable`]
    /// when it cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to the Redis at `url` with `options` (settings in the URL's query win).
    ///
    /// # Errors
    /// As [`RedisStore::connect`].
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
        let (url, options) = parse_url(url, options)?;
        check_prefix(&options.key_prefix)?;
        let shown_url = redact(&url);
        let bad_url =
            |e| StoreError::Misconfigured(format!("failed to read redis url {shown_url}: {e}"));
        let unreachable =
            |e| StoreError::Unavailable(format!("failed to connect to redis at {shown_url}: {e}"));
        // A command that waits for replicas must not time out before the wait does.
        let response_timeout = match (options.response_timeout, options.wait_replicas) {
            (Some(t), Some((_, wait))) => Some(t.max(wait + Duration::from_secs(1))),
            (t, _) => t,
        };
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(response_timeout)
            .set_connection_timeout(options.connection_timeout)
            .set_number_of_retries(4)
            .set_max_delay(Duration::from_millis(500));
        let (link, source) = if let Some(nodes) = cluster_nodes(&url)? {
            let source = watch::Source::Nodes(nodes.clone());
            let mut builder = ClusterClient::builder(nodes).retries(4).max_retry_wait(500);
            if let Some(t) = response_timeout {
                builder = builder.response_timeout(t);
            }
            if let Some(t) = options.connection_timeout {
                builder = builder.connection_timeout(t);
            }
            let client = builder.build().map_err(bad_url)?;
            let conn = Conn::Cluster(client.get_async_connection().await.map_err(unreachable)?);
            (Link::Fixed(conn), source)
        } else if let Some((sentinels, service, node)) = sentinel_parts(&url)? {
            let source = watch::Source::Sentinel {
                sentinels: sentinels.clone(),
                service: service.clone(),
                node: node.clone(),
            };
            let client =
                SentinelClient::build(sentinels, service, Some(node), SentinelServerType::Master)
                    .map_err(bad_url)?;
            let link = SentinelLink {
                client: tokio::sync::Mutex::new(client),
                current: std::sync::Mutex::new(None),
                resolutions: AtomicU64::new(0),
                config,
                resolve_timeout: options.connection_timeout.unwrap_or(Duration::from_secs(2)) * 3,
            };
            // Found now, so that a wrong service name or unreachable sentinels fail at start.
            link.primary().await.map_err(unreachable)?;
            (Link::Sentinel(Box::new(link)), source)
        } else {
            let client = redis::Client::open(url.as_str()).map_err(bad_url)?;
            let conn = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(unreachable)?;
            (
                Link::Fixed(Conn::Single(conn)),
                watch::Source::Nodes(vec![url.clone()]),
            )
        };
        if !options.allow_volatile {
            let mut conn = match &link {
                Link::Fixed(conn) => conn.clone(),
                Link::Sentinel(s) => Conn::Single(s.primary().await.map_err(unreachable)?.1),
            };
            check_persistence(&mut conn, &shown_url).await?;
        }
        let changes = Arc::new(Changes::new());
        let (listening_tx, listening) = tokio::sync::watch::channel(false);
        let (subscriber, stop) = tokio::sync::oneshot::channel();
        tokio::spawn(watch::run(
            source,
            changes.clone(),
            listening_tx,
            options.connection_timeout.unwrap_or(Duration::from_secs(2)),
            stop,
        ));
        Ok(RedisStore {
            inner: Arc::new(Inner {
                link,
                scripts: Scripts::new(),
                options,
                shown_url,
                found: ReserveHistory::default(),
                changes,
                listening,
                _subscriber: subscriber,
            }),
        })
    }

    /// The Redis key name of a record: the prefix, then the hex SHA-256 of the record's name in a
    /// hash tag. Its length is fixed whatever the client key.
    pub fn record_key(&self, key: &Key) -> String {
        record_key(&self.inner.options.key_prefix, key)
    }

    /// The settings in force.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.options
    }

    /// Whether the subscription that wakes waiting duplicates is in effect now (while it is not,
    /// they poll).
    pub fn is_listening(&self) -> bool {
        *self.inner.listening.borrow()
    }

    /// Waits until the subscription that wakes waiting duplicates is in effect, at most
    /// `timeout`; returns whether it is. For callers (and tests) that measure wake-ups.
    pub async fn wait_listening(&self, timeout: Duration) -> bool {
        let mut listening = self.inner.listening.clone();
        tokio::time::timeout(timeout, listening.wait_for(|on| *on))
            .await
            .is_ok_and(|on| on.is_ok())
    }

    /// The connection for one operation: through Sentinel, the current primary's (found anew
    /// after a failure), kept for the whole operation so that a write and its `WAIT` share it.
    async fn conn(&self) -> Result<Pinned> {
        match &self.inner.link {
            Link::Fixed(conn) => Ok(Pinned {
                conn: conn.clone(),
                generation: None,
            }),
            Link::Sentinel(s) => {
                let (generation, manager) = s.primary().await.map_err(|e| {
                    StoreError::Unavailable(format!(
                        "failed to find the redis primary through sentinel at {}: {e}",
                        self.inner.shown_url
                    ))
                })?;
                Ok(Pinned {
                    conn: Conn::Single(manager),
                    generation: Some(generation),
                })
            }
        }
    }

    /// The store error for `e` on `pinned`; through Sentinel, any failure but a refusal by our
    /// scripts also makes the next operation ask the sentinels for the primary again (a failover
    /// shows as a lost connection, `READONLY` or a write its replicas did not acknowledge).
    fn fail(&self, pinned: &Pinned, e: &redis::RedisError, what: &str) -> StoreError {
        let err = classify(e, what);
        self.forget_on(pinned, &err);
        err
    }

    fn forget_on(&self, pinned: &Pinned, err: &StoreError) {
        if let (Link::Sentinel(s), Some(generation)) = (&self.inner.link, pinned.generation) {
            if matches!(
                err,
                StoreError::Unavailable(_) | StoreError::Indeterminate(_)
            ) {
                s.forget(generation);
            }
        }
    }

    /// Runs a read-only script.
    async fn read(&self, inv: &Invocation<'_>, what: &str) -> Result<Value> {
        let mut pinned = self.conn().await?;
        match inv.invoke(&mut pinned.conn).await {
            Ok(v) => Ok(v),
            Err(e) => Err(self.fail(&pinned, &e, what)),
        }
    }

    /// Runs a write script on the record `key` (its Redis name), and waits for replicas in the
    /// same pipeline if so configured (on a cluster, on the master of the key's slot).
    async fn write(&self, key: &str, inv: &Invocation<'_>, what: &str) -> Result<Value> {
        match self.write_replicated(key, inv, what).await? {
            (value, None) => Ok(value),
            (_, Some(short)) => Err(short),
        }
    }

    /// As [`RedisStore::write`], with the script's answer also when too few replicas
    /// acknowledged the write (then with the error that says so), for a caller that must know
    /// what the write did to undo it.
    async fn write_replicated(
        &self,
        key: &str,
        inv: &Invocation<'_>,
        what: &str,
    ) -> Result<(Value, Option<StoreError>)> {
        let mut pinned = self.conn().await?;
        let Some((replicas, timeout)) = self.inner.options.wait_replicas else {
            return inv
                .invoke(&mut pinned.conn)
                .await
                .map(|value| (value, None))
                .map_err(|e| self.fail(&pinned, &e, what));
        };
        let (value, acked) = inv
            .invoke_and_wait(&mut pinned.conn, key, replicas, timeout)
            .await
            .map_err(|e| self.fail(&pinned, &e, what))?;
        if acked >= i64::from(replicas) {
            return Ok((value, None));
        }
        let err = StoreError::Indeterminate(format!(
            "failed to {what} on redis: {acked} of {replicas} replicas acknowledged the write \
             within {timeout:?}, so a failover could lose it"
        ));
        self.forget_on(&pinned, &err);
        Ok((value, Some(err)))
    }

    /// Takes back a fresh reservation too few replicas acknowledged (`short` says so): the call
    /// is refused and its side effect never runs, so a reservation left standing would only turn
    /// unknown when its lease ends and hold every retry for an operator. Released on the primary
    /// (replicas apply the release after the reservation, in order), the refusal is
    /// [`StoreError::Unavailable`]: nothing is held. When the release fails too, `short`.
    async fn take_back(&self, name: &str, lease: Lease, short: StoreError) -> StoreError {
        let inv = self.lease_call(&self.inner.scripts.release, name, lease);
        let released = match self.conn().await {
            Ok(mut pinned) => inv.invoke::<Value>(&mut pinned.conn).await.is_ok(),
            Err(_) => false,
        };
        match (released, short) {
            (true, StoreError::Indeterminate(why)) => StoreError::Unavailable(format!(
                "{why}; the reservation was taken back, so nothing is held"
            )),
            (_, short) => short,
        }
    }

    async fn claim(&self, r: &Reservation, stale: Option<Fence>) -> Result<Claim> {
        let what = if stale.is_some() {
            "take over"
        } else {
            "reserve"
        };
        let script = match stale {
            Some(_) => &self.inner.scripts.takeover,
            None => &self.inner.scripts.reserve,
        };
        let name = self.record_key(&r.key);
        let reads_first = stale.is_none()
            && self.inner.options.wait_replicas.is_none()
            && self.inner.found.read_first(self.inner.options.reserve_path);
        if reads_first {
            // What the reserve script answers when a record counts, judged the same way on a
            // plain read; otherwise the script decides, on the record as it then stands.
            let (now, stored) = self.peek(&name).await?;
            if let (claim, Change::Keep) = transition::reserve(stored.as_ref(), r, now) {
                self.inner.found.record(true);
                return Ok(claim);
            }
        }
        let mut inv = Invocation::new(script);
        inv.key(&name)
            .arg(r.key.tenant.as_str())
            .arg(r.key.tool.as_str())
            .arg(r.key.key.as_str())
            .arg(r.fingerprint.to_hex())
            .arg(r.token.to_hex())
            .arg(ms(r.lease_for));
        if let Some(stale) = stale {
            inv.arg(stale.to_string());
        }
        // See scope_arg in common.lua.
        inv.arg(
            r.scope
                .as_deref()
                .map_or(String::new(), |s| format!("={s}")),
        );
        let (reply, short) = self.write_replicated(&name, &inv, what).await?;
        let items = array(&reply)?;
        match (items, short) {
            ([tag, fence], short) if text(tag)? == "A" => {
                self.inner.found.record(false);
                let lease = Lease {
                    fence: number(fence)?,
                    token: r.token,
                };
                match short {
                    None => Ok(Claim::Acquired(lease)),
                    // A fresh reservation is taken back; a takeover stays as it landed, for the
                    // engine to mark unknown again (the action may have run before).
                    Some(short) if stale.is_none() => {
                        Err(self.take_back(&name, lease, short).await)
                    }
                    Some(short) => Err(short),
                }
            }
            (_, Some(short)) => Err(short),
            ([tag, now, flat], None) if text(tag)? == "E" => {
                self.inner.found.record(true);
                let now = Timestamp::from_millis(number(now)?);
                let record = stored_record(flat)?
                    .and_then(|c| c.view(now))
                    .ok_or_else(|| corrupt(format_args!("{what} script returned no record")))?;
                Ok(Claim::Existing(record))
            }
            _ => Err(corrupt(format_args!(
                "{what} script answered {reply:?}, expected a claim"
            ))),
        }
    }

    fn lease_call<'a>(&self, script: &'a Script, name: &str, lease: Lease) -> Invocation<'a> {
        let mut inv = Invocation::new(script);
        inv.key(name)
            .arg(lease.fence.to_string())
            .arg(lease.token.to_hex());
        inv
    }

    /// The key names of all records under the prefix (deduplicated: `SCAN` may repeat keys), by
    /// the node that holds them: one group on a single server, one per master of a cluster.
    async fn scan(&self, pinned: &mut Pinned) -> Result<Vec<(Option<Node>, Vec<String>)>> {
        let prefix = &self.inner.options.key_prefix;
        let pattern = format!("{prefix}{{*}}");
        let mut conn = pinned.conn.clone();
        let fail = |e: redis::RedisError| self.fail(pinned, &e, "scan records");
        let mut groups = Vec::new();
        for node in conn.masters().await.map_err(fail)? {
            let mut seen = HashSet::new();
            let mut cursor: u64 = 0;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, names): (u64, Vec<String>) =
                    conn.on(node.as_ref(), &cmd).await.map_err(fail)?;
                seen.extend(names.into_iter().filter(|n| is_record_key(prefix, n)));
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            groups.push((node, seen.into_iter().collect()));
        }
        Ok(groups)
    }

    /// The record under `name` (its Redis name) and the server time, read with plain commands:
    /// `TIME` and `HGETALL` in one pipeline on the record's node, no script.
    async fn peek(&self, name: &str) -> Result<(Timestamp, Option<StoredRecord>)> {
        let mut pinned = self.conn().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("TIME").cmd("HGETALL").arg(name);
        let ((secs, micros), hash): ((i64, i64), Value) =
            match pinned.conn.pipe_on_slot(name, pipe).await {
                Ok(reply) => reply,
                Err(e) => return Err(self.fail(&pinned, &e, "read a record")),
            };
        Ok((time_reply(secs, micros), hash_record(&hash)?))
    }

    /// The server's clock.
    async fn server_now(&self) -> Result<Timestamp> {
        let mut pinned = self.conn().await?;
        let (secs, micros): (i64, i64) =
            match redis::cmd("TIME").query_async(&mut pinned.conn).await {
                Ok(t) => t,
                Err(e) => return Err(self.fail(&pinned, &e, "read the server time")),
            };
        Ok(time_reply(secs, micros))
    }
}

/// The instant of a `TIME` reply (seconds, microseconds), in milliseconds as the scripts'
/// `now_ms()` counts them.
fn time_reply(secs: i64, micros: i64) -> Timestamp {
    Timestamp::from_millis(secs * 1000 + micros / 1000)
}

impl Store for RedisStore {
    async fn reserve(&self, r: &Reservation) -> Result<Claim> {
        self.claim(r, None).await
    }

    async fn takeover(&self, r: &Reservation, stale: Fence) -> Result<Claim> {
        self.claim(r, Some(stale)).await
    }

    async fn heartbeat(&self, key: &Key, lease: Lease, lease_for: Duration) -> Result<Timestamp> {
        let name = self.record_key(key);
        let mut inv = self.lease_call(&self.inner.scripts.heartbeat, &name, lease);
        inv.arg(ms(lease_for));
        let reply = self.write(&name, &inv, "extend a lease").await?;
        Ok(Timestamp::from_millis(number(&reply)?))
    }

    async fn complete_at(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        keep: Keep,
        executed_at: Option<Timestamp>,
    ) -> Result<Completion> {
        let name = self.record_key(key);
        let mut inv = self.lease_call(&self.inner.scripts.complete, &name, lease);
        inv.arg(outcome.kind.to_string())
            .arg(outcome.body.as_slice())
            .arg(ms(keep.ttl))
            // How long the record counts, as `Keep::retain_until` reckons it.
            .arg(ms(keep.ttl.max(keep.tombstone)))
            .arg(ms(self.inner.options.expiry_grace))
            .arg(executed_at.map_or(String::new(), |t| t.as_millis().to_string()));
        let reply = self.write(&name, &inv, "complete a record").await?;
        match array(&reply)? {
            [completed_at, expires_at] => Ok(Completion {
                completed_at: Timestamp::from_millis(number(completed_at)?),
                expires_at: Timestamp::from_millis(number(expires_at)?),
            }),
            _ => Err(corrupt(format_args!(
                "complete script answered {reply:?}, expected two times"
            ))),
        }
    }

    async fn release(&self, key: &Key, lease: Lease) -> Result<()> {
        let name = self.record_key(key);
        let inv = self.lease_call(&self.inner.scripts.release, &name, lease);
        self.write(&name, &inv, "release a record").await.map(drop)
    }

    async fn mark_unknown(&self, key: &Key, lease: Lease) -> Result<()> {
        let name = self.record_key(key);
        let inv = self.lease_call(&self.inner.scripts.mark_unknown, &name, lease);
        self.write(&name, &inv, "mark a record unknown")
            .await
            .map(drop)
    }

    async fn reopen(&self, key: &Key, fence: Fence) -> Result<Reopened> {
        let name = self.record_key(key);
        let mut inv = Invocation::new(&self.inner.scripts.reopen);
        inv.key(&name)
            .arg(fence.to_string())
            .arg(ms(self.inner.options.expiry_grace));
        let reply = self.write(&name, &inv, "reopen a record").await?;
        match array(&reply)? {
            [tag] if text(tag)? == "R" => Ok(Reopened::Expired),
            [tag, now, flat] if text(tag)? == "K" => {
                let now = Timestamp::from_millis(number(now)?);
                Ok(Reopened::Kept(
                    stored_record(flat)?.and_then(|c| c.view(now)),
                ))
            }
            _ => Err(corrupt(format_args!(
                "reopen script answered {reply:?}, expected whether it reopened the record"
            ))),
        }
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let mut inv = Invocation::new(&self.inner.scripts.get);
        inv.key(self.record_key(key));
        let reply = self.read(&inv, "read a record").await?;
        match array(&reply)? {
            [now, flat] => {
                let now = Timestamp::from_millis(number(now)?);
                Ok(stored_record(flat)?.and_then(|c| c.view(now)))
            }
            _ => Err(corrupt(format_args!(
                "get script answered {reply:?}, expected a time and a record"
            ))),
        }
    }

    fn change_mark(&self, key: &Key) -> ChangeMark {
        self.inner.changes.mark(self.record_key(key).as_str())
    }

    async fn wait_changed(&self, key: &Key, since: ChangeMark, timeout: Duration) {
        if !self.is_listening() {
            tokio::time::sleep(timeout.min(idemgate_core::store::DEFAULT_POLL)).await;
            return;
        }
        let name = self.record_key(key);
        // Flag the record as waited for, so that the write that settles it publishes its name. A
        // record with nothing to wait for needs no wait; a store that cannot be reached leaves
        // the wait to the timeout. A settling between the caller's mark and this flag is seen
        // here (the record is no longer in flight) or has moved the mark (its publish came
        // after a flag set by an earlier wait).
        let mut inv = Invocation::new(&self.inner.scripts.wait);
        inv.key(name.as_str());
        if let Ok(Value::Int(0)) = self.read(&inv, "wait for a record").await {
            return;
        }
        self.inner.changes.wait(name.as_str(), since, timeout).await;
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let now = self.server_now().await?;
        let mut out = Vec::new();
        let mut pinned = self.conn().await?;
        for (node, names) in self.scan(&mut pinned).await? {
            for batch in names.chunks(SCAN_COUNT as usize) {
                let mut pipe = redis::pipe();
                for name in batch {
                    pipe.cmd("HGETALL").arg(name);
                }
                let hashes: Vec<Value> = pinned
                    .conn
                    .clone()
                    .pipe_on(node.as_ref(), pipe)
                    .await
                    .map_err(|e| self.fail(&pinned, &e, "list records"))?;
                for hash in &hashes {
                    // A record deleted since the scan reads as an empty hash: absent.
                    if let Some(record) = hash_record(hash)?.and_then(|c| c.view(now)) {
                        if filter.matches(&record) {
                            out.push(record);
                        }
                    }
                }
            }
        }
        out.sort_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)));
        if filter.limit > 0 {
            out.truncate(filter.limit);
        }
        Ok(out)
    }

    async fn purge_expired(&self) -> Result<u64> {
        let now = self.server_now().await?;
        let mut purged = 0;
        let mut pinned = self.conn().await?;
        for (node, names) in self.scan(&mut pinned).await? {
            for batch in names.chunks(SCAN_COUNT as usize) {
                let mut pipe = redis::pipe();
                for name in batch {
                    pipe.cmd("HMGET")
                        .arg(name)
                        .arg("state")
                        .arg("expires_at")
                        .arg("retain_until");
                    // Whether a tombstone still has a body to drop, without reading the body.
                    pipe.cmd("HSTRLEN").arg(name).arg("body");
                }
                let replies: Vec<Value> = pinned
                    .conn
                    .clone()
                    .pipe_on(node.as_ref(), pipe)
                    .await
                    .map_err(|e| self.fail(&pinned, &e, "purge records"))?;
                if replies.len() != 2 * batch.len() {
                    return Err(corrupt(format_args!(
                        "purge look answered {} replies for {} records",
                        replies.len(),
                        batch.len()
                    )));
                }
                for (name, look) in batch.iter().zip(replies.chunks_exact(2)) {
                    let (state, expires_at, retain_until): (
                        Option<String>,
                        Option<i64>,
                        Option<i64>,
                    ) = redis::from_redis_value(look[0].clone()).map_err(|e| {
                        corrupt(format_args!("record fields read for purging: {e}"))
                    })?;
                    let body_len: u64 = number(&look[1])?;
                    let past = |t: Option<i64>| t.is_some_and(|t| Timestamp::from_millis(t) <= now);
                    // As transition::purge: delete past the tombstone (a record written before
                    // tombstones kept none), drop the body of a tombstone that still has one.
                    let gone = past(retain_until.or(expires_at));
                    let compact = past(expires_at) && body_len > 0;
                    if state.as_deref() == Some("c") && (gone || compact) {
                        // The script checks again by the server clock, atomically, so a record
                        // reserved anew since the look above stays; it answers 1 only when it
                        // deleted the record.
                        let mut inv = Invocation::new(&self.inner.scripts.purge);
                        inv.key(name);
                        let gone: u64 = number(&self.write(name, &inv, "purge records").await?)?;
                        purged += gone;
                    }
                }
            }
        }
        Ok(purged)
    }
}

/// Whole milliseconds of `d`, capped at [`MAX_MS`].
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).min(MAX_MS)
}

fn record_key(prefix: &str, key: &Key) -> String {
    format!("{prefix}{{{}}}", hex(&key.digest()))
}

fn is_record_key(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('{'))
        .and_then(|rest| rest.strip_suffix('}'))
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn check_prefix(prefix: &str) -> Result<()> {
    let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.' | b'-');
    if prefix.len() > 64 || !prefix.bytes().all(ok) {
        return Err(StoreError::Misconfigured(format!(
            "redis key prefix {prefix:?} is not allowed: use at most 64 letters, digits, ':', '_', \
             '.' and '-' (no glob or hash-tag characters)"
        )));
    }
    Ok(())
}

/// The query options this crate reads itself.
const OWN_OPTIONS: &[&str] = &["allow_volatile", "key_prefix"];
/// The query options of replicated mode ([`RedisOptions::wait_replicas`]), also read by this crate.
const WAIT_OPTIONS: &[&str] = &["wait_replicas", "wait_timeout"];
/// How long a write waits for its replicas when the URL names `wait_replicas` but no
/// `wait_timeout`.
const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(1);
/// The query options of a `redis+sentinel://` URL for the sentinels themselves (Sentinel's own
/// `requirepass`, or an ACL user of the sentinels), read by [`sentinel_parts`]; the URL's user and
/// password are the primary's.
const SENTINEL_OPTIONS: &[&str] = &["sentinel_username", "sentinel_password"];
/// The query options redis-rs reads from every URL.
const DRIVER_OPTIONS: &[&str] = &["protocol"];
/// The query options redis-rs reads only from Unix-socket URLs (a TCP URL carries them in its
/// user, password and path, and redis-rs ignores them in its query).
const UNIX_DRIVER_OPTIONS: &[&str] = &["db", "user", "pass"];

/// Takes this crate's settings out of the URL's query; the driver's options go on to redis-rs, and
/// any other is refused, so that a misspelt option cannot silently fall back to a default.
fn parse_url(url: &str, mut options: RedisOptions) -> Result<(String, RedisOptions)> {
    let unix = ["unix:", "redis+unix:", "valkey+unix:"]
        .iter()
        .any(|scheme| url.starts_with(scheme));
    let mut known = [OWN_OPTIONS, DRIVER_OPTIONS, WAIT_OPTIONS].concat();
    if unix {
        known.extend_from_slice(UNIX_DRIVER_OPTIONS);
    }
    if url.starts_with("redis+sentinel://") {
        known.extend_from_slice(SENTINEL_OPTIONS);
    }
    let query = UrlQuery::parse(url, "redis", &known)?;
    let mut rest = Vec::new();
    let (mut replicas, mut timeout) = (None, None);
    for (name, value) in query.options {
        match name {
            "allow_volatile" => {
                options.allow_volatile = match value {
                    "" | "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    _ => {
                        return Err(StoreError::Misconfigured(format!(
                            "failed to read allow_volatile={value:?} in the redis url: expected \
                             true or false"
                        )))
                    }
                }
            }
            "key_prefix" => options.key_prefix = value.to_owned(),
            "wait_replicas" => {
                replicas = Some(value.parse::<u32>().map_err(|_| {
                    StoreError::Misconfigured(format!(
                        "failed to read wait_replicas={value:?} in the redis url: expected a \
                         number of replicas"
                    ))
                })?);
            }
            "wait_timeout" => timeout = Some(parse_wait_timeout(value)?),
            _ => rest.push(format!("{name}={value}")),
        }
    }
    match (replicas, timeout) {
        (None, None) => {}
        (None, Some(_)) => {
            return Err(StoreError::Misconfigured(
                "failed to read wait_timeout in the redis url: it needs wait_replicas=N".to_owned(),
            ))
        }
        (Some(0), _) => options.wait_replicas = None,
        (Some(n), t) => options.wait_replicas = Some((n, t.unwrap_or(DEFAULT_WAIT_TIMEOUT))),
    }
    let url = if rest.is_empty() {
        query.base.to_owned()
    } else {
        format!("{}?{}", query.base, rest.join("&"))
    };
    Ok((url, options))
}

/// A `wait_timeout` value: milliseconds, or a number with `ms` or `s`; more than zero, since
/// `WAIT n 0` would wait forever.
fn parse_wait_timeout(value: &str) -> Result<Duration> {
    let (number, unit_ms) = if let Some(n) = value.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1000)
    } else {
        (value, 1)
    };
    match number.parse::<u64>() {
        Ok(n) if n > 0 && n <= MAX_MS / unit_ms => Ok(Duration::from_millis(n * unit_ms)),
        _ => Err(StoreError::Misconfigured(format!(
            "failed to read wait_timeout={value:?} in the redis url: expected a duration above \
             zero such as 500ms or 2s"
        ))),
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    let url = url.split_once('?').map_or(url, |(base, _)| base);
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, rest)), Some(at)) if at > scheme.len() => {
            let host = &url[at + 1..];
            let user = rest.split_once('@').map_or("", |(u, _)| u);
            let user = user.split_once(':').map_or(user, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// Refuses a Redis that would forget acknowledged records when it restarts: on a cluster, every
/// node must persist (a replica may become the master of its slots).
async fn check_persistence(conn: &mut Conn, url: &str) -> Result<()> {
    // In the words of those who set it: the store URL of `--store`, `IDEMGATE_STORE`, the
    // gateway's `store = "..."` or the Python package's `Engine.open(...)`.
    let how = format!(
        "enable append-only persistence (appendonly yes, appendfsync always or everysec), or \
         accept losing records on a restart by adding allow_volatile=true to the store URL: \
         {url}?allow_volatile=true (or &allow_volatile=true after its other options), as given \
         to --store, IDEMGATE_STORE or store = \"...\" in the gateway's configuration (in Rust, \
         RedisOptions::allow_volatile)"
    );
    let unreadable = |e: &dyn fmt::Display| {
        StoreError::Misconfigured(format!(
            "failed to read the persistence settings of redis at {url} (CONFIG GET appendonly: \
             {e}; managed services often disable CONFIG), so it may lose records on a restart: \
             {how}"
        ))
    };
    let aof = match conn.config_get("appendonly").await {
        Ok(nodes) => nodes,
        Err(e) if e.is_io_error() => return Err(classify(&e, "read the persistence settings")),
        Err(e) => return Err(unreadable(&e)),
    };
    let fsync = conn
        .config_get("appendfsync")
        .await
        .map_err(|e| classify(&e, "read the persistence settings"))?;
    for (node, aof) in aof {
        let at = match &node {
            Some((host, port)) => format!("{url} (node {host}:{port})"),
            None => url.to_owned(),
        };
        match aof.as_slice() {
            [_, on] if on == "yes" => {}
            [_, value] => {
                let save = conn
                    .config_get("save")
                    .await
                    .unwrap_or_default()
                    .into_iter()
                    .find(|(n, _)| *n == node)
                    .and_then(|(_, v)| v.get(1).cloned())
                    .unwrap_or_else(|| "?".to_owned());
                return Err(StoreError::Misconfigured(format!(
                    "redis at {at} runs with appendonly {value} (save {save:?}), so it loses \
                     reservations and outcomes when it restarts and side effects could run twice: \
                     {how}"
                )));
            }
            _ => {
                return Err(StoreError::Misconfigured(format!(
                    "redis at {at} did not report its appendonly setting, so it may lose records \
                     on a restart: {how}"
                )))
            }
        }
        // An append-only file that Redis never fsyncs (`appendfsync no`) is written back when the
        // operating system likes (up to about 30 s on Linux), so a power cut or a crash of the
        // machine loses acknowledged reservations as surely as `appendonly no` does.
        let policy = fsync
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, v)| v.as_slice());
        if let Some([_, policy]) = policy {
            if policy == "no" {
                return Err(StoreError::Misconfigured(format!(
                    "redis at {at} runs with appendfsync no, so a crash of its machine loses \
                     reservations and outcomes it acknowledged and side effects could run twice: \
                     {how}"
                )));
            }
        }
    }
    Ok(())
}

/// The parts of a `redis+sentinel://[user[:password]@]host:port[,host:port...]/service[/db][?query]`
/// URL: the sentinels, the service (master) name, and the credentials, database and driver
/// options for the primary; `None` for any other URL. The sentinels are reached with the
/// `sentinel_username` / `sentinel_password` of the query (percent-encoded), or without
/// credentials.
fn sentinel_parts(
    url: &str,
) -> Result<Option<(Vec<ConnectionInfo>, String, SentinelNodeConnectionInfo)>> {
    let Some(rest) = url.strip_prefix("redis+sentinel://") else {
        return Ok(None);
    };
    let bad = |why: &str| {
        StoreError::Misconfigured(format!(
            "failed to read redis sentinel url {}: {why} (expected \
             redis+sentinel://[user:password@]host:port,host:port/service[/db][?options])",
            redact(url)
        ))
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut sentinel_auth = RedisConnectionInfo::default();
    let (mut has_user, mut has_password) = (false, false);
    let mut primary_query = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("sentinel_username", v) => {
                sentinel_auth = sentinel_auth.set_username(percent_decode(v).map_err(|w| bad(&w))?);
                has_user = true;
            }
            ("sentinel_password", v) => {
                sentinel_auth = sentinel_auth.set_password(percent_decode(v).map_err(|w| bad(&w))?);
                has_password = true;
            }
            _ => primary_query.push(pair),
        }
    }
    if has_user && !has_password {
        return Err(bad("sentinel_username needs sentinel_password"));
    }
    let query = match primary_query.is_empty() {
        true => String::new(),
        false => format!("?{}", primary_query.join("&")),
    };
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (service, db) = path.split_once('/').unwrap_or((path, ""));
    if service.is_empty() {
        return Err(bad(
            "the path must name the service (the master name the sentinels monitor)",
        ));
    }
    let sentinels: Vec<ConnectionInfo> = hosts
        .split(',')
        .map(|host| {
            let url = match host {
                "" => return Err(bad("empty sentinel address")),
                h if h.contains(':') => format!("redis://{h}"),
                h => format!("redis://{h}:26379"),
            };
            let info = redis::IntoConnectionInfo::into_connection_info(url)
                .map_err(|e| bad(&e.to_string()))?;
            Ok(info.set_redis_settings(sentinel_auth.clone()))
        })
        .collect::<Result<_>>()?;
    let node = redis::IntoConnectionInfo::into_connection_info(format!(
        "redis://{userinfo}primary/{db}{query}"
    ))
    .map_err(|e| bad(&e.to_string()))?;
    let node = SentinelNodeConnectionInfo::default()
        .set_redis_connection_info(node.redis_settings().clone());
    Ok(Some((sentinels, service.to_owned(), node)))
}

/// A percent-encoded URL component as text (`%40` is `@`); an error says what is wrong, never
/// the value (it may be a password).
fn percent_decode(s: &str) -> std::result::Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a credential has a '%' not followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a credential is not UTF-8 once percent-decoded".to_owned())
}

/// The nodes of a `redis+cluster://[user[:password]@]host:port,host:port[/0][?query]` URL as
/// `redis://` URLs carrying the credentials and the driver's query options; `None` for any other
/// URL.
fn cluster_nodes(url: &str) -> Result<Option<Vec<String>>> {
    let Some(rest) = ["redis+cluster://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme))
    else {
        return Ok(None);
    };
    let bad = |why: &str| {
        StoreError::Misconfigured(format!(
            "failed to read redis cluster url {}: {why} (expected \
             redis+cluster://[user:password@]host:port,host:port[?options])",
            redact(url)
        ))
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, format!("?{query}")),
        None => (rest, String::new()),
    };
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !matches!(path, "" | "0") {
        return Err(bad("a cluster has only database 0"));
    }
    let nodes: Vec<String> = hosts
        .split(',')
        .map(|host| match host {
            "" => Err(bad("empty node address")),
            h => Ok(format!("redis://{userinfo}{h}{query}")),
        })
        .collect::<Result<_>>()?;
    Ok(Some(nodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_settings_are_read_from_the_url() {
        let wait =
            |url: &str| parse_url(url, RedisOptions::default()).map(|(_, o)| o.wait_replicas);
        assert_eq!(
            wait("redis://h/?wait_replicas=1").unwrap(),
            Some((1, DEFAULT_WAIT_TIMEOUT))
        );
        assert_eq!(
            wait("redis://h/?wait_replicas=2&wait_timeout=250ms").unwrap(),
            Some((2, Duration::from_millis(250)))
        );
        assert_eq!(
            wait("redis://h/?wait_timeout=3s&wait_replicas=1").unwrap(),
            Some((1, Duration::from_secs(3)))
        );
        assert_eq!(
            wait("redis://h/?wait_replicas=1&wait_timeout=40").unwrap(),
            Some((1, Duration::from_millis(40)))
        );
        assert_eq!(wait("redis://h/?wait_replicas=0").unwrap(), None);
        assert_eq!(wait("redis://h/").unwrap(), None);
        let (url, _) = parse_url(
            "redis://h/?wait_replicas=1&protocol=resp3",
            RedisOptions::default(),
        )
        .unwrap();
        assert_eq!(
            url, "redis://h/?protocol=resp3",
            "the driver never sees them"
        );
        for (bad, says) in [
            ("redis://h/?wait_replicas=one", "wait_replicas=\"one\""),
            ("redis://h/?wait_replicas=-1", "wait_replicas=\"-1\""),
            (
                "redis://h/?wait_replicas=1&wait_timeout=0",
                "wait_timeout=\"0\"",
            ),
            (
                "redis://h/?wait_replicas=1&wait_timeout=2m",
                "wait_timeout=\"2m\"",
            ),
            ("redis://h/?wait_timeout=1s", "it needs wait_replicas"),
        ] {
            let e = wait(bad).unwrap_err();
            assert!(
                matches!(&e, StoreError::Misconfigured(m) if m.contains(says)),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn url_settings_are_taken_out_of_the_query() {
        let (url, o) = parse_url(
            "redis://127.0.0.1:6379/2?allow_volatile=true&protocol=resp3&key_prefix=t:",
            RedisOptions::default(),
        )
        .unwrap();
        assert_eq!(url, "redis://127.0.0.1:6379/2?protocol=resp3");
        assert!(o.allow_volatile);
        assert_eq!(o.key_prefix, "t:");
        let (url, o) =
            parse_url("redis://h/?allow_volatile=false", RedisOptions::default()).unwrap();
        assert_eq!(url, "redis://h/");
        assert!(!o.allow_volatile);
        assert!(parse_url("redis://h/?allow_volatile=maybe", RedisOptions::default()).is_err());
    }

    #[test]
    fn unknown_url_options_are_refused_by_name() {
        for (url, bad) in [
            ("redis://h/?prefx=x", "prefx"),
            (
                "redis://h/?key_prefix=a:&allow_volatil=true",
                "allow_volatil",
            ),
            // redis-rs reads these only from Unix-socket URLs; on TCP they would be ignored.
            ("redis://h/?db=3", "db"),
            ("redis://h/?pass=secret", "pass"),
        ] {
            let e = parse_url(url, RedisOptions::default()).unwrap_err();
            let StoreError::Misconfigured(m) = &e else {
                panic!("{url}: expected Misconfigured, got {e:?}")
            };
            assert!(m.contains(&format!("unknown option {bad:?}")), "{url}: {m}");
            assert!(
                m.contains("allow_volatile, key_prefix, protocol"),
                "{url}: {m}"
            );
            assert!(!m.contains("secret"), "{m}");
        }
        let (url, o) = parse_url(
            "redis+unix:///run/redis.sock?db=2&pass=pw&key_prefix=u:",
            RedisOptions::default(),
        )
        .unwrap();
        assert_eq!(url, "redis+unix:///run/redis.sock?db=2&pass=pw");
        assert_eq!(o.key_prefix, "u:");
    }

    #[test]
    fn cluster_urls_name_every_node_with_credentials_and_driver_options() {
        assert_eq!(cluster_nodes("redis://h:1").unwrap(), None);
        assert_eq!(
            cluster_nodes("redis+cluster://u:pw@h1:1,h2:2/?protocol=resp3").unwrap(),
            Some(vec![
                "redis://u:pw@h1:1?protocol=resp3".to_owned(),
                "redis://u:pw@h2:2?protocol=resp3".to_owned()
            ])
        );
        assert_eq!(
            cluster_nodes("redis+cluster://h1:1/0").unwrap(),
            Some(vec!["redis://h1:1".to_owned()])
        );
        let (url, o) = parse_url(
            "redis+cluster://h1:1,h2:2?key_prefix=c:&wait_replicas=1",
            RedisOptions::default(),
        )
        .unwrap();
        assert_eq!(url, "redis+cluster://h1:1,h2:2");
        assert_eq!(o.key_prefix, "c:");
        assert_eq!(o.wait_replicas, Some((1, DEFAULT_WAIT_TIMEOUT)));
        for bad in [
            "redis+cluster://u:secret@h1:1/2",
            "redis+cluster://u:secret@h1:1,",
        ] {
            let e = cluster_nodes(bad).unwrap_err();
            assert!(
                matches!(&e, StoreError::Misconfigured(m) if !m.contains("secret")),
                "{e:?}"
            );
        }
        assert_eq!(
            redact("redis+cluster://u:secret@h1:1,h2:2"),
            "redis+cluster://u:***@h1:1,h2:2"
        );
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_service() {
        assert!(sentinel_parts("redis://h:1").unwrap().is_none());
        let (sentinels, service, _) =
            sentinel_parts("redis+sentinel://u:pw@s1:5000,s2/mymaster/2?protocol=resp3")
                .unwrap()
                .unwrap();
        let addrs: Vec<String> = sentinels.iter().map(|s| s.addr().to_string()).collect();
        assert_eq!(addrs, ["s1:5000", "s2:26379"]);
        assert!(sentinels
            .iter()
            .all(|s| s.redis_settings().password().is_none()));
        assert_eq!(service, "mymaster");

        // The sentinels' own credentials, percent-decoded (the URL's user and password stay the
        // primary's).
        let (sentinels, _, _) = sentinel_parts(
            "redis+sentinel://u:pw@s1/m?sentinel_username=sen&sentinel_password=p%40ss%26w&protocol=resp3",
        )
        .unwrap()
        .unwrap();
        let auth = sentinels[0].redis_settings();
        assert_eq!(
            (auth.username(), auth.password()),
            (Some("sen"), Some("p@ss&w"))
        );
        for (bad, says) in [
            ("redis+sentinel://u:secret@s1:1", "must name the service"),
            (
                "redis+sentinel://u:secret@s1:1,/m",
                "empty sentinel address",
            ),
            (
                "redis+sentinel://s1/m?sentinel_username=secret",
                "needs sentinel_password",
            ),
            (
                "redis+sentinel://s1/m?sentinel_password=secret%zz",
                "two hex digits",
            ),
        ] {
            let e = sentinel_parts(bad).unwrap_err();
            assert!(
                matches!(&e, StoreError::Misconfigured(m) if m.contains(says) && !m.contains("secret")),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redact("redis://u:secret@h:1/0?x=1"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn prefixes_with_glob_or_tag_characters_are_refused() {
        assert!(check_prefix("idemgate:").is_ok());
        assert!(check_prefix("").is_ok());
        for bad in ["a*", "a{", "a}", "a?", "a[", "a b"] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn record_keys_are_recognised() {
        let key = idemgate_core::Key::new(
            "t".parse().unwrap(),
            "tool".parse().unwrap(),
            "k".parse().unwrap(),
        );
        let name = record_key("p:", &key);
        assert_eq!(name.len(), "p:".len() + 66);
        assert!(is_record_key("p:", &name));
        assert!(!is_record_key("q:", &name));
        assert!(!is_record_key("p:", "p:{abc}"));
    }

    #[test]
    fn durations_are_capped() {
        assert_eq!(ms(Duration::from_millis(1500)), 1500);
        assert_eq!(ms(Duration::MAX), MAX_MS);
    }
}
